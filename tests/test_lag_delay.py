"""Delay samplers: empirical distributions vs exact pmfs (chi-square, fixed keys), never older
than the ring holds, config validation, actor groups, and lag-k acts with version t − k."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from fresh_rl.lag import DelayConfig, actor_group_ids, expected_lag, lag_pmf, sample_lags, version_ring

NUM_DRAWS = 20_000


@functools.partial(jax.jit, static_argnums=(1, 2))
def sample_jit(key, config, num_groups, available):
    return sample_lags(key, config, num_groups, available)


def reference_pmf(config, available=None):
    """Independent reference built from scipy's distributions (not from ``lag_pmf``)."""
    k = np.arange(config.ring_size)
    if config.kind == "fixed":
        pmf = stats.randint(config.lag, config.lag + 1).pmf(k)
    elif config.kind == "uniform":
        pmf = stats.randint(config.min_lag, config.max_lag + 1).pmf(k)
    else:  # geometric on {0, 1, …} with mean μ: success probability 1/(1 + μ); truncate
        p = 1.0 / (1.0 + config.mean_lag)
        pmf = stats.geom(p, loc=-1).pmf(k)
        pmf = pmf / stats.geom(p, loc=-1).cdf(config.ring_size - 1)
    if available is not None:  # clip: mass beyond the oldest held version lands on it
        top = min(available, config.ring_size) - 1
        pmf = np.concatenate([pmf[:top], [pmf[top:].sum()], np.zeros(config.ring_size - top - 1)])
    return pmf


CONFIGS = [
    DelayConfig.fixed(3, ring_size=6),
    DelayConfig.uniform(1, 4, ring_size=6),
    DelayConfig.uniform(0, 0, ring_size=1),
    DelayConfig.geometric(1.5, ring_size=6),
    DelayConfig.geometric(0.3, ring_size=4),
]


@pytest.mark.parametrize("available", [None, 3])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.kind}-K{c.ring_size}")
def test_empirical_distribution_matches_exact_pmf(config, available):
    expected = reference_pmf(config, available)
    # float64 (u ≈ 1.1e-16): ≲ a few dozen roundings ≲ 1e-14 relative; zeros exact on both sides
    np.testing.assert_allclose(lag_pmf(config, available), expected, rtol=1e-12, atol=1e-15)
    lags = np.asarray(sample_jit(jax.random.key(2024), config, NUM_DRAWS, available))
    counts = np.bincount(lags, minlength=config.ring_size)
    assert counts.shape == (config.ring_size,)  # nothing outside [0, K − 1]
    assert np.all(counts[expected == 0] == 0)
    support = expected > 0
    if support.sum() > 1:
        _, p_value = stats.chisquare(counts[support], NUM_DRAWS * expected[support])
        # fixed key: integer draws are exact; a float32 geometric draw moves only within ~1 ulp of a bin edge
        # (≈ 1e-7 a draw); p > 6e-5 is the 4σ two-sided normal tail (≥ 4 SE)
        assert p_value > 6e-5, (counts, NUM_DRAWS * expected)


def test_chi_square_detects_a_wrong_distribution():
    """Guard on the test's power: the uniform draws are rejected against the geometric pmf."""
    lags = np.asarray(sample_jit(jax.random.key(0), DelayConfig.uniform(0, 5, 6), NUM_DRAWS, None))
    expected = reference_pmf(DelayConfig.geometric(1.5, 6))
    _, p_value = stats.chisquare(np.bincount(lags, minlength=6), NUM_DRAWS * expected)
    assert p_value < 1e-6  # non-centrality N·Σ(p − q)²/q ≈ 2·10⁴ on 5 df: p is ~0, far below 1e-6


def test_geometric_mean_is_the_untruncated_mean_when_truncation_is_negligible():
    config = DelayConfig.geometric(2.0, ring_size=64)
    lags = np.asarray(sample_jit(jax.random.key(7), config, NUM_DRAWS, None))
    assert lags.mean() == pytest.approx(2.0, abs=0.08)  # std ≈ 2.45, se ≈ 0.017
    assert DelayConfig.geometric(0.0, 5).geometric_ratio == 0.0
    zero = np.asarray(sample_jit(jax.random.key(1), DelayConfig.geometric(0.0, 5), 100, None))
    assert np.all(zero == 0)


@given(
    config=st.sampled_from(
        [DelayConfig.fixed(4, 5), DelayConfig.uniform(2, 4, 5), DelayConfig.geometric(6.0, 5)]
    ),
    available=st.integers(-1, 7),
    seed=st.integers(0, 2**31 - 1),
)
def test_lags_never_exceed_available_versions(config, available, seed):
    lags = np.asarray(sample_jit(jax.random.key(seed), config, 64, jnp.int32(available)))
    assert lags.dtype == np.int32
    assert lags.min() >= 0
    assert lags.max() <= max(min(available, config.ring_size), 1) - 1


