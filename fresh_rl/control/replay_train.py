"""Jitted actor-critic with trajectory replay, the FreshPER control study: ``train(config, key, hp)``.

FreshPER (arXiv 2604.16918) decays a stored trajectory's priority with its age,
``p·exp(−age/τ)``. This trainer puts the replay methods of :mod:`fresh_rl.replay.methods` (the
same registry as the exact bandit bed) into a control loop, so that staleness comes from a
learning actor-critic on gymnax/Brax tasks. One iteration = one policy version = the buffer's
age unit::

    roll out T steps in N envs with the current θ (no actor lag); row e of the batch
        (T steps of env e: s, a, r, terminated, truncated, s', log β(a|s)) is one item
    fresh update: one full-batch gradient step; GAE(λ) advantages on V_θ at batch start,
        standardised over the batch; PPO-clip ratio π_θ/β (= 1 at this step: the plain
        policy gradient); value loss to the λ-returns
    insert the N rows at version v (base priority: mean |Â| of the row, or |Σ r|)
    K extra updates, by the method: none; K more full-batch steps on the fresh batch (the
        matched-update control, ratio against β, clipped); or K replay steps, each on N rows
        sampled from the buffer:
            V-trace with the current θ on the replayed rows (log ρ = log π_θ − log β with the
            stored β, ρ̄, c̄; detached), advantages v_t − V_θ(s_t) (equal to GAE(λ) when ρ ≡ 1),
            standardised over the replay batch, times the row's PER weight w_i; PPO-clip ratio
            π_θ/β against the stored behaviour log-probs; value loss to the V-trace targets,
            weighted by w_i (our choice, as PER weights the whole TD loss)
        then, for the authors' PER, the sampled rows' priorities are rewritten from these
        advantages
    push θ (version v + 1); learner evaluation when due

Where the paper is silent (it studies LLM RL without a critic) the choices are ours and are
config fields: the item is one env row of T steps, the base priority is the row's mean |Â|
(``priority="advantage"``, the classic PER TD-error magnitude; ``"return"`` = |Σ_t r_t| is the
paper's REINFORCE++ choice and is uniform on CartPole, where every reward is 1), the replay
batch has as many rows as the fresh one, the IS weights are normalised by the buffer-wide
maximum (``importance_weight_normalization``) with the decayed priority floored at
``min_decayed_priority`` (the authors' 1e-8).

**Drift** (``log_every``): every ``log_every`` iterations the learner evaluates every stored
step; per age a (iterations since the row was collected) the per-step ratios r = π_θ/β give
ESS/n = (Σ r)²/(n Σ r²) and KL(β‖π_θ) ≈ mean((r − 1) − log r) (Schulman's k3), reported as
``drift/ess`` and ``drift/kl`` ``[snapshots, H]`` (−1 where no row of that age is stored).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Literal

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from fresh_rl.control import networks
from fresh_rl.control.train import (Batch, TrainConfig, TrainState, _batch_start,
                                    _evaluate_learner, _rollout)
from fresh_rl.control.train import init_state as init_train_state
from fresh_rl.control.evaluation import evaluation_key
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.corrections import generalized_advantage_estimation, ppo_clip_loss, vtrace
from fresh_rl.lag import version_ring
from fresh_rl.replay import (ReplayConfig, ReplayState, magnitude_priority,
                             make_trajectory_buffer)
from fresh_rl.replay import methods as replay_methods
from fresh_rl.replay.methods import (UPDATE_FRESH, UPDATE_NONE, UPDATE_REPLAY, ReplayHParams,
                                     update_kind)
from fresh_rl.sweep.keys import split_run_key, step_key
from fresh_rl.validation import require_choice, require_int

PRIORITY_SOURCES = ("advantage", "return")


@dataclasses.dataclass(frozen=True)
class ReplayTrainConfig:
    """Static configuration of a replay run (hashable; traced settings are :class:`ReplayTrainHParams`).

    Attributes:
      train: the actor-critic, env and loss settings (:class:`fresh_rl.control.train.TrainConfig`).
        Its ``method`` must be ``"ppo_clip"``, ``num_epochs``, ``num_minibatches`` and
        ``num_actor_groups`` 1 and its delay a fixed lag 0: each update here is one full-batch
        step, the extra updates are ``extra_updates`` and the actors are not lagged.
      extra_updates: K, updates after the fresh one (epochs on the fresh batch or replay
        batches, by the method).
      buffer_iterations: H, iterations of data the FIFO buffer holds (capacity N·H rows).
      priority: base priority, ``"advantage"`` (mean |Â| of the row) or ``"return"``
        (|Σ_t r_t| of the row).
      priority_exponent, importance_exponent_default, min_decayed_priority,
      importance_weight_normalization: the buffer's α, the β of methods with IS, the
        decayed-priority floor and the weights' normaliser (:class:`fresh_rl.replay.ReplayConfig`).
      buffer_sampling: ``"freshper"`` (τ a traced hyperparameter) or ``"per"`` (no decay at all,
        for the τ = ∞ equivalence test).
      log_every: iterations between drift snapshots; a divisor of the run's iterations.
    """

    train: TrainConfig
    extra_updates: int = 2
    buffer_iterations: int = 256
    priority: Literal["advantage", "return"] = "advantage"
    priority_exponent: float = 0.6
    importance_exponent_default: float = 0.4
    min_decayed_priority: float = 1e-8
    importance_weight_normalization: Literal["buffer", "batch"] = "buffer"
    buffer_sampling: Literal["freshper", "per"] = "freshper"
    log_every: int = 25

    def __post_init__(self):
        t = self.train
        if not isinstance(t, TrainConfig):
            raise ValueError(f"ReplayTrainConfig.train must be a TrainConfig, got {t!r}")
        require_choice("ReplayTrainConfig.train.method", t.method, ("ppo_clip",))
        for name in ("num_epochs", "num_minibatches", "num_actor_groups"):
            if getattr(t, name) != 1:
                raise ValueError(f"ReplayTrainConfig.train.{name} must be 1 (one full-batch step per "
                                 f"update; K extra updates are extra_updates), got {getattr(t, name)}")
        if t.passes_per_batch not in (None, 1):
            raise ValueError(f"ReplayTrainConfig.train.passes_per_batch must be None or 1, "
                             f"got {t.passes_per_batch}")
        if t.delay.kind != "fixed" or t.delay.lag != 0:
            raise ValueError(f"ReplayTrainConfig.train.delay must be a fixed lag 0 (replay staleness "
                             f"only), got {t.delay!r}")
        require_int("ReplayTrainConfig.extra_updates", self.extra_updates, 0)
        require_int("ReplayTrainConfig.buffer_iterations", self.buffer_iterations, 1)
        require_int("ReplayTrainConfig.log_every", self.log_every, 1)
        if t.num_iterations % self.log_every:
            raise ValueError(f"ReplayTrainConfig.log_every={self.log_every} must divide the run's "
                             f"iterations train.num_iterations={t.num_iterations}")
        require_choice("ReplayTrainConfig.priority", self.priority, PRIORITY_SOURCES)
        require_choice("ReplayTrainConfig.buffer_sampling", self.buffer_sampling, ("freshper", "per"))
        self.replay_config  # validates the buffer fields, naming them

    @property
    def replay_config(self) -> ReplayConfig:
        n = self.train.num_envs
        return ReplayConfig(
            capacity=n * self.buffer_iterations, sample_batch_size=n,
            sampling=self.buffer_sampling, priority_exponent=self.priority_exponent,
            importance_exponent=self.importance_exponent_default, age_decay_tau=math.inf,
            new_item_priority="given", min_decayed_priority=self.min_decayed_priority,
            importance_weight_normalization=self.importance_weight_normalization)

    @property
    def num_iterations(self) -> int:
        return self.train.num_iterations


@struct.dataclass
class ReplayTrainHParams:
    """Traced settings of one run: the control :class:`HyperParams` (learning rate, γ, loss
    coefficients) and the method's :class:`fresh_rl.replay.methods.ReplayHParams`."""

    control: HyperParams
    replay: ReplayHParams


