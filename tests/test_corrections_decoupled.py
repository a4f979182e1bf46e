"""Decoupled correction: r_d / r_s, MIS / TIS, decoupled PPO, interpolation proxies (Proposition 1)."""
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st
from jax.test_util import check_grads

from fresh_rl.corrections import (
    DecoupledPPOConfig,
    MISConfig,
    PPOClipConfig,
    decoupled_ppo_loss,
    interpolation_weight,
    linear_proximal_log_probs,
    linear_proxy_clip_interval,
    loglinear_proximal_log_probs,
    loglinear_proxy_clip_interval,
    mis_mask,
    ppo_clip_loss,
    truncated_importance_weights,
)

B, T = 3, 6
f32 = functools.partial(np.asarray, dtype=np.float32)
CLIP = PPOClipConfig(0.2, 0.28, dual_clip=3.0)


def random_inputs(seed, stale=0.4, discrepancy=0.3, mask_prob=0.2):
    """(log π_θ, log π_old_train, log π_infer, advantages, mask), [B, T]."""
    rng = np.random.default_rng(seed)
    old = f32(np.log(rng.uniform(0.05, 0.95, size=(B, T))))
    infer = f32(old + discrepancy * rng.normal(size=(B, T)))
    lp = f32(old + stale * rng.normal(size=(B, T)))
    adv = f32(rng.normal(size=(B, T)))
    mask = rng.random((B, T)) >= mask_prob
    return lp, old, infer, adv, mask


def loss_and_grad(config):
    def loss(lp, old, infer, adv, mask):
        return decoupled_ppo_loss(lp, old, infer, adv, mask, config=config)

    return jax.jit(loss), jax.jit(jax.grad(lambda *a: loss(*a)[0]))


DEFAULT_LOSS, DEFAULT_GRAD = loss_and_grad(DecoupledPPOConfig(clip=CLIP, tis_cap=2.0))
PPO_LOSS = jax.jit(lambda lp, old, adv, mask: ppo_clip_loss(lp, old, adv, mask, config=CLIP))
PPO_GRAD = jax.jit(jax.grad(lambda *a: PPO_LOSS(*a)[0]))


@given(seed=st.integers(0, 2**31 - 1))
def test_decoupled_with_exact_inference_logits_equals_ppo_clip(seed):
    """π_old_train = π_infer ⇒ r_d = 1: nothing masked, weight 1, loss and gradient of PPO-clip."""
    lp, old, _, adv, mask = random_inputs(seed, stale=1.0)
    loss, metrics = DEFAULT_LOSS(lp, old, old, adv, mask)
    ppo_loss, ppo_metrics = PPO_LOSS(lp, old, adv, mask)
    # float32, two programs (w = exp(0) = 1 exactly): ≤ 18 terms, mean|ℓ| ≤ 2.3, each sum ≤ 20·u·2.3: ≲ 5.5e-6 apart
    np.testing.assert_allclose(loss, ppo_loss, rtol=1e-6, atol=1e-5)
    # elementwise −r·Â/N, no sum: ≤ ~3 roundings apart (≲ 3u ≈ 2e-7 relative); clipped/masked entries exactly 0
    np.testing.assert_allclose(DEFAULT_GRAD(lp, old, old, adv, mask), PPO_GRAD(lp, old, adv, mask), rtol=1e-6,
                               atol=1e-8)
    for key in ("clip_fraction", "clip_fraction_low", "clip_fraction_high", "dual_clip_fraction", "kl_k3", "tv"):
        # fractions: exact counts / N; tv, kl_k3: sums of ≤ 18 terms ≥ 0 in two programs, ≤ 2·20·u ≈ 2.4e-6 relative
        np.testing.assert_allclose(metrics[key], ppo_metrics[key], rtol=5e-6, err_msg=key)
    assert float(metrics["active_token_fraction"]) == 1.0  # exact: log r_d = 0 keeps every token, N/N = 1


