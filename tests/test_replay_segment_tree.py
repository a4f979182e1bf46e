"""K-ary segment tree: exact rebuilds, last-write-wins, safe descent, no float32 drift, sampled
frequencies against the exact probabilities, for fan-outs K = 2, 16 and 128."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from fresh_rl.replay import segment_tree

CAPACITY = 13  # not a multiple of any K: exercises padding leaves
BATCH = 6
FANOUTS = (2, 16, 128)


def numpy_tree(leaves: np.ndarray, reduction: str, fanout: int) -> np.ndarray:
    """Reference: the same layout and pairwise reduction, level by level, in NumPy (one column).

    Each level is padded to a multiple of K, its rows of K siblings reduced in adjacent pairs;
    the root level is padded to K; levels are stored root first.

    Exact equality with the tree is justified: every node is the same sequence of correctly
    rounded float32 adds (or mins) in both, explicit binary ops that XLA does not reassociate or
    fuse into multiply-adds, and subnormals (flushed by XLA) are kept out of the inputs.
    """
    fill = 0.0 if reduction == "sum" else np.inf
    op = np.add if reduction == "sum" else np.minimum
    level, levels = np.asarray(leaves, np.float32), []
    while True:
        rows = -(-len(level) // fanout)
        padded = np.full(rows * fanout, fill, np.float32)
        padded[: len(level)] = level
        levels.insert(0, padded)
        level = padded.reshape(rows, fanout)
        while level.shape[1] > 1:
            level = op(level[:, 0::2], level[:, 1::2]).astype(np.float32)
        level = level[:, 0]
        if rows == 1:
            root = np.full(fanout, fill, np.float32)
            root[0] = level[0]
            levels.insert(0, root)
            return np.concatenate(levels)[:, None]


def col(values) -> jax.Array:
    return jnp.asarray(values, jnp.float32)[:, None]


@jax.jit
def _write(tree, indices, values, mask):
    return segment_tree.write(tree, indices, values[:, None], mask)


_sample = jax.jit(segment_tree.sample)
# one compiled program per (batch size, bound, mask or not) instead of compiling each of its ops
# eagerly per batch size; test_last_write_wins_mask keeps an eager call
_last_write_wins = jax.jit(segment_tree.last_write_wins, static_argnames="index_bound")
# XLA on CPU flushes subnormals to zero, so they are not meaningful priorities.
leaf_values = st.lists(
    st.floats(0.0, 100.0, width=32, allow_subnormal=False) | st.just(0.0),
    min_size=CAPACITY, max_size=CAPACITY,
)


def test_layout_and_fanout_validation():
    assert segment_tree.level_sizes(13, 2) == (2, 2, 4, 8, 14)
    assert segment_tree.level_sizes(1, 16) == (16, 16)
    assert segment_tree.level_sizes(1 << 20, 128) == (128, 128, 8192, 1 << 20)
    assert segment_tree.init(1 << 20, ("sum",), 16).depth == 5
    assert segment_tree.init(1 << 20, ("sum",), 2).depth == 20
    with pytest.raises(ValueError, match="capacity"):
        segment_tree.init(0, ("sum",))
    with pytest.raises(ValueError, match="reductions must be"):
        segment_tree.init(4, ("mean",))
    with pytest.raises(ValueError, match=r"fanout must be one of \(2, 4, 8, 16, 32, 64, 128\)"):
        segment_tree.init(4, ("sum",), 3)


@pytest.mark.parametrize("fanout", FANOUTS)
@given(values=leaf_values)
def test_build_matches_numpy(fanout, values):
    values = np.asarray(values, np.float32)
    for reduction in ("sum", "min"):
        np.testing.assert_array_equal(
            np.asarray(segment_tree.build(col(values), (reduction,), fanout).nodes),
            numpy_tree(values, reduction, fanout),
        )


@given(leaf_values)
def test_root_is_the_same_float_for_every_fanout(values):
    """Siblings are reduced in adjacent pairs, so every K gives the binary tree's root."""
    roots = {k: np.asarray(segment_tree.total(segment_tree.build(col(values), ("sum",), k)))
             for k in (2, 4, 8, 16, 32, 64, 128)}
    for root in roots.values():
        np.testing.assert_array_equal(root, roots[2])


@pytest.mark.parametrize("fanout", FANOUTS)
@given(
    indices=st.lists(st.integers(0, CAPACITY - 1), min_size=BATCH, max_size=BATCH),
    values=st.lists(st.floats(0.0, 10.0, width=32, allow_subnormal=False), min_size=BATCH,
                    max_size=BATCH),
    mask=st.lists(st.booleans(), min_size=BATCH, max_size=BATCH),
    reduction=st.sampled_from(["sum", "min"]),
)
def test_write_is_sequential_last_wins(fanout, indices, values, mask, reduction):
    """A batched write equals writing the unmasked entries one by one, in order."""
    rng = np.random.default_rng(0)
    start = rng.uniform(0, 5, CAPACITY).astype(np.float32)
    expected = start.copy()
    for i, v, m in zip(indices, values, mask):
        if m:
            expected[i] = v
    tree = _write(
        segment_tree.build(col(start), (reduction,), fanout),
        jnp.asarray(indices),
        jnp.asarray(values, jnp.float32),
        jnp.asarray(mask),
    )
    np.testing.assert_array_equal(np.asarray(tree.nodes), numpy_tree(expected, reduction, fanout))