@struct.dataclass
class ReplayTrainState:
    """Carry of the loop: the control ``TrainState`` (θ, shared Adam state, version ring, envs),
    the replay updates' own Adam state (used under ``replay_optimizer="separate"``), the
    buffer, replayed rows per age ``[H]`` and the optimizer updates applied so far."""

    train: TrainState
    replay_opt_state: optax.OptState
    buffer: ReplayState
    sampled_age_counts: jax.Array
    num_updates: jax.Array


def _example_item(config: ReplayTrainConfig) -> dict:
    spec, t = config.train.vec_env.spec, config.train.rollout_length
    action = (jnp.zeros((t,), jnp.int32) if spec.discrete
              else jnp.zeros((t, spec.action_dim), jnp.float32))
    obs = jnp.zeros((t, *spec.obs_shape), jnp.float32)
    steps = jnp.zeros((t,), jnp.float32)
    return {"obs": obs, "next_obs": obs, "action": action, "reward": steps,
            "terminated": steps.astype(bool), "truncated": steps.astype(bool),
            "behaviour_log_prob": steps}


def init_state(config: ReplayTrainConfig, key: chex.PRNGKey, hp: ReplayTrainHParams) -> ReplayTrainState:
    """Control state of ``key``, a second Adam state, an empty buffer with τ = ``hp.replay.age_decay_tau``."""
    train_state = init_train_state(config.train, key, hp.control)
    buffer = make_trajectory_buffer(config.replay_config)
    replay = buffer.init(_example_item(config))
    if config.buffer_sampling == "freshper":
        replay = buffer.set_age_decay_tau(replay, hp.replay.age_decay_tau)
    return ReplayTrainState(
        train=train_state, replay_opt_state=train_state.opt_state, buffer=replay,
        sampled_age_counts=jnp.zeros((config.buffer_iterations,), jnp.int32),
        num_updates=jnp.zeros((), jnp.int32))