@given(seed=st.integers(0, 2**31 - 1))
def test_decoupled_loss_matches_numpy_formula_and_analytic_gradient(seed):
    lp, old, infer, adv, mask = random_inputs(seed)
    loss, metrics = DEFAULT_LOSS(lp, old, infer, adv, mask)
    rd = np.exp(old.astype(np.float64) - infer)
    rs = np.exp(lp.astype(np.float64) - old)
    kept = mask & (rd >= 0.5) & (rd <= 2.0)
    w = np.minimum(rd, 2.0)
    obj = np.minimum(rs * adv, np.clip(rs, 0.8, 1.28) * adv)
    obj = np.where(adv < 0, np.maximum(obj, 3.0 * adv), obj)
    n_kept = max(kept.sum(), 1)
    # float32 vs float64: ≤ 18 kept terms, mean|w·ℓ| ≤ 2.2 (w ≤ 2, |ℓ| ≤ 3|Â|): ≤ (17 + 5)·u·2.2 ≈ 3e-6
    np.testing.assert_allclose(loss, -(w * obj)[kept].sum() / n_kept, rtol=1e-5, atol=5e-6)
    # exact counts (a flag differs only for r_d within ~1e-7 of a bound); count/N in float32: ≤ u ≪ rel 1e-6
    assert float(metrics["active_token_fraction"]) == pytest.approx(kept.sum() / mask.sum())
    assert float(metrics["reject_fraction_token"]) == pytest.approx((mask & ~kept).sum() / mask.sum())
    clipped = ((adv > 0) & (rs > 1.28)) | ((adv < 0) & (rs < 0.8)) | ((adv < 0) & (rs > 3.0))
    expected_grad = np.where(kept & ~clipped, -w * rs * adv / n_kept, 0.0)
    # float32 elementwise −w·r_s·Â/N (no sum): ≲ 8u ≈ 5e-7 relative ≪ rtol; clipped / rejected entries exactly 0
    np.testing.assert_allclose(DEFAULT_GRAD(lp, old, infer, adv, mask), expected_grad, rtol=1e-4, atol=1e-7)
    # float32 mean of ≤ 18 log r_d (mean|log r_d| ≲ 0.6): ≤ 19·u·0.6 ≈ 7e-7 absolute < atol 1e-6
    np.testing.assert_allclose(metrics["train_infer/kl_k1"], -np.log(rd)[mask].mean(), rtol=1e-4, atol=1e-6)


SPLIT_LOSS = jax.jit(lambda lp, old, infer, adv, mask, clip: decoupled_ppo_loss(
    lp, old, infer, adv, mask, config=DecoupledPPOConfig(clip=CLIP, tis_cap=2.0), clip_log_probs=clip))


@given(seed=st.integers(0, 2**31 - 1))
def test_clip_centre_apart_from_the_mask_matches_numpy(seed):
    """``clip_log_probs``: the mask and the TIS weight read r_d = π_old/π_infer, the clip
    r_s = π_θ/π_clip (the factorial routes); ``clip_log_probs = old`` is the default loss."""
    lp, old, infer, adv, mask = random_inputs(seed)
    clip = f32(old + 0.5 * np.random.default_rng(seed + 1).normal(size=old.shape))
    loss, metrics = SPLIT_LOSS(lp, old, infer, adv, mask, clip)
    rd = np.exp(old.astype(np.float64) - infer)
    rs = np.exp(lp.astype(np.float64) - clip)
    kept = mask & (rd >= 0.5) & (rd <= 2.0)
    obj = np.minimum(rs * adv, np.clip(rs, 0.8, 1.28) * adv)
    obj = np.where(adv < 0, np.maximum(obj, 3.0 * adv), obj)
    # the bound of the formula test above (same terms, |ℓ| ≤ 3|Â|, w ≤ 2)
    np.testing.assert_allclose(loss, -(np.minimum(rd, 2.0) * obj)[kept].sum() / max(kept.sum(), 1), rtol=1e-5,
                               atol=5e-6)
    assert float(metrics["active_token_fraction"]) == pytest.approx(kept.sum() / mask.sum())  # exact counts
    same, default = SPLIT_LOSS(lp, old, infer, adv, mask, old), DEFAULT_LOSS(lp, old, infer, adv, mask)
    np.testing.assert_array_equal(same[0], default[0])  # the same ops on the same values


