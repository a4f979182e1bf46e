"""GAE and V-trace: differential tests against rlax (vmapped) and a plain NumPy sum-form loop."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax
from hypothesis import given, strategies as st

from fresh_rl.corrections import (
    VTraceConfig,
    generalized_advantage_estimation,
    reverse_linear_recurrence,
    vtrace,
)

B, T = 4, 12
GAMMA = 0.9
# float32 recurrence A ← a + b·A: ≤ T = 12 steps of ~4 roundings on terms ≲ 15 (the largest |v − V| of these
# batches): ≲ 12·4·u·15 ≈ 4e-5 from exact per float32 result, so two float32 results (vs rlax, jit vs eager,
# re-aligned chunks) ≲ 9e-5 apart
TOL = 1e-4

# The estimators run eagerly here: their scan is jitted inside, so the many static
# configurations of the grid do not each pay a compilation. One jitted copy checks jit.
vtrace_jit = jax.jit(vtrace, static_argnames=("config",))


# rlax is single-trajectory and time-major: vmap it over the batch axis. λ and ρ̄ go in as
# traced scalars so that the whole grid shares one compilation.
rlax_vtrace_batched = jax.jit(jax.vmap(
    lambda v_tm1, v_t, r_t, d_t, rho, m, lambda_, rho_bar: rlax.vtrace_td_error_and_advantage(
        v_tm1, v_t, r_t, d_t, rho, lambda_=lambda_, clip_rho_threshold=rho_bar,
        clip_pg_rho_threshold=rho_bar, sample_mask=m),
    in_axes=(0, 0, 0, 0, 0, 0, None, None),
))
rlax_gae_batched = jax.jit(jax.vmap(
    lambda r, d, v, lambda_: rlax.truncated_generalized_advantage_estimation(r, d, lambda_, v),
    in_axes=(0, 0, 0, None),
))


def make_batch(seed, *, terminations=0.15, truncations=0.0, mask_prob=0.0, log_rho_scale=0.7):
    """Random [B, T] trajectories; next_values[t] = values[t+1] except at truncations."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(B, T))
    bootstrap = rng.normal(size=(B, 1))
    next_values = np.concatenate([values[:, 1:], bootstrap], axis=1)
    terminated = rng.random((B, T)) < terminations
    truncated = (rng.random((B, T)) < truncations) & ~terminated
    # at a truncation the successor is the final observation, whose value is unrelated
    next_values = np.where(truncated, rng.normal(size=(B, T)), next_values)
    batch = dict(
        values=values,
        next_values=next_values,
        rewards=rng.normal(size=(B, T)),
        discounts=GAMMA * (1.0 - terminated),
        log_rhos=log_rho_scale * rng.normal(size=(B, T)),
        episode_ends=terminated | truncated,
        sample_mask=rng.random((B, T)) >= mask_prob,
    )
    return {k: (v.astype(np.float32) if v.dtype == np.float64 else v) for k, v in batch.items()}


def numpy_vtrace(b, *, lambda_, rho_bar, c_bar, pg_rho_bar, impala_bootstrap):
    """V-trace from its sum form (IMPALA Eq. 1), one valid step at a time, float64.

    v_s − V_s = Σ_{t ≥ s, same episode, valid} (Π_{valid i in [s, t)} γ_i c_i) ρ_t δ_t.
    """
    f64 = {k: np.asarray(v, np.float64) if v.dtype == np.float32 else v for k, v in b.items()}
    rho = np.exp(f64["log_rhos"])
    td = f64["rewards"] + f64["discounts"] * f64["next_values"] - f64["values"]
    gae = np.zeros((B, T))
    impala = np.zeros((B, T))
    for row in range(B):
        valid = [t for t in range(T) if f64["sample_mask"][row, t]]
        for i, s in enumerate(valid):
            total, coef = 0.0, 1.0
            for t in valid[i:]:
                total += coef * min(rho_bar, rho[row, t]) * td[row, t]
                if f64["episode_ends"][row, t]:
                    break
                coef *= f64["discounts"][row, t] * lambda_ * min(c_bar, rho[row, t])
            gae[row, s] = total
        for i, s in enumerate(valid):
            has_next = i + 1 < len(valid) and not f64["episode_ends"][row, s]
            next_corr = gae[row, valid[i + 1]] if has_next else 0.0
            if impala_bootstrap == "lambda_mixed":
                next_corr *= lambda_
            succ = f64["next_values"][row, s] + next_corr
            q = f64["rewards"][row, s] + f64["discounts"][row, s] * succ
            impala[row, s] = min(pg_rho_bar, rho[row, s]) * (q - f64["values"][row, s])
    return gae, impala