def _sequences(items: dict, gamma) -> dict:
    return {"reward": items["reward"],
            "discount": gamma * (1.0 - items["terminated"].astype(jnp.float32)),
            "episode_end": items["terminated"] | items["truncated"]}


def _standardize(x):
    return (x - jnp.mean(x)) / (jnp.std(x) + 1e-8)


def _fresh_targets(config: ReplayTrainConfig, params, items: dict, gamma) -> dict:
    """GAE(λ) advantages and λ-returns of the fresh rows on V_θ (θ = the behaviour policy)."""
    _, values, next_values = _batch_start(config.train, params, _as_batch(items))
    seq = _sequences(items, gamma)
    gae = generalized_advantage_estimation(
        seq["reward"], values, next_values, seq["discount"], lambda_=config.train.gae_lambda,
        episode_ends=seq["episode_end"])
    return {"advantage": gae.advantages, "target": gae.returns}


def _replay_targets(config: ReplayTrainConfig, params, items: dict, gamma) -> dict:
    """V-trace advantages v_t − V_θ(s_t) and targets v_t of replayed rows under the current θ
    (log ρ = log π_θ − log β with the stored β), detached."""
    logp, values, next_values = _batch_start(config.train, params, _as_batch(items))
    seq = _sequences(items, gamma)
    out = vtrace(values, next_values, seq["reward"], seq["discount"],
                 logp - items["behaviour_log_prob"], config=config.train.vtrace_config,
                 episode_ends=seq["episode_end"])
    return jax.lax.stop_gradient({"advantage": out.gae_advantages, "target": out.targets})


def _as_batch(items: dict) -> Batch:
    return Batch(obs=items["obs"], action=items["action"], reward=items["reward"],
                      terminated=items["terminated"], truncated=items["truncated"],
                      next_obs=items["next_obs"], behaviour_log_prob=items["behaviour_log_prob"],
                      version=jnp.zeros(items["reward"].shape[0], jnp.int32))


def _base_priority(config: ReplayTrainConfig, items: dict, advantages) -> jax.Array:
    if config.priority == "advantage":
        return magnitude_priority(advantages, reduction="mean")
    return magnitude_priority(jnp.sum(items["reward"], axis=1))


def _loss(config: ReplayTrainConfig, hp: HyperParams, params, items: dict, targets: dict, weights):
    """PPO-clip on standardised advantages × per-row weights, weighted value loss, entropy bonus."""
    policy, values = config.train.network().apply(params, items["obs"])
    logp = networks.log_prob(policy, items["action"])
    adv = _standardize(targets["advantage"]) * weights[:, None]
    pg, _ = ppo_clip_loss(logp, items["behaviour_log_prob"], adv, config=config.train.ppo_clip)
    v_loss = 0.5 * jnp.mean(weights[:, None] * jnp.square(values - targets["target"]))
    ent = jnp.mean(networks.entropy(policy))
    return pg + hp.value_coef * v_loss - hp.entropy_coef * ent