@pytest.mark.parametrize("fanout", FANOUTS)
def test_scattered_and_whole_level_updates_agree(fanout):
    """Small batches on a big tree update parents row by row, big batches rebuild levels
    whole: both exact, with duplicates, on both columns at once."""
    rng = np.random.default_rng(1)
    capacity = 3000
    start = rng.uniform(0, 1, (capacity, 2)).astype(np.float32)
    # jitted: one compile instead of the build's ops one by one at this size (exactness of build: above)
    initial = jax.jit(segment_tree.build, static_argnums=(1, 2))(jnp.asarray(start), ("sum", "min"), fanout)
    for batch in (4, 40, 2000):
        idx = rng.integers(0, capacity, batch)
        vals = rng.uniform(0, 1, (batch, 2)).astype(np.float32)
        expected = start.copy()
        for i, v in zip(idx, vals):
            expected[i] = v
        tree = jax.jit(segment_tree.write)(initial, jnp.asarray(idx), jnp.asarray(vals))
        for column, reduction in enumerate(("sum", "min")):
            np.testing.assert_array_equal(np.asarray(tree.nodes[:, column : column + 1]),
                                          numpy_tree(expected[:, column], reduction, fanout))


@pytest.mark.parametrize("fanout", FANOUTS)
@given(values=leaf_values,
       targets=st.lists(st.floats(-10.0, 2000.0, width=32), min_size=8, max_size=8))
def test_descent_matches_prefix_sums_and_skips_zero_mass(fanout, values, targets):
    values = np.asarray(values, np.float32)
    values[3] = max(values[3], 1.0)  # total > 0
    tree = segment_tree.build(col(values), ("sum",), fanout)
    got = np.asarray(_sample(tree, jnp.asarray(targets, jnp.float32)))
    assert np.all(values[got] > 0), "descent returned a zero-mass leaf"
    # Reference: leaf i holds the targets in [S_i, S_{i+1}) of the float64 prefix sums.
    prefix = np.concatenate([[0.0], np.cumsum(values.astype(np.float64))])
    total = float(np.asarray(segment_tree.total(tree))[0])
    for target, leaf in zip(targets, got):
        clamped = min(max(target, 0.0), total)
        # Float32 tree rounding can move a boundary by a few ulps of the total.
        slack = 1e-5 * total
        assert prefix[leaf] - slack <= clamped <= prefix[leaf + 1] + slack


@pytest.mark.parametrize("fanout", FANOUTS)
def test_descent_at_exact_boundaries_and_out_of_range(fanout):
    values = jnp.asarray([0.0, 1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0], jnp.float32)
    tree = segment_tree.build(values[:, None], ("sum",), fanout)
    targets = jnp.asarray([-1.0, 0.0, 1.0, 2.999, 3.0, 1e9, jnp.inf, jnp.nan], jnp.float32)
    got = np.asarray(_sample(tree, targets))
    # masses are small integers: every prefix sum and boundary is exact in float32
    assert got[:6].tolist() == [1, 1, 4, 4, 4, 4]
    assert set(got.tolist()) <= {1, 4}


@pytest.mark.parametrize("fanout", FANOUTS)
def test_descent_never_enters_empty_subtrees_even_with_overflowing_residuals(fanout):
    """Rounding can leave a residual at or above a subtree's mass; simulate it directly by
    starting the walk with residuals ≥ the total. An unguarded walk would go right into the
    empty leaves 5..; ours stays on positive leaves."""
    values = jnp.asarray([0.0, 1.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0], jnp.float32)
    tree = segment_tree.build(values[:, None], ("sum",), fanout)
    residuals = jnp.asarray([3.0, 3.5, 100.0, 0.0], jnp.float32)
    leaves = np.asarray(segment_tree._descend(tree, residuals, 0)[0])
    assert np.all(np.asarray(values)[leaves] > 0)


