"""Acting: the actors' rollout with lagged versions, the simulated inference engine, and the
learner's batch-start forward pass.

One rollout (``TrainConfig.rollout_length`` = T steps in ``num_envs`` envs)::

    lags_g ~ TrainConfig.delay, one draw per actor group g (backward lag)
    θ_g, v_g ← version_ring.gather(ring, lags)            version v_T − k_g
    env e acts with θ_{group(e)}; with an inference engine, actions come from the perturbed
        π_infer (the engine) and the clean log π_v(a|s) is recorded beside log π_infer(a|s)
    stored per step: s, a, r, terminated, truncated, s_{t+1}, log β(a|s), log π_v(a|s), v

**The inference engine** (``TrainConfig.inference_discrepancy``; our choice, the missing-old-
logits paper, arXiv 2605.12070, does not model one): logits z̃ = z + σ(s)·ε, ε ~ N(0, I) fresh
at every step, with σ(s) = discrepancy/κ(s) and κ(s) = √(2/π)·Σ_a π(a|s)·√(1 − 2π(a|s) +
Σ_b π(b|s)²), the first-order mean of |log r_d| per unit σ, so E|log r_d| ≈ discrepancy in
every state whatever the policy; σ ≤ ``max_logit_noise`` where the policy is nearly
deterministic.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp
from flax import struct

from fresh_rl.control import networks
from fresh_rl.control.config import TrainConfig
from fresh_rl.lag import actor_group_ids, sample_lags, version_ring

InferenceEngine = Callable[[networks.PolicyOutput, chex.PRNGKey], networks.PolicyOutput]
"""``engine(policy, key) -> acting policy``: how an inference engine's distribution differs from
the trainer's clean one for the same parameters."""


@struct.dataclass
class Batch:
    """One iteration's rollout, batch-major ``[num_envs, T, ...]``.

    ``behaviour_log_prob`` = log β(a|s), the acting distribution's log-prob (the engine's when
    there is one) under version ``version``; ``train_log_prob`` = the clean log π_v(a|s) of the
    same version (equal to ``behaviour_log_prob`` without an engine); ``next_obs`` is the true
    successor (the final observation on episode ends).
    """

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array
    behaviour_log_prob: jax.Array
    version: jax.Array
    train_log_prob: jax.Array


def first_order_discrepancy(logits: jax.Array) -> jax.Array:
    """κ(s) = E|log r_d| per unit logit noise σ, to first order in σ, ``[...]``.

    With z̃ = z + σε, log π(a) − log π̃(a) ≈ −σ(ε_a − Σ_b π_b ε_b), a centred normal of variance
    σ²(1 − 2π_a + Σ_b π_b²); its mean absolute value is σ√(2/π)·√(·), averaged over a ~ π.
    """
    p = jax.nn.softmax(logits, axis=-1)
    spread = jnp.sqrt(jnp.maximum(1.0 - 2.0 * p + jnp.sum(p * p, axis=-1, keepdims=True), 0.0))
    return math.sqrt(2.0 / math.pi) * jnp.sum(p * spread, axis=-1)


def make_inference_engine(discrepancy: float, max_logit_noise: float) -> InferenceEngine:
    """``engine(policy, key)``: discrete π with logits z + σ(s)ε, σ(s) = min(discrepancy/κ(s),
    max_logit_noise) (module docstring); the identity in distribution when ``discrepancy`` = 0."""

    def engine(policy: networks.PolicyOutput, key) -> networks.PolicyOutput:
        kappa = first_order_discrepancy(policy.loc)
        sigma = jnp.minimum(discrepancy / jnp.maximum(kappa, 1e-12), max_logit_noise)
        noise = jax.random.normal(key, policy.loc.shape, policy.loc.dtype)
        return policy.replace(loc=policy.loc + sigma[..., None] * noise)

    return engine


