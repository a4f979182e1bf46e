"""Types and step bookkeeping shared by the gymnax and Brax adapters.

Both :class:`fresh_rl.control.envs.VecEnv` and :class:`fresh_rl.control.brax_envs.BraxVecEnv`
only produce the raw ``(obs, final_obs, reward, terminated, truncated)`` of a vectorised step
and hand it to :func:`start_episodes` / :func:`finish_step` here, so one piece of code owns:

**Both flags on one step (our choice).** When the time limit and the terminal test fire on
the same step, the step counts as *terminated* (no bootstrap), ``truncated`` is reported
as ``False``: the episode really ended, the time limit adds nothing.

**Observation normalisation** (optional, ``normalize_obs``): running mean/variance over the first reset
batch and every successor observation s_{t+1} the actors receive (parallel Welford merge of
each step's batch of ``num_envs`` observations; later reset observations are not added, our
choice), ``ô = clip((o − μ)/√(σ² + 1e-8), ±obs_clip)``, elementwise: one mean and variance per
entry of the observation shape (per pixel and channel of an image ``[H, W, C]``). The statistics are
updated *before* the step's observations are normalised, and ``obs`` and ``next_obs`` of one
step use the same statistics, so ``next_obs_t`` equals ``obs_{t+1}`` on non-final steps. The
trainer stores normalised observations, so behaviour and learner log-probs see identical
inputs. With the flag off the statistics are left at (0, 1) and ``ô = o``.

**Episode bookkeeping.** The undiscounted return and length of each running episode are
accumulated and reported on the step that ends it (``episode_return``, ``episode_length``,
valid where ``done``).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import chex
import jax
import jax.numpy as jnp
from flax import struct


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Static shape information of an environment.

    Attributes:
      obs_shape: shape of one observation: ``[D]`` (vector) or ``[H, W, C]`` (image).
      discrete: categorical actions (True) or a continuous box (False).
      action_dim: number of actions (discrete) or box dimension (continuous).
      action_low, action_high: box bounds (continuous; ``None`` for discrete).
    """

    obs_shape: tuple[int, ...]
    discrete: bool
    action_dim: int
    action_low: Any = None
    action_high: Any = None


@struct.dataclass
class RunningStats:
    """Running mean and variance of observations (parallel Welford; Chan et al. 1979).

    Merging a batch with mean m_b, variance v_b (population) and size n_b into (n, μ, M2)::

        n' = n + n_b,   Δ = m_b − μ,   μ' = μ + Δ n_b/n',
        M2' = M2 + v_b n_b + Δ² n n_b/n',   σ² = M2'/n'
    """

    count: jax.Array
    mean: jax.Array
    m2: jax.Array

    @property
    def var(self) -> jax.Array:
        return jnp.where(self.count > 0, self.m2 / jnp.maximum(self.count, 1.0), 1.0)


def init_running_stats(obs_shape) -> RunningStats:
    return RunningStats(
        count=jnp.zeros((), jnp.float32),
        mean=jnp.zeros(obs_shape, jnp.float32),
        m2=jnp.zeros(obs_shape, jnp.float32),
    )


def update_running_stats(stats: RunningStats, batch: chex.Array) -> RunningStats:
    """Merge a ``[n_b, *obs_shape]`` batch into ``stats`` (formula in the class docstring)."""
    batch = batch.astype(jnp.float32)
    n_b = jnp.asarray(batch.shape[0], jnp.float32)
    m_b = jnp.mean(batch, axis=0)
    v_b = jnp.var(batch, axis=0)
    total = stats.count + n_b
    delta = m_b - stats.mean
    mean = stats.mean + delta * n_b / total
    m2 = stats.m2 + v_b * n_b + jnp.square(delta) * stats.count * n_b / total
    return RunningStats(count=total, mean=mean, m2=m2)


