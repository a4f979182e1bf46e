"""The jitted trainer: jit + vmap over seeds, determinism, lag bookkeeping (lag 0 ⇒ β = π_T;
lag k ⇒ version gap k after warm-up), every method finite, VACO ≡ PPO-clip on the first update
at lag 0, a CartPole learning smoke test, and config validation naming the field.

Each configuration is compiled once (module-level fixtures); networks and batches are tiny.
"""


import jax
import numpy as np
import pytest

import jax.numpy as jnp

from fresh_rl.control import METHODS, HyperParams, Method, TrainConfig, register_method, train
from fresh_rl.corrections import AdaptiveKLConfig, VACOConfig
from fresh_rl.lag import DelayConfig

SEEDS = jax.random.split(jax.random.PRNGKey(42), 2)

# PPO-clip on CartPole: 8 envs × 64 steps × 15 iterations = 7 680 env steps per seed.
SMOKE = TrainConfig(
    env_name="CartPole-v1", num_envs=8, rollout_length=64, total_env_steps=8 * 64 * 15,
    num_epochs=4, num_minibatches=4, learning_rate=2.5e-3, hidden_sizes=(32, 32),
    method="ppo_clip",
)

LAG = 2
TINY = dict(env_name="CartPole-v1", num_envs=4, rollout_length=8, total_env_steps=4 * 8 * 5,
            num_epochs=1, num_minibatches=2, hidden_sizes=(8,))


@pytest.fixture(scope="module")
def smoke_run():
    fn = jax.jit(jax.vmap(train, in_axes=(None, 0)), static_argnums=0)
    out = jax.block_until_ready(fn(SMOKE, SEEDS))
    again = jax.block_until_ready(fn(SMOKE, SEEDS))  # cached executable: cheap
    return out, again


_EQ_BASE = dict(TINY, total_env_steps=4 * 8, num_minibatches=1)
EQ_PPO = TrainConfig(**_EQ_BASE, method="ppo_clip")
EQ_VACO = TrainConfig(**_EQ_BASE, method="vaco", vaco_advantage="gae_like", vaco=VACOConfig(delta=10.0),
                      advantage_normalization="standardize")  # PPO-clip's default; VACO's is "scale"


# Gaussian policy, observation normalisation, uniform lags over two actor groups.
PENDULUM = TrainConfig(**{**TINY, "env_name": "Pendulum-v1", "total_env_steps": 4 * 8 * 3},
                       method="vaco", normalize_obs=True, entropy_coef=0.0,
                       delay=DelayConfig.uniform(0, 2, 3), num_actor_groups=2)


# One VACO configuration with a traced lag, swept over HyperParams rows (lag, δ, learning rate):
# (2, 0.2, lr), (0, 0.2, lr), (2, 0.2, 10·lr); the learning rate is a shared leaf, applied by the one
# optimizer of every method.
GRID_BASE = TrainConfig(**TINY, method="vaco", delay=DelayConfig.fixed(0, 3), num_actor_groups=2)
GRID = {"lag": [LAG, 0, LAG], "vaco_delta": [0.2, 0.2, 0.2],
        "learning_rate": [GRID_BASE.learning_rate, GRID_BASE.learning_rate, 10 * GRID_BASE.learning_rate]}


@pytest.fixture(scope="module")
def tiny_runs():
    """Every method at fixed lag 2 (ring K = 3), two actor groups, five iterations, plus the
    two lag-0 configurations of the VACO ≡ PPO-clip test, and (``"grid"``) the vmapped run over
    the traced HyperParams rows of ``GRID``.

    All of them are one jitted program: each run is the same function of the same key as when
    compiled alone, and XLA compiles one program holding all runs in about half the time of one
    program per run (its fixed cost per program is paid once). The grid's HyperParams are a
    program argument, so they stay traced, not constants."""
    configs = {
        method: TrainConfig(**TINY, method=method, delay=DelayConfig.fixed(LAG, 3), num_actor_groups=2)
        for method in METHODS
    }
    configs["eq_ppo"], configs["eq_vaco"] = EQ_PPO, EQ_VACO
    configs["pendulum"] = PENDULUM
    configs["warmup"] = TrainConfig(**{**TINY, "total_env_steps": 4 * 8 * 9}, delay=DelayConfig.fixed(LAG, 3),
                                    lag_warmup_versions=3)
    configs["ppo_kl_adaptive"] = TrainConfig(
        **TINY, method="ppo_kl", kl_coef=0.5, kl_adaptive=AdaptiveKLConfig(target=1e-12),
        delay=DelayConfig.fixed(LAG, 3))

    @jax.jit
    def run_all(key, grid):
        runs = {name: train(cfg, key) for name, cfg in configs.items()}
        runs["grid"] = jax.vmap(train, in_axes=(None, None, 0))(GRID_BASE, key, grid)
        return runs

    return jax.block_until_ready(run_all(SEEDS[0], HyperParams.from_grid(GRID_BASE, GRID)))