@given(seed=st.integers(0, 2**31 - 1), garbage=st.sampled_from([np.nan, 1e4, -1e4]))
def test_masked_token_never_changes_decoupled_loss_or_gradient(seed, garbage):
    inputs = random_inputs(seed)
    mask = inputs[-1]
    dirty = [np.where(mask, x, np.float32(garbage)).astype(np.float32) for x in inputs[:-1]] + [mask]
    loss, metrics = DEFAULT_LOSS(*inputs)
    dirty_loss, dirty_metrics = DEFAULT_LOSS(*dirty)
    # exact: the same compiled program on inputs that are equal once masked entries are replaced by 0
    np.testing.assert_array_equal(loss, dirty_loss)
    for key in metrics:
        np.testing.assert_array_equal(metrics[key], dirty_metrics[key], err_msg=key)
    dirty_grad = DEFAULT_GRAD(*dirty)
    np.testing.assert_array_equal(DEFAULT_GRAD(*inputs), dirty_grad)
    np.testing.assert_array_equal(np.asarray(dirty_grad)[~mask], 0.0)


def test_mis_rules_match_numpy():
    rng = np.random.default_rng(0)
    log_rd = f32(0.4 * rng.normal(size=(6, 5)))
    log_rd[2, 1] = np.log(1e-5)  # one catastrophic token
    mask = rng.random((6, 5)) > 0.2
    mask[2, 1] = True
    config = MISConfig(token_bounds=(0.6, 1.8), sequence_sum_bounds=(0.3, 3.0),
                       geometric_mean_bounds=(0.8, 1.25), catastrophic_threshold=1e-4)
    kept, rejected = mis_mask(jnp.asarray(log_rd), mask, config)
    rd = np.exp(log_rd.astype(np.float64))
    token_ok = (rd >= 0.6) & (rd <= 1.8)
    seq_log = np.where(mask, log_rd, 0).sum(1, keepdims=True)
    seq_ok = (np.exp(seq_log) >= 0.3) & (np.exp(seq_log) <= 3.0)
    geo = np.exp(seq_log / np.maximum(mask.sum(1, keepdims=True), 1))
    geo_ok = (geo >= 0.8) & (geo <= 1.25)
    cat_ok = ~np.any(mask & (rd < 1e-4), axis=1, keepdims=True)
    # exact flags: every log r_d, row sum and row mean is ≥ 4.6e-3 (log scale) from a bound here, ≫ float32 rounding
    np.testing.assert_array_equal(rejected["token"], mask & ~token_ok)
    np.testing.assert_array_equal(rejected["sequence_sum"], mask & ~np.broadcast_to(seq_ok, mask.shape))
    np.testing.assert_array_equal(rejected["geometric_mean"], mask & ~np.broadcast_to(geo_ok, mask.shape))
    np.testing.assert_array_equal(rejected["catastrophic"], mask & ~np.broadcast_to(cat_ok, mask.shape))
    np.testing.assert_array_equal(kept, mask & token_ok & seq_ok & geo_ok & cat_ok)
    assert not np.any(np.asarray(kept)[2])  # the catastrophic token drops its whole sequence