def drift_by_age(config: ReplayTrainConfig, params, replay: ReplayState) -> dict:
    """Per-step ESS/n and k3 KL(β‖π_θ) of the stored rows, by age ``[H]`` (−1: no row of that age)."""
    items = replay.experience
    h, t = config.buffer_iterations, config.train.rollout_length
    rows = items["reward"].shape[0]
    policy, _ = config.train.network().apply(params, items["obs"].reshape(rows * t, *items["obs"].shape[2:]))
    actions = items["action"].reshape(rows * t, *items["action"].shape[2:])
    log_r = networks.log_prob(policy, actions).reshape(rows, t) - items["behaviour_log_prob"]
    age = jnp.where(replay.valid, replay.latest_version - replay.insert_version, h)
    ages = jnp.clip(age, 0, h)  # h: the bin of empty slots (and of rows older than the buffer)
    r = jnp.exp(log_r)
    k3 = (r - 1.0) - log_r  # Schulman's k3 per step (fresh_rl.corrections.approx_kl's kl_k3)
    sums = jax.ops.segment_sum(jnp.stack([jnp.sum(r, 1), jnp.sum(r * r, 1), jnp.sum(k3, 1),
                                          jnp.full((rows,), float(t))], axis=1), ages,
                               num_segments=h + 1)[:h]
    s, s2, kl, n = sums.T
    seen = n > 0
    return {"ess": jnp.where(seen, s * s / jnp.maximum(n * s2, 1e-30), -1.0),
            "kl": jnp.where(seen, kl / jnp.maximum(n, 1.0), -1.0)}


def make_iteration(config: ReplayTrainConfig):
    """``iteration(state, hp, key) -> (state, metrics)``: one policy version (module docstring)."""
    tc = config.train
    buffer = make_trajectory_buffer(config.replay_config)
    h = config.buffer_iterations

    def iteration(state: ReplayTrainState, hp: ReplayTrainHParams, key):
        key_roll, key_replay = jax.random.split(key)
        ts = state.train
        optimizer = tc.optimizer(hp.control.learning_rate)
        sgd = optax.chain(optax.clip_by_global_norm(tc.max_grad_norm),
                          optax.sgd(hp.control.learning_rate))
        grad_fn = jax.grad(lambda p, items, targets, w: _loss(config, hp.control, p, items, targets, w))
        ts, batch, roll_metrics = _rollout(tc, ts, key_roll, hp.control)
        version = ts.ring.latest_version
        fresh = {"obs": batch.obs, "next_obs": batch.next_obs, "action": batch.action,
                 "reward": batch.reward, "terminated": batch.terminated,
                 "truncated": batch.truncated, "behaviour_log_prob": batch.behaviour_log_prob}
        fresh_targets = _fresh_targets(config, ts.params, fresh, hp.control.gamma)
        ones = jnp.ones((tc.num_envs,), jnp.float32)
        params, opt_state, replay_opt_state = replay_methods.apply_update(
            hp.replay, optimizer, sgd, ts.params, ts.opt_state, state.replay_opt_state,
            grad_fn(ts.params, fresh, fresh_targets, ones), UPDATE_FRESH)
        replay = replay_methods.insert(buffer, hp.replay, state.buffer, fresh, version,
                                       _base_priority(config, fresh, fresh_targets["advantage"]))
        kind = update_kind(hp.replay)
        is_replay = kind == UPDATE_REPLAY

        def extra_update(j, carry):
            params, opt_state, replay_opt_state, replay, age_counts = carry
            sample = buffer.sample(replay, jax.random.fold_in(key_replay, j),
                                   importance_exponent=hp.replay.importance_exponent)
            exp = sample.experience
            replay_targets = _replay_targets(config, params, exp, hp.control.gamma)
            pick = lambda replayed, fresh_: jnp.where(is_replay, replayed, fresh_)  # noqa: E731
            items = jax.tree.map(pick, exp, fresh)
            targets = jax.tree.map(pick, replay_targets, fresh_targets)
            weights = pick(sample.importance_weights, ones)
            grads = grad_fn(params, items, targets, weights)
            params, opt_state, replay_opt_state = replay_methods.apply_update(
                hp.replay, optimizer, sgd, params, opt_state, replay_opt_state, grads, kind)
            refreshed = replay_methods.refresh(
                buffer, hp.replay, replay, sample.indices,
                _base_priority(config, exp, replay_targets["advantage"]))
            replay = jax.tree.map(lambda r, o: jnp.where(is_replay, r, o), refreshed, replay)
            age_counts = age_counts.at[jnp.clip(sample.age, 0, h - 1)].add(is_replay.astype(jnp.int32))
            return params, opt_state, replay_opt_state, replay, age_counts

        params, opt_state, replay_opt_state, replay, age_counts = jax.lax.fori_loop(
            0, config.extra_updates, extra_update,
            (params, opt_state, replay_opt_state, replay, state.sampled_age_counts))
        updates = 1 + jnp.where(kind == UPDATE_NONE, 0, config.extra_updates)
        ts = ts.replace(params=params, opt_state=opt_state,
                        ring=version_ring.push(ts.ring, params))
        metrics = {**roll_metrics, "updates": updates}
        if tc.eval_every:
            ts, eval_metrics = _evaluate_learner(tc, ts, evaluation_key(key))
            metrics.update(eval_metrics)
        state = ReplayTrainState(train=ts, replay_opt_state=replay_opt_state, buffer=replay,
                                 sampled_age_counts=age_counts,
                                 num_updates=state.num_updates + updates)
        return state, metrics

    return iteration


