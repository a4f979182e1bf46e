"""Study results with named axes: arrays whose leading axes carry a name and coordinates.

A study's raw results are arrays shaped like its grid, e.g. ``[lag, delta, seed, iteration]``.
:class:`NamedArrays` keeps the grid's axis names and values with them, so a table reads
``run.sel(lag=8, delta=0.2)["episode_return"]`` instead of ``run["episode_return"][1, 2]``, and
the ``.npz`` it saves says which axis is which (:meth:`NamedArrays.to_npz`).
"""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from fresh_rl.provenance import write_atomic

RESERVED_PREFIX = "named__"
"""Names starting with this are the ``.npz`` entries of the axis names, not variables or attrs."""
DIMS_KEY = RESERVED_PREFIX + "dims"
"""The ``.npz`` entry holding the dim names: its presence marks a file :meth:`NamedArrays.to_npz` wrote."""
COORD_PREFIX = RESERVED_PREFIX + "coord__"
"""``COORD_PREFIX + dim``: the ``.npz`` entry holding that dim's coordinates."""
VARIABLES_KEY = RESERVED_PREFIX + "variables"
"""The ``.npz`` entry naming the variables (the other plain entries are attrs)."""


@dataclasses.dataclass(frozen=True)
class NamedArrays:
    """Variables sharing the leading axes ``dims``, with one coordinate tuple per dim.

    ``coords``: the values along each dim (e.g. lags, deltas, seed numbers; unique); a dim left
    out gets ``range(size)``. ``data``: arrays whose leading axes are ``dims`` (trailing axes are
    free, e.g. iterations). ``attrs``: arrays without the dims (a run's config, timing), kept
    alongside. Construction checks every shape: a ``ValueError`` names the variable, dim and sizes."""

    dims: tuple[str, ...]
    coords: Mapping[str, tuple]
    data: Mapping[str, np.ndarray]
    attrs: Mapping[str, np.ndarray] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        dims, data = tuple(self.dims), {k: np.asarray(v) for k, v in self.data.items()}
        if len(set(dims)) != len(dims) or not set(self.coords) <= set(dims):
            raise ValueError(f"dims must be unique and name every coords key: dims {dims}, coords {tuple(self.coords)}")
        reserved = sorted(k for k in (*data, *self.attrs) if k.startswith(RESERVED_PREFIX))
        if reserved or set(data) & set(self.attrs):
            raise ValueError(f"names must not start with {RESERVED_PREFIX!r} nor be both a variable and an attr: "
                             f"{reserved or sorted(set(data) & set(self.attrs))}")
        coords = {}
        for axis, dim in enumerate(dims):
            if dim in self.coords:
                coords[dim] = tuple(self.coords[dim])
            elif data:
                first = next(iter(data.values()))
                coords[dim] = tuple(range(first.shape[axis] if axis < first.ndim else 0))
            else:
                raise ValueError(f"dim {dim!r} has no coordinates and no variable to size it")
            if len(set(coords[dim])) != len(coords[dim]):
                raise ValueError(f"coordinates of dim {dim!r} repeat: {coords[dim]}")
        for name, array in data.items():
            for axis, dim in enumerate(dims):
                size = array.shape[axis] if axis < array.ndim else None
                if size != len(coords[dim]):
                    raise ValueError(f"variable {name!r} has size {size} along dim {dim!r} (axis {axis}) but "
                                     f"{len(coords[dim])} coordinates: shape {array.shape}, dims {dims}")
        object.__setattr__(self, "dims", dims)
        object.__setattr__(self, "coords", coords)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "attrs", {k: np.asarray(v) for k, v in self.attrs.items()})

    def __contains__(self, name: str) -> bool:
        return name in self.data

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.data:
            raise KeyError(f"no variable {name!r}; variables: {sorted(self.data)}")
        return self.data[name]

    def axis(self, dim: str) -> int:
        """The position of ``dim`` among the leading axes; ``ValueError`` names the dims."""
        if dim not in self.dims:
            raise ValueError(f"no dim {dim!r}; dims: {self.dims}")
        return self.dims.index(dim)

    def index(self, dim: str, value: Any) -> int:
        """The position of coordinate ``value`` along ``dim``; ``KeyError`` names the allowed values."""
        self.axis(dim)  # an unknown dim: ValueError
        if value not in self.coords[dim]:
            raise KeyError(f"{dim}={value!r} is not a coordinate; {dim} has {self.coords[dim]}")
        return self.coords[dim].index(value)

    def isel(self, **indices: int) -> NamedArrays:
        """Every variable at position ``indices[dim]`` along each named dim (views), which is dropped."""
        data = self.data
        for dim in sorted(indices, key=self.axis, reverse=True):  # the last axis first: the others stay put
            index, size = indices[dim], len(self.coords[dim])
            if not -size <= index < size:
                raise IndexError(f"index {index} is out of range for dim {dim!r} of size {size}")
            data = {k: v[(slice(None),) * self.axis(dim) + (index,)] for k, v in data.items()}
        return NamedArrays(tuple(d for d in self.dims if d not in indices),
                           {d: c for d, c in self.coords.items() if d not in indices}, data, self.attrs)

    def sel(self, **values: Any) -> NamedArrays:
        """Every variable at coordinate ``values[dim]`` of each named dim, which is dropped."""
        return self.isel(**{dim: self.index(dim, value) for dim, value in values.items()})

    def mean(self, dim: str) -> NamedArrays:
        """Every variable's mean over ``dim`` (NaN stays NaN), which is dropped."""
        return self._reduced(dim, np.mean)

    def sum(self, dim: str) -> NamedArrays:
        """Every variable's sum over ``dim`` (e.g. histogram counts over seeds), which is dropped."""
        return self._reduced(dim, np.sum)

    def _reduced(self, dim: str, reduce: Callable[..., np.ndarray]) -> NamedArrays:
        axis = self.axis(dim)
        return NamedArrays(self.dims[:axis] + self.dims[axis + 1:], {d: c for d, c in self.coords.items() if d != dim},
                           {k: reduce(v, axis=axis) for k, v in self.data.items()}, self.attrs)

    @classmethod
    def from_grid(cls, flat: Mapping[str, np.ndarray], coords: Mapping[str, Sequence],
                  attrs: Optional[Mapping[str, np.ndarray]] = None) -> NamedArrays:
        """Flat arrays whose leading axis runs over a product grid, reshaped into its dims.

        ``coords``: each dim's values, in axis order (the first slowest, the last fastest: row-major,
        as :func:`itertools.product`). :func:`fresh_rl.sweep.product_grid` ``(n, s, a=A, b=B)``
        orders its rows so: its grid is ``coords = {"a": A, "b": B, "seed": range(s, s + n)}``
        (the seed fastest). ``ValueError`` names a variable whose leading size is not the product
        of the coordinate lengths."""
        shape = tuple(len(values) for values in coords.values())
        data = {}
        for name, array in flat.items():
            array = np.asarray(array)
            size = array.shape[0] if array.ndim else None
            if size != math.prod(shape):
                raise ValueError(f"variable {name!r} has leading size {size} but the grid {dict(zip(coords, shape))} "
                                 f"has {math.prod(shape)} points: shape {array.shape}")
            data[name] = array.reshape(shape + array.shape[1:])
        return cls(tuple(coords), coords, data, attrs or {})

    def assign(self, **arrays: np.ndarray) -> NamedArrays:
        """These arrays added as variables (shape-checked), replacing any of the same name."""
        return NamedArrays(self.dims, self.coords, {**self.data, **arrays}, self.attrs)

    def to_mapping(self) -> dict[str, np.ndarray]:
        """The flat arrays :meth:`to_npz` saves: variables and attrs under their names, plus the
        dims, each dim's coordinates and the variable names under :data:`RESERVED_PREFIX` keys."""
        coords = {COORD_PREFIX + d: np.asarray(c) for d, c in self.coords.items()}
        for dim in self.dims:
            if tuple(coords[COORD_PREFIX + dim].tolist()) != self.coords[dim]:
                raise ValueError(f"coordinates of dim {dim!r} do not survive an array: {self.coords[dim]}")
        return {**self.data, **self.attrs, **coords, DIMS_KEY: np.asarray(self.dims, str),
                VARIABLES_KEY: np.asarray(tuple(self.data), str)}

    @classmethod
    def from_mapping(cls, arrays: Mapping[str, np.ndarray]) -> NamedArrays:
        """The inverse of :meth:`to_mapping`; ``ValueError`` if ``arrays`` hold no :data:`DIMS_KEY`."""
        if DIMS_KEY not in arrays:
            raise ValueError(f"no {DIMS_KEY!r} entry: these arrays were not saved with their axis names")
        dims, names = tuple(arrays[DIMS_KEY].tolist()), set(arrays[VARIABLES_KEY].tolist())
        return cls(dims, {d: tuple(arrays[COORD_PREFIX + d].tolist()) for d in dims},
                   {k: v for k, v in arrays.items() if k in names},
                   {k: v for k, v in arrays.items() if k not in names and not k.startswith(RESERVED_PREFIX)})

    def to_npz(self, path) -> Path:
        """Save to ``path`` in one atomic write (:func:`fresh_rl.provenance.write_atomic`)."""
        arrays = self.to_mapping()
        return write_atomic(path, lambda f: np.savez(f, **arrays), binary=True)

    @classmethod
    def from_npz(cls, path) -> NamedArrays:
        """A :class:`NamedArrays` saved by :meth:`to_npz`."""
        with np.load(path, allow_pickle=False) as saved:
            return cls.from_mapping(dict(saved))
