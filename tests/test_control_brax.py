"""The Brax adapter: spec and env ids, auto-reset with terminated vs truncated kept apart,
next_obs = the pre-reset successor, a differential check against Brax's own ``step``, running
observation statistics, config errors naming the field, and a short ``train`` smoke run.

One adapter configuration is compiled once (module fixture) and exercises action repeat 2,
normalisation and both episode endings: envs 0–1 push the cart at full force (the pole falls
on simulator step 7, inside agent step 4: terminated), envs 2–3 do nothing (the pole stays up:
truncated at the time limit, 24 simulator steps = 12 agent steps). Env 0's action 3.0 checks
the clip to 1.
"""

import brax.envs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fresh_rl.control import BraxVecEnv, TrainConfig, VecEnv, brax_env_names, env_names, make_vec_env, train
from fresh_rl.control.brax_envs import BRAX_BACKENDS, _spec, _task

N, STEPS, REPEAT, EP_LEN = 4, 30, 2, 24
ACTIONS = jnp.array([[3.0], [1.0], [0.0], [0.0]])
VENV = BraxVecEnv("inverted_pendulum", N, normalize_obs=True, episode_length=EP_LEN, action_repeat=REPEAT)


@pytest.fixture(scope="module")
def rollout():
    """Adapter rollout (states before/after every step) and, from the same states, Brax's raw
    ``step`` applied REPEAT times (reward masked after a terminal sub-step). One compile."""
    task = brax.envs.get_environment("inverted_pendulum", backend="spring")
    clipped = jnp.clip(ACTIONS, -1.0, 1.0)

    def raw_sub_step(carry, _):
        env_state, reward, done = carry
        env_state = jax.vmap(task.step)(env_state, clipped)
        return (env_state, reward + (1.0 - done) * env_state.reward, jnp.maximum(done, env_state.done)), None

    def body(state, k):
        new, out = VENV.step(k, state, ACTIONS)
        zeros = jnp.zeros((N,), jnp.float32)
        (raw_state, raw_reward, raw_done), _ = jax.lax.scan(
            raw_sub_step, (state.env_state, zeros, zeros), length=REPEAT)
        return new, (state, new, out, (raw_state.obs, raw_reward, raw_done))

    state0, obs0 = VENV.reset(jax.random.PRNGKey(0))
    run = jax.jit(lambda s, k: jax.lax.scan(body, s, jax.random.split(k, STEPS))[1])
    before, after, outs, raw = run(state0, jax.random.PRNGKey(1))
    return jax.tree.map(np.asarray, (state0, obs0, before, after, outs, raw))


def test_spec_and_env_ids():
    spec = VENV.spec
    assert spec.obs_shape == (4,) and not spec.discrete and spec.action_dim == 1
    assert (spec.action_low, spec.action_high) == (-1.0, 1.0)
    assert brax_env_names() == tuple(brax.envs._envs)
    names = env_names()
    assert "CartPole-v1" in names and "brax/inverted_pendulum" in names and "brax/ant" in names
    ant = make_vec_env("brax/ant", 2, brax_backend="positional")
    assert ant == BraxVecEnv("ant", 2, backend="positional")
    assert isinstance(make_vec_env("CartPole-v1", 2), VecEnv)


def test_auto_reset_terminated_vs_truncated(rollout):
    _, _, before, after, outs, _ = rollout
    term, trunc = outs.terminated, outs.truncated
    assert not (term & trunc).any()
    # Pushing envs: the pole falls on simulator step 7 = the first sub-step of agent step 4.
    np.testing.assert_array_equal(np.flatnonzero(term[:, 0]), [3, 7, 11, 15, 19, 23, 27])
    np.testing.assert_array_equal(term[:, 0], term[:, 1])
    assert not trunc[:, :2].any()
    # Idle envs: truncated by the time limit, 24 sim steps = 12 agent steps, never terminated.
    np.testing.assert_array_equal(np.flatnonzero(trunc[:, 2]), [11, 23])
    np.testing.assert_array_equal(trunc[:, 2], trunc[:, 3])
    assert not term[:, 2:].any()
    done = term | trunc
    np.testing.assert_array_equal(outs.episode_length[done], np.where(term[done], 4, 12))
    # Reward 1 per simulator step while alive: the terminal agent step pays its first sub-step only.
    np.testing.assert_allclose(outs.episode_return[trunc], 24.0)  # sums of 1.0s: exact
    np.testing.assert_allclose(outs.episode_return[term], 7.0)
    # After a done step the env is freshly reset: bookkeeping zeroed, |q|, |qd| ≤ 0.01, and a new
    # random initial state (not the first one again).
    assert (after.episode_length[done] == 0).all() and (after.episode_return[done] == 0).all()
    assert (np.abs(after.env_state.obs[done]) <= 0.01).all()  # float32 U(±0.01) vs float32(0.01) (NEP 50)
    t, e = np.argwhere(trunc)[0]
    assert not np.allclose(after.env_state.obs[t, e], before.env_state.obs[0, e])  # independent draws


