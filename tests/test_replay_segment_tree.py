"""Segment tree: exact rebuilds, last-write-wins, safe descent, no float32 drift."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fresh_rl.replay import segment_tree

CAPACITY = 13  # not a power of two: exercises padding leaves
BATCH = 6


def numpy_tree(leaves: np.ndarray, reduction: str) -> np.ndarray:
    """Reference: the same pairwise reduction, level by level, in NumPy (one column)."""
    size = 1 << max(0, len(leaves) - 1).bit_length()
    fill = 0.0 if reduction == "sum" else np.inf
    level = np.full(size, fill, np.float32)
    level[: len(leaves)] = leaves
    op = np.add if reduction == "sum" else np.minimum
    levels = [level]
    while len(level) > 1:
        level = op(level[0::2], level[1::2]).astype(np.float32)
        levels.append(level)
    return np.concatenate([np.array([fill], np.float32), *reversed(levels)])[:, None]


def col(values) -> jax.Array:
    return jnp.asarray(values, jnp.float32)[:, None]


@functools.partial(jax.jit, static_argnames="reduction")
def _write(nodes, indices, values, mask, reduction):
    return segment_tree.write(nodes, indices, values[:, None], (reduction,), mask)


_sample = jax.jit(segment_tree.sample)
# XLA on CPU flushes subnormals to zero, so they are not meaningful priorities.
leaf_values = st.lists(
    st.floats(0.0, 100.0, width=32, allow_subnormal=False) | st.just(0.0), min_size=CAPACITY, max_size=CAPACITY
)


def test_sizes():
    assert segment_tree.next_power_of_two(1) == 1
    assert segment_tree.next_power_of_two(13) == 16
    assert segment_tree.next_power_of_two(16) == 16
    assert segment_tree.tree_depth(1 << 20) == 20
    with pytest.raises(ValueError, match="capacity"):
        segment_tree.init(0, ("sum",))
    with pytest.raises(ValueError, match="reductions must be"):
        segment_tree.init(4, ("mean",))


@given(leaf_values)
def test_build_matches_numpy(values):
    values = np.asarray(values, np.float32)
    for reduction in ("sum", "min"):
        np.testing.assert_array_equal(
            np.asarray(segment_tree.build(col(values), (reduction,))),
            numpy_tree(values, reduction),
        )


@given(
    st.lists(st.integers(0, CAPACITY - 1), min_size=BATCH, max_size=BATCH),
    st.lists(st.floats(0.0, 10.0, width=32, allow_subnormal=False), min_size=BATCH, max_size=BATCH),
    st.lists(st.booleans(), min_size=BATCH, max_size=BATCH),
    st.sampled_from(["sum", "min"]),
)
def test_write_is_sequential_last_wins(indices, values, mask, reduction):
    """A batched write equals writing the unmasked entries one by one, in order."""
    rng = np.random.default_rng(0)
    start = rng.uniform(0, 5, CAPACITY).astype(np.float32)
    expected = start.copy()
    for i, v, m in zip(indices, values, mask):
        if m:
            expected[i] = v
    nodes = _write(
        segment_tree.build(col(start), (reduction,)),
        jnp.asarray(indices),
        jnp.asarray(values, jnp.float32),
        jnp.asarray(mask),
        reduction,
    )
    np.testing.assert_array_equal(np.asarray(nodes), numpy_tree(expected, reduction))


def test_path_walk_and_full_rebuild_agree():
    """Small batch on a big tree takes the path walk, big batch the rebuild: both exact."""
    rng = np.random.default_rng(1)
    capacity = 1 << 12
    start = rng.uniform(0, 1, capacity).astype(np.float32)
    for batch in (4, 2048):  # 2·4·12 < 4096 (path), 2·2048·12 ≥ 4096 (rebuild)
        idx = rng.integers(0, capacity, batch)
        vals = rng.uniform(0, 1, batch).astype(np.float32)
        expected = start.copy()
        for i, v in zip(idx, vals):
            expected[i] = v
        nodes = segment_tree.write(
            segment_tree.build(col(start), ("sum",)), jnp.asarray(idx), col(vals), ("sum",)
        )
        np.testing.assert_array_equal(np.asarray(nodes), numpy_tree(expected, "sum"))


@given(leaf_values, st.lists(st.floats(-10.0, 2000.0, width=32), min_size=8, max_size=8))
def test_descent_matches_prefix_sums_and_skips_zero_mass(values, targets):
    values = np.asarray(values, np.float32)
    values[3] = max(values[3], 1.0)  # total > 0
    nodes = segment_tree.build(col(values), ("sum",))
    got = np.asarray(_sample(nodes, jnp.asarray(targets, jnp.float32)))
    assert np.all(values[got] > 0), "descent returned a zero-mass leaf"
    # Reference: leaf i holds the targets in [S_i, S_{i+1}) of the float64 prefix sums.
    prefix = np.concatenate([[0.0], np.cumsum(values.astype(np.float64))])
    total = float(np.asarray(segment_tree.total(nodes))[0])
    for target, leaf in zip(targets, got):
        clamped = min(max(target, 0.0), total)
        # Float32 tree rounding can move a boundary by a few ulps of the total.
        slack = 1e-5 * total
        assert prefix[leaf] - slack <= clamped <= prefix[leaf + 1] + slack


def test_descent_at_exact_boundaries_and_out_of_range():
    values = jnp.asarray([0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0], jnp.float32)
    nodes = segment_tree.build(values[:, None], ("sum",))
    targets = jnp.asarray([-1.0, 0.0, 1.0, 2.999, 3.0, 1e9, jnp.inf, jnp.nan], jnp.float32)
    got = np.asarray(_sample(nodes, targets))
    assert got[:6].tolist() == [1, 1, 4, 4, 4, 4]
    assert set(got.tolist()) <= {1, 4}


def test_last_write_wins_mask():
    mask = segment_tree.last_write_wins(jnp.asarray([5, 2, 5, 7, 2, 5]))
    assert mask.tolist() == [False, False, False, True, True, True]


def test_no_float32_drift_after_1e5_batched_writes():
    """10^5 batched writes with duplicates and zeros: root equals Σ leaves within 1e-5 rel.

    Every step also samples; no sample may land on a zero-mass leaf.
    """
    capacity, batch, steps = 1000, 16, 100_000

    def step(carry, key):
        nodes, bad_samples = carry
        k_idx, k_val, k_zero, k_sample = jax.random.split(key, 4)
        idx = jax.random.randint(k_idx, (batch,), 0, 40)  # many duplicates
        idx = jnp.where(jnp.arange(batch) % 2 == 0, idx, jax.random.randint(k_idx, (batch,), 0, capacity))
        vals = jax.random.uniform(k_val, (batch,)) * 10.0 ** jax.random.uniform(k_zero, (batch,), minval=-3, maxval=3)
        vals = jnp.where(jax.random.bernoulli(k_zero, 0.2, (batch,)), 0.0, vals)
        nodes = segment_tree.write(nodes, idx, jnp.stack([vals, vals], -1), ("sum", "min"))
        root = segment_tree.total(nodes)[0]
        targets = segment_tree.stratified_targets(k_sample, root, 32)
        leaf = segment_tree.sample(nodes, targets)
        hit_zero = jnp.sum(segment_tree.leaves(nodes, capacity)[leaf, 0] <= 0)
        return (nodes, bad_samples + jnp.where(root > 0, hit_zero, 0)), None

    init = segment_tree.build(jnp.ones((capacity, 2), jnp.float32), ("sum", "min"))
    keys = jax.random.split(jax.random.key(0), steps)
    (nodes, bad_samples), _ = jax.jit(lambda n, k: jax.lax.scan(step, (n, 0), k))(init, keys)
    leaves = np.asarray(segment_tree.leaves(nodes, capacity), np.float64)
    root, root_min = np.asarray(segment_tree.total(nodes))
    assert abs(root - leaves[:, 0].sum()) <= 1e-5 * leaves[:, 0].sum()
    assert root_min == leaves[:, 1].min()
    # Every internal node equals the reduction of its children exactly (no accumulated deltas).
    for column, reduction in enumerate(("sum", "min")):
        np.testing.assert_array_equal(
            np.asarray(nodes[:, column : column + 1]),
            numpy_tree(leaves[:, column].astype(np.float32), reduction),
        )
    assert int(bad_samples) == 0


def test_descent_never_enters_empty_subtrees_even_with_overflowing_residuals():
    """Rounding can leave a residual at or above a subtree's mass; simulate it directly by
    starting the walk with residuals ≥ the total. An unguarded walk would go right into the
    empty leaves 5..7; ours stays on positive leaves."""
    values = jnp.asarray([0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0], jnp.float32)
    nodes = segment_tree.build(values[:, None], ("sum",))
    residuals = jnp.asarray([3.0, 3.5, 100.0, 0.0], jnp.float32)
    leaves = np.asarray(segment_tree._descend(nodes, residuals, 0))
    assert np.all(np.asarray(values)[leaves] > 0)


@given(
    st.lists(st.integers(0, 9), min_size=1, max_size=12),
    st.data(),
    st.booleans(),
)
def test_last_write_wins_matches_sequential_reference(indices, data, presort):
    """Both the sorted fast path and the sort path keep exactly the last unmasked write."""
    if presort:
        indices = sorted(indices)
    mask = data.draw(st.lists(st.booleans(), min_size=len(indices), max_size=len(indices)))
    winner = {}
    for position, (i, m) in enumerate(zip(indices, mask)):
        if m:
            winner[i] = position
    expected = [winner.get(i) == p for p, i in enumerate(indices)]
    for bound in (None, 10):
        got = segment_tree.last_write_wins(jnp.asarray(indices), jnp.asarray(mask), index_bound=bound)
        assert np.asarray(got).tolist() == expected
