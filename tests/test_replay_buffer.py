"""Trajectory buffer: distributions vs an eager NumPy reference, FreshPER exactness, FIFO,
validation, and jit / vmap / donation."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.experimental import checkify
from scipy import stats

from fresh_rl.replay import (
    ReplayConfig,
    magnitude_priority,
    make_trajectory_buffer,
    segment_tree,
)

T = 3  # trajectory length of the toy items


def example_item():
    return {"obs": jnp.zeros((T, 2), jnp.float32), "reward": jnp.zeros((), jnp.float32)}


def make_batch(batch, value):
    return {
        "obs": jnp.full((batch, T, 2), value, jnp.float32),
        "reward": jnp.arange(batch, dtype=jnp.float32) + value,
    }


class EagerReference:
    """Plain NumPy FreshPER the authors' way: recompute every decayed priority from scratch,
    floored at ``min_decayed_priority``."""

    def __init__(self, config: ReplayConfig):
        self.c = config
        self.priority = np.zeros(config.capacity)
        self.version = np.zeros(config.capacity, np.int64)
        self.valid = np.zeros(config.capacity, bool)
        self.pos = 0
        self.max_priority = 1.0

    def add(self, batch, version, priorities=None):
        for j in range(batch):
            self.priority[self.pos] = (
                self.max_priority if priorities is None else priorities[j]
            )
            self.version[self.pos] = version
            self.valid[self.pos] = True
            self.pos = (self.pos + 1) % self.c.capacity
        if priorities is not None:
            self.max_priority = max(self.max_priority, float(np.max(priorities)))

    def set_priorities(self, indices, priorities):
        for i, p in zip(indices, priorities):  # sequential: the last write wins
            self.priority[i] = p
        self.max_priority = max(self.max_priority, float(np.max(priorities)))

    def probabilities(self, now):
        if self.c.sampling == "uniform":
            return self.valid / self.valid.sum()
        decay = np.exp(-(now - self.version) / self.c.age_decay_tau) if self.c.sampling == "freshper" else 1.0
        # the floor applies to every positive priority; zero priority is never sampled
        positive = self.priority.astype(np.float32) > 0  # what the float32 buffer stores
        decayed = np.where(positive, np.maximum(self.priority * decay, self.c.min_decayed_priority), 0.0)
        leaf = np.where(self.valid, decayed ** self.c.priority_exponent, 0.0)
        return leaf / leaf.sum()

    def weights(self, indices, now, beta):
        probs = self.probabilities(now)
        n = self.valid.sum()
        w = (n * probs) ** (-beta)
        sampleable = self.valid & (probs > 0)
        return w[indices] / np.max(w[sampleable])


def _jitted(buffer):
    return (
        jax.jit(buffer.add),
        jax.jit(buffer.set_priorities),
        jax.jit(jax.vmap(buffer.sample, in_axes=(None, 0))),
    )


MODES = {
    "uniform": ReplayConfig(capacity=24, sample_batch_size=8, sampling="uniform"),
    "per": ReplayConfig(capacity=24, sample_batch_size=8, sampling="per", priority_exponent=0.7),
    # τ small and a low rebase threshold so that the sequence below rebases several times.
    "freshper": ReplayConfig(
        capacity=24, sample_batch_size=8, sampling="freshper", priority_exponent=0.6,
        age_decay_tau=3.0, rebase_exponent=1.0,
    ),
}
FANOUTS = (2, 16, 128)  # binary, mid-width, the widest (the default K is 8)
DEFAULT_K = segment_tree.DEFAULT_FANOUT


@pytest.mark.parametrize(
    "mode, fanout",
    [(mode, DEFAULT_K) for mode in MODES]
    + [("per", 2), ("freshper", 2), ("freshper", 16), ("freshper", 128)],
)
def test_sampling_distribution_matches_numpy_reference(mode, fanout):
    """Chi-square of 16,000 draws against the eager NumPy probabilities, after adds,
    FIFO evictions, duplicate priority updates and (FreshPER) rebases."""
    config = ReplayConfig(**{**MODES[mode].__dict__, "tree_fanout": fanout})
    buffer = make_trajectory_buffer(config)
    add, set_priorities, sample_many = _jitted(buffer)
    reference = EagerReference(config)
    rng = np.random.default_rng(42)
    state = buffer.init(example_item())
    rebases = 0
    for version in range(12):  # 12 adds of 5 into 24 slots: 2.5 buffer turnovers
        state = add(state, make_batch(5, version), version, None)
        reference.add(5, version)
        if version >= 2:
            idx = rng.integers(0, min(reference.valid.sum(), 24), 10)
            idx[-1] = idx[0]  # a duplicate: the later write must win
            pri = rng.uniform(0.01, 4.0, 10).astype(np.float32)
            state = set_priorities(state, jnp.asarray(idx), jnp.asarray(pri))
            reference.set_priorities(idx, pri)
        rebases += int(state.reference_version) != 0 and version == int(state.reference_version)
    now = 11
    expected = reference.probabilities(now)
    # float32 keys exp(α log p + (α/τ)Δt), |exponent| ≲ 3: ≲ 10 u; a pairwise sum of ≤ 24 positive
    # leaves ≲ 5 u; one division: ≲ 1e-6 relative, rtol 2e-5 leaves 20×; atol only for the exact zeros
    np.testing.assert_allclose(
        np.asarray(buffer.sampling_probabilities(state)), expected, rtol=2e-5, atol=1e-7
    )
    if mode == "freshper":
        assert int(state.reference_version) > 0, "the sequence was meant to trigger a rebase"

    keys = jax.random.split(jax.random.key(7), 2000)
    samples = sample_many(state, keys)
    counts = np.bincount(np.asarray(samples.indices).ravel(), minlength=config.capacity)
    assert counts[expected == 0].sum() == 0
    support = expected > 0
    chi2 = stats.chisquare(counts[support], expected[support] * counts.sum())
    # fixed key: under a correct sampler p ~ U(0, 1), so 1e-3 is a 0.1% false alarm; rounding moves
    # only draws within a few ulp of a boundary (≈ 1e-6 of them), not the statistic
    assert chi2.pvalue > 1e-3, (chi2, counts, expected)

    # Reported probabilities, ages and weights of the sampled rows equal the reference.
    first = jax.tree.map(lambda x: x[0], samples)
    idx = np.asarray(first.indices)
    np.testing.assert_allclose(np.asarray(first.probabilities), expected[idx], rtol=2e-5)  # as above
    np.testing.assert_array_equal(np.asarray(first.age), now - reference.version[idx])  # integers
    # w = exp(−β(log u_i − log u_min)) with |log u| ≲ 3 stored directly: ≲ 10 u relative, rtol 2e-5
    np.testing.assert_allclose(
        np.asarray(first.importance_weights),
        reference.weights(idx, now, config.importance_exponent) if mode != "uniform" else 1.0,
        rtol=2e-5,
    )
    # Stored experience comes back with the item (a gather of stored floats: exact).
    np.testing.assert_array_equal(
        np.asarray(first.experience["obs"][:, 0, 0]), reference.version[idx].astype(np.float32)
    )


@pytest.mark.parametrize(
    "fanout", [DEFAULT_K] + [pytest.param(k, marks=pytest.mark.slow) for k in FANOUTS]
)
def test_freshper_equals_eager_formula_over_1e5_versions(fanout):
    """Probabilities and IS weights equal the normalised eager (p·exp(−age/τ))^α over 10^5
    versions of simulated time with FIFO turnover, priority updates and rebases."""
    config = ReplayConfig(capacity=64, sample_batch_size=16, sampling="freshper",
                          priority_exponent=0.6, importance_exponent=0.5, age_decay_tau=500.0,
                          tree_fanout=fanout)
    buffer = make_trajectory_buffer(config)
    add_every, versions_per_chunk, total_versions = 50, 5000, 100_000

    @jax.jit
    def advance(state, key, start_version):
        """Adds 2 items every 50 versions and updates 4 priorities; 5000 versions per call."""

        def step(state, inputs):
            key, version = inputs
            k_pri, k_idx, k_upd = jax.random.split(key, 3)
            pri = jax.random.uniform(k_pri, (2,), minval=0.1, maxval=3.0)
            state = buffer.add(state, make_batch(2, 0.0), version, pri)
            idx = jax.random.randint(k_idx, (4,), 0, jnp.maximum(state.num_valid, 1))
            upd = jax.random.uniform(k_upd, (4,), minval=0.01, maxval=5.0)
            return buffer.set_priorities(state, idx, upd), None

        versions = start_version + add_every * jnp.arange(versions_per_chunk // add_every)
        keys = jax.random.split(key, versions.shape[0])
        return jax.lax.scan(step, state, (keys, versions))[0]

    given_config = ReplayConfig(**{**config.__dict__, "new_item_priority": "given"})
    buffer = make_trajectory_buffer(given_config)
    sample = jax.jit(buffer.sample)
    state = buffer.init(example_item())
    key = jax.random.key(3)
    rebased_at = set()
    for chunk in range(total_versions // versions_per_chunk):
        key, k_adv, k_sample = jax.random.split(key, 3)
        state = advance(state, k_adv, chunk * versions_per_chunk)
        rebased_at.add(int(state.reference_version))
        now = int(state.latest_version)
        valid = np.asarray(state.valid)
        age = now - np.asarray(state.insert_version, np.float64)
        base = np.asarray(state.base_priority, np.float64)
        eager = np.where(valid, (base * np.exp(-age / config.age_decay_tau)) ** 0.6, 0.0)
        eager_p = eager / eager.sum()
        # exponents up to rebase_exponent = 30 in float32: (α/τ)·Δt rounds by ≲ 2 u·30 ≈ 4e-6 (plus
        # exp, log and a 64-leaf sum, ≲ 10 u): ≲ 6e-6 relative, rtol 1e-4; no slot is empty or floored
        np.testing.assert_allclose(
            np.asarray(buffer.sampling_probabilities(state)), eager_p, rtol=1e-4, atol=1e-9
        )
        s = sample(state, k_sample)
        idx = np.asarray(s.indices)
        n = valid.sum()
        w = (n * eager_p) ** -0.5
        expected_w = w[idx] / w[valid & (eager_p > 0)].max()
        # log-key differences carry ≲ 2·4e-6 (as above), × β = 0.5, through exp: ≲ 5e-6, rtol 1e-4
        np.testing.assert_allclose(np.asarray(s.importance_weights), expected_w, rtol=1e-4)
    assert now >= total_versions - add_every
    assert len(rebased_at) > 3, "t_ref must have been rebased several times"


def test_per_is_freshper_without_decay_and_uniform_ignores_priorities():
    per = make_trajectory_buffer(ReplayConfig(capacity=8, sample_batch_size=2, sampling="per"))
    state = per.init(example_item())
    state = per.add(state, make_batch(4, 0.0), 0)
    state = per.add(state, make_batch(4, 0.0), 1000)  # age is irrelevant without decay
    state = per.set_priorities(state, jnp.arange(8), jnp.arange(1.0, 9.0))
    expected = np.arange(1.0, 9.0) ** 0.6
    # keys exp(α log p), |log p| ≤ 2.1: log's ulp (4 u) ×α, α's float32 rounding and exp: ≲ 9 u each;
    # root and division ≲ 4 u: ≲ 22 u ≈ 1.3e-6 worst case (the old 1e-6 was below it): rtol 5e-6
    np.testing.assert_allclose(per.sampling_probabilities(state), expected / expected.sum(), rtol=5e-6)


def test_new_items_get_running_max_priority():
    buffer = make_trajectory_buffer(ReplayConfig(capacity=8, sample_batch_size=2, sampling="per",
                                                 priority_exponent=1.0))
    state = buffer.add(buffer.init(example_item()), make_batch(2, 0.0), 0)
    assert np.allclose(state.base_priority[:2], 1.0)  # initial max priority is 1 (copied: exact)
    state = buffer.set_priorities(state, jnp.array([0, 1]), jnp.array([5.0, 0.5]))
    state = buffer.add(state, make_batch(2, 0.0), 1)
    np.testing.assert_allclose(state.base_priority[:4], [5.0, 0.5, 5.0, 5.0])  # copies: exact
    given = make_trajectory_buffer(ReplayConfig(capacity=8, sample_batch_size=2, sampling="per",
                                                new_item_priority="given"))
    state = given.add(given.init(example_item()), make_batch(2, 0.0), 0, jnp.array([0.3, 0.7]))
    # stored as float32(0.3), float32(0.7): < u ≈ 6e-8 from 0.3, 0.7, within the default rtol 1e-7
    np.testing.assert_allclose(state.base_priority[:2], [0.3, 0.7])
    with pytest.raises(ValueError, match="priorities are required"):
        given.add(state, make_batch(2, 0.0), 0)


def test_fifo_eviction_keeps_the_newest_items():
    buffer = make_trajectory_buffer(ReplayConfig(capacity=5, sample_batch_size=1, sampling="uniform"))
    state = buffer.init(example_item())
    for version in range(4):
        state = buffer.add(state, make_batch(2, float(version)), version)
    assert int(state.num_valid) == 5 and int(state.write_position) == 3
    # 8 items into 5 slots, in order: v0→0,1  v1→2,3  v2→4,0  v3→1,2 (the 3 oldest evicted).
    np.testing.assert_array_equal(state.insert_version, [2, 3, 3, 1, 2])
    np.testing.assert_array_equal(state.experience["obs"][:, 0, 0], [2, 3, 3, 1, 2])


@pytest.mark.parametrize(
    "mode, fanout", [("uniform", DEFAULT_K), ("per", DEFAULT_K), ("freshper", DEFAULT_K)]
    + [("freshper", k) for k in FANOUTS]
)
def test_never_samples_unwritten_or_zero_priority_slots(mode, fanout):
    config = ReplayConfig(capacity=1000, sample_batch_size=64, sampling=mode, age_decay_tau=1.0,
                          tree_fanout=fanout)
    buffer = make_trajectory_buffer(config)

    @jax.jit  # the same jitted add, set_priorities and sample calls as one program: one compile, not four
    def sampled_indices(keys):
        state = buffer.add(buffer.init(example_item()), make_batch(70, 0.0), 0, None)
        state = buffer.add(state, make_batch(30, 1.0), 40, None)  # 100 of 1000 slots written
        # Zero out most priorities; the survivors (95..99) include old ones, decayed 40 versions.
        state = buffer.set_priorities(state, jnp.arange(95), jnp.zeros(95))
        return jax.vmap(buffer.sample, in_axes=(None, 0))(state, keys).indices

    indices = np.asarray(sampled_indices(jax.random.split(jax.random.key(0), 500)))
    if mode == "uniform":
        assert indices.max() < 100
    else:
        assert set(np.unique(indices)) <= set(range(95, 100))


@pytest.mark.parametrize("fanout", FANOUTS)
@pytest.mark.parametrize("normalization", ["buffer", "batch"])
def test_importance_weight_normalisation(normalization, fanout):
    config = ReplayConfig(capacity=6, sample_batch_size=4, sampling="per", priority_exponent=1.0,
                          importance_exponent=1.0, importance_weight_normalization=normalization,
                          tree_fanout=fanout)
    buffer = make_trajectory_buffer(config)
    state = buffer.add(buffer.init(example_item()), make_batch(6, 0.0), 0)
    state = buffer.set_priorities(state, jnp.arange(6), jnp.array([1.0, 2.0, 3.0, 4.0, 5.0, 0.0]))
    s = buffer.sample(state, jax.random.key(1), importance_exponent=0.5)
    p = np.array([1.0, 2, 3, 4, 5, 0]) / 15
    w = (6 * p[np.asarray(s.indices)]) ** -0.5
    # The zero-priority slot is never sampled and never sets the normaliser.
    expected = w / ((6 * p[0]) ** -0.5 if normalization == "buffer" else w.max())
    # exp(−0.5(log u_i − log u_min)), |log u| ≤ log 5: ≲ 5 u; "batch" re-takes log(exp(·)): ≲ 8 u ≈ 5e-7
    np.testing.assert_allclose(s.importance_weights, expected, rtol=1e-6)


@pytest.mark.parametrize("fanout", FANOUTS)
def test_rebase_preserves_probabilities(fanout):
    config = ReplayConfig(capacity=16, sample_batch_size=4, age_decay_tau=10.0,
                          tree_fanout=fanout)
    buffer = make_trajectory_buffer(config)
    state = buffer.init(example_item())
    for v in range(0, 80, 10):
        state = buffer.add(state, make_batch(2, 0.0), v)
    before = np.asarray(buffer.sampling_probabilities(state))
    after = np.asarray(buffer.sampling_probabilities(buffer.rebase(state, 70)))
    # keys recomputed with exponents |α Δt/τ| ≤ 4.2 on each side: ≲ 15 u each, ≲ 2e-6 apart; rtol 1e-5
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# Validation


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("age_decay_tau", 0.0, r"age_decay_tau must be in \(0"),
        ("age_decay_tau", -5.0, r"age_decay_tau must be in \(0"),
        ("priority_exponent", 1.5, r"priority_exponent must be in \[0.0, 1.0\]"),
        ("priority_exponent", -0.1, r"priority_exponent must be in \[0.0, 1.0\]"),
        ("importance_exponent", 2.0, r"importance_exponent must be in \[0.0, 1.0\]"),
        ("capacity", 0, r"capacity must be in \[1, inf\], got 0"),
        ("capacity", -3, r"capacity must be in \[1, inf\], got -3"),
        ("capacity", True, r"capacity must be an integer in \[1, inf\], got True"),
        ("sample_batch_size", 100, r"sample_batch_size must be in \[1, 10\], got 100"),
        ("sampling", "lifo", "sampling must be one of"),
        ("rebase_exponent", 100.0, "rebase_exponent"),
        ("tree_fanout", 3, r"tree_fanout must be one of \(2, 4, 8, 16, 32, 64, 128\), got 3"),
        ("tree_fanout", 256, "tree_fanout must be one of"),
    ],
)
def test_bad_configuration_names_the_field(field, value, match):
    kwargs = {"capacity": 10, "sample_batch_size": 4, field: value}
    with pytest.raises(ValueError, match=match):
        ReplayConfig(**kwargs)


def _small_prioritized(**overrides):
    config = ReplayConfig(capacity=8, sample_batch_size=4, **overrides)
    buffer = make_trajectory_buffer(config)
    return buffer, buffer.add(buffer.init(example_item()), make_batch(6, 0.0), 0)


@pytest.mark.parametrize("bad", [np.nan, -1.0, np.inf])
def test_bad_priority_raises_eagerly(bad):
    buffer, state = _small_prioritized()
    with pytest.raises(ValueError, match="priorities must be finite and >= 0"):
        buffer.set_priorities(state, jnp.array([0, 1]), jnp.array([1.0, bad]))


def test_bad_index_and_oversized_sample_raise_eagerly():
    buffer, state = _small_prioritized()
    with pytest.raises(ValueError, match=r"indices must be in \[0, capacity=8\)"):
        buffer.set_priorities(state, jnp.array([7]), jnp.array([1.0]))  # slot 7 is empty
    with pytest.raises(ValueError, match=r"indices must be in \[0, capacity=8\)"):
        buffer.set_priorities(state, jnp.array([8]), jnp.array([1.0]))
    small = make_trajectory_buffer(ReplayConfig(capacity=8, sample_batch_size=8))
    partial = small.add(small.init(example_item()), make_batch(3, 0.0), 0)
    with pytest.raises(ValueError, match="sample_batch_size=8 must be <= the number of valid"):
        small.sample(partial, jax.random.key(0))
    with pytest.raises(ValueError, match=r"importance_exponent must be in \[0.0, 1.0\]"):
        buffer.sample(state, jax.random.key(0), importance_exponent=1.5)


def test_empty_add_batch_names_the_argument():
    buffer, state = _small_prioritized()
    with pytest.raises(ValueError, match=r"add: trajectories must hold a batch of size in "
                                         r"\[1, capacity=8\].*got 0"):
        buffer.add(state, make_batch(0, 0.0), 0)
    with pytest.raises(ValueError, match="add: trajectories"):
        jax.jit(buffer.add)(state, make_batch(0, 0.0), 0)
    with pytest.raises(ValueError, match=r"capacity=8\].*got 9"):
        buffer.add(state, make_batch(9, 0.0), 0)


def test_jit_fallback_skips_bad_writes_and_masks_unsatisfiable_samples():
    buffer, state = _small_prioritized()
    before = np.asarray(buffer.sampling_probabilities(state))
    state = jax.jit(buffer.set_priorities)(
        state, jnp.array([0, 1, 9, 7]), jnp.array([np.nan, -2.0, 1.0, 1.0])
    )
    # exact: every write is rejected, the leaves are untouched and the parents are re-derived by
    # the same IEEE pairwise adds (no multiply, no reassociation), so the root is the same float
    np.testing.assert_array_equal(buffer.sampling_probabilities(state), before)
    assert int(state.num_rejected_writes) == 4
    big = make_trajectory_buffer(ReplayConfig(capacity=8, sample_batch_size=8))
    partial = big.add(big.init(example_item()), make_batch(3, 0.0), 0)
    s = jax.jit(big.sample)(partial, jax.random.key(0))
    assert not np.any(s.mask) and np.all(np.asarray(s.importance_weights) == 0)


@pytest.mark.parametrize("mode", ["per", "freshper"])
def test_all_zero_priorities_sample_nothing(mode):
    """No positive priority: eager sample raises; jitted, every row is masked with finite zero
    probabilities and weights (exact zeros: ``where`` selects the constant 0)."""
    buffer = make_trajectory_buffer(ReplayConfig(capacity=8, sample_batch_size=4, sampling=mode,
                                                 new_item_priority="given"))
    state = buffer.add(buffer.init(example_item()), make_batch(6, 0.0), 0, jnp.zeros(6))
    with pytest.raises(ValueError, match="sample: no stored item has a positive priority"):
        buffer.sample(state, jax.random.key(0))
    s = jax.jit(buffer.sample)(state, jax.random.key(0))
    assert not np.any(s.mask)
    np.testing.assert_array_equal(s.importance_weights, 0.0)
    np.testing.assert_array_equal(s.probabilities, 0.0)


def test_integer_fields_take_numpy_and_jax_integers():
    """Stored as Python ints (the config is a static jit argument: hashable, equal to the
    Python-int config)."""
    config = ReplayConfig(capacity=np.int64(8), sample_batch_size=jnp.int32(4))
    assert config == ReplayConfig(capacity=8, sample_batch_size=4)
    assert type(config.capacity) is int and type(config.sample_batch_size) is int
    buffer = make_trajectory_buffer(config)
    state = buffer.add(buffer.init(example_item()), make_batch(2, 0.0), np.int64(3))
    assert int(state.latest_version) == 3


def test_jit_checks_raise_through_checkify():
    buffer, state = _small_prioritized(jit_checks=True)
    checked = jax.jit(checkify.checkify(buffer.set_priorities))
    err, _ = checked(state, jnp.array([0]), jnp.array([np.nan]))
    with pytest.raises(Exception, match="priorities must be finite and >= 0"):
        err.throw()
    err, _ = checked(state, jnp.array([0]), jnp.array([2.0]))
    err.throw()  # no error on good input


# ---------------------------------------------------------------------------------------------
# Transformations


def test_vmap_over_independent_buffers_matches_a_loop():
    config = ReplayConfig(capacity=16, sample_batch_size=4, age_decay_tau=5.0)
    buffer = make_trajectory_buffer(config)
    seeds = 3

    def run(key):
        def step(v, carry):  # versions 0..4; a loop body compiled once instead of unrolled 5 times
            state, key = carry
            key, k = jax.random.split(key)
            state = buffer.add(state, make_batch(3, v.astype(jnp.float32)), v)
            s = buffer.sample(state, k)
            return buffer.set_priorities(state, s.indices, jax.random.uniform(k, (4,)) + 0.1), key

        state, key = jax.lax.fori_loop(0, 5, step, (buffer.init(example_item()), key))
        return state, buffer.sample(state, key)

    keys = jax.random.split(jax.random.key(0), seeds)
    batched_state, batched_sample = jax.jit(jax.vmap(run))(keys)
    for i in range(seeds):
        state_i, sample_i = jax.jit(run)(keys[i])
        # two XLA programs: log/exp may differ by ≤ 2 ulp each (vector vs scalar code, FMA), ≲ 9 u per
        # key, ≲ 20 u ≈ 1.2e-6 per probability (the old 1e-6 was below it): rtol 5e-6
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a[i], b, rtol=5e-6),
                     (batched_state, batched_sample), (state_i, sample_i))


def test_donated_state_gives_the_same_result():
    config = ReplayConfig(capacity=32, sample_batch_size=4)
    buffer = make_trajectory_buffer(config)

    def step(state, key, version):
        state = buffer.add(state, make_batch(4, 1.0), version)
        s = buffer.sample(state, key)
        return buffer.set_priorities(state, s.indices, s.probabilities + 0.5)

    donated = jax.jit(step, donate_argnums=0)
    plain = jax.jit(step)
    a = buffer.init(example_item())
    b = buffer.init(example_item())
    for v in range(6):
        key = jax.random.key(v)
        a = donated(a, key, v)
        b = plain(b, key, v)
    # exact: donation only adds an input-output alias to the same HLO (buffer reuse, no arithmetic)
    jax.tree.map(np.testing.assert_array_equal, a, b)


# ---------------------------------------------------------------------------------------------
# Base priorities


@given(
    st.lists(st.floats(-100, 100, width=32), min_size=8, max_size=8),
    st.lists(st.booleans(), min_size=8, max_size=8),
    st.sampled_from(["mean", "max", "sum"]),
)
def test_magnitude_priority_matches_numpy(values, mask, reduction):
    v = np.asarray(values, np.float32).reshape(2, 4)
    m = np.asarray(mask).reshape(2, 4)
    got = np.asarray(magnitude_priority(v, m, reduction=reduction, eps=1e-6))
    mags = [np.abs(row[mr]) for row, mr in zip(v, m)]
    ref = {
        "mean": [x.mean() if x.size else 0.0 for x in mags],
        "max": [x.max() if x.size else 0.0 for x in mags],
        "sum": [x.sum() for x in mags],
    }[reduction]
    # float32 sums/means of ≤ 4 magnitudes in either order: ≲ 4 u each side, ≲ 5e-7; rtol 1e-5
    np.testing.assert_allclose(got, np.asarray(ref) + 1e-6, rtol=1e-5)
    # |v| + ε: one correctly rounded float32 add on both sides (NEP 50): equal; default rtol 1e-7
    np.testing.assert_allclose(magnitude_priority(v[:, 0]), np.abs(v[:, 0]) + 1e-6)
    assert np.all(got > 0)


def test_magnitude_priority_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"eps must be in \(0, inf\)"):
        magnitude_priority(jnp.ones(3), eps=0.0)
    with pytest.raises(ValueError, match="reduction must be"):
        magnitude_priority(jnp.ones((2, 3)), reduction="median")


# ---------------------------------------------------------------------------------------------
# Online τ (set_age_decay_tau)


@functools.cache
def _filled_buffer(config: ReplayConfig):
    """``(buffer, fill)``: ``fill(priorities)`` is ``buffer.init``, 8 items added in 4 batches at
    versions 0, 3, 6, 9, then ``priorities`` set; jitted once per config and reused across examples.

    The empty state is made outside the jitted part and passed in: a buffer's τ is then an input of
    the program (the state's decay rate), not a constant in it, so the buffers of the drawn τs lower
    to the same program and the session's persistent compilation cache (tests/conftest.py) compiles
    it once instead of once per example (each example is still traced with its own buffer)."""
    buffer = make_trajectory_buffer(config)

    @jax.jit
    def fill_from(state, priorities):
        for v in range(4):
            state = buffer.add(state, make_batch(2, float(v)), 3 * v)
        return buffer.set_priorities(state, jnp.arange(8), priorities)

    return buffer, lambda priorities: fill_from(buffer.init(example_item()), priorities)


@settings(max_examples=8)
# priorities 0 (never sampled) or ≥ 1e-6: below that float32 rounds or flushes them to 0, which
# is the floor's business (tests/test_replay_floor.py), not τ switching's
@given(st.floats(0.5, 200.0), st.lists(st.one_of(st.just(0.0), st.floats(1e-6, 5.0)), min_size=8, max_size=8))
def test_set_age_decay_tau_equals_a_buffer_built_with_that_tau(tau, priorities):
    if not any(priorities):
        priorities[0] = 1.0
    priorities = jnp.asarray(priorities, jnp.float32)
    start, fill_start = _filled_buffer(ReplayConfig(capacity=8, sample_batch_size=2,
                                                    age_decay_tau=7.0))
    target, fill_target = _filled_buffer(ReplayConfig(capacity=8, sample_batch_size=2,
                                                      age_decay_tau=tau))
    switched = jax.jit(start.set_age_decay_tau)(fill_start(priorities), tau)  # traced τ
    reference = EagerReference(target.config)
    reference.add(8, 0)
    reference.version[:] = np.repeat(3 * np.arange(4), 2)
    reference.set_priorities(range(8), np.asarray(priorities))
    # float32 exponents |α ln p + (α/τ)Δt| ≲ 20 (α ln 1e-6 ≈ −8, α·9/τ ≤ 11): ≲ 40 u ≈ 2.4e-6 per side,
    # also for the τ = ∞ comparison below: rtol 2e-5; atol only for zero slots
    np.testing.assert_allclose(start.sampling_probabilities(switched),
                               reference.probabilities(now=9), rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(start.sampling_probabilities(switched),
                               target.sampling_probabilities(fill_target(priorities)), rtol=2e-5,
                               atol=1e-7)
    # τ = ∞ turns the decay off: standard PER
    per, fill_per = _filled_buffer(ReplayConfig(capacity=8, sample_batch_size=2, sampling="per"))
    np.testing.assert_allclose(
        start.sampling_probabilities(jax.jit(start.set_age_decay_tau)(fill_start(priorities), jnp.inf)),
        per.sampling_probabilities(fill_per(priorities)), rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("bad", [0.0, -5.0, np.nan, -np.inf])
def test_set_age_decay_tau_rejects_bad_tau(bad):
    """Concrete: ValueError naming the field and (0, inf]. Traced: checkify error with
    jit_checks, else the τ is skipped (probabilities unchanged) and counted."""
    buffer, state = _small_prioritized(age_decay_tau=5.0)
    state = buffer.add(state, make_batch(2, 1.0), 7)
    with pytest.raises(ValueError, match=r"age_decay_tau must be in \(0.0, inf\], got"):
        buffer.set_age_decay_tau(state, bad)
    before = np.asarray(buffer.sampling_probabilities(state))
    skipped = jax.jit(buffer.set_age_decay_tau)(state, bad)
    # the skip still rebases (keys exp(∓0.84) instead of exp(±0.84)): ≲ 10 u ≈ 6e-7 apart, rtol 1e-6
    np.testing.assert_allclose(buffer.sampling_probabilities(skipped), before, rtol=1e-6)
    assert int(skipped.num_rejected_writes) == 1
    checked_buffer, _ = _small_prioritized(age_decay_tau=5.0, jit_checks=True)
    checked = jax.jit(checkify.checkify(checked_buffer.set_age_decay_tau))
    err, _ = checked(state, bad)
    with pytest.raises(Exception, match=r"age_decay_tau must be in \(0, inf\]"):
        err.throw()
    err, _ = checked(state, jnp.inf)
    err.throw()  # ∞ is allowed: no decay


def test_set_age_decay_tau_rejects_non_freshper_buffers():
    per = make_trajectory_buffer(ReplayConfig(capacity=8, sample_batch_size=2, sampling="per"))
    with pytest.raises(ValueError, match="sampling='freshper'"):
        per.set_age_decay_tau(per.init(example_item()), 10.0)
