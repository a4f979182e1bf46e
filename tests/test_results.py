"""fresh_rl.results.NamedArrays against plain NumPy indexing: ``sel`` is the positional slice at
the coordinate's position, ``isel``, ``mean`` and ``sum`` drop the named axis, the ``.npz`` round trip
keeps dims, coordinates, variables and attrs exactly, ``from_grid`` puts each row of a
``product_grid`` at its point, and bad dims, values and shapes raise errors naming them."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fresh_rl.results import DIMS_KEY, NamedArrays
from fresh_rl.sweep import product_grid


@st.composite
def named_arrays(draw):
    """A NamedArrays of 1–3 dims (some without coordinates; ints, floats or text), two
    variables with trailing axes of their own, and the positional arrays it was built from."""
    ndim = draw(st.integers(1, 3))
    dims = tuple(draw(st.permutations(["lag", "delta", "seed"]))[:ndim])
    sizes = [draw(st.integers(1, 4)) for _ in dims]
    coords = {}
    for dim, size in zip(dims, sizes):
        values = draw(st.sampled_from([st.integers(-100, 100), st.floats(-10, 10, allow_nan=False),
                                       st.text("abmx", min_size=1, max_size=3)]))
        if draw(st.booleans()):
            coords[dim] = tuple(draw(st.lists(values, min_size=size, max_size=size, unique=True)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    data = {"returns": rng.normal(size=(*sizes, draw(st.integers(1, 5)))).astype(np.float32),
            "count": rng.integers(0, 10, size=tuple(sizes))}
    return NamedArrays(dims, coords, data, {"config": np.array("c"), "seed": np.array(3)}), data


def _positional(arrays: NamedArrays, dim: str, position: int, variable: str) -> np.ndarray:
    return np.take(arrays.data[variable], position, axis=arrays.dims.index(dim))


@given(named_arrays())
def test_sel_is_the_positional_slice_at_every_coordinate(case):
    arrays, data = case
    for axis, dim in enumerate(arrays.dims):
        assert len(arrays.coords[dim]) == data["count"].shape[axis]
        for position, value in enumerate(arrays.coords[dim]):
            picked = arrays.sel(**{dim: value})
            assert picked.dims == arrays.dims[:axis] + arrays.dims[axis + 1:]
            assert dim not in picked.coords and picked.attrs.keys() == arrays.attrs.keys()
            for name in data:
                np.testing.assert_array_equal(picked[name], _positional(arrays, dim, position, name))
                np.testing.assert_array_equal(arrays.isel(**{dim: position})[name], picked[name])
                np.testing.assert_array_equal(arrays.mean(dim)[name], data[name].mean(axis=axis))
                np.testing.assert_array_equal(arrays.sum(dim)[name], data[name].sum(axis=axis))


@given(named_arrays())
def test_sel_over_every_dim_at_once_is_the_positional_cell(case):
    arrays, data = case
    positions = [len(arrays.coords[d]) - 1 for d in arrays.dims]
    cell = arrays.sel(**{d: arrays.coords[d][p] for d, p in zip(arrays.dims, positions)})
    assert cell.dims == ()
    np.testing.assert_array_equal(cell["returns"], data["returns"][tuple(positions)])
    assert cell["count"] == data["count"][tuple(positions)]


@given(named_arrays())
def test_npz_round_trip_keeps_dims_coords_data_and_attrs(tmp_path_factory, case):
    arrays, _ = case
    path = tmp_path_factory.mktemp("named") / "run.npz"
    arrays.to_npz(path)
    loaded = NamedArrays.from_npz(path)
    assert loaded.dims == arrays.dims and loaded.coords == arrays.coords
    for got, want in ((loaded.data, arrays.data), (loaded.attrs, arrays.attrs)):
        assert got.keys() == want.keys()
        for name in want:
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name])
    assert {d: [type(v) for v in c] for d, c in loaded.coords.items()} == \
        {d: [type(v) for v in c] for d, c in arrays.coords.items()}
    assert [p.name for p in path.parent.iterdir()] == ["run.npz"]  # the atomic write leaves no temporary file


@given(st.lists(st.lists(st.integers(-50, 50), min_size=1, max_size=3, unique=True), max_size=2),
       st.integers(1, 3), st.integers(0, 100), st.integers(1, 3))
def test_from_grid_puts_each_product_grid_row_at_its_point(hyperparameters, num_seeds, first_seed, trailing):
    """``from_grid(flat, {**values, "seed": seeds}).sel(**row)`` is the flat array at the row
    :func:`fresh_rl.sweep.product_grid` gives that point (the seed fastest)."""
    values = {f"hp{i}": v for i, v in enumerate(hyperparameters)}
    grid = product_grid(num_seeds, first_seed, **values)
    flat = {"returns": np.arange(grid.size * trailing).reshape(grid.size, trailing), "count": np.arange(grid.size)}
    arrays = NamedArrays.from_grid(flat, {**values, "seed": range(first_seed, first_seed + num_seeds)},
                                   {"config": np.array("c")})
    assert arrays.dims == (*values, "seed") and arrays.attrs.keys() == {"config"}
    for row, point in enumerate(grid.rows):
        cell = arrays.sel(**point)
        np.testing.assert_array_equal(cell["returns"], flat["returns"][row])
        assert cell["count"] == row


def _run():
    return NamedArrays(("lag", "delta", "seed"), {"lag": (0, 8, -1), "delta": (0.1, 0.2)},
                       {"episode_return": np.zeros((3, 2, 4, 5))}, {"config": np.array("c")})


def test_a_bad_dim_or_value_names_the_dim_and_the_allowed_values():
    run = _run()
    with pytest.raises(ValueError, match=r"no dim 'lags'; dims: \('lag', 'delta', 'seed'\)"):
        run.sel(lags=0)
    with pytest.raises(KeyError, match=r"lag=4 is not a coordinate; lag has \(0, 8, -1\)"):
        run.sel(lag=4)
    with pytest.raises(KeyError, match=r"delta=0.3 .* delta has \(0.1, 0.2\)"):
        run.sel(lag=0, delta=0.3)
    with pytest.raises(IndexError, match="index 4 is out of range for dim 'seed' of size 4"):
        run.isel(seed=4)
    with pytest.raises(ValueError, match="no dim 'iteration'"):
        run.mean("iteration")
    with pytest.raises(KeyError, match=r"no variable 'returns'; variables: \['episode_return'\]"):
        run["returns"]


def test_mismatched_shapes_name_the_variable_dim_and_sizes():
    with pytest.raises(ValueError, match=r"variable 'tv' has size 2 along dim 'lag' \(axis 0\) but 3 coordinates"):
        NamedArrays(("lag",), {"lag": (0, 8, -1)}, {"tv": np.zeros((2, 5))})
    with pytest.raises(ValueError, match=r"variable 'gap' has size None along dim 'seed' \(axis 2\)"):
        _run().assign(gap=np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"variable 'tv' has leading size 5 but the grid \{'lag': 3, 'seed': 2\} "
                                         "has 6 points"):
        NamedArrays.from_grid({"x": np.zeros(6), "tv": np.zeros((5, 2))}, {"lag": (0, 8, -1), "seed": range(2)})
    with pytest.raises(ValueError, match="coordinates of dim 'lag' repeat"):
        NamedArrays(("lag",), {"lag": (0, 0)}, {"tv": np.zeros(2)})
    with pytest.raises(ValueError, match="dims must be unique and name every coords key"):
        NamedArrays(("lag",), {"delta": (0.1,)}, {"tv": np.zeros(1)})
    with pytest.raises(ValueError, match="dim 'seed' has no coordinates and no variable to size it"):
        NamedArrays(("seed",), {}, {})
    with pytest.raises(ValueError, match="must not start with 'named__'"):
        NamedArrays(("seed",), {}, {"named__x": np.zeros(2)})


def test_a_dim_without_coordinates_counts_positions_and_npz_without_names_is_refused(tmp_path):
    run = NamedArrays(("seed", "lag"), {"lag": (0, 4)}, {"x": np.arange(6).reshape(3, 2)})
    assert run.coords["seed"] == (0, 1, 2)
    np.savez(tmp_path / "positional.npz", x=np.zeros((3, 2)))
    with pytest.raises(ValueError, match=f"no '{DIMS_KEY}' entry"):
        NamedArrays.from_npz(tmp_path / "positional.npz")
    with pytest.raises(ValueError, match="coordinates of dim 'lag' do not survive an array"):
        NamedArrays(("lag",), {"lag": (0, "mixture")}, {"x": np.zeros(2)}).to_npz(tmp_path / "mixed.npz")
