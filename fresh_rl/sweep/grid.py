"""Seeds × hyperparameter grids as flat leading axes, and their sharded execution.

A sweep is one jitted, vmapped program over a flat *grid axis* of length
``N = num_seeds · Π len(values)``: point ``i`` gets a PRNG key and one value per
hyperparameter. :func:`run_sharded` lays that axis out over every local device with a
one-axis :class:`jax.sharding.Mesh` (``"grid"``), so each device runs ``N / D`` points of the
same compiled program; grids larger than memory run in chunks of ``chunk_size`` points.

Determinism: point ``i`` runs integer seed ``s_i`` with the run key ``seed_key(s_i)`` (the one
schedule of :mod:`fresh_rl.sweep.keys`), independent of the device count, the chunking and the
other hyperparameters, so sharded, chunked and plain runs of the same grid give the same numbers
(tested on 8 simulated CPU devices), and seed 3 of a sweep equals ``fresh-rl train --seed 3``.

Multi-process: call :func:`~fresh_rl.sweep.distributed.initialize_distributed` first in every
process; the mesh then spans ``jax.devices()`` of all processes, each process feeds its
addressable shards, and :func:`to_host` gathers the full result on every process
(docs/sweeps.md, "Several processes").
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from fresh_rl.provenance import write_atomic
from fresh_rl.sweep.checkpoint import RunCheckpointer, progress_printer
from fresh_rl.sweep.keys import seed_keys
from fresh_rl.validation import checked_result, checkify_if_checked, require_int

GRID_AXIS = "grid"
MAX_GRID_POINTS = 1_000_000
"""Largest grid :func:`product_grid` builds (its rows alone take about a kilobyte each)."""


@dataclasses.dataclass(frozen=True)
class Grid:
    """A flat seeds × hyperparameter grid.

    Attributes:
      keys: ``[N, 2]`` uint32 PRNG keys, one per point.
      values: name → ``[N]`` array of that hyperparameter at each point.
      rows: N dicts ``{"seed": s, name: value, …}`` describing the points (for result tables);
        ``s`` is the integer seed, ``keys[i] = seed_key(rows[i]["seed"])``.
    """

    keys: jax.Array
    values: Mapping[str, np.ndarray]
    rows: tuple[dict, ...]

    @property
    def size(self) -> int:
        return len(self.rows)


def product_grid(num_seeds: int, seed: int = 0, **values: Sequence) -> Grid:
    """Cartesian product of the seeds ``seed … seed + num_seeds − 1`` and every
    hyperparameter's values: seed fastest, then the hyperparameters from the last given to the
    first (the first is slowest). ``ValueError`` before anything is built if the grid has more
    than :data:`MAX_GRID_POINTS` points."""
    require_int("num_seeds", num_seeds, 1)
    for name, vals in values.items():
        if len(vals) == 0:
            raise ValueError(f"hyperparameter {name!r} needs at least one value")
    size = num_seeds * math.prod(len(vals) for vals in values.values())
    if size > MAX_GRID_POINTS:
        axes = " × ".join([f"{num_seeds} seeds", *(f"{len(v)} {n}" for n, v in values.items())])
        raise ValueError(f"the grid has {size:,} points ({axes}), more than MAX_GRID_POINTS = "
                         f"{MAX_GRID_POINTS:,}; split it into several sweeps")
    names = list(values)
    rows = []
    for combo in itertools.product(*(values[n] for n in names)):
        for s in range(seed, seed + num_seeds):
            rows.append({"seed": s, **dict(zip(names, combo))})
    keys = seed_keys([r["seed"] for r in rows])
    arrays = {n: np.asarray([r[n] for r in rows]) for n in names}
    return Grid(keys=keys, values=arrays, rows=tuple(rows))


def grid_mesh(devices: Optional[Sequence[jax.Device]] = None) -> Mesh:
    """One-axis mesh ``("grid",)`` over ``devices`` (default: all devices of all processes)."""
    devices = list(jax.devices() if devices is None else devices)
    # Auto (compiler-propagated) sharding: the per-point program indexes and gathers freely, and
    # the grid axis splits cleanly because no point depends on another. (jax.make_mesh would
    # default to Explicit axes, under which those gathers need per-op out_sharding.)
    return Mesh(np.asarray(devices), (GRID_AXIS,), axis_types=(AxisType.Auto,))


def _pad(tree, size: int):
    def pad(x):
        x = np.asarray(x)  # host values: every process feeds its own shards of the global array
        extra = size - x.shape[0]
        return x if extra == 0 else np.concatenate([x, np.repeat(x[-1:], extra, axis=0)])
    return jax.tree.map(pad, tree)


def run_sharded(fn: Callable[..., Any], *grid_args, mesh: Optional[Mesh] = None,
                chunk_size: Optional[int] = None, pad: bool = True, checkpointer=None,
                on_chunk: Optional[Callable[[int, int, float], None]] = None) -> Any:
    """``vmap(fn)`` over the leading (grid) axis of ``grid_args``, sharded over ``mesh``.

    Args:
      fn: per-point function ``fn(*point_args) -> pytree``; every leaf of ``grid_args`` has the
        grid axis first. Static settings belong in ``fn``'s closure (e.g.
        ``functools.partial(train, config)``).
      mesh: default :func:`grid_mesh` over all devices (of every process after
        :func:`~fresh_rl.sweep.distributed.initialize_distributed`).
      chunk_size: points per program call (default: the whole grid); rounded up to a multiple
        of the device count. Chunks reuse one compiled program.
      pad: fill the last chunk (or a grid smaller than the device count) with copies of the
        last point; ``False`` makes a chunk that does not divide over the devices an error.
      checkpointer: a :class:`~fresh_rl.sweep.checkpoint.RunCheckpointer`: the gathered outputs
        are saved after every chunk and a rerun continues after the last saved chunk (its
        fingerprint must name the grid and everything in ``fn``). A diverged point's NaN
        outputs are saved with the rest: they are a result (find them with
        :func:`~fresh_rl.sweep.integrity.nonfinite_cells`). All processes call it.
      on_chunk: called after every computed chunk of a checkpointed run as ``on_chunk(points
        done, points, seconds per point)`` (e.g. :func:`~fresh_rl.sweep.checkpoint.progress_printer`).
    Returns:
      The stacked outputs, each leaf a global ``jax.Array`` with the grid axis sharded over the
      mesh (one chunk) or concatenated on the host's default device (several chunks); NumPy
      arrays gathered on every process when checkpointing.
    """
    mesh = grid_mesh() if mesh is None else mesh
    num_devices = mesh.devices.size
    n = jax.tree.leaves(grid_args)[0].shape[0]
    for leaf in jax.tree.leaves(grid_args):
        if leaf.shape[0] != n:
            raise ValueError(f"every grid argument needs the grid axis first with size {n}, got {leaf.shape}")
    if chunk_size is not None:
        require_int("chunk_size", chunk_size, 1)
    chunk = n if chunk_size is None else min(chunk_size, n)
    if not pad and (chunk % num_devices or n % chunk):
        raise ValueError(f"with pad=False every chunk must divide over the {num_devices} devices: the grid has "
                         f"{n} points in chunks of {chunk} (chunk_size={chunk_size}); choose a grid or chunk_size "
                         f"that is a multiple of {num_devices}, or pad=True")
    chunk = math.ceil(chunk / num_devices) * num_devices
    sharding = NamedSharding(mesh, PartitionSpec(GRID_AXIS))
    # one trace and one compile for every chunk: the output shapes (for the checkpoint's restore
    # target) come from the same trace as the program (an eval_shape of the jitted function
    # traced it a second time, its unsharded abstract arguments missing jit's trace cache)
    # (inside fresh_rl.checked(): checkified, its error read after every chunk)
    body, checkified = checkify_if_checked(jax.vmap(fn))
    traced = jax.jit(body, out_shardings=(None, sharding) if checkified else sharding).trace(*jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((chunk,) + x.shape[1:], x.dtype, sharding=sharding), grid_args))
    program = functools.cache(lambda: traced.lower().compile())  # not compiled if every chunk is restored

    def run_chunk(start):
        part = jax.tree.map(lambda x: jax.device_put(x, sharding),
                            _pad(jax.tree.map(lambda x: x[start:start + chunk], grid_args), chunk))
        out = checked_result(program()(*part), checkified)
        keep = min(chunk, n - start)
        return out if keep == chunk else jax.tree.map(lambda x: x[:keep], out)

    if checkpointer is not None:
        return _run_chunks_checkpointed(run_chunk, traced.out_info[1] if checkified else traced.out_info, n,
                                        checkpointer, on_chunk)
    outputs = [run_chunk(start) for start in range(0, n, chunk)]
    if len(outputs) == 1:
        return outputs[0]
    return jax.tree.map(lambda *xs: jnp.concatenate([multihost_utils.process_allgather(x, tiled=True)
                                                     for x in xs]), *outputs)


def _run_chunks_checkpointed(run_chunk, shapes, n, checkpointer, on_chunk=None):
    """Chunks in order, the gathered outputs saved after each; resumes after the last saved.
    ``shapes``: one chunk's output shapes; ``on_chunk(done, n, seconds per point)`` after each
    computed chunk (the rate of this invocation's chunks, compilation included)."""
    chunk = jax.tree.leaves(shapes)[0].shape[0]
    abstract = {"outputs": jax.tree.map(lambda s: jax.ShapeDtypeStruct((n,) + s.shape[1:], s.dtype), shapes),
                "points_done": jax.ShapeDtypeStruct((), np.int32)}
    restored = checkpointer.restore_latest(abstract)
    if restored is None:
        tree = {"outputs": jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), abstract["outputs"]),
                "points_done": np.int32(0)}
    else:
        tree = jax.tree.map(np.array, restored[1])
    started, resumed_at = time.perf_counter(), int(tree["points_done"])
    for index, start in enumerate(range(0, n, chunk)):
        if start < int(tree["points_done"]):
            continue
        out = to_host(run_chunk(start))
        for target, value in zip(jax.tree.leaves(tree["outputs"]), jax.tree.leaves(out)):
            target[start:start + value.shape[0]] = value
        tree["points_done"] = np.int32(min(n, start + chunk))
        checkpointer.save(index + 1, tree, allow_nonfinite=True)  # finished runs' outputs, not a state
        if on_chunk is not None:
            done = int(tree["points_done"])
            on_chunk(done, n, (time.perf_counter() - started) / (done - resumed_at))
    return tree["outputs"]


