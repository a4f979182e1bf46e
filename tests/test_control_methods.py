"""The method registry's fairness settings: the unbiased centred baseline (exact enumeration over a
categorical policy, against plain NumPy), VACO's two δ conventions at their exact float32
boundaries, passes per batch (the pass scan's length; Adam's step count), the method table, the PPO-KL
presets, configuration errors, and IMPALA (one pass, scale-only advantages) learning CartPole.
"""
import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fresh_rl.control import METHODS, HyperParams, Method, TrainConfig, train
from fresh_rl.control.methods import centring_weight, method_table, method_table_markdown
from fresh_rl.control.presets import (KL_COEFS, VACO_SCALES, Scale, headline_index, study_variants, swept_field,
                                      variant_config, variant_grid)
from fresh_rl.control.losses import normalize_advantages
from fresh_rl.corrections import VACOConfig
from fresh_rl.lag import DelayConfig

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(env_name="CartPole-v1", num_envs=4, rollout_length=8, total_env_steps=4 * 8 * 3,
            num_epochs=3, num_minibatches=2, hidden_sizes=(8,))
K = 5  # actions of the categorical example


# --------------------------------------------------------------------------- centred baseline

def _numpy_extra_gradient(theta, log_beta, log_pi_t, form, reference, baseline):
    """E_{a~β}[b(a)·w(a)·∇_θ log π_θ(a)] in float64 by enumeration, π_θ = softmax(θ):
    ∇_θ log π_θ(a) = e_a − π_θ; w = π_θ/π_ref (ratio losses) or 1 (−Â·log π_θ);
    b = π_θ/(β·w) (centred_ratio) or 1 (plain centring)."""
    pi = np.exp(theta - theta.max())
    pi /= pi.sum()
    beta, pi_t = np.exp(log_beta), np.exp(log_pi_t)
    ref = beta if reference == "behaviour" else pi_t
    w = np.ones(K) if form == "log_prob" else pi / ref
    b = pi / (beta * w) if baseline == "centered_ratio" else np.ones(K)
    return sum(beta[a] * b[a] * w[a] * (np.eye(K)[a] - pi) for a in range(K))


def _ratio_bound(theta, log_beta, log_pi_t):
    """M = max(1, π_θ/β, π_θ/π_T): bounds every weight β·b·w and PPO-KL's (r − 1) term per action."""
    pi = np.exp(theta - theta.max())
    pi /= pi.sum()
    return max(1.0, np.max(pi / np.exp(log_beta)), np.max(pi / np.exp(log_pi_t)))


@jax.jit
def _jax_extra_gradients(theta, log_beta, log_pi_t):
    """Per method: the gradient of its real policy loss from the baseline term alone, summed over
    actions with weights β(a) (a minibatch holding every action once, advantage K·β(a)·b(a);
    the Â = 0 loss is subtracted so non-linear terms such as PPO-KL's penalty cancel)."""
    hp = HyperParams.from_config(TrainConfig(**TINY))
    out = {}
    for name in ("impala", "vaco_align_only", "ppo_kl"):
        method = METHODS[name]
        ref = log_beta if method.default_route == "behaviour" else log_pi_t
        config = TrainConfig(**{**TINY, "num_minibatches": 1}, method=name)

        def loss(th, adv, method=method, ref=ref, config=config):
            logp = jax.nn.log_softmax(th)
            mb = {"advantage": adv, "reference_log_prob": ref, "behaviour_log_prob": log_beta,
                  "learner_log_prob": log_pi_t}
            return method.policy_loss(logp, mb, hp, config)[0]

        logp = jax.nn.log_softmax(theta)
        weights = {"centered_ratio": centring_weight(method, logp, ref, log_beta), "standardize": jnp.ones(K)}
        zero = jax.grad(loss)(theta, jnp.zeros(K))
        for kind, b in weights.items():
            # ∇ of −mean(Â·…) with Â = −K·β·b: + Σ_a β b w ∇log π, the term subtracting c·b adds (c = 1)
            out[name, kind] = jax.grad(loss)(theta, -K * jnp.exp(log_beta) * b) - zero
    return out


def _logits(draw):
    return np.asarray(draw(st.lists(st.floats(-2.0, 2.0), min_size=K, max_size=K)), np.float64)