def test_sampled_lags_make_groups_act_with_version_t_minus_k():
    """A lag-k group really acts with version t − k (versions tagged by the ring)."""
    ring_size, num_groups = 4, 6
    config = DelayConfig.uniform(0, ring_size - 1, ring_size)
    ring = version_ring.init({"v": jnp.asarray(0, jnp.int32)}, ring_size)
    key = jax.random.key(3)
    for t in range(1, 7):
        ring = version_ring.push(ring, {"v": jnp.asarray(t, jnp.int32)})
        key, sub = jax.random.split(key)
        lags = sample_jit(sub, config, num_groups, version_ring.available_versions(ring))
        params, versions = version_ring.gather(ring, lags)
        np.testing.assert_array_equal(np.asarray(versions), t - np.asarray(lags))
        np.testing.assert_array_equal(np.asarray(params["v"]), np.asarray(versions))
        env_versions = versions[actor_group_ids(12, num_groups)]
        np.testing.assert_array_equal(np.asarray(env_versions), np.repeat(np.asarray(versions), 2))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(kind="poisson"), r"kind must be one of \('fixed', 'uniform', 'geometric'\)"),
        (dict(kind="fixed", ring_size=0), r"ring_size must be in \[1, inf\]"),
        (dict(kind="fixed", ring_size=2.0), r"ring_size must be an integer in \[1, inf\]"),
        (dict(kind="fixed", ring_size=4, lag=-1), r"lag must be in \[0, 3\]"),
        (dict(kind="fixed", ring_size=4, lag=4), r"lag must be in \[0, 3\]"),
        (dict(kind="uniform", ring_size=4, min_lag=-1, max_lag=2), r"min_lag must be in \[0, 3\]"),
        (dict(kind="uniform", ring_size=4, min_lag=2, max_lag=1), r"max_lag must be in \[2, 3\]"),
        (dict(kind="uniform", ring_size=4, min_lag=0, max_lag=4), r"max_lag must be in \[0, 3\]"),
        (dict(kind="geometric", ring_size=4, mean_lag=-0.5), r"mean_lag must be in \[0.0, inf\)"),
        (dict(kind="geometric", ring_size=4, mean_lag=float("nan")), r"mean_lag must be in"),
        (dict(kind="geometric", ring_size=4, mean_lag=float("inf")), r"mean_lag must be in"),
    ],
)
def test_bad_configs_raise_naming_field_and_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DelayConfig(**kwargs)


def test_bad_num_groups_raises():
    with pytest.raises(ValueError, match=r"num_groups must be in \[1, inf\]"):
        sample_lags(jax.random.key(0), DelayConfig.fixed(0, 1), 0)


def test_actor_group_ids():
    np.testing.assert_array_equal(actor_group_ids(6, 3), [0, 0, 1, 1, 2, 2])
    np.testing.assert_array_equal(actor_group_ids(4, 1), [0, 0, 0, 0])
    with pytest.raises(ValueError, match="num_groups must divide num_actors=6"):
        actor_group_ids(6, 4)
    with pytest.raises(ValueError, match=r"num_groups must be in \[1, inf\]"):
        actor_group_ids(6, 0)
    with pytest.raises(ValueError, match=r"num_actors must be in \[3, inf\]"):
        actor_group_ids(2, 3)


def test_traced_fixed_lag_equals_static_config_and_is_clipped():
    key = jax.random.PRNGKey(0)
    config = DelayConfig.fixed(0, 5)
    swept = jax.jit(jax.vmap(lambda k: sample_lags(key, config, 3, 4, fixed_lag=k)))(jnp.array([0, 2, 3, 7, -1]))
    for row, k in zip(np.asarray(swept), (0, 2, 3, 7, -1)):
        static = sample_lags(key, DelayConfig.fixed(min(max(k, 0), 4), 5), 3, 4)
        np.testing.assert_array_equal(row, np.asarray(static))  # 7 → K − 1 = 4 → available − 1 = 3
    with pytest.raises(ValueError, match="fixed_lag"):
        sample_lags(key, DelayConfig.uniform(0, 2, 3), 2, fixed_lag=1)


@given(ring=st.integers(1, 64), a=st.integers(0, 63), b=st.integers(0, 63), mean=st.floats(0.0, 50.0))
def test_expected_lag_closed_forms_equal_the_pmf_mean(ring, a, b, mean):
    """``expected_lag``'s closed forms (fixed, uniform, truncated geometric) against Σ k·p(k) of
    ``lag_pmf``: float64 sums of ≤ 64 terms ≤ 64, and the geometric form's cancellation near q → 1
    (1 − q ≥ 1/51), stay within 1e-9 relative."""
    low, high = sorted((a % ring, b % ring))
    for config in (DelayConfig.fixed(high, ring), DelayConfig.uniform(low, high, ring),
                   DelayConfig.geometric(mean, ring)):
        pmf = lag_pmf(config)
        assert expected_lag(config) == pytest.approx(float(pmf @ np.arange(pmf.size)), rel=1e-9, abs=1e-9)