def run_ours(b, config, fn=vtrace):
    return fn(
        b["values"], b["next_values"], b["rewards"], b["discounts"], b["log_rhos"],
        config=config, episode_ends=b["episode_ends"], sample_mask=b["sample_mask"],
    )


def max_err_on_valid(x, y, mask):
    return float(np.max(np.abs(np.where(mask, np.asarray(x, np.float64) - np.asarray(y, np.float64), 0.0))))


@pytest.mark.parametrize("rho_bar", [1.0, 5.0, math.inf])
@pytest.mark.parametrize("lambda_", [0.0, 0.95, 1.0])
def test_vtrace_matches_rlax_vmapped(rho_bar, lambda_):
    """Grid ρ̄ × λ, random terminations and sample masks, float32: |ours − rlax| ≤ TOL."""
    for seed in range(3):
        b = make_batch(seed, terminations=0.2, mask_prob=0.2 if seed else 0.0)
        expected = rlax_vtrace_batched(b["values"], b["next_values"], b["rewards"], b["discounts"],
                                       np.exp(b["log_rhos"]), b["sample_mask"],
                                       np.float32(lambda_), np.float32(rho_bar))
        for bootstrap in ("lambda_mixed", "target"):
            ours = run_ours(b, VTraceConfig(lambda_=lambda_, rho_bar=rho_bar, c_bar=1.0,
                                            impala_bootstrap=bootstrap))
            m = b["sample_mask"]
            assert max_err_on_valid(ours.gae_advantages, expected.errors, m) <= TOL
            assert max_err_on_valid(ours.targets, expected.errors + b["values"], m) <= TOL
            if bootstrap == "lambda_mixed" or lambda_ == 1.0:  # the forms coincide at λ = 1
                assert max_err_on_valid(ours.impala_advantages, expected.pg_advantage, m) <= TOL
            np.testing.assert_array_equal(np.asarray(ours.gae_advantages)[~m], 0.0)


@pytest.mark.parametrize("c_bar", [0.5, 2.0, math.inf])
@pytest.mark.parametrize("rho_bar", [1.0, math.inf])
@pytest.mark.parametrize("lambda_", [0.0, 0.95, 1.0])
def test_vtrace_matches_numpy_loop_with_cbar_and_truncations(c_bar, rho_bar, lambda_):
    """Settings rlax cannot express (c̄ ≠ 1, truncation with bootstrap) vs the NumPy sum form."""
    for seed, (bootstrap, pg_rho_bar) in enumerate((("target", None), ("lambda_mixed", 3.0))):
        config = VTraceConfig(lambda_=lambda_, rho_bar=rho_bar, c_bar=c_bar, pg_rho_bar=pg_rho_bar,
                              impala_bootstrap=bootstrap)
        b = make_batch(100 + seed, terminations=0.1, truncations=0.15, mask_prob=0.15, log_rho_scale=0.5)
        ours = run_ours(b, config)
        gae, impala = numpy_vtrace(
            b, lambda_=lambda_, rho_bar=rho_bar, c_bar=c_bar,
            pg_rho_bar=rho_bar if pg_rho_bar is None else pg_rho_bar, impala_bootstrap=bootstrap,
        )
        m = b["sample_mask"]
        assert max_err_on_valid(ours.gae_advantages, gae, m) <= TOL
        assert max_err_on_valid(ours.impala_advantages, impala, m) <= TOL