@settings(max_examples=15, deadline=None)
@given(st.data())
def test_centred_ratio_baseline_adds_no_expected_gradient_by_exact_enumeration(data):
    theta, beta_logits, pi_t_logits = (_logits(data.draw) for _ in range(3))
    log_beta = beta_logits - np.log(np.exp(beta_logits).sum())
    log_pi_t = pi_t_logits - np.log(np.exp(pi_t_logits).sum())
    grads = _jax_extra_gradients(*(jnp.asarray(x, jnp.float32) for x in (theta, log_beta, log_pi_t)))
    # float32 inputs, exp and log-softmax make each summed term (β·b·w, PPO-KL's (r − 1)/K, all ≤ M)
    # ≲ 50 u ≈ 3e-6 relative off, so entries move by ≲ 3e-6·M, M ≤ 0.93/0.0046 ≈ 200 at logits in
    # [−2, 2] (the old fixed 2e-5 was below that): atol 2e-5 + 5e-6·M
    atol = 2e-5 + 5e-6 * _ratio_bound(theta, log_beta, log_pi_t)
    for name in ("impala", "vaco_align_only", "ppo_kl"):
        method = METHODS[name]
        for kind in ("centered_ratio", "standardize"):
            expected = _numpy_extra_gradient(theta, log_beta, log_pi_t, method.loss_form, method.default_route, kind)
            np.testing.assert_allclose(grads[name, kind], expected, atol=atol, err_msg=(name, kind))
        # the centred baseline is unbiased for every loss form and reference (float64: terms ≤ M·1,
        # a handful of roundings, ≲ 1e-13)
        np.testing.assert_allclose(_numpy_extra_gradient(theta, log_beta, log_pi_t, method.loss_form,
                                                         method.default_route, "centered_ratio"), 0.0, atol=1e-12)
    # plain centring: unbiased for a ratio against β (PPO-KL), biased for IMPALA and a ratio against π_T
    np.testing.assert_allclose(grads["ppo_kl", "standardize"], 0.0, atol=atol)
    pi = np.exp(theta - theta.max()) / np.exp(theta - theta.max()).sum()
    # IMPALA's plain-centring bias is exactly β − π (float64), so > 0.05 here implies > 1e-3 below
    if np.abs(pi - np.exp(log_beta)).max() > 0.05:  # π_θ ≠ β by a margin float32 resolves
        assert np.abs(_numpy_extra_gradient(theta, log_beta, log_pi_t, "log_prob", "behaviour",
                                            "standardize")).max() > 1e-3


def test_plain_centring_is_biased_on_a_fixed_example():
    """A hand-checkable case: β uniform over 5 actions, π_θ puts half its mass on action 0."""
    theta = np.log(np.array([4.0, 1.0, 1.0, 1.0, 1.0]))
    log_beta = np.full(K, -np.log(K))
    # E_β[∇log π] = Σ_a β(a)(e_a − π) = β − π = (0.2 − 0.5, 0.2 − 0.125, …); float64: default rtol 1e-7
    np.testing.assert_allclose(_numpy_extra_gradient(theta, log_beta, log_beta, "log_prob", "behaviour",
                                                     "standardize"), [-0.3, 0.075, 0.075, 0.075, 0.075])
    grads = _jax_extra_gradients(*(jnp.asarray(x, jnp.float32) for x in (theta, log_beta, log_beta)))
    # float32, every term ≤ 1 (M = 2.5, β and π ≥ 0.125): a few roundings of O(1) terms, ≲ 10 u ≈ 6e-7
    np.testing.assert_allclose(grads["impala", "standardize"], [-0.3, 0.075, 0.075, 0.075, 0.075], atol=1e-6)
    np.testing.assert_allclose(grads["impala", "centered_ratio"], 0.0, atol=1e-6)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.floats(-3, 3), st.floats(-1.5, 1.5), st.floats(-1.5, 1.5)), min_size=2, max_size=12))