@pytest.fixture(scope="module")
def method_runs(tiny_runs):
    return {m: tiny_runs[m] for m in METHODS}


def test_train_vmaps_over_seeds_and_is_deterministic(smoke_run):
    out, again = smoke_run
    ret = np.asarray(out.metrics["episode_return"])
    assert ret.shape == (2, SMOKE.num_iterations)
    # exact: the same compiled executable run twice on the same inputs
    jax.tree.map(np.testing.assert_array_equal, out.params, again.params)
    np.testing.assert_array_equal(ret, np.asarray(again.metrics["episode_return"]))
    assert not np.array_equal(ret[0], ret[1]), "different seeds must give different runs"
    leaf = jax.tree.leaves(out.params)[0]
    assert leaf.shape[0] == 2


def test_lag_zero_behaviour_equals_learner_at_batch_start(smoke_run):
    out, _ = smoke_run
    m = out.metrics
    # β (per-step rollout forward) and π_T (batch-start forward) are the same θ through different
    # matmul shapes: Δ log π ≲ 1e-6 (reordered ≤ 32-term float32 sums), so TV ≈ ½·mean|Δ| and
    # 1 − ESS (float32 sums of 512 weights ≈ 1 ± 1e-6) stay ≲ 3e-6: atol 1e-5
    np.testing.assert_allclose(m["lag/tv"], 0.0, atol=1e-5)
    np.testing.assert_array_equal(m["lag/version_gap_mean"], 0.0)  # integer versions: exact
    np.testing.assert_array_equal(m["lag/version_gap_max"], 0.0)
    np.testing.assert_allclose(m["lag/ess"], 1.0, atol=1e-5)
    # PPO-clip's ratio starts at 1 and moves during the epochs: the loss sees forward lag only.
    assert np.all(np.asarray(m["loss/tv"]) > 0)


def test_ppo_clip_learns_cartpole(smoke_run):
    out, _ = smoke_run
    ret = np.asarray(out.metrics["episode_return"]).mean(axis=0)  # mean over 2 seeds
    initial, final = ret[:2].mean(), ret[-3:].mean()
    print(f"CartPole PPO-clip return per iteration (seed mean): {np.round(ret, 1).tolist()}")
    assert initial < 40.0  # random policy: ~20
    # a non-learner stays ≈ 20; this budget climbs past 100 by iteration 7 and ends ≈ 170 (printed
    # above): 60 and 2× initial sit ≈ 3× below it
    assert final > 2.0 * initial and final > 60.0, (initial, final)


def test_lag_k_gives_version_gap_k_after_warm_up(method_runs):
    for method, out in method_runs.items():
        gap = np.asarray(out.metrics["lag/version_gap_mean"])
        # iteration i acts with version max(i − k, 0) while the learner is at version i
        np.testing.assert_array_equal(gap, [0, 1, 2, 2, 2], err_msg=method)
        np.testing.assert_array_equal(out.metrics["lag/version_gap_max"], [0, 1, 2, 2, 2])
        np.testing.assert_array_equal(out.metrics["lag/stale_fraction"], [0, 1, 1, 1, 1])
        # acting with older parameters shows up as a TV(π_T, β) > 0 once stale
        assert np.all(np.asarray(out.metrics["lag/tv"])[1:] > 0), method


def test_lag_warmup_acts_on_policy_then_never_older_than_its_last_version(tiny_runs):
    """W_u = 3, lag 2: versions 0–3 act on-policy, then the lag ramps 1, 2; iteration i acts with
    version i − gap_i = max(i − 2, min(i, 3)), so no lagged actor ever gets θ0 (integer gaps: exact)."""
    gap = np.asarray(tiny_runs["warmup"].metrics["lag/version_gap_mean"])
    np.testing.assert_array_equal(gap, [0, 0, 0, 0, 1, 2, 2, 2, 2])
    acting = np.arange(9) - gap
    np.testing.assert_array_equal(acting, np.maximum(np.arange(9) - LAG, np.minimum(np.arange(9), 3)))


def test_every_method_returns_finite_metrics(method_runs):
    assert set(method_runs) == set(METHODS)
    for method, out in method_runs.items():
        for name, value in out.metrics.items():
            assert np.all(np.isfinite(np.asarray(value))), (method, name)
        assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(out.params)), method
        assert "loss/loss" in out.metrics and "loss/value_loss" in out.metrics
        assert np.all(np.asarray(out.metrics["lag/forward_tv"]) > 0), method  # forward lag, every method
        assert np.all(np.asarray(out.metrics["lag/forward_tv_weighted"]) > 0), method
    assert "loss/mask_fraction" in method_runs["vaco"].metrics
    assert "loss/clip_fraction" in method_runs["ppo_clip"].metrics
    # align-only never filters; the IMPALA loss has no clip or filter at all
    np.testing.assert_array_equal(method_runs["vaco_align_only"].metrics["loss/filter_on"], 0.0)