@pytest.mark.parametrize("lambda_", [0.0, 0.95, 1.0])
def test_gae_matches_rlax_vmapped(lambda_):
    for seed in range(3):
        b = make_batch(seed, terminations=0.2)
        values_ext = np.concatenate([b["values"], b["next_values"][:, -1:]], axis=1)
        expected = rlax_gae_batched(b["rewards"], b["discounts"], values_ext, np.float32(lambda_))
        ours = generalized_advantage_estimation(b["rewards"], b["values"], b["next_values"], b["discounts"], lambda_=lambda_,
                       episode_ends=b["episode_ends"])
        assert float(np.max(np.abs(np.asarray(ours.advantages) - np.asarray(expected)))) <= TOL
        assert float(np.max(np.abs(np.asarray(ours.returns - ours.advantages) - b["values"]))) <= TOL


@pytest.mark.parametrize("lambda_", [0.0, 0.95, 1.0])
def test_gae_with_truncations_and_mask_matches_numpy_loop(lambda_):
    b = make_batch(11, terminations=0.1, truncations=0.2, mask_prob=0.2)
    ours = generalized_advantage_estimation(b["rewards"], b["values"], b["next_values"], b["discounts"], lambda_=lambda_,
                   episode_ends=b["episode_ends"], sample_mask=b["sample_mask"])
    # GAE is V-trace with π = μ (all ratios 1, no truncation active)
    gae, _ = numpy_vtrace(dict(b, log_rhos=np.zeros_like(b["log_rhos"])), lambda_=lambda_,
                          rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0, impala_bootstrap="target")
    assert max_err_on_valid(ours.advantages, gae, b["sample_mask"]) <= TOL


def test_truncation_bootstraps_but_termination_does_not():
    """Same data: a time-limit end keeps γ V(s_final); a terminal end drops it; both cut the trace."""
    values = jnp.zeros((1, 3), jnp.float32)
    rewards = jnp.array([[1.0, 1.0, 1.0]], jnp.float32)
    next_values = jnp.array([[0.0, 10.0, 0.0]], jnp.float32)  # s_final of step 1 has value 10
    ends = jnp.array([[False, True, False]])
    truncated = generalized_advantage_estimation(rewards, values, next_values, jnp.full((1, 3), GAMMA, jnp.float32),
                        lambda_=1.0, episode_ends=ends)
    terminated = generalized_advantage_estimation(rewards, values, next_values,
                         jnp.array([[GAMMA, 0.0, GAMMA]], jnp.float32), lambda_=1.0, episode_ends=ends)
    # float32: ≤ 2 steps of a few roundings on values ≤ 10 (and f32(0.9)): ≲ 4u ≈ 2.4e-7 relative
    np.testing.assert_allclose(truncated.advantages[0], [1 + GAMMA * (1 + GAMMA * 10), 1 + GAMMA * 10, 1.0],
                               rtol=1e-6)
    np.testing.assert_allclose(terminated.advantages[0], [1 + GAMMA, 1.0, 1.0], rtol=1e-6)


def test_vtrace_on_policy_gae_form_equals_gae():
    """With π = μ and ρ̄, c̄ ≥ 1, the GAE-like V-trace advantage is GAE(λ) (docs/vaco.md)."""
    b = make_batch(5, terminations=0.1, truncations=0.1, mask_prob=0.1)
    b["log_rhos"] = np.zeros_like(b["log_rhos"])
    ours = run_ours(b, VTraceConfig(lambda_=0.95, rho_bar=1.0, c_bar=1.0))
    gae = generalized_advantage_estimation(b["rewards"], b["values"], b["next_values"], b["discounts"], lambda_=0.95,
                  episode_ends=b["episode_ends"], sample_mask=b["sample_mask"])
    # float32, the same ops (ρ = exp(0) = 1 exactly) and the same jitted recurrence: equal up to eager/fused
    # rounding of δ (≲ 2u·|A| ≤ 2u·3.3 ≈ 4e-7)
    np.testing.assert_allclose(ours.gae_advantages, gae.advantages, atol=1e-6)
    np.testing.assert_allclose(ours.targets, gae.returns, atol=1e-6)


CONFIG = VTraceConfig(lambda_=0.95, rho_bar=2.0, c_bar=1.0)