@pytest.mark.parametrize("fanout", FANOUTS)
def test_sampled_frequencies_match_exact_probabilities(fanout):
    """Chi-square of 2^17 stratified draws against P(i) = x_i / Σ x over 300 leaves spanning
    four decades, a fifth of them zero (never drawn)."""
    rng = np.random.default_rng(fanout)
    values = (rng.uniform(0.1, 1.0, 300) * 10.0 ** rng.integers(0, 4, 300)).astype(np.float32)
    values[rng.random(300) < 0.2] = 0.0
    tree = segment_tree.build(col(values), ("sum",), fanout)

    @jax.jit
    def draw(key):
        keys = jax.random.split(key, 128)
        targets = jax.vmap(lambda k: segment_tree.stratified_targets(
            k, segment_tree.total(tree)[0], 1024))(keys)
        return jax.vmap(lambda t: segment_tree.sample(tree, t))(targets).ravel()

    counts = np.bincount(np.asarray(draw(jax.random.key(0))), minlength=300)
    expected = values.astype(np.float64) / values.sum()
    assert counts[expected == 0].sum() == 0
    support = expected > 0
    chi2 = stats.chisquare(counts[support], expected[support] / expected[support].sum()
                           * counts.sum())
    # fixed key: p ~ U(0, 1) for a correct sampler (0.1% false alarm); rounding moves only targets
    # within a few ulp of a boundary
    assert chi2.pvalue > 1e-3, chi2


def test_last_write_wins_mask():
    mask = segment_tree.last_write_wins(jnp.asarray([5, 2, 5, 7, 2, 5]))
    assert mask.tolist() == [False, False, False, True, True, True]


@pytest.mark.parametrize("fanout", FANOUTS)
def test_no_float32_drift_after_2e4_batched_writes(fanout):
    """2·10^4 batched writes (3.2·10^5 leaf updates, 320 per leaf) with duplicates and zeros: root
    equals Σ leaves within 1e-5 rel. An incrementally updated root (each add rounded at the root's
    magnitude) would random-walk by ≈ √(3.2·10^5)·u ≈ 3e-5 relative: the bound tells the two apart.

    Every step also samples; no sample may land on a zero-mass leaf.
    """
    capacity, batch, steps = 1000, 16, 20_000

    def step(carry, key):
        tree, bad_samples = carry
        k_idx, k_val, k_zero, k_sample = jax.random.split(key, 4)
        idx = jax.random.randint(k_idx, (batch,), 0, 40)  # many duplicates
        idx = jnp.where(jnp.arange(batch) % 2 == 0, idx,
                        jax.random.randint(k_idx, (batch,), 0, capacity))
        vals = jax.random.uniform(k_val, (batch,)) * 10.0 ** jax.random.uniform(
            k_zero, (batch,), minval=-3, maxval=3)
        vals = jnp.where(jax.random.bernoulli(k_zero, 0.2, (batch,)), 0.0, vals)
        tree = segment_tree.write(tree, idx, jnp.stack([vals, vals], -1))
        root = segment_tree.total(tree)[0]
        targets = segment_tree.stratified_targets(k_sample, root, 32)
        leaf = segment_tree.sample(tree, targets)
        hit_zero = jnp.sum(segment_tree.leaf_values(tree, leaf)[:, 0] <= 0)
        return (tree, bad_samples + jnp.where(root > 0, hit_zero, 0)), None

    @jax.jit  # the initial build inside the program: one compile instead of its ops one by one
    def run(keys):
        init = segment_tree.build(jnp.ones((capacity, 2), jnp.float32), ("sum", "min"), fanout)
        return jax.lax.scan(step, (init, 0), keys)[0]

    tree, bad_samples = run(jax.random.split(jax.random.key(0), steps))
    leaves = np.asarray(segment_tree.leaves(tree), np.float64)
    root, root_min = np.asarray(segment_tree.total(tree))
    # the root is a pairwise float32 sum of 1000 non-negative leaves: ≤ 14 roundings deep (K = 128),
    # ≲ 14 u ≈ 8e-7 relative, 12× inside 1e-5; the min is exact
    assert abs(root - leaves[:, 0].sum()) <= 1e-5 * leaves[:, 0].sum()
    assert root_min == leaves[:, 1].min()
    # Every internal node equals the reduction of its children exactly (no accumulated deltas).
    for column, reduction in enumerate(("sum", "min")):
        np.testing.assert_array_equal(
            np.asarray(tree.nodes[:, column : column + 1]),
            numpy_tree(leaves[:, column].astype(np.float32), reduction, fanout),
        )
    assert int(bad_samples) == 0


@given(
    st.lists(st.integers(0, 9), min_size=1, max_size=12),
    st.data(),
    st.booleans(),
)
def test_last_write_wins_matches_sequential_reference(indices, data, presort):
    """Both the packed-key sort and the argsort path keep exactly the last unmasked write."""
    if presort:
        indices = sorted(indices)
    mask = data.draw(st.lists(st.booleans(), min_size=len(indices), max_size=len(indices)))
    winner = {}
    for position, (i, m) in enumerate(zip(indices, mask)):
        if m:
            winner[i] = position
    expected = [winner.get(i) == p for p, i in enumerate(indices)]
    for bound in (None, 10):
        got = _last_write_wins(jnp.asarray(indices), jnp.asarray(mask), index_bound=bound)
        assert np.asarray(got).tolist() == expected
        if all(mask):
            unmasked = _last_write_wins(jnp.asarray(indices), index_bound=bound)
            assert np.asarray(unmasked).tolist() == expected
