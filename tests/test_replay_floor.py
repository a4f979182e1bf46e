"""The decayed-priority floor of the FreshPER buffer (``ReplayConfig.min_decayed_priority``) and
the ``|advantage|`` priority, against eager NumPy formulas."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fresh_rl.replay import ReplayConfig, advantage_priority, make_trajectory_buffer

CAPACITY, BATCH, SAMPLE = 16, 4, 8
ALPHA, BETA = 0.6, 0.4


def _buffer(floor, normalization="buffer"):
    config = ReplayConfig(capacity=CAPACITY, sample_batch_size=SAMPLE, sampling="freshper",
                          priority_exponent=ALPHA, importance_exponent=BETA, age_decay_tau=10.0,
                          new_item_priority="given", min_decayed_priority=floor,
                          importance_weight_normalization=normalization, rebase_exponent=5.0)
    return make_trajectory_buffer(config)


@pytest.fixture(scope="module", params=[(1e-8, "buffer"), (1e-3, "batch")])
def programs(request):
    floor, normalization = request.param
    buffer = _buffer(floor, normalization)

    @jax.jit
    def run(tau, versions, priorities, update_priorities, key):
        """Four adds (versions[j], priorities[j]), τ set first, then one priority rewrite of
        slots 0..3; returns the state's probabilities and one sample."""
        state = buffer.set_age_decay_tau(buffer.init({"x": jnp.zeros(())}), tau)
        state = jax.lax.scan(
            lambda s, vp: (buffer.add(s, {"x": jnp.zeros((BATCH,))}, vp[0], vp[1]), None),
            state, (versions, priorities))[0]
        state = buffer.set_priorities(state, jnp.arange(BATCH), update_priorities)
        return state, buffer.sampling_probabilities(state), buffer.sample(state, key)

    return floor, normalization, run


def _eager(floor, tau, base, version, now):
    decayed = base * np.exp(-(now - version) / tau)
    q = np.where(base > 0, np.maximum(decayed, floor) if floor > 0 else decayed, 0.0) ** ALPHA
    q = np.where(base > 0, q, 0.0)
    return q / q.sum()


@settings(max_examples=10)
@given(tau=st.floats(0.5, 50.0), steps=st.lists(st.integers(0, 400), min_size=4, max_size=4),
       priorities=st.lists(st.floats(1e-4, 10.0), min_size=16, max_size=16),
       updates=st.lists(st.sampled_from([0.0, 1e-6, 0.5, 3.0]), min_size=4, max_size=4),
       seed=st.integers(0, 1000))
def test_floor_probabilities_and_weights_match_eager_formula(programs, tau, steps, priorities,
                                                             updates, seed):
    """P(i) ∝ max(p_i e^{−age/τ}, f)^α (0 for p_i = 0) and w_i = (N P_i)^{−β}/max_j, after adds
    that push items below the floor, a rebase and priority rewrites (zero included)."""
    floor, normalization, run = programs
    versions = np.cumsum(steps).astype(np.int32)
    state, probs, sample = run(jnp.float32(tau), jnp.asarray(versions),
                               jnp.asarray(priorities, jnp.float32).reshape(4, BATCH),
                               jnp.asarray(updates, jnp.float32), jax.random.key(seed))
    base = np.asarray(state.base_priority, np.float64)
    version = np.asarray(state.insert_version, np.float64)
    eager = _eager(floor, tau, base, version, versions[-1])
    # float32 log keys and log F of |x| ≲ 17 (α ln f ≥ −11, rebase at 5) with τ rounded to float32:
    # ≲ 50 u each, ≲ 100 u ≈ 6e-6 per probability, rtol 2e-4 (the floor is continuous at F)
    np.testing.assert_allclose(np.asarray(probs), eager, rtol=2e-4, atol=1e-9)
    idx = np.asarray(sample.indices)
    assert np.all(eager[idx] > 0), "never samples a zero-priority slot"
    np.testing.assert_allclose(np.asarray(sample.probabilities), eager[idx], rtol=2e-4, atol=1e-9)
    w = (CAPACITY * np.where(eager > 0, eager, 1.0)) ** -BETA
    norm = w[eager > 0].max() if normalization == "buffer" else w[idx].max()
    # log-key differences ≲ 100 u abs, × β, through exp: ≲ 3e-6 relative, rtol 5e-4
    np.testing.assert_allclose(np.asarray(sample.importance_weights), w[idx] / norm, rtol=5e-4)


@functools.cache
def _stale_weights(floor):
    buffer = _buffer(floor)

    @jax.jit
    def weights(age, tau):
        state = buffer.set_age_decay_tau(buffer.init({"x": jnp.zeros(())}), tau)
        state = buffer.add(state, {"x": jnp.zeros((1,))}, 0, jnp.ones(1))
        state = buffer.add(state, {"x": jnp.zeros((SAMPLE,))}, age, jnp.ones(SAMPLE))
        return buffer.sample(state, jax.random.key(0)).importance_weights

    return weights


@settings(max_examples=10)
@given(age=st.integers(2_000, 10_000_000), tau=st.floats(1.0, 1000.0))
def test_one_stale_item_cannot_zero_the_weights(age, tau):
    """One item of age ≫ τ: without the floor every sampled weight of the fresh items underflows
    to exactly 0 once age/τ is large; with the floor each is at least (f/p_max)^(αβ)."""
    results = {floor: np.asarray(_stale_weights(floor)(age, jnp.float32(tau)))
               for floor in (0.0, 1e-8)}
    # w = exp(β·α ln f) with the exponent ≈ −4.4 rounded in float32 (≲ 1e-6 abs): ≲ 1e-6 relative < 1e-5
    assert np.all(results[1e-8] >= (1e-8) ** (ALPHA * BETA) * (1 - 1e-5))
    assert np.all(results[1e-8] > 0)
    if ALPHA * BETA * age / tau > 120:  # exp(−x) underflows float32 below ~e^−104
        assert np.all(results[0.0] == 0.0)


def test_floor_is_validated():
    with pytest.raises(ValueError, match=r"min_decayed_priority must be in \[0"):
        ReplayConfig(capacity=4, sample_batch_size=2, min_decayed_priority=-1.0)
    with pytest.raises(ValueError, match="min_decayed_priority"):
        ReplayConfig(capacity=4, sample_batch_size=2, min_decayed_priority=math.nan)


@settings(max_examples=20)
@given(returns=st.lists(st.floats(-5, 5), min_size=1, max_size=8), baseline=st.floats(-2, 2),
       scale=st.one_of(st.none(), st.floats(0.0, 3.0)))
def test_advantage_priority_matches_numpy(returns, baseline, scale):
    r = np.asarray(returns, np.float32)
    b = np.full_like(r, baseline)
    s = None if scale is None else np.full_like(r, scale)
    got = np.asarray(advantage_priority(r, b, s))
    want = np.abs(r - b) / (1.0 if s is None else s + 1e-6) + 1e-6
    # the same ≤ 4 correctly rounded float32 ops on both sides (NumPy stays in float32): ≲ 4 u apart;
    # atol covers XLA's flush of a subnormal r − b to 0 (|Δ| ≤ 1e-38/1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