@given(seed=st.integers(0, 2**31 - 1), garbage=st.sampled_from([np.nan, 1e6, -3.0]))
def test_masked_steps_never_change_valid_outputs(seed, garbage):
    """Overwriting every input at masked steps (even with NaN) leaves all valid outputs unchanged."""
    b = make_batch(seed, terminations=0.1, truncations=0.1, mask_prob=0.3)
    m = b["sample_mask"]
    dirty = dict(b)
    for key in ("values", "next_values", "rewards", "discounts", "log_rhos"):
        dirty[key] = np.where(m, b[key], np.float32(garbage)).astype(np.float32)
    dirty["episode_ends"] = np.where(m, b["episode_ends"], ~b["episode_ends"])
    clean_out, dirty_out = run_ours(b, CONFIG), run_ours(dirty, CONFIG)
    # exact: the same ops on inputs that are equal once masked steps are replaced (offset 0, decay 1)
    for field in ("targets", "gae_advantages", "impala_advantages"):
        np.testing.assert_array_equal(getattr(clean_out, field), getattr(dirty_out, field))
        np.testing.assert_array_equal(np.asarray(getattr(dirty_out, field))[~m], 0.0)


@given(seed=st.integers(0, 2**31 - 1))
def test_cut_row_equals_independent_segments(seed):
    """A row cut at episode ends equals running each episode as its own (shifted) row."""
    b = make_batch(seed, terminations=0.1, truncations=0.15)
    out = run_ours(b, CONFIG)
    row = 0
    ends = list(np.flatnonzero(b["episode_ends"][row])) + [T - 1]
    start = 0
    for end in sorted(set(ends)):
        length = end - start + 1
        seg = {k: np.zeros((B, T), v.dtype) for k, v in b.items()}
        for k in b:
            seg[k][0, T - length:] = b[k][row, start:end + 1]  # right-aligned, rest masked
        seg["sample_mask"] = np.zeros((B, T), bool)
        seg["sample_mask"][0, T - length:] = True
        seg["episode_ends"][0, T - 1] = False  # the row end cuts anyway
        seg_out = run_ours(seg, CONFIG)
        # float32: the recurrence's chunk pairs fall differently in the shifted row (see TOL)
        np.testing.assert_allclose(seg_out.targets[0, T - length:], out.targets[row, start:end + 1], atol=TOL)
        np.testing.assert_allclose(seg_out.impala_advantages[0, T - length:],
                                   out.impala_advantages[row, start:end + 1], atol=TOL)
        start = end + 1


def test_outputs_carry_no_gradient():
    b = make_batch(1)

    def total(values):
        out = vtrace(values, b["next_values"], b["rewards"], b["discounts"], b["log_rhos"], config=CONFIG)
        return jnp.sum(out.targets) + jnp.sum(out.impala_advantages)

    np.testing.assert_array_equal(jax.grad(total)(jnp.asarray(b["values"])), 0.0)


def test_works_under_jit_and_vmap_over_a_seed_axis():
    batches = [make_batch(s, mask_prob=0.2, truncations=0.1) for s in range(2)]
    stacked = {k: np.stack([bb[k] for bb in batches]) for k in batches[0]}
    out = jax.jit(jax.vmap(lambda bb: run_ours(bb, CONFIG)))(stacked)
    eager = run_ours(batches[1], CONFIG)
    # float32, fused jit vs eager ops: two float32 results of the recurrence (see TOL)
    np.testing.assert_allclose(out.targets[1], eager.targets, atol=TOL)
    np.testing.assert_allclose(run_ours(batches[1], CONFIG, vtrace_jit).impala_advantages,
                               eager.impala_advantages, atol=TOL)