def test_normalize_advantages_matches_numpy(rows):
    adv, log_p, log_b = (np.asarray(c, np.float32) for c in zip(*rows))
    log_t = np.zeros_like(adv)
    std = adv.std() + 1e-8
    # float32 vs NumPy: Â − mean Â and Â − c·b cancel to ≲ (n + n^1.5)·u·max|Â| ≈ 3e-6·max|Â| per side
    # (n ≤ 12, |c·b| ≤ ‖Â‖), then ÷σ: atol grows with cond = max|Â|/σ (O(1) unless Â is near-constant)
    cond = np.abs(adv).max() / std
    for method, log_ref in (("impala", log_b), ("vaco", log_t), ("ppo_clip", log_b)):
        mb = {"advantage": jnp.asarray(adv), "reference_log_prob": jnp.asarray(log_ref),
              "behaviour_log_prob": jnp.asarray(log_b)}
        numerator = log_p if METHODS[method].loss_form == "log_prob" else log_ref
        b = np.exp(numerator.astype(np.float64) - log_b)
        c = (adv * b).sum() / max((b * b).sum(), 1e-8)
        expected = {"none": adv, "scale": adv / std, "standardize": (adv - adv.mean()) / std,
                    "centered_ratio": (adv - c * b) / std}
        for kind, want in expected.items():
            config = TrainConfig(**TINY, method=method, advantage_normalization=kind)
            got = normalize_advantages(config, mb, jnp.asarray(log_p))
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=(2e-4 + 1e-5 * cond) * (1 + np.abs(want).max()),
                                       err_msg=(method, kind))
    # b ≡ 1 for a ratio against β: centred_ratio is standardize
    config = TrainConfig(**TINY, method="ppo_clip")
    mb = {"advantage": jnp.asarray(adv), "reference_log_prob": jnp.asarray(log_b),
          "behaviour_log_prob": jnp.asarray(log_b)}
    # b = exp(0) = 1 exactly, so c = Σ Â·1 / Σ 1 is mean Â up to the order of one float32 sum of n ≤ 12
    # terms (XLA may fuse Â·b into its reduction): |c − mean Â| ≲ n·u·max|Â| ≈ 7e-7·max|Â|, which ÷σ
    # becomes ≲ 7e-7·cond; near-constant Â (σ ≪ |Â|) makes cond large
    np.testing.assert_allclose(
        normalize_advantages(TrainConfig(**TINY, method="ppo_clip", advantage_normalization="centered_ratio"),
                              mb, jnp.asarray(log_p)),
        normalize_advantages(config, mb, jnp.asarray(log_p)), rtol=1e-5, atol=1e-5 + 2e-6 * cond)


# --------------------------------------------------------------------------- VACO's δ conventions

def _log_of(target: float) -> np.float32:
    """A float32 x with ``jnp.exp(x) == target`` exactly (searched among x's neighbours).

    Searched with this machine's ``jnp.exp``, so the boundary checks below stay exact on any XLA
    target (the loss computes ``exp(x − 0)`` elementwise, the same op on the same value)."""
    x = lo = hi = np.float32(np.log(target))
    candidates = [x]
    for _ in range(64):
        lo, hi = np.nextafter(lo, np.float32(-np.inf)), np.nextafter(hi, np.float32(np.inf))
        candidates += [lo, hi]
    xs = np.asarray(candidates, np.float32)
    hits = xs[np.asarray(jnp.exp(jnp.asarray(xs))) == np.float32(target)]
    assert hits.size, target
    return hits[0]


def _vaco_metrics(method: str, ratio: np.float32, delta: float):
    """The registered loss on four samples, all with ratio π_θ/π_T = ``ratio`` (exact in float32)
    and advantages (+1, −1, +1, −1): when the filter is on, the two Â > 0 samples are masked."""
    config = TrainConfig(**TINY, method=method)
    x = _log_of(float(ratio))
    logp = jnp.full((4,), x, jnp.float32)
    mb = {"advantage": jnp.asarray([1.0, -1.0, 1.0, -1.0]), "learner_log_prob": jnp.zeros(4),
          "behaviour_log_prob": jnp.zeros(4), "reference_log_prob": jnp.zeros(4)}
    hp = HyperParams.from_config(config).replace(vaco_delta=jnp.float32(delta))
    return jax.tree.map(float, METHODS[method].policy_loss(logp, mb, hp, config)[1])


