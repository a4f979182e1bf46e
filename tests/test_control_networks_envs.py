"""Control networks (log-prob / entropy vs distrax and NumPy) and the gymnax adapter
(auto-reset, terminated vs truncated, episode bookkeeping, running observation statistics)."""

import distrax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fresh_rl.control import ActorCritic, PolicyOutput, VecEnv, entropy, log_prob, sample
from fresh_rl.control.env_types import init_running_stats, update_running_stats


def test_categorical_log_prob_entropy_match_distrax_and_numpy():
    logits = jax.random.normal(jax.random.PRNGKey(0), (5, 3)) * 2.0
    actions = jnp.array([0, 2, 1, 1, 0])
    policy = PolicyOutput(loc=logits)
    ref = distrax.Categorical(logits=logits)
    # float32 log-softmax of |z| ≲ 6 (K = 3): |Δ log p| ≲ few u·(|log p| + log K) ≈ 1e-7 + 3e-7·|log p|,
    # inside atol 1e-6 + rtol 1e-5·|log p| (also against float64 below); entropy ≲ 10 u
    np.testing.assert_allclose(log_prob(policy, actions), ref.log_prob(actions), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(entropy(policy), ref.entropy(), rtol=1e-5, atol=1e-6)
    z = np.asarray(logits, np.float64)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    np.testing.assert_allclose(log_prob(policy, actions), logp[np.arange(5), np.asarray(actions)], rtol=1e-5, atol=1e-6)


def test_gaussian_log_prob_entropy_match_distrax_and_numpy():
    key_m, key_a = jax.random.split(jax.random.PRNGKey(1))
    mean = jax.random.normal(key_m, (4, 2))
    log_std = jnp.array([-0.5, 0.3])
    actions = jax.random.normal(key_a, (4, 2)) * 2.0
    policy = PolicyOutput(loc=mean, log_std=log_std)
    ref = distrax.MultivariateNormalDiag(mean, jnp.broadcast_to(jnp.exp(log_std), mean.shape))
    # float32 sums of −½z² (|z| ≲ 15), log σ and ½ log 2π: ≲ 5 u·(|log p| + 5) ≈ 3e-7·|log p| + 2e-6,
    # inside atol 1e-5 + rtol 1e-5·|log p|
    np.testing.assert_allclose(log_prob(policy, actions), ref.log_prob(actions), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(entropy(policy), ref.entropy(), rtol=1e-5, atol=1e-5)
    m, s, a = np.asarray(mean, np.float64), np.exp(np.asarray(log_std, np.float64)), np.asarray(actions, np.float64)
    expected = (-0.5 * ((a - m) / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi)).sum(-1)
    np.testing.assert_allclose(log_prob(policy, actions), expected, rtol=1e-5, atol=1e-5)


def test_actor_critic_shapes_and_gaussian_sampling_moments():
    net = ActorCritic(action_dim=2, discrete=False, hidden_sizes=(8,), init_log_std=-1.0)
    obs = jnp.ones((3, 5))
    params = net.init(jax.random.PRNGKey(0), obs)
    policy, value = net.apply(params, obs)
    assert policy.loc.shape == (3, 2) and value.shape == (3,) and policy.log_std.shape == (2,)
    np.testing.assert_allclose(policy.log_std, [-1.0, -1.0])  # a parameter initialised to −1: exact
    big = PolicyOutput(loc=jnp.zeros((20000, 2)), log_std=jnp.log(jnp.array([0.5, 2.0])))
    draws = np.asarray(sample(jax.random.PRNGKey(3), big))
    np.testing.assert_allclose(draws.std(0), [0.5, 2.0], rtol=0.03)  # n = 2·10⁴: SE = σ/√(2n) = 0.5%, 6 SE
    disc = ActorCritic(action_dim=4, discrete=True, hidden_sizes=(8,))
    p2 = disc.init(jax.random.PRNGKey(0), obs)
    pol2, _ = disc.apply(p2, obs)
    assert pol2.log_std is None and pol2.loc.shape == (3, 4)
    assert sample(jax.random.PRNGKey(0), pol2).dtype == jnp.int32


def _run(venv, actions, steps, key):
    state, obs0 = venv.reset(key)

    def body(state, k):
        state, out = venv.step(k, state, actions)
        return state, out

    _, outs = jax.jit(lambda s, k: jax.lax.scan(body, s, jax.random.split(k, steps)))(state, key)
    return obs0, outs


def test_cartpole_terminates_and_auto_resets():
    venv = VecEnv("CartPole-v1", num_envs=2)
    _, outs = _run(venv, jnp.zeros(2, jnp.int32), 40, jax.random.PRNGKey(0))  # always push left
    term = np.asarray(outs.terminated)
    assert term.any(axis=0).all(), "constant action must topple the pole within 40 steps"
    assert not np.asarray(outs.truncated).any()
    t, e = np.argwhere(term)[0]
    final = np.asarray(outs.next_obs)[t, e]
    reset = np.asarray(outs.obs)[t, e]
    # gymnax terminates at |x| > 2.4 or |θ| > 12° = 0.20944: no arithmetic, 0.2094 is just below
    assert abs(final[0]) > 2.4 or abs(final[2]) > 0.2094  # true successor is out of bounds
    # gymnax CartPole resets uniformly in ±0.05 (float32 draws, compared with float32(0.05) under NEP 50)
    assert np.all(np.abs(reset) <= 0.05)
    # episode bookkeeping: CartPole pays 1 per step, so return == length at the end
    assert outs.episode_length[t, e] == t + 1
    np.testing.assert_allclose(outs.episode_return[t, e], t + 1)  # a sum of 1.0s < 2^24: exact
    # not-done steps: next_obs equals the next step's obs
    nd = ~np.asarray(outs.terminated | outs.truncated)[:-1]
    np.testing.assert_array_equal(np.asarray(outs.next_obs)[:-1][nd], np.asarray(outs.obs)[:-1][nd])


def test_pendulum_truncates_at_time_limit_not_terminates():
    venv = VecEnv("Pendulum-v1", num_envs=2, normalize_obs=False)
    _, outs = _run(venv, jnp.zeros((2, 1)), 205, jax.random.PRNGKey(1))
    trunc = np.asarray(outs.truncated)
    assert not np.asarray(outs.terminated).any()
    assert trunc[199].all() and trunc.sum() == 2  # max_steps_in_episode = 200
    assert (np.asarray(outs.episode_length)[199] == 200).all()
    # the truncated step keeps the true successor, distinct from the reset observation
    assert not np.allclose(np.asarray(outs.next_obs)[199], np.asarray(outs.obs)[199])  # O(0.1–1) apart
    assert np.asarray(outs.episode_length)[200].tolist() == [1, 1]


def test_running_stats_match_numpy_and_normalised_obs():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 3)).astype(np.float32) for n in (4, 7, 1, 9)]
    stats = init_running_stats((3,))
    for b in batches:
        stats = update_running_stats(stats, jnp.asarray(b))
    allobs = np.concatenate(batches)
    # float32 merges of 21 samples (mean 3, sd 2) on both sides: ≲ 20 u·(mean² + var)/var ≈ 4e-6 on
    # the variance, less on the mean: rtol 1e-5 / 1e-4
    np.testing.assert_allclose(stats.mean, allobs.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats.var, allobs.var(0), rtol=1e-4)
    venv = VecEnv("Pendulum-v1", num_envs=4, normalize_obs=True)
    state, obs0 = venv.reset(jax.random.PRNGKey(0))
    assert state.obs_stats.count == 4
    # a batch normalised by its own statistics: |mean| ≲ 4 u·max|x|/σ ≈ 6e-7 (|x| ≤ 1, σ ≥ 0.4 here)
    np.testing.assert_allclose(np.asarray(obs0).mean(0), 0.0, atol=1e-5)


def test_env_config_errors_name_the_field():
    with pytest.raises(ValueError, match="env_name"):
        VecEnv("NotAnEnv-v0", 2)
    with pytest.raises(ValueError, match="num_envs"):
        VecEnv("CartPole-v1", 0)