def test_tis_weights_token_and_sequence():
    rng = np.random.default_rng(1)
    log_rd = f32(0.5 * rng.normal(size=(4, 5)))
    mask = rng.random((4, 5)) > 0.2
    w, truncated = truncated_importance_weights(jnp.asarray(log_rd), mask, 1.5, "token")
    rd = np.exp(log_rd.astype(np.float64))
    # float32 exp of the same float32 log r_d (or of f32 log 1.5): within a few ulp, ≲ 4·2u ≈ 5e-7 < rtol 1e-6
    np.testing.assert_allclose(w, np.where(mask, np.minimum(rd, 1.5), 0), rtol=1e-6)
    np.testing.assert_array_equal(truncated, mask & (rd > 1.5))
    w_seq, _ = truncated_importance_weights(jnp.asarray(log_rd), mask, 1.5, "sequence")
    seq = np.exp(np.where(mask, log_rd, 0).sum(1, keepdims=True))
    # float32 row sums of ≤ 5 log r_d (Σ|log r_d| ≤ 1.9) in two orders: ≤ 2·4·u·1.9 ≈ 1e-6, then exp (few ulp)
    np.testing.assert_allclose(w_seq, np.where(mask, np.minimum(seq, 1.5), 0), rtol=1e-5)
    w_full, truncated_none = truncated_importance_weights(jnp.asarray(log_rd), mask, math.inf)
    np.testing.assert_allclose(w_full, np.where(mask, rd, 0), rtol=1e-6)  # as above: exp of the same float32
    assert not np.any(truncated_none)


def test_staleness_leaking_into_rd_lowers_the_active_fraction():
    """The paper's failure: old logits recomputed with the *current* weights put the staleness
    into r̂_d, so the train–inference mask drops tokens that the exact old logits keep."""
    rng = np.random.default_rng(2)
    exact_old = f32(np.log(rng.uniform(0.05, 0.95, size=(8, 16))))
    infer = f32(exact_old + 0.05 * rng.normal(size=exact_old.shape))  # small numerical mismatch
    current = f32(exact_old + 1.0 * rng.normal(size=exact_old.shape))  # several versions of drift
    adv, mask = f32(rng.normal(size=exact_old.shape)), np.ones(exact_old.shape, bool)
    _, exact_metrics = DEFAULT_LOSS(current, exact_old, infer, adv, mask)
    _, recompute_metrics = DEFAULT_LOSS(current, current, infer, adv, mask)
    assert float(exact_metrics["active_token_fraction"]) == 1.0  # exact: max |log r_d| = 0.14 ≪ log 2 here
    # log r̂_d ~ N(0, 1): P(|log r̂_d| ≤ log 2) = 0.51; 128 tokens: SE 0.044, so 0.7 is 4.3 SE above
    assert float(recompute_metrics["active_token_fraction"]) < 0.7


# ----------------------------------------------------------------------------- interpolation proxies


def test_interpolation_weight():
    v_behav = np.array([[3, 4, 5, 2, 5]], np.int32)
    alpha = interpolation_weight(v_behav, proximal_version=4, current_version=5)
    np.testing.assert_allclose(alpha, [[0.5, 0.0, 0.0, 2 / 3, 0.0]], rtol=1e-6)  # float32 2/3: ≤ u; others exact
    with pytest.raises(AssertionError):
        interpolation_weight(v_behav.astype(np.float32), 4, 5)


def test_proxy_log_probs_formulas():
    rng = np.random.default_rng(3)
    behav, cur = f32(np.log(rng.uniform(0.05, 0.95, size=(2, 4)))), f32(np.log(rng.uniform(0.05, 0.95, size=(2, 4))))
    alpha = f32(rng.uniform(size=(2, 4)))
    # float32 both sides, eager: the same sub, mul, add in the same order (≤ 1 ulp apart even if one side fuses)
    np.testing.assert_allclose(loglinear_proximal_log_probs(behav, cur, alpha), behav + alpha * (cur - behav),
                               rtol=1e-6)
    expected = np.log((1 - alpha) * np.exp(behav) + alpha * np.exp(cur))
    # float32 both: log-space args ≤ 7.3 round at ≲ u·7.3, |result| ≥ 0.55: ≲ 2·u·(7.3 + 4.5 + 6)/0.55 ≈ 4e-6
    np.testing.assert_allclose(linear_proximal_log_probs(behav, cur, alpha), expected, rtol=1e-5)
    for a in (0.0, 1.0):  # end points are exact: logaddexp of x and −inf returns x
        np.testing.assert_allclose(linear_proximal_log_probs(behav, cur, np.float32(a)), behav if a == 0 else cur,
                                   rtol=1e-6)
    # the current policy enters detached
    grad = jax.grad(lambda x: jnp.sum(linear_proximal_log_probs(behav, x, alpha)))(cur)
    np.testing.assert_array_equal(grad, 0.0)