def run_stage(fn: Callable[..., Any], *grid_args, directory, fingerprint: str, chunk_size: int,
              label: str = "") -> tuple[dict, float]:
    """One resumable stage of a study: :func:`run_sharded` of ``fn`` over ``grid_args``, each
    chunk saved in ``<directory>-<hash of fingerprint>`` (new settings, new folder; a rerun
    restores the saved chunks), progress on stderr. Returns the outputs as NumPy arrays and the
    wall time of the invocation that finished the stage (kept in ``<folder>.seconds``). A run
    that diverges keeps its NaN outputs (saved like any other; the study scores it by its rule)."""
    directory = Path(directory)
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:10]
    folder = directory.with_name(f"{directory.name}-{digest}")
    timing = folder.with_name(folder.name + ".seconds")
    started = time.perf_counter()
    out = run_sharded(fn, *grid_args, chunk_size=chunk_size,
                      checkpointer=RunCheckpointer(folder, fingerprint=fingerprint),
                      on_chunk=progress_printer(label or directory.name))
    if not timing.exists():
        timing.write_text(f"{time.perf_counter() - started:.1f}\n")
    return {k: np.asarray(v) for k, v in out.items()}, float(timing.read_text())


def saved_arrays(path, compute: Callable[[], Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """The arrays saved at ``path`` (an ``.npz`` a finished stage wrote) or, if there is none,
    ``compute()``'s, saved there first in one atomic write (an interrupted write leaves no file,
    so a rerun computes again instead of loading half an archive)."""
    path = Path(path)
    if path.exists():
        with np.load(path) as saved:
            return dict(saved)
    data = {k: np.asarray(v) for k, v in compute().items()}
    write_atomic(path, lambda f: np.savez(f, **data), binary=True)
    return data


def to_host(tree) -> Any:
    """Gather a (possibly multi-host sharded) result pytree into NumPy arrays on every host."""
    return jax.tree.map(lambda x: np.asarray(multihost_utils.process_allgather(x, tiled=True)), tree)
