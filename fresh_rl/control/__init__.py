"""Control RL on gymnax and Brax with simulated policy lag: one trainer, three seams.

* :mod:`.networks` — actor-critic MLPs, or a CNN then the MLP on image observations
  (categorical / Gaussian with state-independent log-std), log-prob, entropy, sampling, mode.
* :mod:`.env_types` — what both env adapters share: ``EnvSpec``, ``VecEnvState``,
  ``StepOutput``, running observation normalisation, terminated ≠ truncated, episode bookkeeping.
* :mod:`.envs` — vectorised gymnax 1.x adapter with auto-reset; ``make_vec_env`` dispatches env ids.
* :mod:`.brax_envs` — the same interface over Brax tasks (``"brax/<name>"`` ids), with our own
  time limit and auto-reset.
* :mod:`.methods` — the method registry (``Method``, ``register_method``, ``METHODS``):
  PPO-clip, PPO-KL, SPO, IMPALA, the VACO family, decoupled PPO.
* :mod:`.data_sources` — the data-source registry (``DataSource``, ``DATA_SOURCES``): lagged
  actors, and replay (uniform, PER, the authors' PER, the age-decayed FreshPER buffer).
* :mod:`fresh_rl.corrections.routes` — the old-log-prob route registry shared with the LLM
  trainer; :mod:`.old_log_probs` — the control trainer's sources for it.
* :mod:`.config` — ``TrainConfig``: the static run, the three seams and which combinations run.
* :mod:`.hyperparams` — ``HyperParams``, the traced (sweepable) hyperparameters as one pytree.
* :mod:`.acting` — the lagged actors' rollout, the simulated inference engine, batch start.
* :mod:`.losses` — advantages, value targets, normalisation and the per-minibatch loss.
* :mod:`.train` — the update loop and the jittable, seed- and hyperparameter-vmappable
  ``train(config, key, hparams)``.
* :mod:`.evaluation` — ``evaluate``: episode returns of given (e.g. the learner's) parameters
  on fresh envs with frozen observation statistics; the trainer's ``eval/…`` metrics.
"""
from fresh_rl.control.acting import Batch
from fresh_rl.control.brax_envs import BRAX_BACKENDS, BraxVecEnv, brax_env_names
from fresh_rl.control.config import VACO_ADVANTAGE_FORMS, TrainConfig, combination_error
from fresh_rl.control.data_sources import DATA_SOURCES, DataSource, ReplaySettings, register_data_source
from fresh_rl.control.env_types import EnvSpec, RunningStats, StepOutput, VecEnvState
from fresh_rl.control.envs import VecEnv, env_names, gymnax_env_names, make_vec_env
from fresh_rl.control.evaluation import evaluate, evaluation_key
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.methods import ADVANTAGE_NORMALIZATIONS, METHODS, Method, register_method
from fresh_rl.control.networks import ActorCritic, PolicyOutput, entropy, log_prob, mode, sample
from fresh_rl.control.train import TrainOutput, TrainState, init_state, train, train_iteration

__all__ = [
    "ADVANTAGE_NORMALIZATIONS",
    "BRAX_BACKENDS",
    "DATA_SOURCES",
    "METHODS",
    "VACO_ADVANTAGE_FORMS",
    "ActorCritic",
    "Batch",
    "BraxVecEnv",
    "DataSource",
    "EnvSpec",
    "HyperParams",
    "Method",
    "PolicyOutput",
    "ReplaySettings",
    "RunningStats",
    "StepOutput",
    "TrainConfig",
    "TrainOutput",
    "TrainState",
    "VecEnv",
    "VecEnvState",
    "brax_env_names",
    "combination_error",
    "entropy",
    "env_names",
    "evaluate",
    "evaluation_key",
    "gymnax_env_names",
    "init_state",
    "log_prob",
    "make_vec_env",
    "mode",
    "register_data_source",
    "register_method",
    "sample",
    "train",
    "train_iteration",
]