EPS_LOW, EPS_HIGH = 0.2, 0.28
# log-spaced grid of total ratios r = π_θ/π_behav, both advantage signs
GRID_R = np.exp(np.linspace(-2.5, 2.5, 301))
GRID_LOG_R = f32(np.log(np.concatenate([GRID_R, GRID_R])))[None, :]
GRID_ADV = f32(np.concatenate([np.ones_like(GRID_R), -np.ones_like(GRID_R)]))[None, :]
BEHAV = np.zeros_like(GRID_LOG_R)
GRID_MASK = np.ones_like(GRID_LOG_R, dtype=bool)
FULL_WEIGHT = DecoupledPPOConfig(clip=PPOClipConfig(EPS_LOW, EPS_HIGH), mis=MISConfig(token_bounds=None),
                                 tis_cap=math.inf)


def proxy_decoupled_grad(proxy_fn, alpha):
    def loss(lp):
        prox = proxy_fn(BEHAV, lp, jnp.full_like(lp, alpha))
        return decoupled_ppo_loss(lp, prox, BEHAV, GRID_ADV, GRID_MASK, config=FULL_WEIGHT)[0]

    return np.asarray(jax.grad(loss)(GRID_LOG_R)), float(loss(GRID_LOG_R))


def widened_ppo_grad(lower, upper):
    config = PPOClipConfig(epsilon_low=1.0 - float(lower), epsilon_high=float(upper) - 1.0)
    fn = lambda lp: ppo_clip_loss(lp, BEHAV, GRID_ADV, GRID_MASK, config=config)[0]
    return np.asarray(jax.grad(fn)(GRID_LOG_R))


def far_from(bounds, rel=2e-3):
    """Grid points not within rel of either interval end (the gradient is a step there); float32 ratios
    and ends are within ~1e-6 of exact, so 2e-3 keeps every point on the same side in both computations."""
    r = np.exp(GRID_LOG_R.astype(np.float64))
    return np.all([np.abs(r / b - 1) > rel for b in bounds if 0 < b < np.inf], axis=0)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.6, 0.8, 0.95])
@pytest.mark.parametrize("proxy", ["loglinear", "linear"])
def test_proposition_1_proxy_equals_ppo_clip_on_total_ratio_with_widened_interval(proxy, alpha):
    """Brute force: with a proxy for π_old_train and the full behaviour weight, the decoupled
    gradient equals PPO-clip's on the total ratio r with the derived interval [L, U]."""
    proxy_fn, interval_fn = {
        "loglinear": (loglinear_proximal_log_probs, loglinear_proxy_clip_interval),
        "linear": (linear_proximal_log_probs, linear_proxy_clip_interval),
    }[proxy]
    lower, upper = (float(x) for x in interval_fn(EPS_LOW, EPS_HIGH, alpha))
    grad, _ = proxy_decoupled_grad(proxy_fn, alpha)
    expected = widened_ppo_grad(lower, upper)
    ok = far_from((lower, upper))
    # float32: w·r_s = r up to ≲ 10 roundings (≲ 6e-7 relative) ≪ rtol; clipped entries are exact 0 on both sides
    np.testing.assert_allclose(grad[ok], expected[ok], rtol=2e-4, atol=1e-9)
    # independent of the loss code: the clipped set is exactly "r outside [L, U] in the direction of A"
    r = np.exp(GRID_LOG_R.astype(np.float64))
    clipped = ((GRID_ADV > 0) & (r > upper)) | ((GRID_ADV < 0) & (r < lower))
    np.testing.assert_array_equal((grad == 0)[ok], clipped[ok])
    if alpha == 0.0:  # no interpolation: the proxy is π_behav and the interval PPO's own (float32: ≤ few u)
        assert (lower, upper) == pytest.approx((1 - EPS_LOW, 1 + EPS_HIGH))


