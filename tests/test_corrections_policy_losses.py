"""Policy losses: worked examples, rlax / NumPy references, gradients, mask properties, configs."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax
from hypothesis import given, strategies as st
from jax.test_util import check_grads

from fresh_rl.corrections import (
    AdaptiveKLConfig,
    DPPOBinaryTVConfig,
    PPOClipConfig,
    PPOKLConfig,
    SPOConfig,
    VACOConfig,
    adaptive_kl_coefficient,
    dppo_binary_tv_loss,
    impala_policy_gradient_loss,
    ppo_clip_loss,
    ppo_kl_loss,
    spo_loss,
    tv_filter_mask,
    vaco_policy_loss,
)

B, T = 3, 5
f32 = functools.partial(np.asarray, dtype=np.float32)


def vaco_learner_start(lp, ref, adv, mask=None, *, config):
    """VACO with π_T = ref and an unrelated behaviour policy (reference='learner_start')."""
    return vaco_policy_loss(lp, ref, ref - 0.3, adv, mask, config=config)


# name -> (loss function taking (log_probs, reference, advantages, mask), config kwargs)
LOSSES = {
    "ppo_clip": functools.partial(ppo_clip_loss, config=PPOClipConfig(0.2, 0.28, dual_clip=3.0)),
    "ppo_kl": functools.partial(ppo_kl_loss, kl_coef=0.5),
    "spo": functools.partial(spo_loss, config=SPOConfig(0.2)),
    "impala": impala_policy_gradient_loss,
    "vaco": functools.partial(vaco_learner_start, config=VACOConfig(delta=0.05)),
    "dppo_binary_tv": functools.partial(dppo_binary_tv_loss, config=DPPOBinaryTVConfig(0.1, 0.1)),
}
LOSS_JIT = {name: jax.jit(fn) for name, fn in LOSSES.items()}
GRAD_JIT = {name: jax.jit(jax.grad(lambda *a, fn=fn: fn(*a)[0])) for name, fn in LOSSES.items()}
# VACO with no backward lag (π_T = β) and a threshold the small drifts below never reach
LOSS_JIT["vaco_big_delta"] = jax.jit(
    lambda lp, ref, adv, m: vaco_policy_loss(lp, ref, ref, adv, m, config=VACOConfig(delta=0.5))
)
GRAD_JIT["vaco_big_delta"] = jax.jit(jax.grad(lambda *a: LOSS_JIT["vaco_big_delta"](*a)[0]))


def random_inputs(seed, shape=(B, T), mask_prob=0.3, scale=0.5):
    rng = np.random.default_rng(seed)
    ref = f32(np.log(rng.uniform(0.05, 0.95, size=shape)))
    lp = f32(ref + scale * rng.normal(size=shape))
    adv = f32(rng.normal(size=shape))
    mask = rng.random(shape) >= mask_prob
    return lp, ref, adv, mask


# ----------------------------------------------------------------------------- worked examples

RATIOS = f32([2.0, 2.0, 0.5, 0.5])
ADVS = f32([1.0, -1.0, 1.0, -1.0])


def grad_wrt_log_probs(fn, lp, ref, adv):
    return np.asarray(jax.grad(lambda x: fn(x, ref, adv)[0])(lp))


def test_vaco_worked_example_tv_0375_masks_samples_0_and_3():
    lp, ref = f32(np.log(RATIOS)), np.zeros(4, np.float32)
    config = VACOConfig(delta=0.1)
    loss, metrics = vaco_policy_loss(lp, ref, ref, ADVS, config=config)
    # float32: r = exp(f32 log r) is within ~3u·r of (2, 2, ½, ½) (≤ 3.6e-7), so ½·mean|r − 1| within ≲ 2e-7
    assert float(metrics["tv_filter_estimate"]) == pytest.approx(0.375, abs=1e-6)
    assert float(metrics["tv"]) == pytest.approx(0.375, abs=1e-6)
    assert float(metrics["mask_fraction"]) == pytest.approx(0.5)  # exact: 2 of 4 flags, 2/4 exact in float32
    kept = tv_filter_mask(jnp.asarray(lp), ADVS, np.ones(4, bool), metrics["tv_filter_estimate"], 0.1)
    np.testing.assert_array_equal(kept, [False, True, True, False])
    # the masked samples carry no gradient, the kept ones the plain IS gradient −r A / N
    grad = grad_wrt_log_probs(lambda x, r, a: vaco_policy_loss(x, r, r, a, config=config), lp, ref, ADVS)
    # float32: kept entries −r·Â/4 with r within ~3u·r of 2 and ½ (≤ 1e-7 here); masked ones exactly 0
    np.testing.assert_allclose(grad, [0.0, 2.0 / 4, -0.5 / 4, 0.0], atol=1e-6)
    # float32: (2 + (−½))/4 from r's within ~3u·r: ≲ 1.5e-7 off, under the default rel 1e-6 (3.75e-7)
    assert float(loss) == pytest.approx(-(2.0 * -1.0 + 0.5 * 1.0) / 4)


def test_vaco_ratio_11_everywhere_masks_nothing():
    lp, ref = f32(np.log(np.full(4, 1.1))), np.zeros(4, np.float32)
    _, metrics = vaco_policy_loss(lp, ref, ref, ADVS, config=VACOConfig(delta=0.1))
    # float32: r = 1.1 within ~3u·1.1 ≈ 2e-7, so ½·mean|r − 1| = 0.05 within ≲ 1.5e-7
    assert float(metrics["tv_filter_estimate"]) == pytest.approx(0.05, abs=1e-6)
    assert float(metrics["mask_fraction"]) == 0.0
    assert float(metrics["filter_on"]) == 0.0


@given(seed=st.integers(0, 2**31 - 1))
def test_vaco_zero_lag_below_threshold_is_unclipped_is_policy_gradient(seed):
    """π_T = β (no backward lag) and D̂ ≤ δ: loss and gradient equal −mean(r Â)."""
    lp, ref, adv, mask = random_inputs(seed, scale=0.05)
    loss, metrics = LOSS_JIT["vaco_big_delta"](lp, ref, adv, mask)
    assert float(metrics["filter_on"]) == 0.0

    def is_pg(x):
        r = jnp.exp(x - ref)
        return -jnp.sum(jnp.where(mask, r * adv, 0.0)) / mask.sum()

    # float32, two programs: each mean of ≤ 15 terms r·Â (mean|r·Â| ≤ 1.8) errs ≤ 18·u·1.8, so ≲ 4e-6 apart
    np.testing.assert_allclose(loss, is_pg(lp), rtol=1e-5, atol=5e-6)
    # float32: elementwise −r·Â/N, no sum: a few roundings (≲ 4u ≈ 2.4e-7 relative); masked entries exactly 0
    np.testing.assert_allclose(GRAD_JIT["vaco_big_delta"](lp, ref, adv, mask), jax.grad(is_pg)(lp),
                               rtol=1e-5, atol=1e-7)



def test_vaco_threshold_conventions_tv_and_l1():
    """D̂ = 0.375: δ = 0.5 read as TV keeps all; read as an L1 budget (mean|r−1| = 0.75 > 0.5) filters."""
    lp, ref = f32(np.log(RATIOS)), np.zeros(4, np.float32)
    _, tv_metrics = vaco_policy_loss(lp, ref, ref, ADVS, config=VACOConfig(delta=0.5, threshold_convention="tv"))
    _, l1_metrics = vaco_policy_loss(lp, ref, ref, ADVS, config=VACOConfig(delta=0.5, threshold_convention="l1"))
    assert float(tv_metrics["mask_fraction"]) == 0.0
    assert float(l1_metrics["mask_fraction"]) == pytest.approx(0.5)
    assert VACOConfig(delta=0.5, threshold_convention="l1").tv_threshold == 0.25


def test_vaco_reference_selection_and_importance_weighted_tv():
    lp, pi_t, beta, adv, mask = *random_inputs(7)[:2], random_inputs(8)[1], *random_inputs(7)[2:]
    r_t = np.exp(lp - pi_t)
    r_b = np.exp(lp - beta)
    w = np.exp(pi_t - beta)
    for config, expected in [
        (VACOConfig(reference="learner_start"), 0.5 * np.abs(r_t - 1)[mask].mean()),
        (VACOConfig(reference="behaviour"), 0.5 * np.abs(r_b - 1)[mask].mean()),
        (VACOConfig(importance_weighted_tv=True), 0.5 * (w * np.abs(r_t - 1))[mask].mean()),
    ]:
        _, metrics = vaco_policy_loss(lp, pi_t, beta, adv, mask, config=config)
        # float32 both: means of 12 terms ≥ 0, each within 3u·r (Σr ≤ 3.8·Σ|r − 1|): ≲ (11 + 12)·u ≈ 1.4e-6 relative
        np.testing.assert_allclose(metrics["tv_filter_estimate"], expected, rtol=1e-5)
    _, metrics = vaco_policy_loss(lp, pi_t, beta, adv, mask)
    np.testing.assert_allclose(metrics["backward_ratio_mean"], w[mask].mean(), rtol=1e-5)  # same: 12 terms > 0


@given(seed=st.integers(0, 2**31 - 1))
def test_vaco_filter_keeps_exactly_the_inward_samples(seed):
    lp, ref, adv, mask = random_inputs(seed, scale=1.0, mask_prob=0.1)
    lp = np.where(np.random.default_rng(seed + 1).random(lp.shape) < 0.2, ref, lp)  # some unmoved tokens
    _, metrics = LOSS_JIT["vaco"](lp, ref, adv, mask)
    assert float(metrics["filter_on"]) == 1.0  # log-ratio scale 1 puts D̂ far above δ = 0.05
    grad = np.asarray(GRAD_JIT["vaco"](lp, ref, adv, mask))
    outward = mask & (adv * np.sign(lp - ref) > 0)
    np.testing.assert_array_equal(grad[outward], 0.0)
    inward = mask & ~outward & (adv != 0)
    # float32 elementwise −r·Â/N (no sum) on both sides: ≲ 4u ≈ 2.4e-7 relative; outward ones exactly 0
    np.testing.assert_allclose(grad[inward], (-np.exp(lp - ref) * adv / mask.sum())[inward], rtol=1e-5)
    unmoved = mask & (lp == ref) & (adv != 0)  # never masked: they get the plain gradient −Â/N
    np.testing.assert_allclose(grad[unmoved], (-adv / mask.sum())[unmoved], rtol=1e-5)


# ----------------------------------------------------------------------------- PPO family


def test_ppo_clip_matches_rlax_symmetric():
    lp, ref, adv, _ = random_inputs(3, shape=(16,), scale=0.4)
    ours, _ = ppo_clip_loss(lp, ref, adv, config=PPOClipConfig(0.2, 0.2))
    expected = rlax.clipped_surrogate_pg_loss(jnp.exp(lp - ref), adv, 0.2)
    # float32, both: a mean of 16 terms (mean|ℓ| = 0.86) errs ≤ (15 + 3)·u·0.86 ≈ 9e-7 each, ≲ 1.8e-6 apart
    assert abs(float(ours) - float(expected)) <= 2e-6


@given(seed=st.integers(0, 2**31 - 1))
def test_ppo_clip_asymmetric_dual_clip_matches_numpy(seed):
    lp, ref, adv, mask = random_inputs(seed, scale=1.0)
    adv = f32(adv * 2)
    loss, metrics = LOSS_JIT["ppo_clip"](lp, ref, adv, mask)
    r = np.exp(lp.astype(np.float64) - ref)
    obj = np.minimum(r * adv, np.clip(r, 0.8, 1.28) * adv)
    obj = np.where(adv < 0, np.maximum(obj, 3.0 * adv), obj)
    # float32 vs float64: mean of ≤ 15 terms, mean|ℓ| ≤ 5.6 (|ℓ| ≤ 3|Â|): ≤ (14 + 8)·u·5.6 ≈ 7e-6
    np.testing.assert_allclose(loss, -obj[mask].mean(), rtol=1e-5, atol=1e-5)
    clipped = ((adv > 0) & (r > 1.28)) | ((adv < 0) & (r < 0.8))
    dual = (adv < 0) & (r > 3.0)
    # exact counts (a flag differs only for r within ~1e-6 of an edge); count/N in float32: ≤ u ≪ rel 1e-6
    assert float(metrics["clip_fraction"]) == pytest.approx(clipped[mask].mean())
    assert float(metrics["dual_clip_fraction"]) == pytest.approx(dual[mask].mean())
    # analytic gradient: −r A / N where neither clip is active, 0 elsewhere
    expected_grad = np.where(mask & ~clipped & ~dual, -r * adv / mask.sum(), 0.0)
    # float32 vs float64, elementwise (no sum): r from f32 log r (|log r| ≲ 4) and ≤ 3 products: ≲ 8u ≈ 5e-7 relative
    np.testing.assert_allclose(GRAD_JIT["ppo_clip"](lp, ref, adv, mask), expected_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("estimator", ["k1", "k2", "k3"])
def test_ppo_kl_value_and_analytic_gradient(estimator):
    lp, ref, adv, mask = random_inputs(4)
    beta = 0.7
    loss, metrics = ppo_kl_loss(lp, ref, adv, mask, kl_coef=beta, config=PPOKLConfig(estimator))
    log_r = lp.astype(np.float64) - ref
    r = np.exp(log_r)
    penalty = {"k1": -log_r, "k2": 0.5 * log_r**2, "k3": r - 1 - log_r}[estimator]
    dpenalty = {"k1": -np.ones_like(r), "k2": log_r, "k3": r - 1}[estimator]
    # float32 vs float64, seed 4: mean of 13 terms, mean|r·Â| + β·mean|k| ≤ 1.2, |loss| ≥ 0.32: ≤ 18·u·1.2/0.32 ≈ 4e-6
    np.testing.assert_allclose(loss, (-r * adv + beta * penalty)[mask].mean(), rtol=1e-5)
    # mean|k| ≤ 0.55 (mean|log r|): ≤ 18·u·0.55 ≈ 6e-7 absolute, under atol + rtol·|mean k| ≥ 1e-6 (mean k ≥ 0.093)
    np.testing.assert_allclose(metrics["kl_penalty"], penalty[mask].mean(), rtol=1e-5, atol=1e-7)
    grad = jax.grad(lambda x: ppo_kl_loss(x, ref, adv, mask, kl_coef=beta, config=PPOKLConfig(estimator))[0])(lp)
    # float32 elementwise (−r·Â + β·k′)/N: ≲ 4u·(|r·Â| + β|k′|)/N ≤ 6e-8, and every valid |grad| ≥ 0.011 here
    np.testing.assert_allclose(grad, np.where(mask, (-r * adv + beta * dpenalty) / mask.sum(), 0), rtol=1e-4,
                               atol=1e-7)


def test_ppo_kl_coefficient_can_be_traced_for_the_adaptive_rule():
    lp, ref, adv, mask = random_inputs(5)
    fn = jax.jit(lambda c: ppo_kl_loss(lp, ref, adv, mask, kl_coef=c)[0])
    # float32, jit vs eager: a mean of 11 terms (mean|ℓ| ≤ 0.84) errs ≤ 14·u·0.84 each; 2× that / |loss| 0.39 ≈ 3.6e-6
    np.testing.assert_allclose(fn(jnp.float32(0.3)), ppo_kl_loss(lp, ref, adv, mask, kl_coef=0.3)[0], rtol=5e-6)


def test_adaptive_kl_coefficient_rule():
    config = AdaptiveKLConfig(target=0.01)  # exact: ×/÷ 2 of 1.0; the d's are ≥ 20% away from the thresholds
    assert float(adaptive_kl_coefficient(1.0, 0.001, config)) == 0.5  # d < d_targ / 1.5
    assert float(adaptive_kl_coefficient(1.0, 0.02, config)) == 2.0  # d > d_targ * 1.5
    assert float(adaptive_kl_coefficient(1.0, 0.012, config)) == 1.0
    assert float(jax.jit(adaptive_kl_coefficient, static_argnums=2)(1.0, 0.02, config)) == 2.0


def test_spo_value_gradient_and_optimum():
    lp, ref, adv, mask = random_inputs(6, scale=0.4)
    eps = 0.2
    loss, metrics = spo_loss(lp, ref, adv, mask, config=SPOConfig(eps))
    r = np.exp(lp.astype(np.float64) - ref)
    obj = r * adv - np.abs(adv) / (2 * eps) * (r - 1) ** 2
    # float32 vs float64: 8 terms of mean size 1.35 cancel to −0.021: ≤ (7 + 6)·u·1.35 ≈ 1e-6 absolute, hence atol
    np.testing.assert_allclose(loss, -obj[mask].mean(), rtol=1e-5, atol=2e-6)
    dobj = r * adv - np.abs(adv) / eps * (r - 1) * r  # d obj / d log π
    grad = jax.grad(lambda x: spo_loss(x, ref, adv, mask, config=SPOConfig(eps))[0])(lp)
    # float32 elementwise: ≲ 6u·(|r·Â| + |Â|/ε·|r − 1|·r)/N, ≥ 25× inside rtol·|grad| + atol for every entry here
    np.testing.assert_allclose(grad, np.where(mask, -dobj / mask.sum(), 0), rtol=1e-4, atol=1e-7)
    # exact count: every |r − 1| is ≥ 0.036 from ε here; count/N in float32 ≤ u ≪ rel 1e-6
    assert float(metrics["clip_fraction"]) == pytest.approx((np.abs(r - 1) > eps)[mask].mean())
    # per-sample objective is maximised at r = 1 + ε sign(A)
    grid = np.linspace(0.5, 1.5, 1001)
    for a in (1.0, -1.0):
        values = [-float(spo_loss(f32([np.log(g)]), f32([0.0]), f32([a]), config=SPOConfig(eps))[0]) for g in grid[::50]]
        # float64 grid point vs 1 ± ε: ≲ 1e-15; neighbours 0.05 away score 6e-3 lower, ≫ float32 rounding
        assert grid[::50][int(np.argmax(values))] == pytest.approx(1 + eps * a)


def test_impala_loss_and_gradient():
    lp, ref, adv, mask = random_inputs(9)
    loss, metrics = impala_policy_gradient_loss(lp, ref, adv, mask)
    # float32 both (NumPy gets float32): 8 terms, mean|Â·log π| 0.67, |loss| 0.117: ≤ 2·9·u·0.67/0.117 ≈ 6e-6
    np.testing.assert_allclose(loss, -(adv * lp)[mask].mean(), rtol=1e-5)
    grad = jax.grad(lambda x: impala_policy_gradient_loss(x, ref, adv, mask)[0])(lp)
    np.testing.assert_allclose(grad, np.where(mask, -adv / mask.sum(), 0), rtol=1e-5)  # elementwise: ≤ 2u
    # float32 both: mean|log r| 0.49, |kl_k1| 0.139: ≤ 2·8·u·0.49/0.139 ≈ 3.4e-6
    np.testing.assert_allclose(metrics["kl_k1"], -(lp - ref)[mask].mean(), rtol=1e-5)


def test_dppo_binary_tv_mask_matches_numpy():
    lp, ref, adv, mask = random_inputs(10, scale=0.8)
    config = DPPOBinaryTVConfig(delta_low=0.05, delta_high=0.1)
    loss, metrics = dppo_binary_tv_loss(lp, ref, adv, mask, config=config)
    change = np.exp(lp.astype(np.float64)) - np.exp(ref)
    masked = ((adv > 0) & (change > 0.1)) | ((adv < 0) & (change < -0.05))
    kept = mask & ~masked
    r = np.exp(lp.astype(np.float64) - ref)
    # float32 vs float64: Σ|ℓ|/N = 0.34, |loss| 0.187: ≤ 18·u·0.34/0.187 ≈ 2e-6
    np.testing.assert_allclose(loss, -np.where(kept, r * adv, 0).sum() / mask.sum(), rtol=1e-5)
    # exact count: every Δπ is ≥ 0.034 from a threshold here; count/N in float32 ≤ u ≪ rel 1e-6
    assert float(metrics["mask_fraction"]) == pytest.approx((mask & masked).sum() / mask.sum())
    grad = jax.grad(lambda x: dppo_binary_tv_loss(x, ref, adv, mask, config=config)[0])(lp)
    # float32 elementwise −r·Â/N (no sum): ≲ 6u ≈ 4e-7 relative ≪ rtol; unkept entries exactly 0
    np.testing.assert_allclose(grad, np.where(kept, -r * adv / mask.sum(), 0), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_gradient_matches_finite_differences(name):
    """jax.grad vs central finite differences, away from clip / mask boundaries."""
    lp, ref, adv, _ = random_inputs(12, shape=(6,), scale=0.02)
    fn = LOSSES[name]
    # float32 central differences, eps 1e-3: rounding ≲ 20·u·|ℓ|/eps ≈ 1e-3·|ℓ|, truncation ~eps²; kinks ≫ eps away
    check_grads(lambda x: fn(x, ref, adv)[0], (jnp.asarray(lp, jnp.float32),), order=1, modes=["rev"],
                atol=1e-2, rtol=1e-2, eps=1e-3)


# ----------------------------------------------------------------------------- properties


@pytest.mark.parametrize("name", sorted(LOSSES))
@given(seed=st.integers(0, 2**31 - 1), garbage=st.sampled_from([np.nan, 1e4, -1e4]))
def test_masked_token_never_changes_loss_or_gradient(name, seed, garbage):
    lp, ref, adv, mask = random_inputs(seed)
    dirty = [np.where(mask, x, np.float32(garbage)).astype(np.float32) for x in (lp, ref, adv)]
    loss, metrics = LOSS_JIT[name](lp, ref, adv, mask)
    dirty_loss, dirty_metrics = LOSS_JIT[name](*dirty, mask)
    # exact: the same compiled program on inputs that are equal once masked entries are replaced by 0
    np.testing.assert_array_equal(loss, dirty_loss)
    for key in metrics:
        np.testing.assert_array_equal(metrics[key], dirty_metrics[key], err_msg=key)
    grad, dirty_grad = GRAD_JIT[name](lp, ref, adv, mask), GRAD_JIT[name](*dirty, mask)
    np.testing.assert_array_equal(grad, dirty_grad)
    np.testing.assert_array_equal(np.asarray(dirty_grad)[~mask], 0.0)


@pytest.mark.parametrize("name", sorted(LOSSES))
@given(seed=st.integers(0, 2**31 - 1))
def test_loss_is_invariant_to_sample_order_and_returns_scalars(name, seed):
    lp, ref, adv, mask = random_inputs(seed)
    perm = np.random.default_rng(seed).permutation(B * T)
    shuffled = [x.reshape(-1)[perm].reshape(B, T) for x in (lp, ref, adv, mask)]
    loss, metrics = LOSS_JIT[name](lp, ref, adv, mask)
    shuffled_loss, _ = LOSS_JIT[name](*shuffled)
    # float32 sums of ≤ 15 terms in two orders: ≤ 2·18·u·mean|ℓ| ≤ 6.6e-6 (mean|ℓ| ≤ 3.1; SPO's bigger ℓ are its
    # positive penalty, so rtol covers them)
    np.testing.assert_allclose(loss, shuffled_loss, rtol=1e-5, atol=1e-5)
    assert loss.shape == () and all(v.shape == () for v in metrics.values())
    assert all(np.isfinite(v) for v in metrics.values())
    for key in ("active_fraction", "tv", "kl_k1", "kl_k3", "ess"):
        assert key in metrics


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_all_masked_gives_zero_loss_and_finite_metrics(name):
    lp, ref, adv, _ = random_inputs(0)
    loss, metrics = LOSSES[name](lp, ref, adv, np.zeros((B, T), bool))
    assert float(loss) == 0.0  # exact: a sum of zeros over max(0, 1)
    assert all(np.isfinite(v) for v in metrics.values())


def test_losses_work_under_jit_and_vmap():
    inputs = [random_inputs(s) for s in range(2)]
    stacked = [np.stack(x) for x in zip(*inputs)]
    for name, fn in LOSSES.items():
        batched, _ = jax.jit(jax.vmap(fn))(*stacked)
        # float32, two programs, seed 1: 10 terms, mean|ℓ| ≤ 1.2 where |loss| < 0.2: ≤ 2·13·u·1.2 ≈ 1.9e-6
        np.testing.assert_allclose(batched[1], fn(*inputs[1])[0], rtol=1e-5, atol=2e-6, err_msg=name)


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: PPOClipConfig(epsilon_low=-0.1), "epsilon_low"),
        (lambda: PPOClipConfig(epsilon_low=1.0), "epsilon_low"),
        (lambda: PPOClipConfig(epsilon_high=-0.1), "epsilon_high"),
        (lambda: PPOClipConfig(dual_clip=1.0), "dual_clip"),
        (lambda: PPOKLConfig("k4"), "kl_estimator"),
        (lambda: AdaptiveKLConfig(target=0.0), "target"),
        (lambda: AdaptiveKLConfig(target=0.01, tolerance=0.5), "tolerance"),
        (lambda: AdaptiveKLConfig(target=0.01, factor=0.5), "factor"),
        (lambda: SPOConfig(epsilon=0.0), "epsilon"),
        (lambda: VACOConfig(delta=0.0), "delta"),
        (lambda: VACOConfig(delta=-1.0), "delta"),
        (lambda: VACOConfig(threshold_convention="kl"), "threshold_convention"),
        (lambda: VACOConfig(reference="pi_old"), "reference"),
        (lambda: VACOConfig(reference="behaviour", importance_weighted_tv=True), "importance_weighted_tv"),
        (lambda: DPPOBinaryTVConfig(delta_low=0.0, delta_high=0.1), "delta_low"),
        (lambda: DPPOBinaryTVConfig(delta_low=0.1, delta_high=1.5), "delta_high"),
        (lambda: ppo_kl_loss(*random_inputs(0), kl_coef=-1.0), "kl_coef"),
    ],
)
def test_bad_configuration_raises_value_error_naming_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_bad_shapes_and_dtypes_fail_with_chex_messages():
    lp, ref, adv, mask = random_inputs(0)
    with pytest.raises(AssertionError, match="shape"):
        ppo_clip_loss(lp, ref[:, :-1], adv)
    with pytest.raises(AssertionError):
        ppo_clip_loss(lp, ref, adv, mask.astype(np.float32))
    with pytest.raises(AssertionError):
        vaco_policy_loss(lp.astype(np.int32), ref, ref, adv)
    with pytest.raises(AssertionError, match="rank"):
        spo_loss(np.float32(0.0), np.float32(0.0), np.float32(1.0))


@pytest.mark.parametrize("name", sorted(LOSSES))
@given(shape=st.sampled_from([(4,), (2, 3), (1, 2, 3)]), seed=st.integers(0, 2**31 - 1))
def test_any_rank_gives_scalar_loss_and_zero_gradient_on_masked(name, shape, seed):
    lp, ref, adv, mask = random_inputs(seed, shape=shape)
    loss, metrics = LOSSES[name](lp, ref, adv, mask)
    grad = jax.grad(lambda x: LOSSES[name](x, ref, adv, mask)[0])(lp)
    assert loss.shape == () and grad.shape == shape
    assert np.isfinite(float(loss)) and np.all(np.isfinite(grad))
    np.testing.assert_array_equal(np.asarray(grad)[~mask], 0.0)  # exact: masked by where before any arithmetic
