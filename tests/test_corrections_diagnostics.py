"""Diagnostics: approximate KL (k1/k2/k3), ESS, TV estimate, ratio statistics."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from fresh_rl.corrections import (
    approx_kl,
    effective_sample_size,
    masked_mean,
    policy_diagnostics,
    ratio_statistics,
    tv_estimate,
    tv_estimate_weighted,
    version_lag_statistics,
)

diagnostics_jit = jax.jit(policy_diagnostics)


def sample_two_categoricals(seed, n=40000, k=5):
    """Actions from p (the reference) and log r = log q(a) − log p(a); exact KL(p‖q), TV(p, q)."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(k) * 3)
    q = rng.dirichlet(np.ones(k) * 3)
    actions = rng.choice(k, size=n, p=p)
    log_ratio = np.log(q[actions]) - np.log(p[actions])
    return log_ratio.astype(np.float32), float(np.sum(p * np.log(p / q))), 0.5 * float(np.abs(p - q).sum())


def test_kl_and_tv_estimators_are_consistent_for_categoricals():
    log_ratio, kl, tv = sample_two_categoricals(0)
    out = approx_kl(log_ratio)
    # n = 40,000 fixed NumPy draws: SE 0.0044 (k1), 0.0025 (k3), 0.0019 (tv): 0.02 is ≥ 4.5 SE, still ≥ 4.1 SE
    # after the float32 sum's worst case n·u·mean|log r| ≈ 40,000·u·0.73 ≈ 1.7e-3
    assert float(out["kl_k1"]) == pytest.approx(kl, abs=0.02)
    assert float(out["kl_k3"]) == pytest.approx(kl, abs=0.02)
    assert float(tv_estimate(log_ratio)) == pytest.approx(tv, abs=0.02)


@pytest.mark.parametrize("seed", range(4))
def test_weighted_tv_is_unbiased_for_the_tv_between_two_policies_from_a_third(seed):
    """TV(p, q) from actions of β ≠ p, q: within 5 standard errors of the exact value."""
    rng = np.random.default_rng(seed)
    k, n = 5, 40000
    p, q = rng.dirichlet(np.ones(k) * 3), rng.dirichlet(np.ones(k) * 3)
    beta = 0.5 / k + 0.5 * rng.dirichlet(np.ones(k) * 3)  # β ≥ 0.1 everywhere: each draw ≤ ½·1/0.1 = 5
    actions = rng.choice(k, size=n, p=beta)
    estimate = float(tv_estimate_weighted((np.log(p) - np.log(beta))[actions].astype(np.float32),
                                          (np.log(q) - np.log(beta))[actions].astype(np.float32)))
    draws = 0.5 * np.abs(p - q) / beta  # the per-draw value as a function of the action
    exact = 0.5 * float(np.abs(p - q).sum())
    assert float(beta @ draws) == pytest.approx(exact)  # unbiased: E_β of a draw is the exact TV
    standard_error = float(np.sqrt((beta @ draws**2 - exact**2) / n))
    # 5 SE (bounded draws, CLT: two-sided tail 6e-7) plus the float32 mean's worst case n·u·mean (u = 2^-24)
    assert abs(estimate - exact) <= 5 * standard_error + n * 2**-24 * estimate


@given(seed=st.integers(0, 2**31 - 1))
def test_weighted_tv_reduces_to_tv_estimate_against_the_behaviour_and_is_symmetric(seed):
    rng = np.random.default_rng(seed)
    log_p, log_q = (0.5 * rng.normal(size=(2, 3, 7))).astype(np.float32)
    mask = rng.random((3, 7)) > 0.3
    assert float(tv_estimate_weighted(log_p, np.zeros_like(log_p), mask)) == float(tv_estimate(log_p, mask))
    assert float(tv_estimate_weighted(log_p, log_q, mask)) == float(tv_estimate_weighted(log_q, log_p, mask))


