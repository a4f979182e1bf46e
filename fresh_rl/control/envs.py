"""Vectorised gymnax 1.x adapter and the env-id dispatcher.

**What the installed gymnax (1.0.1) gives.** ``env.step(key, state, action, params)`` returns
six values ``(obs, state, reward, terminated, truncated, info)`` and already auto-resets:
``obs``/``state`` are the reset ones when ``done = terminated ∨ truncated``; ``truncated`` is
``state.time ≥ params.max_steps_in_episode`` (the time limit) and ``terminated`` the task's
own terminal test; ``info["final_observation"]`` is the true successor ``s_{t+1}`` before
the reset. This adapter keeps both flags and passes ``final_observation`` on as
``next_obs`` so that a truncated step bootstraps from the real last state.

**Shared with Brax.** Observation normalisation, the both-flags rule (terminated wins) and the
episode bookkeeping live in :mod:`fresh_rl.control.env_types`; :class:`VecEnv` only produces
the raw ``(obs, final_obs, reward, terminated, truncated)`` of a step and calls them.

**Env ids** (:func:`env_names`, :func:`make_vec_env`): gymnax ids as gymnax spells them, and
``"brax/<name>"`` for every Brax registry entry. Observations keep the env's own shape: vectors
``[D]`` (classic control, Brax) or images ``[H, W, C]`` (MinAtar, e.g. ``Breakout-MinAtar``
``[10, 10, 4]``); the trainer picks the network's encoder from the rank.
"""
from __future__ import annotations

import dataclasses
import math

import chex
import gymnax
import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.control.brax_envs import BRAX_BACKENDS, BraxVecEnv, brax_env_names
from fresh_rl.control.env_types import EnvSpec, StepOutput, VecEnvState, finish_step, start_episodes
from fresh_rl.validation import require_choice, require_in_range


BRAX_PREFIX = "brax/"


def gymnax_env_names() -> tuple[str, ...]:
    """Names accepted by :class:`VecEnv` (``gymnax.registered_envs``)."""
    return tuple(gymnax.registered_envs)


def env_names() -> tuple[str, ...]:
    """Every id :func:`make_vec_env` accepts: gymnax ids, then ``"brax/<name>"`` ids."""
    return gymnax_env_names() + tuple(BRAX_PREFIX + n for n in brax_env_names())


def make_vec_env(name: str, num_envs: int, normalize_obs: bool = False, obs_clip: float = 10.0,
                 brax_backend: str = "spring"):
    """The vectorised adapter for ``name``: :class:`~fresh_rl.control.brax_envs.BraxVecEnv`
    (default episode length and action repeat) for ``"brax/<name>"``, gymnax :class:`VecEnv`
    otherwise. ``brax_backend`` is validated for every id (it is a config field either way)."""
    require_choice("brax_backend", brax_backend, BRAX_BACKENDS)
    if name.startswith(BRAX_PREFIX):
        return BraxVecEnv(name[len(BRAX_PREFIX):], num_envs, normalize_obs, obs_clip, backend=brax_backend)
    return VecEnv(name, num_envs, normalize_obs, obs_clip)


@dataclasses.dataclass(frozen=True)
class VecEnv:
    """``num_envs`` copies of a gymnax environment, vmapped, with auto-reset (hashable/static).

    Attributes:
      name: a gymnax environment id (see :func:`gymnax_env_names`).
      num_envs: number of parallel environments (≥ 1).
      normalize_obs: running observation normalisation (see the module docstring).
      obs_clip: clip of normalised observations (> 0).
    """

    name: str = "CartPole-v1"
    num_envs: int = 1
    normalize_obs: bool = False
    obs_clip: float = 10.0

    def __post_init__(self):
        require_choice("env_name", self.name, gymnax_env_names())
        require_in_range("num_envs", self.num_envs, 1, math.inf)
        require_in_range("obs_clip", self.obs_clip, 0.0, math.inf, low_inclusive=False)

    # gymnax objects are rebuilt on demand (cheap) so the dataclass stays hashable.
    def _make(self):
        return gymnax.make(self.name)

    @property
    def spec(self) -> EnvSpec:
        env, params = self._make()
        space = env.action_space(params)
        obs_shape = tuple(env.observation_space(params).shape)
        if hasattr(space, "n"):
            return EnvSpec(obs_shape=obs_shape, discrete=True, action_dim=int(space.n))
        return EnvSpec(
            obs_shape=obs_shape, discrete=False, action_dim=int(space.shape[0]) if space.shape else 1,
            action_low=float(np.min(np.asarray(space.low))),
            action_high=float(np.max(np.asarray(space.high))),
        )

    @property
    def time_limit(self) -> int:
        """Agent steps after which an episode is truncated (gymnax ``max_steps_in_episode``)."""
        _, params = self._make()
        return int(params.max_steps_in_episode)

    def reset(self, key: chex.PRNGKey) -> tuple[VecEnvState, jax.Array]:
        """Reset all envs; returns the state and the (normalised) first observations."""
        env, params = self._make()
        keys = jax.random.split(key, self.num_envs)
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(keys, params)
        return start_episodes(self, env_state, obs)

    def step(self, key: chex.PRNGKey, state: VecEnvState, actions: chex.Array) -> tuple[VecEnvState, StepOutput]:
        """Step every env; continuous actions are clipped to the action box first."""
        env, params = self._make()
        spec = self.spec
        if not spec.discrete:
            actions = jnp.clip(actions, spec.action_low, spec.action_high)
        keys = jax.random.split(key, self.num_envs)
        obs, env_state, reward, terminated, truncated, info = jax.vmap(
            env.step, in_axes=(0, 0, 0, None)
        )(keys, state.env_state, actions, params)
        return finish_step(self, state, env_state, obs, info["final_observation"], reward,
                           terminated, truncated)