def test_matches_raw_brax_step_and_next_obs_is_pre_reset_successor(rollout):
    _, _, _, after, outs, (raw_obs, raw_reward, raw_done) = rollout
    np.testing.assert_allclose(outs.reward, raw_reward, rtol=1e-6)  # 0/1 rewards, small integer sums: exact
    np.testing.assert_array_equal(outs.terminated, raw_done > 0)
    done = outs.terminated | outs.truncated
    # the same vmapped task.step in two loops of one program: equal but for fusion-dependent FMA
    # contraction (≲ 1 ulp per op over 2 sub-steps), ≲ 4 ulp(4) ≈ 2e-6 for |obs| ≤ 4.05; the old
    # rtol 1e-6 / atol 1e-7 were below an ulp: rtol 1e-5, atol 5e-6
    np.testing.assert_allclose(after.env_state.obs[~done], raw_obs[~done], rtol=1e-5, atol=5e-6)
    # next_obs is the normalised raw successor on every step, reset or not ...
    stats = after.obs_stats  # [STEPS, ...]: count > 0 on every step, so var = m2 / count
    mean, var = stats.mean[:, None], (stats.m2 / stats.count[:, None])[:, None]
    expected = np.clip((raw_obs - mean) / np.sqrt(var + 1e-8), -VENV.obs_clip, VENV.obs_clip)
    # (x − m)/σ in float32 on both sides: ≲ 4 u·|x − m|/σ plus the few-ulp x above ÷ σ, ≲ 4 u·|x|/σ
    # with |x|/σ ≲ 10 (σ grows with |x|): ≲ 3e-6, inside atol 1e-5 + rtol 1e-5
    np.testing.assert_allclose(outs.next_obs, expected, rtol=1e-5, atol=1e-5)
    # ... and differs from obs (the reset observation) exactly where the episode ended.
    same = np.all(outs.next_obs == outs.obs, axis=-1)
    np.testing.assert_array_equal(same, ~done)


def test_running_stats_see_first_reset_and_every_successor(rollout):
    state0, obs0, _, after, _, (raw_obs, _, _) = rollout
    assert state0.obs_stats.count == N
    # normalised by its own batch: |mean| ≲ 4 u·max|x|/σ ≈ 1.3e-6 (resets U(±0.01), σ ≥ 0.0018 here)
    np.testing.assert_allclose(obs0.mean(0), 0.0, atol=1e-5)
    seen = np.concatenate([state0.env_state.obs, raw_obs.reshape(-1, 4)]).astype(np.float64)
    final = jax.tree.map(lambda x: x[-1], after.obs_stats)
    assert final.count == N * (STEPS + 1)
    # 31 float32 merges: ≲ 31 u relative (2e-6) plus ≲ 5 u·max|x| ≈ 1.2e-6 abs (|x| ≤ 4.05; the positions,
    # |x| ≤ 0.31, ≲ 1e-7); the variance ≲ 1e-5 relative: rtol 1e-4 / 1e-3
    np.testing.assert_allclose(final.mean, seen.mean(0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(final.var, seen.var(0), rtol=1e-3, atol=1e-7)


def test_config_errors_name_the_field_and_list_choices():
    with pytest.raises(ValueError, match=r"env_name must be one of .*'inverted_pendulum'.*'nope'"):
        BraxVecEnv("nope", 2)
    with pytest.raises(ValueError, match=r"backend must be one of \('spring', 'positional', 'generalized', 'mjx'\)"):
        BraxVecEnv("inverted_pendulum", 2, backend="bullet")
    with pytest.raises(ValueError, match=r"brax_backend must be one of .*'spring'"):
        make_vec_env("brax/inverted_pendulum", 2, brax_backend="bullet")
    with pytest.raises(ValueError, match=r"env_name must be one of .*'brax/inverted_pendulum'"):
        TrainConfig(env_name="brax/nope")
    for field, kwargs in (("episode_length", {"episode_length": 0}), ("action_repeat", {"action_repeat": 0}),
                          ("num_envs", {"num_envs": 0}), ("obs_clip", {"obs_clip": 0.0})):
        with pytest.raises(ValueError, match=field):
            BraxVecEnv(**{"name": "inverted_pendulum", "num_envs": 2, **kwargs})
    assert BRAX_BACKENDS == ("spring", "positional", "generalized", "mjx")


def test_cached_task_holds_no_tracers_when_first_built_under_jit():
    _task.cache_clear()
    _spec.cache_clear()
    jax.jit(lambda x: x + VENV.spec.action_dim)(1.0)  # first use inside a trace, as in train()
    leaves = jax.tree.leaves(_task("inverted_pendulum", "spring").sys)
    assert leaves and not any(isinstance(x, jax.core.Tracer) for x in leaves)


def test_train_smoke_on_brax_inverted_pendulum():
    cfg = TrainConfig(env_name="brax/inverted_pendulum", num_envs=4, rollout_length=8,
                      total_env_steps=4 * 8 * 3, num_epochs=1, num_minibatches=2, hidden_sizes=(8,))
    out = jax.jit(train, static_argnums=0)(cfg, jax.random.PRNGKey(0))
    for leaf in jax.tree.leaves(out.params):
        assert np.isfinite(np.asarray(leaf)).all()
    for name, value in out.metrics.items():
        assert np.isfinite(np.asarray(value)).all(), name
    assert np.asarray(out.metrics["episodes_completed"]).sum() > 0
