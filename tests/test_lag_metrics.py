"""Per-batch lag metrics vs a NumPy reference; edge cases, masking, no gradient, bad shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fresh_rl.lag import BehaviourTags, lag_metrics, lag_metrics_from_tags

metrics_jit = jax.jit(lag_metrics)
KEYS = {
    "version_gap_mean", "version_gap_max", "stale_fraction", "tv", "ess", "kl_k1", "kl_k2", "kl_k3",
}


def numpy_reference(behaviour, learner, versions, learner_version, mask):
    valid = mask.astype(bool)
    log_r = (learner - behaviour)[valid].astype(np.float64)
    gaps = (learner_version - versions)[valid].astype(np.float64)
    if not valid.any():
        return dict(version_gap_mean=0.0, version_gap_max=0.0, stale_fraction=0.0, tv=0.0,
                    ess=1.0, kl_k1=0.0, kl_k2=0.0, kl_k3=0.0)
    r = np.exp(log_r)
    return dict(
        version_gap_mean=gaps.mean(),
        version_gap_max=gaps.max(),
        stale_fraction=(gaps > 0).mean(),
        tv=0.5 * np.abs(r - 1).mean(),
        ess=r.sum() ** 2 / (r.size * (r**2).sum()),
        kl_k1=(-log_r).mean(),
        kl_k2=(0.5 * log_r**2).mean(),
        kl_k3=(r - 1 - log_r).mean(),
    )


def random_batch(seed, shape=(4, 6)):
    rng = np.random.default_rng(seed)
    behaviour = rng.normal(-1.0, 0.5, shape).astype(np.float32)
    learner = (behaviour + rng.normal(0.0, 0.3, shape)).astype(np.float32)
    versions = rng.integers(5, 11, shape).astype(np.int32)
    mask = rng.random(shape) < 0.7
    return behaviour, learner, versions, mask


@given(seed=st.integers(0, 2**31 - 1), use_mask=st.booleans())
def test_metrics_match_numpy_reference(seed, use_mask):
    behaviour, learner, versions, mask = random_batch(seed)
    if not use_mask:
        mask = np.ones_like(mask)
    # Masked-out entries hold garbage that must not leak into any metric.
    behaviour = np.where(mask, behaviour, -np.inf).astype(np.float32)
    learner = np.where(mask, learner, np.nan).astype(np.float32)
    out = metrics_jit(behaviour, learner, versions, jnp.int32(10), jnp.asarray(mask))
    assert set(out) == KEYS
    expected = numpy_reference(behaviour, learner, versions, 10, mask)
    # float32 on ≤ 24 entries: ≤ 24·u ≈ 1.4e-6 relative (ESS ≲ 3× that), kl_k1 may cancel: ≤ 24·u·mean|log r|
    # ≲ 24·u·0.5 ≈ 7e-7 absolute, all ≪ rel 1e-4 / abs 1e-5; version gaps are exact integer arithmetic
    for key in KEYS:
        assert float(out[key]) == pytest.approx(expected[key], rel=1e-4, abs=1e-5), key


def test_identical_policies_and_versions_give_zero_lag():
    logp = jnp.log(jnp.asarray([0.2, 0.5, 0.9], jnp.float32))
    out = lag_metrics(logp, logp, jnp.full((3,), 4, jnp.int32), 4)
    for key in ("version_gap_mean", "version_gap_max", "stale_fraction", "tv", "kl_k1", "kl_k2", "kl_k3"):
        assert float(out[key]) == 0.0, key  # exact: log r = x − x = 0, r = exp(0) = 1
    assert float(out["ess"]) == pytest.approx(1.0)  # exact: 3²/(3·3)


def test_known_values():
    behaviour = jnp.log(jnp.asarray([0.5, 0.5], jnp.float32))
    learner = jnp.log(jnp.asarray([1.0, 0.25], jnp.float32))  # r = (2, 0.5)
    out = lag_metrics(behaviour, learner, jnp.asarray([3, 5], jnp.int32), 6)
    # float32 log then exp: r within ~4 ulp of (2, ½) (≲ 1e-6, 2.4e-7), so tv within ≲ 3e-7 and ess ≲ 7e-7
    assert float(out["tv"]) == pytest.approx(0.5 * (1.0 + 0.5) / 2, abs=1e-6)
    assert float(out["ess"]) == pytest.approx(2.5**2 / (2 * 4.25), abs=1e-6)
    assert float(out["version_gap_mean"]) == pytest.approx(2.0)  # exact: small integers
    assert float(out["version_gap_max"]) == pytest.approx(3.0)
    assert float(out["stale_fraction"]) == 1.0


def test_empty_mask_and_tags_wrapper():
    behaviour, learner, versions, _ = random_batch(0)
    out = lag_metrics(behaviour, learner, versions, 10, jnp.zeros(behaviour.shape, bool))
    assert {k: float(v) for k, v in out.items()} == dict(
        version_gap_mean=0.0, version_gap_max=0.0, stale_fraction=0.0, tv=0.0, ess=1.0,
        kl_k1=0.0, kl_k2=0.0, kl_k3=0.0,
    )
    tags = BehaviourTags(log_prob=jnp.asarray(behaviour), version=jnp.asarray(versions))
    a = lag_metrics_from_tags(tags, learner, 10)
    b = lag_metrics(behaviour, learner, versions, 10)
    for key in KEYS:
        assert float(a[key]) == float(b[key])  # exact: the same eager ops on the same values


def test_metrics_carry_no_gradient():
    behaviour, learner, versions, _ = random_batch(1)
    grad = jax.grad(lambda lp: sum(lag_metrics(behaviour, lp, versions, 10).values()))(learner)
    np.testing.assert_array_equal(np.asarray(grad), 0.0)


def test_bad_shapes_and_dtypes_raise():
    behaviour, learner, versions, mask = random_batch(2)
    with pytest.raises(AssertionError):
        lag_metrics(behaviour, learner[:, :3], versions, 10)
    with pytest.raises(AssertionError):
        lag_metrics(behaviour, learner, versions[:, :3], 10)
    with pytest.raises(AssertionError):
        lag_metrics(behaviour, learner, versions.astype(np.float32), 10)
    with pytest.raises(AssertionError):
        lag_metrics(behaviour, learner, versions, 10, mask.astype(np.float32))