def test_forward_tv_weighted_is_the_plain_estimate_at_lag_zero(tiny_runs):
    """At lag 0 the actors act with π_T: with w = π_T/β the weighted estimate is ½·mean w|π_θ/π_T − 1|,
    so it is the plain one within a relative max|w − 1| ≈ max|log π_T − log β|: two float32 evaluations
    of one network on the same rows (a few ulps of a log-probability of order 1, ~1e-6), far under 1e-4."""
    for name in ("eq_ppo", "eq_vaco"):
        m = tiny_runs[name].metrics
        assert np.all(np.asarray(m["lag/forward_tv"]) > 0)
        np.testing.assert_allclose(m["lag/forward_tv_weighted"], m["lag/forward_tv"], rtol=1e-4)


def test_vaco_equals_ppo_clip_first_update_at_lag_zero(tiny_runs):
    """Lag 0, one epoch, one minibatch, filter inactive, GAE-like realignment: V-trace with
    ρ = c = 1 is GAE, and at θ = θ_T both losses have gradient −mean Â ∇log π."""
    a, b = tiny_runs["eq_ppo"], tiny_runs["eq_vaco"]
    assert EQ_PPO.num_iterations == 1
    # one Adam step lr·g/(|g| + ε) from the same θ: relative gradient differences δ ≲ 1e-5 (GAE vs
    # V-trace, β vs π_T rounding) move θ by ≤ lr·δ·ε/|g| ≪ 1e-6 (|g| ≫ ε = 1e-5)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6), a.params, b.params)
    # the policy loss −mean(r·Â) of standardised Â is 0 up to rounding: the two differ by a reordered
    # mean of 32 terms (≲ 32·u·mean|Â| ≈ 2e-6, mean|Â| ≤ 1) plus mean|Â·Δr| (Δr ≲ 1e-6); the old
    # atol 1e-6 was below that: atol 1e-5
    np.testing.assert_allclose(a.metrics["loss/loss"], b.metrics["loss/loss"], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(b.metrics["loss/filter_on"], 0.0)
    # the update really happened (non-zero gradient), so equal parameters are not trivial; an untrained
    # V ≈ 0 against returns of O(1–8) gives ‖g‖ ≫ 1e-3, a no-op update 0
    assert float(a.metrics["loss/grad_norm"][0]) > 1e-3


def test_hyperparams_equal_the_static_configs(tiny_runs):
    """One vmapped run over HyperParams(lag, δ) reproduces the static-config runs."""
    out = tiny_runs["grid"]
    ref = tiny_runs["vaco"]  # static fixed lag 2, δ = 0.2
    # vmapped with traced (lag, δ) vs static: float32 rounding only; Adam's step is scale-free, so
    # relative noise ≲ 1e-6 moves θ by ≲ 10 steps × lr·1e-6 = 2.5e-9 (|g| ≫ ε): rtol 1e-5, atol 1e-6
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x[0], y, rtol=1e-5, atol=1e-6), out.params, ref.params)
    np.testing.assert_array_equal(out.metrics["lag/version_gap_mean"][0], ref.metrics["lag/version_gap_mean"])
    np.testing.assert_array_equal(out.metrics["lag/version_gap_mean"][1], 0)


def test_learning_rate_grid_is_one_program_matching_the_static_config(tiny_runs):
    out = tiny_runs["grid"]  # rows 0 and 2 of one vmapped run differ only in the traced learning rate
    ref = tiny_runs["vaco"]  # static lag 2, δ = 0.2 and the config's learning rate
    # traced vs static learning rate (same float32 value): as in the test above, rtol 1e-5, atol 1e-6
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x[0], y, rtol=1e-5, atol=1e-6), out.params, ref.params)
    assert not np.allclose(jax.tree.leaves(out.params)[0][2], jax.tree.leaves(ref.params)[0])


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("lag", 3, r"HyperParams.lag must be in \[0, 2\]"),
        ("lag", 1.0, "HyperParams.lag must be an integer"),
        ("vaco_delta", -1.0, r"HyperParams.vaco_delta must be in \(0.0, inf\]"),
        ("vaco_delta", float("nan"), "HyperParams.vaco_delta"),
        ("learning_rate", float("inf"), r"HyperParams.learning_rate must be in \(0.0, inf\)"),
        ("entropy_coef", -0.1, "HyperParams.entropy_coef"),
        ("value_coef", float("nan"), "HyperParams.value_coef"),
        ("kl_coef", -1.0, "HyperParams.kl_coef"),
        ("gamma", 1.5, r"HyperParams.gamma must be in \[0.0, 1.0\]"),
    ],
)
def test_hyperparams_validate_names_the_field_and_range(field, value, message):
    config = TrainConfig(**TINY, method="vaco", delay=DelayConfig.fixed(0, 3))
    hp = HyperParams.from_config(config)
    with pytest.raises(ValueError, match=message):
        hp.replace(**{field: np.asarray([getattr(hp, field), value])}).validate(config)