def test_vaco_tv_and_l1_filter_exactly_above_their_thresholds():
    at = np.float32(1.5)  # |r − 1| = 0.5 for every sample: D̂ = 0.25, mean|r − 1| = 0.5, exact
    above = np.nextafter(at, np.float32(2))  # |r − 1| = 0.5 + 2⁻²³: D̂ = 0.25 + 2⁻²⁴ (exact)
    for method, delta in (("vaco_tv", 0.25), ("vaco_l1", 0.5)):
        m = _vaco_metrics(method, at, delta)
        assert m["tv_filter_estimate"] == 0.25
        assert (m["filter_on"], m["mask_fraction"]) == (0.0, 0.0), method  # at the boundary: off
        m = _vaco_metrics(method, above, delta)
        assert m["tv_filter_estimate"] == 0.25 + 2.0 ** -24
        assert (m["filter_on"], m["mask_fraction"]) == (1.0, 0.5), method  # just above: on
    # the conventions differ by a factor 2: l1's δ = 0.25 filters where tv's does not
    assert _vaco_metrics("vaco_l1", at, 0.25)["filter_on"] == 1.0
    # "vaco" reads the config's convention (default tv): identical to vaco_tv
    assert _vaco_metrics("vaco", above, 0.25) == _vaco_metrics("vaco_tv", above, 0.25)
    assert _vaco_metrics("vaco", at, 0.25) == _vaco_metrics("vaco_tv", at, 0.25)


# --------------------------------------------------------------------------- passes, table, presets

def test_passes_per_batch_resolution():
    assert TrainConfig(**TINY, method="impala").passes_per_batch_used == 1
    assert TrainConfig(**TINY, method="ppo_clip").passes_per_batch_used == TINY["num_epochs"]
    assert TrainConfig(**TINY, method="vaco", passes_per_batch=2).passes_per_batch_used == 2
    assert TrainConfig(**TINY, method="impala", passes_per_batch=2).passes_per_batch_used == 2
    assert TrainConfig(**TINY, method="impala").advantage_normalization_used == "scale"


def _adam_steps(opt_state) -> int:
    """Adam's update counter (one value for every seed of a vmapped run)."""
    adam = [s for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(s, optax.ScaleByAdamState))
            if isinstance(s, optax.ScaleByAdamState)]
    (count,) = {int(c) for s in adam for c in np.ravel(s.count)}
    return count


def _scan_lengths(jaxpr) -> list[int]:
    """Lengths of every ``scan`` in a (closed) jaxpr, nested ones included."""
    lengths = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            lengths.append(eqn.params["length"])
        for sub in jax.core.jaxprs_in_params(eqn.params):
            lengths += _scan_lengths(sub)
    return lengths


def test_passes_per_batch_sets_the_number_of_sgd_passes():
    """The program's pass scan has ``passes_per_batch_used`` steps: the override (5) beats
    num_epochs (6); without it, num_epochs. (Traced, not compiled; IMPALA's default of one pass
    is counted by Adam's step counter in its acceptance test below.) The other scans of this
    program have lengths 2, 3, 4 and 8."""
    base = dict(TINY, num_epochs=6)
    for passes, want, absent in ((5, 5, 6), (None, 6, 5)):
        config = TrainConfig(**base, method="ppo_clip", passes_per_batch=passes)
        lengths = _scan_lengths(jax.make_jaxpr(lambda key: train(config, key))(jax.random.PRNGKey(0)).jaxpr)
        assert want in lengths and absent not in lengths, (passes, lengths)


def test_method_table_covers_every_method_and_is_in_the_docs():
    rows = {row["method"]: row for row in method_table()}
    assert set(rows) == set(METHODS)
    assert rows["impala"]["passes per batch"] == "1" and rows["impala"]["normalisation"] == "scale"
    assert rows["ppo_clip"]["passes per batch"] == "num_epochs"
    assert "l1" in rows["vaco_l1"]["loss hyperparameters"] and "tv" in rows["vaco_tv"]["loss hyperparameters"]
    assert method_table_markdown() in (ROOT / "docs/vaco.md").read_text()


