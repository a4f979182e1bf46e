"""Control RL on gymnax and Brax with simulated policy lag.

* :mod:`.networks` — actor-critic MLPs, or a CNN then the MLP on image observations
  (categorical / Gaussian with state-independent log-std), log-prob, entropy, sampling, mode.
* :mod:`.env_types` — what both env adapters share: ``EnvSpec``, ``VecEnvState``,
  ``StepOutput``, running observation normalisation, terminated ≠ truncated, episode bookkeeping.
* :mod:`.envs` — vectorised gymnax 1.x adapter with auto-reset; ``make_vec_env`` dispatches env ids.
* :mod:`.brax_envs` — the same interface over Brax tasks (``"brax/<name>"`` ids), with our own
  time limit and auto-reset.
* :mod:`.hyperparams` — ``HyperParams``, the traced (sweepable) hyperparameters as one pytree.
* :mod:`.methods` — the method registry (``Method``, ``register_method``, ``METHODS``):
  PPO-clip, PPO-KL, SPO, IMPALA, VACO and its ablations.
* :mod:`.train` — ``TrainConfig`` and the jittable, seed- and hyperparameter-vmappable
  ``train(config, key, hparams)``, with backward lag from the version ring.
* :mod:`.evaluation` — ``evaluate``: episode returns of given (e.g. the learner's) parameters
  on fresh envs with frozen observation statistics; the trainer's ``eval/…`` metrics.
* :mod:`.replay_train` — actor-critic with trajectory replay (the FreshPER control study).
* :mod:`.old_logits_train` — decoupled-loss PPO with an inference engine, random staleness and
  the old-logit routes (the missing-old-logits control study).
"""
from fresh_rl.control.brax_envs import BRAX_BACKENDS, BraxVecEnv, brax_env_names
from fresh_rl.control.env_types import EnvSpec, RunningStats, StepOutput, VecEnvState
from fresh_rl.control.envs import VecEnv, env_names, gymnax_env_names, make_vec_env
from fresh_rl.control.evaluation import evaluate, evaluation_key
from fresh_rl.control.networks import ActorCritic, PolicyOutput, entropy, log_prob, mode, sample
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.methods import ADVANTAGE_NORMALIZATIONS, METHODS, Method, register_method
from fresh_rl.control.train import (
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
    "ADVANTAGE_NORMALIZATIONS",
    "BRAX_BACKENDS",
    "METHODS",
    "VACO_ADVANTAGE_FORMS",
    "ActorCritic",
    "Batch",
    "BraxVecEnv",
    "EnvSpec",
    "HyperParams",
    "Method",
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
    "evaluate",
    "evaluation_key",
    "gymnax_env_names",
    "init_state",
    "log_prob",
    "make_vec_env",
    "mode",
    "register_method",
    "sample",
    "train",
    "train_iteration",
]