def test_hyperparams_lag_needs_a_fixed_delay_and_from_grid_checks_names():
    config = TrainConfig(**TINY, delay=DelayConfig.uniform(0, 2, 3))
    HyperParams.from_config(config).validate(config)  # the default lag is fine for any kind
    with pytest.raises(ValueError, match="delay.kind='fixed'"):
        HyperParams.from_config(config).replace(lag=jnp.asarray(1)).validate(config)
    with pytest.raises(ValueError, match="unknown HyperParams fields"):
        HyperParams.from_grid(config, {"clip": [0.1]})
    assert set(HyperParams.field_names()) >= {"lag", "vaco_delta", "learning_rate", "entropy_coef",
                                              "value_coef", "kl_coef", "gamma"}


def test_registering_a_method_is_the_only_edit_needed():
    """A plain policy gradient ``−mean(Â · log π)`` registered here trains with no other change."""
    def plain_pg(logp, mb, hparams, config):
        loss = -jnp.mean(mb["advantage"] * logp)
        return loss, {"loss": loss}

    register_method(Method("toy_pg", plain_pg))
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_method(Method("toy_pg", plain_pg))
        config = TrainConfig(**TINY, method="toy_pg")
        assert config.advantage_normalization_used == "standardize"
        out = jax.jit(train, static_argnums=0)(config, SEEDS[0])
        for name, value in out.metrics.items():
            assert np.all(np.isfinite(np.asarray(value))), name
        assert float(np.asarray(out.metrics["loss/grad_norm"]).min()) > 0
    finally:
        METHODS.pop("toy_pg")
    with pytest.raises(ValueError, match="method"):
        TrainConfig(**TINY, method="toy_pg")


def test_adaptive_kl_doubles_beta_when_kl_exceeds_target(tiny_runs):
    """Target 1e-12: every batch's measured KL is above 1.5·target, so β doubles each batch;
    the fixed-β run keeps β."""
    beta = np.asarray(tiny_runs["ppo_kl_adaptive"].metrics["loss/kl_coef"])
    # doubling is exact in float32: exact, rtol 1e-6 is slack
    np.testing.assert_allclose(beta, 0.5 * 2.0 ** np.arange(len(beta)), rtol=1e-6)
    np.testing.assert_allclose(tiny_runs["ppo_kl"].metrics["loss/kl_coef"], 1.0)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(method="trpo"), "method"),
        (dict(env_name="Nope-v0"), "env_name"),
        (dict(num_minibatches=3), "num_minibatches"),
        (dict(num_actor_groups=3), "num_actor_groups"),
        (dict(gamma=1.5), "gamma"),
        (dict(total_env_steps=10), "total_env_steps"),
        (dict(method="impala", num_minibatches=8), "num_minibatches"),
        (dict(vaco_advantage="other"), "vaco_advantage"),
        (dict(learning_rate=0.0), "learning_rate"),
        (dict(kl_adaptive=0.01), "kl_adaptive"),
        (dict(advantage_normalization="whiten"), "advantage_normalization"),
        (dict(brax_backend="physx"), "brax_backend"),
        (dict(lag_warmup_versions=-1), "lag_warmup_versions"),
    ],
)
def test_config_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{**TINY, **kwargs})


def test_negative_lag_is_rejected_by_delay_config():
    with pytest.raises(ValueError, match="lag"):
        TrainConfig(**TINY, delay=DelayConfig.fixed(-1, 3))


def test_continuous_pendulum_run_is_finite_and_normalises_obs(tiny_runs):
    out = tiny_runs["pendulum"]
    for name, value in out.metrics.items():
        assert np.all(np.isfinite(np.asarray(value))), name
    log_std = out.params["params"]["log_std"]
    assert log_std.shape == (1,)
    # reset batch (4) + 4 successors per step × 8 steps × 3 iterations (an integer-valued float: exact)
    assert float(out.state.env_state.obs_stats.count) == 4 + 4 * 8 * 3
    gaps = np.asarray(out.metrics["lag/version_gap_mean"])
    assert gaps[0] == 0 and np.all((gaps >= 0) & (gaps <= 2))
