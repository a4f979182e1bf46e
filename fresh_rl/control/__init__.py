"""Control RL on gymnax with simulated policy lag.

* :mod:`.networks` — actor-critic MLPs (categorical / Gaussian with state-independent log-std),
  log-prob, entropy, sampling.
* :mod:`.envs` — vectorised gymnax 1.x adapter: auto-reset, terminated ≠ truncated, running
  observation normalisation, episode bookkeeping.
* :mod:`.train` — ``TrainConfig`` and the jittable, seed-vmappable ``train(config, key)`` for
  PPO-clip, PPO-KL, SPO, IMPALA, VACO and its ablations, with backward lag from the version ring.
"""
from fresh_rl.control.envs import EnvSpec, RunningStats, StepOutput, VecEnv, VecEnvState, env_names
from fresh_rl.control.networks import ActorCritic, PolicyOutput, entropy, log_prob, sample
from fresh_rl.control.train import (
    METHODS,
    VACO_ADVANTAGE_FORMS,
    Batch,
    TrainConfig,
    TrainOutput,
    TrainState,
    init_state,
    train,
    train_iteration,
)

__all__ = [
    "METHODS",
    "VACO_ADVANTAGE_FORMS",
    "ActorCritic",
    "Batch",
    "EnvSpec",
    "PolicyOutput",
    "RunningStats",
    "StepOutput",
    "TrainConfig",
    "TrainOutput",
    "TrainState",
    "VecEnv",
    "VecEnvState",
    "entropy",
    "env_names",
    "init_state",
    "log_prob",
    "sample",
    "train",
    "train_iteration",
]