def rollout(config: TrainConfig, ring: version_ring.VersionRing, env_state: Any, obs: jax.Array, key,
            lag: jax.Array) -> tuple[Any, jax.Array, Batch, dict]:
    """Act for T steps; env e uses the version of its group's sampled lag (module docstring).

    ``lag`` is the traced fixed lag (read with ``delay.kind == "fixed"``). With an engine each
    acting key is split into (perturbation, action) keys; without one the key schedule is
    the plain one. Returns ``(env_state, obs, batch, metrics)`` with the metrics
    ``episode_return_sum``, ``episodes_completed`` and ``lag/sampled_lag_mean``.
    """
    net = config.network()
    venv = config.vec_env
    G = config.num_actor_groups
    T = config.rollout_length
    engine: Optional[InferenceEngine] = (
        None if config.inference_discrepancy is None
        else make_inference_engine(config.inference_discrepancy, config.max_logit_noise))
    # one split for the whole rollout: the lag draw, then per step G acting keys and an env key
    keys = jax.random.split(key, 1 + T * (G + 1))
    key_lag, step_keys_ = keys[0], keys[1:].reshape(T, G + 1, *keys.shape[1:])
    available = version_ring.available_versions(ring)
    if config.lag_warmup_versions:  # serve no version older than W_u (TrainConfig docstring)
        available = jnp.minimum(available, jnp.maximum(
            ring.latest_version - config.lag_warmup_versions, 0).astype(available.dtype) + 1)
    lags = sample_lags(key_lag, config.delay, G, available,
                       fixed_lag=lag if config.delay.kind == "fixed" else None)
    group_params, group_versions = version_ring.gather(ring, lags)
    env_versions = group_versions[actor_group_ids(config.num_envs, G)]

    def group_act(params, obs, key):
        policy, _ = net.apply(params, obs)
        if engine is None:
            actions = networks.sample(key, policy)
            logp = networks.log_prob(policy, actions)
            return actions, logp, logp
        key_engine, key_act = jax.random.split(key)
        acting = engine(policy, key_engine)
        actions = networks.sample(key_act, acting)
        return actions, networks.log_prob(acting, actions), networks.log_prob(policy, actions)

    def step(carry, keys):
        env_state, obs, ret_sum, ret_count = carry
        obs_g = obs.reshape(G, config.num_envs // G, *obs.shape[1:])
        actions_g, logp_g, train_logp_g = jax.vmap(group_act)(group_params, obs_g, keys[:G])
        actions = actions_g.reshape(config.num_envs, *actions_g.shape[2:])
        env_state, out = venv.step(keys[G], env_state, actions)
        ret_sum = ret_sum + jnp.sum(jnp.where(out.done, out.episode_return, 0.0))
        ret_count = ret_count + jnp.sum(out.done)
        transition = Batch(
            obs=obs, action=actions, reward=out.reward, terminated=out.terminated,
            truncated=out.truncated, next_obs=out.next_obs,
            behaviour_log_prob=logp_g.reshape(config.num_envs), version=env_versions,
            train_log_prob=train_logp_g.reshape(config.num_envs))
        return (env_state, out.obs, ret_sum, ret_count), transition

    init = (env_state, obs, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
    (env_state, obs, ret_sum, ret_count), traj = jax.lax.scan(step, init, step_keys_)
    batch = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), traj)  # [T, N, ...] → [N, T, ...]
    return env_state, obs, batch, {"episode_return_sum": ret_sum, "episodes_completed": ret_count,
                                   "lag/sampled_lag_mean": jnp.mean(lags.astype(jnp.float32))}


def batch_start(config: TrainConfig, params, obs: jax.Array, action: jax.Array, next_obs: jax.Array):
    """Learner forward pass on rows ``[rows, T]``: log π(a|s), V(s), V(s_{t+1}) under ``params``
    (one forward on [obs; next_obs] instead of two)."""
    policy, values = config.network().apply(params, jnp.concatenate([obs, next_obs], axis=0))
    n = obs.shape[0]
    policy = jax.tree.map(lambda x: x[:n] if x.ndim > 1 else x, policy)
    return networks.log_prob(policy, action), values[:n], values[n:]


def log_probs(config: TrainConfig, params, obs: jax.Array, action: jax.Array) -> jax.Array:
    """log π(a|s) ``[rows, T]`` under ``params`` (one forward pass)."""
    policy, _ = config.network().apply(params, obs)
    return networks.log_prob(policy, action)


__all__ = ["Batch", "InferenceEngine", "batch_start", "first_order_discrepancy", "log_probs",
           "make_inference_engine", "rollout"]
