"""Learner evaluation: episode returns of given parameters on fresh environments.

The trainer's ``episode_return`` is the return of the *behaviour* policy, so at lag k it scores
parameters k versions old. :func:`evaluate` scores any parameters on their own (in the trainer:
the current learner parameters θ after a batch's update, the next batch's θ_T)::

    env_state, o_0 ← reset(key_reset)           num_episodes fresh envs, one episode each
    a_t = argmax_a π_θ(a|ô_t) / mean of π_θ(·|ô_t)      (deterministic)
        ~ π_θ(·|ô_t)                                     (stochastic)
    ô_t = normalize(o_t) with the training run's statistics, frozen
    G_e = Σ_t r_t of env e's first episode (undiscounted), until it terminates or is
          truncated by the env's time limit

**Protocol (our choices).**
  * Fresh env instances: ``make_vec_env(config.env_name, num_episodes)`` with normalisation off
    (raw observations), so the training envs, their episode bookkeeping and their running
    statistics are untouched; continuous actions are clipped to the action box by the adapter,
    as in training.
  * Frozen observation normalisation: with ``config.normalize_obs`` the raw observation is
    normalised by :func:`fresh_rl.control.env_types.normalize` with the given ``obs_stats``
    (the training run's running statistics at evaluation time), never updated here.
  * Each env counts only its first episode; the loop stops when every env's first episode has
    ended (at most ``time_limit`` steps: gymnax ``max_steps_in_episode``, Brax
    ``⌈episode_length / action_repeat⌉``).
  * Keys: ``key_reset, key_steps = split(key)``; step t acts and steps the envs with
    ``split(fold_in(key_steps, t))``. In the trainer, iteration i evaluates with
    :func:`evaluation_key` of its iteration key (a stream of its own: the rollout and update
    keys are unchanged), deterministic and stochastic with the same key (the same initial
    states).
"""
from __future__ import annotations

from typing import Any, Optional

import chex
import jax
import jax.numpy as jnp

from fresh_rl.control import envs as envs_lib
from fresh_rl.control import networks
from fresh_rl.control.config import TrainConfig
from fresh_rl.control.env_types import RunningStats, normalize
from fresh_rl.validation import require_int

_EVAL_STREAM = 0x6576616C  # "eval": fold_in tag of the evaluation key stream


def evaluation_key(iteration_key: chex.PRNGKey) -> jax.Array:
    """The evaluation key of one training iteration: ``fold_in(iteration_key, tag)``."""
    return jax.random.fold_in(iteration_key, _EVAL_STREAM)


def evaluate(config: TrainConfig, params: Any, obs_stats: Optional[RunningStats], key: chex.PRNGKey,
             num_episodes: int, deterministic: chex.Numeric) -> jax.Array:
    """Undiscounted returns ``[num_episodes]`` of ``params`` (protocol in the module docstring).

    Jittable with ``static_argnums=(0, 4)``; ``deterministic`` is a bool that may be traced
    (:func:`evaluation_metrics` vmaps over it, so both modes share one compiled loop).
    ``obs_stats`` (the training run's ``state.env_state.obs_stats``) is required when
    ``config.normalize_obs`` and ignored otherwise.
    """
    require_int("num_episodes", num_episodes, 1)
    if config.normalize_obs and obs_stats is None:
        raise ValueError("obs_stats must be the training run's RunningStats when config.normalize_obs "
                         "is set (evaluation normalises with them frozen), got None")
    train_venv = config.vec_env
    venv = envs_lib.make_vec_env(config.env_name, num_episodes, normalize_obs=False,
                                 obs_clip=config.obs_clip, brax_backend=config.brax_backend)
    net = config.network()
    limit = venv.time_limit
    key_reset, key_steps = jax.random.split(key)
    env_state, obs = venv.reset(key_reset)

    def act(obs, key):
        policy, _ = net.apply(params, normalize(train_venv, obs_stats, obs) if config.normalize_obs else obs)
        return jnp.where(deterministic, networks.mode(policy), networks.sample(key, policy))

    def cond(carry):
        t, _, _, _, finished = carry
        return (t < limit) & ~jnp.all(finished)

    def body(carry):
        t, env_state, obs, returns, finished = carry
        key_act, key_env = jax.random.split(jax.random.fold_in(key_steps, t))
        env_state, out = venv.step(key_env, env_state, act(obs, key_act))
        first_end = out.done & ~finished
        returns = jnp.where(first_end, out.episode_return, returns)
        return t + 1, env_state, out.obs, returns, finished | out.done

    init = (jnp.zeros((), jnp.int32), env_state, obs, jnp.zeros((num_episodes,), jnp.float32),
            jnp.zeros((num_episodes,), bool))
    _, env_state, _, returns, finished = jax.lax.while_loop(cond, body, init)
    # an episode still running at the step cap (not reached by gymnax or Brax envs) counts its return so far
    return jnp.where(finished, returns, env_state.episode_return)


def evaluation_metrics(config: TrainConfig, params: Any, obs_stats: Optional[RunningStats],
                       key: chex.PRNGKey) -> dict[str, jax.Array]:
    """``return_deterministic`` and ``return_stochastic``: means over ``config.eval_episodes``
    returns of :func:`evaluate`, both with ``key`` (one loop, vmapped over the mode); NaN when
    ``params`` hold a non-finite value. A diverged policy acts NaN, and an env may score that
    well: Brax inverted_pendulum's termination test is false for a NaN state, so a NaN policy
    "balances" for the whole episode (return 1000); NaN keeps a divergence visible to scores."""
    returns = jax.vmap(lambda det: evaluate(config, params, obs_stats, key, config.eval_episodes, det))(
        jnp.array([True, False]))
    finite = jnp.all(jnp.asarray([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(params)]))
    means = jnp.where(finite, jnp.mean(returns, axis=-1), jnp.nan)
    return {"return_deterministic": means[0], "return_stochastic": means[1]}


def evaluate_learner(config: TrainConfig, params: Any, obs_stats: Optional[RunningStats], version: jax.Array,
                     last_eval: dict, key: chex.PRNGKey) -> tuple[dict, dict]:
    """The trainer's learner evaluation after the update that makes learner ``version``: when
    it is a multiple of ``eval_every`` or the last one (``lax.cond``) evaluate ``params``, else
    carry ``last_eval`` forward. Returns ``(last_eval, metrics)``: ``eval/return_deterministic``,
    ``eval/return_stochastic`` and ``eval/valid`` (1 on the iterations that evaluated)."""
    due = (version % config.eval_every == 0) | (version == config.num_iterations)
    last_eval = jax.lax.cond(due, lambda: evaluation_metrics(config, params, obs_stats, key), lambda: last_eval)
    metrics = {f"eval/{k}": v for k, v in last_eval.items()}
    return last_eval, {**metrics, "eval/valid": due.astype(jnp.int32)}