def test_loglinear_interval_is_a_power_of_ppos_and_linear_loses_its_upper_clip():
    lower, upper = loglinear_proxy_clip_interval(EPS_LOW, EPS_HIGH, 0.5)
    # float32 f32(0.8)², f32(1.28)² via pow: ≲ 5u ≈ 3e-7 relative < the default rel 1e-6
    assert float(lower) == pytest.approx((1 - EPS_LOW) ** 2) and float(upper) == pytest.approx((1 + EPS_HIGH) ** 2)
    assert loglinear_proxy_clip_interval(EPS_LOW, EPS_HIGH, 1.0) == (0.0, np.inf)  # exact: exponent 1/0 = ∞
    # linear: α(1 + ε_high) ≥ 1 ⇒ r_s < 1/α ≤ 1 + ε_high for every r: no upper clip (exact, eager float32:
    # f32(1/1.28) = 0.78125 and 0.78125·f32(1.28) rounds to 1, so the denominator is 0)
    assert float(linear_proxy_clip_interval(EPS_LOW, EPS_HIGH, 1 / (1 + EPS_HIGH))[1]) == np.inf
    assert float(linear_proxy_clip_interval(EPS_LOW, EPS_HIGH, 1.0)[0]) == 0.0


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: MISConfig(token_bounds=(2.0, 0.5)), "token_bounds"),
        (lambda: MISConfig(token_bounds=(-1.0, 2.0)), "token_bounds"),
        (lambda: MISConfig(sequence_sum_bounds=(1.0,)), "sequence_sum_bounds"),
        (lambda: MISConfig(geometric_mean_bounds=(1.1, 1.0)), "geometric_mean_bounds"),
        (lambda: MISConfig(catastrophic_threshold=0.0), "catastrophic_threshold"),
        (lambda: DecoupledPPOConfig(tis_cap=0.0), "tis_cap"),
        (lambda: DecoupledPPOConfig(tis_level="batch"), "tis_level"),
        (lambda: DecoupledPPOConfig(clip=PPOClipConfig(epsilon_low=-0.2)), "epsilon_low"),
    ],
)
def test_bad_configuration_raises_value_error_naming_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_bad_shapes_and_dtypes_fail_with_chex_messages():
    lp, old, infer, adv, mask = random_inputs(0)
    with pytest.raises(AssertionError, match="rank"):
        decoupled_ppo_loss(lp[0], old[0], infer[0], adv[0])
    with pytest.raises(AssertionError, match="shape"):
        decoupled_ppo_loss(lp, old[:, :-1], infer, adv)
    with pytest.raises(AssertionError):
        decoupled_ppo_loss(lp, old, infer, adv, mask.astype(np.int32))


def test_decoupled_loss_works_under_jit_and_vmap():
    inputs = [random_inputs(s) for s in range(2)]
    stacked = [np.stack(x) for x in zip(*inputs)]
    config = DecoupledPPOConfig(clip=CLIP, mis=MISConfig(geometric_mean_bounds=(0.5, 2.0)), tis_cap=2.0,
                                tis_level="sequence")
    fn = functools.partial(decoupled_ppo_loss, config=config)
    batched, metrics = jax.jit(jax.vmap(fn))(*stacked)
    eager, eager_metrics = fn(*inputs[1])
    # float32, two programs, seed 1: 14 kept terms, mean|w·ℓ| 0.67, w from row sums: ≲ 1.6e-6 < rtol·|loss 0.28|
    np.testing.assert_allclose(batched[1], eager, rtol=1e-5, atol=1e-7)
    # exact: the same kept count (log r_d ≥ 0.08, row means ≥ 0.45 from ±log 2) over the same N
    np.testing.assert_allclose(metrics["active_token_fraction"][1], eager_metrics["active_token_fraction"])