@pytest.mark.parametrize("time_steps", [1, 2, 5, 7, 20])
def test_reverse_linear_recurrence_matches_loop(time_steps):
    """Includes lengths that are not a multiple of the chunk size (padding path)."""
    rng = np.random.default_rng(time_steps)
    a = rng.normal(size=(3, time_steps)).astype(np.float32)
    d = rng.uniform(-1.0, 1.0, size=(3, time_steps)).astype(np.float32)
    d[0, time_steps // 2] = 0.0  # a cut
    expected = np.zeros((3, time_steps))
    acc = np.zeros(3)
    for t in reversed(range(time_steps)):
        acc = a[:, t] + d[:, t] * acc
        expected[:, t] = acc
    out = reverse_linear_recurrence(jnp.asarray(a), jnp.asarray(d))
    assert out.shape == (3, time_steps)
    # float32 vs float64: ≤ 20 steps, |d| < 1, |A| ≤ 3.2: first-order rounding ≤ 4u·Σ_k Π|d|·(|a| + |d·A|) ≲ 2e-6
    np.testing.assert_allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(lambda_=1.5), "lambda_"),
        (dict(lambda_=-0.1), "lambda_"),
        (dict(rho_bar=0.0), "rho_bar"),
        (dict(c_bar=-1.0), "c_bar"),
        (dict(c_bar=float("nan")), "c_bar"),
        (dict(pg_rho_bar=0.0), "pg_rho_bar"),
        (dict(impala_bootstrap="bogus"), "impala_bootstrap"),
    ],
)
def test_bad_vtrace_config_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        VTraceConfig(**kwargs)


def test_bad_gae_lambda_names_the_field():
    b = make_batch(0)
    with pytest.raises(ValueError, match="lambda_"):
        generalized_advantage_estimation(b["rewards"], b["values"], b["next_values"], b["discounts"], lambda_=2.0)


def test_bad_shapes_and_dtypes_fail_with_chex_messages():
    b = make_batch(0)
    with pytest.raises(AssertionError, match="shape"):
        vtrace(b["values"][:, :-1], b["next_values"], b["rewards"], b["discounts"], b["log_rhos"])
    with pytest.raises(AssertionError, match="rank"):
        vtrace(b["values"][0], b["next_values"][0], b["rewards"][0], b["discounts"][0], b["log_rhos"][0])
    with pytest.raises(AssertionError):
        vtrace(b["values"], b["next_values"], b["rewards"], b["discounts"], b["log_rhos"],
               sample_mask=b["sample_mask"].astype(np.float32))
    with pytest.raises(AssertionError):
        vtrace(b["values"].astype(np.int32), b["next_values"], b["rewards"], b["discounts"], b["log_rhos"])


@given(
    shape=st.sampled_from([(1, 1), (2, 3), (1, 7), (3, 2)]),
    seed=st.integers(0, 2**31 - 1),
    lambda_=st.sampled_from([0.0, 0.5, 1.0]),
)
def test_output_shapes_and_masked_zeros_for_any_shape(shape, seed, lambda_):
    rng = np.random.default_rng(seed)
    values, next_values, rewards, log_rhos = rng.normal(size=(4, *shape)).astype(np.float32)
    discounts = np.full(shape, GAMMA, np.float32)
    mask = rng.random(shape) > 0.3
    ends = rng.random(shape) > 0.7
    out = vtrace(values, next_values, rewards, discounts, log_rhos, config=VTraceConfig(lambda_=lambda_),
                 episode_ends=ends, sample_mask=mask)
    gae = generalized_advantage_estimation(rewards, values, next_values, discounts, lambda_=lambda_,
                                           episode_ends=ends, sample_mask=mask)
    for x in (out.targets, out.gae_advantages, out.impala_advantages, out.clipped_rhos, gae.advantages, gae.returns):
        assert x.shape == shape and x.dtype == np.float32
        assert np.all(np.isfinite(x))
        np.testing.assert_array_equal(np.asarray(x)[~mask], 0.0)
    # the last valid step of a row has nothing after it: its GAE advantage is its TD error
    for row in range(shape[0]):
        valid = np.flatnonzero(mask[row])
        if valid.size:
            t = valid[-1]
            td = rewards[row, t] + GAMMA * next_values[row, t] - values[row, t]
            # A_t = δ_t + b·0 exactly; δ_t: the same 3 float32 ops in order (an FMA moves it ≤ u·|γV′| ≲ 3e-7)
            np.testing.assert_allclose(gae.advantages[row, t], td, rtol=1e-5, atol=1e-6)