def test_ppo_kl_presets_adaptive_and_fixed_beta_grid():
    scale = Scale(tasks=VACO_SCALES["ci"].tasks, lags=(0, 4), num_seeds=2,
                  methods=("ppo_kl_adaptive", "ppo_kl_fixed", "ppo_kl", "vaco"), ablations=())
    task = scale.tasks[0]
    variants = {name: (method, overrides, values) for name, method, overrides, values in study_variants(scale, task)}
    configs = {name: variant_config(task, m, o, ring_size=5) for name, (m, o, _) in variants.items()}
    assert configs["ppo_kl_adaptive"].kl_adaptive.target == 0.01
    assert configs["ppo_kl"] == configs["ppo_kl_adaptive"]  # the old name, kept for saved results
    assert configs["ppo_kl_fixed"].kl_adaptive is None and configs["ppo_kl_fixed"].method == "ppo_kl"
    assert variants["ppo_kl_fixed"][2] == KL_COEFS == (0.01, 0.03, 0.1, 0.3, 1.0)
    assert swept_field(configs["ppo_kl_fixed"]) == "kl_coef"
    assert swept_field(configs["ppo_kl_adaptive"]) == swept_field(configs["vaco"]) == "vaco_delta"
    grid, hp = variant_grid(configs["ppo_kl_fixed"], (0, 4), KL_COEFS, num_seeds=2, seed=0)
    # copies of float32(KL_COEFS); float32(0.2) is < u from 0.2: both within the default rtol 1e-7
    np.testing.assert_allclose(np.asarray(hp.kl_coef).reshape(2, 5, 2), np.tile(np.float32(KL_COEFS)[:, None], (2, 1, 2)))
    np.testing.assert_allclose(hp.vaco_delta, configs["ppo_kl_fixed"].vaco.delta)
    # reported value: the fixed-β grid's best at lag 0 (diverged runs never win); VACO's δ = 0.2
    finals = np.zeros((2, 5, 2))
    finals[0, 2] = 100.0
    finals[0, 3] = [500.0, np.nan]
    finals[1, 4] = 400.0  # best at lag 4 only: not chosen
    assert headline_index("ppo_kl_fixed", KL_COEFS, finals) == 2
    assert headline_index("vaco", (0.05, 0.1, 0.2, 0.4), np.zeros((2, 4, 2))) == 2
    assert headline_index("ppo_clip", (0.2,), np.zeros((2, 1, 2))) == 0


@pytest.mark.parametrize("build, field", [
    (lambda: TrainConfig(**TINY, method="trpo"), "method"),
    (lambda: TrainConfig(**TINY, passes_per_batch=0), "passes_per_batch"),
    (lambda: TrainConfig(**TINY, passes_per_batch=1.5), "passes_per_batch"),
    (lambda: TrainConfig(**TINY, advantage_normalization="centred"), "advantage_normalization"),
    (lambda: TrainConfig(**TINY, method="vaco_tv", vaco=VACOConfig(threshold_convention="l1")),
     "vaco.threshold_convention"),
    (lambda: Method("x", lambda *a: None, passes_per_batch=0), "Method.passes_per_batch"),
    (lambda: Method("x", lambda *a: None, loss_form="ratio2"), "Method.loss_form"),
    (lambda: Method("x", lambda *a: None, loss_config=("",)), "Method.loss_config"),
    (lambda: Method("x", lambda *a: None, threshold_convention="kl"), "Method.threshold_convention"),
    (lambda: Method("x", lambda *a: None, default_normalization="whiten"), "Method.default_normalization"),
])
def test_bad_configuration_names_the_field(build, field):
    with pytest.raises(ValueError, match=re.escape(field)):
        build()


# --------------------------------------------------------------------------- IMPALA learns CartPole

IMPALA_CARTPOLE = TrainConfig(
    env_name="CartPole-v1", method="impala", num_envs=16, rollout_length=32, num_minibatches=4,
    learning_rate=3e-3, hidden_sizes=(32, 32), total_env_steps=16 * 32 * 60, delay=DelayConfig.fixed(0, 1))


def test_impala_one_pass_scale_only_learns_cartpole_at_lag_zero():
    """IMPALA's own definition: one pass per batch, advantages scaled, not centred. Measured:
    the 3-seed mean of the last 5 iterations reaches 150 after ~13k env steps and was 235–370
    over four other 3-seed groups at this budget (30 720 env steps)."""
    config = IMPALA_CARTPOLE
    assert (config.passes_per_batch_used, config.advantage_normalization_used) == (1, "scale")
    out = jax.jit(jax.vmap(train, in_axes=(None, 0)), static_argnums=0)(config, jax.random.split(jax.random.PRNGKey(0), 3))
    ret = np.asarray(out.metrics["episode_return"])
    initial, final = ret[:, :2].mean(), ret[:, -5:].mean()
    print(f"IMPALA CartPole: initial {initial:.1f}, final {final:.1f}, per seed {ret[:, -5:].mean(1).round(1)}")
    # random CartPole ≈ 22; 150 sits 85 below the weakest measured 3-seed group (235), 7× above random
    assert initial < 40.0 and final >= 150.0, (initial, final)
    assert _adam_steps(out.state.opt_state) == config.num_iterations * 1 * config.num_minibatches
    assert math.isfinite(float(np.asarray(out.metrics["loss/loss"]).mean()))