def test_decoupled_gradient_matches_finite_differences():
    """jax.grad vs central differences, away from the clip and mask boundaries."""
    lp, old, infer, adv, mask = random_inputs(4, stale=0.02, discrepancy=0.1, mask_prob=0.0)
    fn = lambda x: decoupled_ppo_loss(x, old, infer, adv, mask, config=DecoupledPPOConfig(clip=CLIP, tis_cap=2.0))[0]
    # float32 central differences, eps 1e-3: rounding ≲ 20·u·|ℓ|/eps ≈ 1e-3·|ℓ|, truncation ~eps²; kinks ≫ eps away
    check_grads(fn, (jnp.asarray(lp),), order=1, modes=["rev"], atol=1e-2, rtol=1e-2, eps=1e-3)


# --------------------------------------------------------------------------- numerator / count split


@functools.lru_cache(maxsize=None)
def whole_and_split_losses(config):
    """Jitted value-and-gradient of the whole-batch loss and of the same loss assembled from a
    split of the rows into [0, 1) and [1, B): Σ_parts numerator / Σ_parts kept count."""
    from fresh_rl.corrections.decoupled import decoupled_ppo_loss_sum
    from fresh_rl.corrections.policy_losses import token_mean_loss

    def whole(lp, old, infer, adv, mask):
        return decoupled_ppo_loss(lp, old, infer, adv, mask, config=config)[0]

    def split(lp, old, infer, adv, mask):
        parts = [decoupled_ppo_loss_sum(lp[rows], old[rows], infer[rows], adv[rows], mask[rows],
                                        config=config) for rows in (slice(0, 1), slice(1, B))]
        return token_mean_loss(sum(p[0] for p in parts), sum(p[1] for p in parts))

    def count_and_active(lp, old, infer, adv, mask):
        _, count, metrics = decoupled_ppo_loss_sum(lp, old, infer, adv, mask, config=config)
        return count, metrics["active_token_fraction"]

    return (jax.jit(jax.value_and_grad(whole)), jax.jit(jax.value_and_grad(split)),
            jax.jit(count_and_active))


@pytest.mark.parametrize("config", [
    DecoupledPPOConfig(clip=CLIP, tis_cap=2.0),
    DecoupledPPOConfig(clip=CLIP, tis_cap=1.5, tis_level="sequence",
                       mis=MISConfig(token_bounds=None, geometric_mean_bounds=(0.8, 1.25))),
])
@given(seed=st.integers(0, 2**31 - 1))
def test_row_split_sums_and_counts_give_the_whole_batch_loss(config, seed):
    """Gradient accumulation's identity: the loss of the whole batch (value and gradient) is
    Σ_parts numerator / Σ_parts kept count for a split by rows (sequence rules included), and
    the count is the kept-token count ρ_active · valid."""
    whole, split, count_and_active = whole_and_split_losses(config)
    inputs = random_inputs(seed, discrepancy=0.5)
    (value, grad), (split_value, split_grad) = whole(*inputs), split(*inputs)
    # float32: a sum of ≤ 18 terms vs two partial sums (mean|w·ℓ| ≤ 3.4): ≤ 2·20·u·3.4 ≈ 8e-6 apart (w's row sums in)
    np.testing.assert_allclose(split_value, value, rtol=1e-6, atol=1e-5)
    # elementwise w·ℓ′/N, the same integer N; a sequence w is exp of a row sum of ≤ 6 log r_d (Σ|·| ≤ 5.6) taken in
    # another order: ≤ 10·u·5.6 + 3u ≈ 3.5e-6 relative; zeros exact
    np.testing.assert_allclose(split_grad, grad, rtol=5e-6, atol=1e-7)
    count, active = count_and_active(*inputs)
    # count exact; active = count/N rounded once in float32: ≤ u ≪ rel 1e-6
    assert float(count) == pytest.approx(float(active) * inputs[-1].sum(), rel=1e-6)
