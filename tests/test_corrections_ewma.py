"""Revised PPO-EWMA reference tree: update rule, β from the staleness window, auto-reset."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, strategies as st

from fresh_rl.corrections import (
    EWMAConfig,
    ewma_beta_from_staleness,
    ewma_maybe_reset,
    ewma_update,
    init_ewma_reference,
)
from fresh_rl.control.config import TrainConfig
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.lag import DelayConfig, expected_lag
from fresh_rl.llm.async_pipeline import AsyncConfig


def make_params(seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return {
        "dense": {"kernel": jnp.asarray(scale * rng.normal(size=(3, 2)), jnp.float32),
                  "bias": jnp.asarray(scale * rng.normal(size=(2,)), jnp.float32)},
        "embed": jnp.asarray(scale * rng.normal(size=(4,)), jnp.bfloat16),
    }


update_jit = jax.jit(ewma_update, static_argnums=2)
reset_jit = jax.jit(ewma_maybe_reset, static_argnums=3)


@given(seed=st.integers(0, 2**31 - 1), beta=st.floats(0.0, 1.0))
def test_update_is_the_convex_combination_per_leaf_and_keeps_dtypes(seed, beta):
    ref, params = init_ewma_reference(make_params(seed)), make_params(seed + 1)
    config = EWMAConfig(beta=beta)
    new = ewma_update(ref, params, config)
    for r, p, n in zip(jax.tree.leaves(ref.params), jax.tree.leaves(params), jax.tree.leaves(new.params)):
        assert n.dtype == r.dtype and n.shape == r.shape
        expected = beta * np.asarray(r, np.float64) + (1 - beta) * np.asarray(p, np.float64)
        # float32: f32(β), f32(1 − β), 2 products, 1 sum: ≤ 3u·max(|θ|, |θ_ref|) ≲ 3u·4.5 ≈ 8e-7 (normal leaves);
        # bfloat16 storage: the cast rounds by ≤ 2⁻⁹ ≈ 2e-3 relative
        tol = 1e-2 if r.dtype == jnp.bfloat16 else 1e-6
        np.testing.assert_allclose(np.asarray(n, np.float64), expected, rtol=tol, atol=tol)
    assert int(new.reset_count) == 0


def test_update_works_under_jit():
    ref, params = init_ewma_reference(make_params(0)), make_params(1)
    config = EWMAConfig(beta=0.75)
    jitted, eager = update_jit(ref, params, config), ewma_update(ref, params, config)
    for a, b in zip(jax.tree.leaves(jitted), jax.tree.leaves(eager)):
        # XLA may fuse into an FMA under jit: with β = 0.75 (1 − β exact) that skips one rounding of β·θ_ref, ≤ u·3.6
        # of the result here (|β·θ_ref| + |(1 − β)·θ| ≤ 3.6·|result|) ≈ 2e-7; bf16: ≤ 1 bf16 ulp (≤ 2⁻⁷ ≈ 7.8e-3)
        tol = 1e-2 if a.dtype == jnp.bfloat16 else 1e-6
        np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=tol)


@pytest.mark.parametrize("window", [1, 2, 4, 8])
def test_default_beta_puts_the_reference_window_versions_behind(window):
    """θ_v = v·c drifting linearly: in steady state θ − θ_ref = β/(1−β)·c = W·c, so the
    EWMA reference sits W versions behind the current parameters (centre of mass W)."""
    config = EWMAConfig.from_staleness(window)
    assert config.beta == pytest.approx(window / (window + 1))  # exact: the same float64 expression
    ref = init_ewma_reference({"w": jnp.zeros(())})
    for version in range(1, 400):
        ref = update_jit(ref, {"w": jnp.asarray(float(version))}, config)
    # float32: each update rounds by ≲ 2u·400 and the EWMA keeps ≤ 1/(1 − β) = W + 1 of them: ≲ 4.8e-5·(W + 1) ≤ 1e-3·W
    np.testing.assert_allclose(399.0 - float(ref.params["w"]), window, rtol=1e-3)


def test_beta_rules():  # exact: float64 W/(W + 1) etc. against the same float64 values
    assert ewma_beta_from_staleness(4) == pytest.approx(0.8)  # mean age = W: a fixed lag
    assert ewma_beta_from_staleness(4, "mean_age", mean_age=2.0) == pytest.approx(4 / 6)  # U{0..4}
    assert ewma_beta_from_staleness(4, "window") == pytest.approx(0.8)
    assert ewma_beta_from_staleness(4, "half_window") == pytest.approx(4 / 6)
    assert ewma_beta_from_staleness(4, "one_minus_inverse") == pytest.approx(0.75)
    assert ewma_beta_from_staleness(0) == 0.0  # synchronous: θ_ref = θ


@pytest.mark.parametrize("delay", [DelayConfig.fixed(4, 5), DelayConfig.uniform(0, 4, 5), DelayConfig.uniform(0, 16, 17),
                                   DelayConfig.geometric(3.0, 17)])
def test_one_default_beta_for_control_and_llm_centres_the_reference_on_the_mean_lag(delay):
    """The control trainer's and the LLM pipeline's default β are one rule: the EWMA's centre of
    mass β/(1 − β) equals the mean version lag of the data (fixed W: W; U{0..W}: W/2)."""
    config = TrainConfig(env_name="CartPole-v1", delay=delay, route="ewma")
    beta = float(HyperParams.from_config(config).ewma_beta)
    # float32 leaf of a float64 β: relative 6e-8, amplified by 1/(1 − β) ≤ 17 in the centre of mass
    assert beta / (1 - beta) == pytest.approx(expected_lag(delay), rel=1e-5)
    if delay.kind != "geometric":  # the LLM pipeline has the fixed and the uniform lag
        window = delay.ring_size - 1
        llm = AsyncConfig(staleness_window=window, lag_kind=delay.kind)
        assert llm.beta(window) == pytest.approx(beta, rel=1e-6)  # the same rule, float32 leaf vs float64


def test_reset_when_active_fraction_falls_below_threshold():
    ref, params = init_ewma_reference(make_params(0)), make_params(1)
    config = EWMAConfig(beta=0.9, reset_active_fraction=0.9)
    kept = reset_jit(ref, params, jnp.float32(0.95), config)
    reset = reset_jit(kept, params, jnp.float32(0.5), config)
    for r, k, n, p in zip(*(jax.tree.leaves(x) for x in (ref.params, kept.params, reset.params, params))):
        np.testing.assert_array_equal(k, r)
        np.testing.assert_array_equal(n, p)
    assert int(kept.reset_count) == 0 and int(reset.reset_count) == 1
    disabled = ewma_maybe_reset(ref, params, 0.0, EWMAConfig(beta=0.9, reset_active_fraction=None))
    assert disabled is ref


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: EWMAConfig(beta=1.5), "beta"),
        (lambda: EWMAConfig(beta=-0.1), "beta"),
        (lambda: EWMAConfig(beta=float("nan")), "beta"),
        (lambda: EWMAConfig(beta=0.5, reset_active_fraction=1.1), "reset_active_fraction"),
        (lambda: ewma_beta_from_staleness(-1), "staleness_window"),
        (lambda: ewma_beta_from_staleness(0.5, "one_minus_inverse"), "staleness_window"),
        (lambda: ewma_beta_from_staleness(2, "halflife"), "rule"),
        (lambda: ewma_beta_from_staleness(2, mean_age=3.0), "mean_age"),
        (lambda: EWMAConfig.from_staleness(-3), "staleness_window"),
    ],
)
def test_bad_configuration_raises_value_error_naming_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_mismatched_trees_fail_with_chex_message():
    ref = init_ewma_reference(make_params(0))
    with pytest.raises(AssertionError):
        ewma_update(ref, {"dense": make_params(1)["dense"]}, EWMAConfig(beta=0.5))


def test_bf16_reference_of_fp32_params_rounds_each_mix_and_loses_sub_ulp_steps():
    """A bfloat16 θ_ref of fp32 θ (``init_ewma_reference(params, jnp.bfloat16)``): the update is
    the fp32 mix rounded to bf16, the reset casts θ to bf16, and a step (1 − β)(θ − θ_ref)
    below half a bf16 ulp is lost (the documented floor), where an fp32 θ_ref moves."""
    theta = {"w": jnp.asarray([1.0, 0.5, -2.0], jnp.float32)}
    ref16 = init_ewma_reference(theta, jnp.bfloat16)
    assert ref16.params["w"].dtype == jnp.bfloat16
    target = {"w": jnp.asarray([1.3, 0.25, -1.0], jnp.float32)}
    new = update_jit(ref16, target, EWMAConfig(beta=0.5))
    # exact: β = 0.5 makes both products exact, so jit (FMA or not) and eager round the same float32 sum once
    expected = (0.5 * ref16.params["w"].astype(jnp.float32) + 0.5 * target["w"]).astype(jnp.bfloat16)
    assert new.params["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(new.params["w"]), np.asarray(expected))
    reset = reset_jit(new, target, jnp.float32(0.0), EWMAConfig(beta=0.5, reset_active_fraction=0.9))
    assert reset.params["w"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(reset.params["w"]), np.asarray(target["w"].astype(jnp.bfloat16)))
    nudged = {"w": theta["w"] + 2.0 ** -9}  # (1 − β)·2⁻⁹ = 2⁻¹⁰ < half an ulp of 1.0 in bf16 (2⁻⁸)
    stuck = update_jit(ref16, nudged, EWMAConfig(beta=0.5))
    np.testing.assert_array_equal(np.asarray(stuck.params["w"][0]), np.asarray(ref16.params["w"][0]))
    moved = update_jit(init_ewma_reference(theta), nudged, EWMAConfig(beta=0.5))
    assert float(moved.params["w"][0]) > 1.0