@given(seed=st.integers(0, 2**31 - 1))
def test_diagnostics_match_numpy_on_valid_entries(seed):
    rng = np.random.default_rng(seed)
    log_r = (0.5 * rng.normal(size=(3, 7))).astype(np.float32)
    mask = rng.random((3, 7)) > 0.3
    mask[0, 0] = True
    out = diagnostics_jit(log_r, mask)
    lr = log_r.astype(np.float64)[mask]
    r = np.exp(lr)
    expected = {
        "tv": 0.5 * np.abs(r - 1).mean(),
        "kl_k1": (-lr).mean(),
        "kl_k2": (0.5 * lr**2).mean(),
        "kl_k3": (r - 1 - lr).mean(),
        "ess": r.sum() ** 2 / (len(r) * (r**2).sum()),
        "ratio_mean": r.mean(),
        "ratio_std": r.std(),
        "ratio_min": r.min(),
        "ratio_max": r.max(),
        "log_ratio_abs_mean": np.abs(lr).mean(),
    }
    # float32 on ≤ 21 entries: sums ≤ 21·u ≈ 1.3e-6 relative (ess, ratio_std ≲ 3× that, tv/k3 terms ≲ 3u·r each);
    # kl_k1 may cancel: ≤ 21·u·mean|log r| ≲ 21·u·0.7 ≈ 9e-7 < atol
    for key, value in expected.items():
        np.testing.assert_allclose(out[key], value, rtol=2e-5, atol=1e-6, err_msg=key)
    assert float(out["kl_k2"]) >= 0 and float(out["kl_k3"]) >= 0
    # masked entries never matter
    dirty = np.where(mask, log_r, np.float32(np.nan))
    dirty_out = diagnostics_jit(dirty, mask)
    # exact: the same compiled program on inputs that are equal once masked entries are replaced by 0
    for key in out:
        np.testing.assert_array_equal(out[key], dirty_out[key], err_msg=key)


@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(1e-3, 1e3))
def test_ess_is_scale_invariant_and_bounded(seed, scale):
    w = np.random.default_rng(seed).exponential(size=12).astype(np.float32)
    ess = float(effective_sample_size(w))
    # float32 (Σw)²/(n·Σw²) of 12 weights: ≲ 37 roundings, ≤ 37·u ≈ 2.2e-6 relative outside [1/12, 1]
    assert 1 / 12 - 5e-6 <= ess <= 1 + 5e-6
    # the same bound on each side plus the rounding of scale·w: ≲ 2·37·u + u ≈ 4.5e-6 ≪ rel 1e-4
    assert float(effective_sample_size(np.float32(scale) * w)) == pytest.approx(ess, rel=1e-4)


def test_ess_extremes_and_empty_mask():
    # exact: sums of small integers and 25/200 = 1/8 are exact in float32
    assert float(effective_sample_size(np.ones(8, np.float32))) == pytest.approx(1.0)
    one_hot = np.zeros(8, np.float32)
    one_hot[3] = 5.0
    assert float(effective_sample_size(one_hot)) == pytest.approx(1 / 8)
    empty = np.zeros(8, bool)
    assert float(effective_sample_size(np.ones(8, np.float32), empty)) == 1.0
    stats = ratio_statistics(np.ones(8, np.float32), empty)
    assert float(stats["ratio_min"]) == 1.0 and float(stats["ratio_max"]) == 1.0
    assert float(masked_mean(jnp.ones(8), empty)) == 0.0


def test_diagnostics_carry_no_gradient():
    log_r = jnp.asarray(np.linspace(-1, 1, 6), jnp.float32)
    grad = jax.grad(lambda x: sum(policy_diagnostics(x).values()))(log_r)
    np.testing.assert_array_equal(grad, 0.0)


def test_bad_inputs_fail_with_chex_messages():
    with pytest.raises(AssertionError):
        tv_estimate(np.zeros(4, np.int32))
    with pytest.raises(AssertionError, match="shape"):
        approx_kl(np.zeros(4, np.float32), np.ones(3, bool))


def test_version_lag_statistics():
    versions = np.array([[7, 5, 2], [6, 6, 0]], np.int32)
    mask = np.array([[True, True, False], [True, True, False]])
    out = version_lag_statistics(versions, 7, mask)
    assert float(out["version_gap_mean"]) == pytest.approx((0 + 2 + 1 + 1) / 4)  # exact: 4/4 in float32
    assert float(out["version_gap_max"]) == 2.0
    assert float(version_lag_statistics(versions, 7, np.zeros_like(mask))["version_gap_max"]) == 0.0
    with pytest.raises(AssertionError):
        version_lag_statistics(versions.astype(np.float32), 7)