@struct.dataclass
class VecEnvState:
    """Per-seed state of ``num_envs`` environments.

    Attributes:
      env_state: the wrapped environment's state pytree (gymnax or Brax), leading axis ``num_envs``.
      obs_stats: :class:`RunningStats` (shared by all envs of one seed).
      episode_return, episode_length: ``[num_envs]`` accumulators of the running episodes.
    """

    env_state: Any
    obs_stats: RunningStats
    episode_return: jax.Array
    episode_length: jax.Array


@struct.dataclass
class StepOutput:
    """One vectorised step, every field ``[num_envs, ...]``.

    Attributes:
      obs: (normalised) observation to act on next — the reset observation where ``done``.
      next_obs: (normalised) true successor s_{t+1} before any reset, for bootstrapping.
      reward: float32 reward of the step.
      terminated: bool, the task's terminal state was reached (no bootstrap).
      truncated: bool, the time limit ended the episode and it was not terminated.
      episode_return, episode_length: totals of the episode that ended here (valid where done).
    """

    obs: jax.Array
    next_obs: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    episode_return: jax.Array
    episode_length: jax.Array

    @property
    def done(self) -> jax.Array:
        return self.terminated | self.truncated


def normalize(venv, stats: RunningStats, obs: jax.Array) -> jax.Array:
    """``clip((o − μ)/√(σ² + 1e-8), ±obs_clip)`` when ``venv.normalize_obs``, else float32 ``o``."""
    obs = obs.astype(jnp.float32)
    if not venv.normalize_obs:
        return obs
    z = (obs - stats.mean) / jnp.sqrt(stats.var + 1e-8)
    return jnp.clip(z, -venv.obs_clip, venv.obs_clip)


def start_episodes(venv, env_state: Any, obs: jax.Array) -> tuple[VecEnvState, jax.Array]:
    """State and (normalised) observations after resetting all ``venv.num_envs`` envs.

    ``venv`` is an adapter (``num_envs``, ``normalize_obs``, ``obs_clip``); the first reset
    batch ``obs [num_envs, ...]`` enters the running statistics.
    """
    stats = init_running_stats(obs.shape[1:])
    if venv.normalize_obs:
        stats = update_running_stats(stats, obs)
    state = VecEnvState(
        env_state=env_state,
        obs_stats=stats,
        episode_return=jnp.zeros((venv.num_envs,), jnp.float32),
        episode_length=jnp.zeros((venv.num_envs,), jnp.int32),
    )
    return state, normalize(venv, stats, obs)


def finish_step(venv, state: VecEnvState, env_state: Any, obs: jax.Array, final_obs: jax.Array,
                reward: jax.Array, terminated: jax.Array, truncated: jax.Array
                ) -> tuple[VecEnvState, StepOutput]:
    """Statistics, both-flags rule and episode bookkeeping of one raw vectorised step.

    Args: the adapter ``venv``, the state before the step, the env state after auto-reset,
    ``obs`` (reset observation where done), ``final_obs`` (true successor s_{t+1}), and the
    step's ``reward``, ``terminated`` and raw ``truncated`` (time limit; ``& ~terminated``
    is applied here), each with leading axis ``num_envs``.
    """
    n = venv.num_envs
    reward = jnp.reshape(reward, (n,)).astype(jnp.float32)
    terminated = jnp.reshape(terminated, (n,)).astype(bool)
    truncated = jnp.reshape(truncated, (n,)).astype(bool) & ~terminated
    done = terminated | truncated
    stats = state.obs_stats
    if venv.normalize_obs:
        # Our choice: the statistics see the first reset batch and every successor s_{t+1}
        # (final observations before a reset); later reset observations are not added.
        stats = update_running_stats(stats, final_obs)
    episode_return = state.episode_return + reward
    episode_length = state.episode_length + 1
    new_state = VecEnvState(
        env_state=env_state,
        obs_stats=stats,
        episode_return=jnp.where(done, 0.0, episode_return),
        episode_length=jnp.where(done, 0, episode_length),
    )
    out = StepOutput(
        obs=normalize(venv, stats, obs),
        next_obs=normalize(venv, stats, final_obs),
        reward=reward,
        terminated=terminated,
        truncated=truncated,
        episode_return=episode_return,
        episode_length=episode_length,
    )
    return new_state, out
