"""Control RL on gymnax and Brax with simulated policy lag.

* :mod:`.networks` — actor-critic MLPs (categorical / Gaussian with state-independent log-std),
  log-prob, entropy, sampling.
* :mod:`.envs` — vectorised gymnax 1.x adapter: auto-reset, terminated ≠ truncated, running
  observation normalisation, episode bookkeeping; ``make_vec_env`` dispatches env ids.
* :mod:`.brax_envs` — the same interface over Brax tasks (``"brax/<name>"`` ids), with our own
  time limit and auto-reset.
* :mod:`.train` — ``TrainConfig`` and the jittable, seed-vmappable ``train(config, key)`` for
  PPO-clip, PPO-KL, SPO, IMPALA, VACO and its ablations, with backward lag from the version ring.
"""
from fresh_rl.control.brax_envs import BRAX_BACKENDS, BraxVecEnv, brax_env_names
from fresh_rl.control.envs import (
    EnvSpec,
    RunningStats,
    StepOutput,
    VecEnv,
    VecEnvState,
    env_names,
    gymnax_env_names,
    make_vec_env,
)
from fresh_rl.control.networks import ActorCritic, PolicyOutput, entropy, log_prob, sample
from fresh_rl.control.train import (
    METHODS,
    VACO_ADVANTAGE_FORMS,
    ADVANTAGE_NORMALIZATIONS,
    Batch,
    SweepParams,
    TrainConfig,
    TrainOutput,
    TrainState,
    init_state,
    train,
    train_iteration,
)

__all__ = [
    "ADVANTAGE_NORMALIZATIONS",
    "SweepParams",
    "BRAX_BACKENDS",
    "METHODS",
    "VACO_ADVANTAGE_FORMS",
    "ActorCritic",
    "Batch",
    "BraxVecEnv",
    "EnvSpec",
    "PolicyOutput",
    "RunningStats",
    "StepOutput",
    "TrainConfig",
    "TrainOutput",
    "TrainState",
    "VecEnv",
    "VecEnvState",
    "brax_env_names",
    "entropy",
    "env_names",
    "gymnax_env_names",
    "init_state",
    "log_prob",
    "make_vec_env",
    "sample",
    "train",
    "train_iteration",
]