def train(config: ReplayTrainConfig, key: chex.PRNGKey, hp: ReplayTrainHParams) -> dict:
    """One whole run; ``jax.jit(train, static_argnums=0)`` and ``jax.vmap(train, (None, 0, 0))``
    over keys and hyperparameter rows. Keys as :func:`fresh_rl.control.train.train`:
    ``key_init, key_loop = split_run_key(key)``, iteration i uses ``step_key(key_loop, i)``.

    Returns the per-iteration metrics ``[num_iterations]`` (``episode_return``,
    ``episodes_completed``, ``updates`` and, with ``train.eval_every``, ``eval/…``), the drift
    snapshots ``drift/ess`` and ``drift/kl`` ``[num_iterations/log_every, H]``,
    ``sampled_age_counts`` ``[H]``, ``num_updates`` and ``adam_count`` (the shared Adam state's
    own step counter).
    """
    hp.control.validate(config.train)
    key_init, key_loop = split_run_key(key)
    iteration = make_iteration(config)

    def one(carry, _):
        state, i = carry
        state, metrics = iteration(state, hp, step_key(key_loop, i))
        return (state, i + 1), metrics

    def chunk(carry, _):
        carry, metrics = jax.lax.scan(one, carry, None, length=config.log_every)
        state = carry[0]
        return carry, (metrics, drift_by_age(config, state.train.params, state.buffer))

    (state, _), (metrics, drift) = jax.lax.scan(
        chunk, (init_state(config, key_init, hp), jnp.zeros((), jnp.int32)), None,
        length=config.num_iterations // config.log_every)
    out = {k: v.reshape(-1, *v.shape[2:]) for k, v in metrics.items()}
    out.update({"drift/ess": drift["ess"], "drift/kl": drift["kl"],
                "sampled_age_counts": state.sampled_age_counts, "num_updates": state.num_updates,
                "adam_count": _adam_count(state.train.opt_state)})
    return out


def _adam_count(opt_state) -> jax.Array:
    (count,) = [s.count for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(
        s, optax.ScaleByAdamState)) if isinstance(s, optax.ScaleByAdamState)]
    return count


def hparams(config: ReplayTrainConfig, rows, learning_rates=None) -> ReplayTrainHParams:
    """``[N]`` hyperparameters from :func:`fresh_rl.replay.methods.replay_hparams` dicts
    ``rows`` and per-row ``learning_rates`` (default: the config's)."""
    rows = list(rows)
    values = {} if learning_rates is None else {"learning_rate": list(learning_rates)}
    return ReplayTrainHParams(control=HyperParams.from_grid(config.train, values, size=len(rows)),
                              replay=replay_methods.stack_replay_hparams(rows))


__all__ = ["PRIORITY_SOURCES", "ReplayTrainConfig", "ReplayTrainHParams", "ReplayTrainState",
           "drift_by_age", "hparams", "init_state", "make_iteration", "train"]
