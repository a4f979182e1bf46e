"""One control trainer, ``train(config, key, hparams)``: lagged actors, any method, any data
source, any old-log-prob route.

One iteration (= one batch = one policy version)::

    acting (fresh_rl.control.acting): lags_g ~ delay per actor group; roll out T steps in
        num_envs envs, env e acting with θ_{v_T − k_g} (through the inference engine if set)
    batch start: log π_T(a|s), V_T(s), V_T(s_{t+1}) under the newest version θ_T
    old log-probs: the route (fresh_rl.corrections.routes; config.route or the method's
        default) fills the ratio's reference
    advantages, once per batch (fresh_rl.control.losses): GAE(λ) on V_T, or V-trace with
        log ρ = log π_T − log β on V_T, or none here (IMPALA recomputes V-trace every step)
    passes × minibatches gradient steps of the method's loss (forward lag)
    replay sources (fresh_rl.control.data_sources): insert the N rows, then K full-batch
        updates on sampled rows (or on the fresh batch, or none, by the traced replay leaves)
    EWMA routes: θ_ref ← β θ_ref + (1 − β) θ;  ring ← push(ring, θ): version v_T + 1
    learner evaluation when due (fresh_rl.control.evaluation)

**Keys** (:mod:`fresh_rl.sweep.keys`): ``key_init, key_loop = split_run_key(key)``; iteration
i uses ``step_key(key_loop, i)``, split into (rollout, update) keys; the update key shuffles the
passes and, folded with j, draws the j-th replay sample; ``evaluation_key(iteration key)`` evaluates.
**Versions**: one ``push`` per iteration, so lag k means "parameters k batches old".
**Metrics** (one value per iteration): ``episode_return`` — mean undiscounted return of the
episodes that ended during the iteration's rollout (the previous value carried if none ended;
0 before the first), ``episodes_completed``, ``updates`` (optimizer updates this iteration),
the batch-start ``lag/…`` metrics of :func:`fresh_rl.lag.lag_metrics` (version gap, TV(π_T, β),
ESS, KL), ``lag/forward_tv`` — ½·mean|π_θ/π_T − 1| over the batch after its updates (the
unweighted mean, our choice, exact in expectation at lag 0, biased under backward lag since the
actions come from β), ``lag/forward_tv_weighted`` — ½·mean|π_θ/β − π_T/β|, the same TV
importance-sampled from β's actions (unbiased at every lag), ``loss/…`` — the mean over the
fresh gradient steps of the loss's metrics plus ``value_loss``, ``entropy``, ``log_rd_abs``
(mean |log π_old − log β|) and ``grad_norm``, ``old_logits/…`` — the route's forwards and resets,
the engine's true mean |log r_d| and the staleness mean |log π_T/π_v|; with
``eval_every`` > 0 the learner's ``eval/return_deterministic``, ``eval/return_stochastic`` and
``eval/valid``. With ``replay.drift_every`` > 0: ``drift/ess``, ``drift/ess_row`` and ``drift/kl``
``[iterations/drift_every, H]``, per age the per-step and per-row (trajectory) ESS/n and the k3
KL(β‖π_θ) of the stored rows (−1 where no row of that age is stored; :func:`drift_by_age`).
**Hyperparameters**: every sweepable value is a leaf of the traced
:class:`~fresh_rl.control.hyperparams.HyperParams`; the config supplies only its defaults.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from fresh_rl.control import networks
from fresh_rl.control.acting import Batch, batch_start, log_probs, rollout
from fresh_rl.control.config import TrainConfig
from fresh_rl.control.env_types import VecEnvState
from fresh_rl.control.evaluation import evaluate_learner, evaluation_key
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.losses import frozen_advantages, make_loss_fn, replayed_advantages, sequences
from fresh_rl.control.old_log_probs import ControlRouteSources, select_route, splits_clip, uses_ewma, uses_proxies
from fresh_rl.corrections import (EWMAReference, adaptive_kl_coefficient, ewma_update, init_ewma_reference, tv_estimate,
                                  tv_estimate_weighted)
from fresh_rl.lag import lag_metrics, version_ring
from fresh_rl.replay import ReplayState, magnitude_priority, make_trajectory_buffer
from fresh_rl.replay import methods as replay_methods
from fresh_rl.replay.methods import UPDATE_NONE, UPDATE_REPLAY
from fresh_rl.sweep.keys import split_run_key, step_keys

ROW_FIELDS: tuple[str, ...] = ("obs", "next_obs", "action", "reward", "terminated", "truncated",
                               "behaviour_log_prob", "train_log_prob", "version")
"""The per-step fields of a batch row, as stored in the replay buffer."""


@struct.dataclass
class ReplayCarry:
    """The replay sources' part of the carry: the buffer, the replay updates' own Adam state
    (``replay_optimizer="separate"``) and the replayed rows per age ``[H]``."""

    buffer: ReplayState
    opt_state: optax.OptState
    sampled_age_counts: jax.Array


@struct.dataclass
class TrainState:
    """Carry of the training loop (one seed). ``last_eval``: the latest ``eval/…`` values
    (``{}`` when ``eval_every = 0``); ``ewma``: θ_ref (``None`` unless a route uses it);
    ``replay``: ``None`` unless the data source keeps a buffer."""

    params: Any
    opt_state: Any
    ring: version_ring.VersionRing
    env_state: VecEnvState
    obs: jax.Array
    last_return: jax.Array
    kl_coef: jax.Array  # PPO-KL's β (constant unless ``kl_adaptive``)
    last_eval: dict
    num_updates: jax.Array
    ewma: Optional[EWMAReference] = None
    replay: Optional[ReplayCarry] = None


@struct.dataclass
class TrainOutput:
    """Result of :func:`train`: final learner parameters, final state and the metrics
    (``[num_iterations]`` arrays; the drift snapshots ``[snapshots, H]``)."""

    params: Any
    state: TrainState
    metrics: dict


def _example_row(config: TrainConfig) -> dict:
    spec, t = config.vec_env.spec, config.rollout_length
    action = jnp.zeros((t,), jnp.int32) if spec.discrete else jnp.zeros((t, spec.action_dim), jnp.float32)
    obs = jnp.zeros((t, *spec.obs_shape), jnp.float32)
    steps = jnp.zeros((t,), jnp.float32)
    return {"obs": obs, "next_obs": obs, "action": action, "reward": steps, "terminated": steps.astype(bool),
            "truncated": steps.astype(bool), "behaviour_log_prob": steps, "train_log_prob": steps,
            "version": steps.astype(jnp.int32)}


def init_state(config: TrainConfig, key: chex.PRNGKey, hparams: Optional[HyperParams] = None) -> TrainState:
    """Network, optimiser, version ring (K = ``config.delay.ring_size``), env state, θ_ref when
    a route needs it and an empty buffer for a replay source; β starts at ``hparams.kl_coef``."""
    hparams = HyperParams.from_config(config) if hparams is None else hparams
    key_net, key_env = jax.random.split(key)
    env_state, obs = config.vec_env.reset(key_env)
    params = networks.init_params(config.network(), key_net, obs[:1])
    opt_state = config.optimizer(hparams.learning_rate).init(params)
    replay = None
    if config.data_source_spec.buffered:
        buffer = make_trajectory_buffer(config.replay_config)
        replay = ReplayCarry(
            buffer=buffer.set_age_decay_tau(buffer.init(_example_row(config)), hparams.age_decay_tau),
            opt_state=opt_state, sampled_age_counts=jnp.zeros((config.replay.buffer_iterations,), jnp.int32))
    return TrainState(
        params=params, opt_state=opt_state, ring=version_ring.init(params, config.delay.ring_size),
        env_state=env_state, obs=obs, last_return=jnp.zeros((), jnp.float32),
        kl_coef=jnp.asarray(hparams.kl_coef, jnp.float32),
        last_eval={f"return_{kind}": jnp.zeros((), jnp.float32) for kind in ("deterministic", "stochastic")}
        if config.eval_every else {},
        num_updates=jnp.zeros((), jnp.int32),
        ewma=init_ewma_reference(params) if uses_ewma(config) else None,
        replay=replay)


def sgd_passes(loss_fn: Callable, optimizer: optax.GradientTransformation, params, opt_state,
               data: dict, key: chex.PRNGKey, passes: int, num_minibatches: int):
    """``passes`` shuffled passes over ``data`` (leading axis = the shuffled units: samples or
    env rows), each ``num_minibatches`` gradient steps of ``loss_fn(params, mb) -> (loss,
    metrics)``. Returns ``((params, opt_state), metrics [passes, num_minibatches])`` with
    ``grad_norm`` added."""
    units = jax.tree.leaves(data)[0].shape[0]
    M = num_minibatches

    def make_minibatches(perm):
        return jax.tree.map(lambda x: x[perm].reshape(M, units // M, *x.shape[1:]), data)

    def sgd_step(carry, mb):
        params, opt_state = carry
        grads, m = jax.grad(loss_fn, has_aux=True)(params, mb)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return (params, opt_state), {**m, "grad_norm": optax.tree.norm(grads)}

    def epoch(carry, perm):
        return jax.lax.scan(sgd_step, carry, make_minibatches(perm))

    # every epoch's shuffle from one draw: argsort of uniform random bits is a uniformly random
    # permutation (ties, probability ~units²/2³³, keep a valid permutation by the stable sort)
    perms = jnp.argsort(jax.random.bits(key, (passes, units), jnp.uint32), axis=-1)
    return jax.lax.scan(epoch, (params, opt_state), perms)


def _base_priority(config: TrainConfig, rows: dict, advantages) -> jax.Array:
    """Mean |Â| of each row (``replay.priority="advantage"``) or |Σ_t r_t| (``"return"``)."""
    if config.replay.priority == "advantage":
        return magnitude_priority(advantages, reduction="mean")
    return magnitude_priority(jnp.sum(rows["reward"], axis=1))


def _replay_updates(config: TrainConfig, state: TrainState, hparams: HyperParams, loss_fn_for: Callable,
                    rows: dict, fresh_mb: dict, fresh_advantage: jax.Array, ewma: Optional[EWMAReference],
                    key) -> tuple[TrainState, jax.Array]:
    """Insert the fresh rows, then the K extra updates of the replay sources (module docstring of
    :mod:`fresh_rl.control.data_sources`). Returns the state and the number of extra updates."""
    hp = hparams.replay
    buffer = make_trajectory_buffer(config.replay_config)
    h = config.replay.buffer_iterations
    optimizer = config.optimizer(hparams.learning_rate)
    sgd = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.sgd(hparams.learning_rate))
    carry = state.replay
    replay = replay_methods.insert(buffer, hp, carry.buffer, rows, state.ring.latest_version,
                                   _base_priority(config, rows, fresh_advantage))
    kind = replay_methods.update_kind(hp)
    is_replay = kind == UPDATE_REPLAY
    ones = jnp.ones((config.num_envs, 1), jnp.float32)

    def extra_update(j, inner):
        params, opt_state, replay_opt_state, replay, age_counts = inner
        sample = buffer.sample(replay, jax.random.fold_in(key, j), importance_exponent=hp.importance_exponent)
        exp = sample.experience
        logp, values, next_values = jax.lax.stop_gradient(
            batch_start(config, params, exp["obs"], exp["action"], exp["next_obs"]))
        seq = sequences(hparams.gamma, exp["reward"], exp["terminated"], exp["truncated"])
        adv, target = replayed_advantages(config, seq, logp, exp["behaviour_log_prob"], values, next_values)
        route = select_route(config, ControlRouteSources(
            config=config, hparams=hparams, params=params, ring=state.ring, ewma_reference=ewma, rows=exp,
            learner_log_prob=logp, fresh=False), hparams.route)
        replayed_mb = {"obs": exp["obs"], "action": exp["action"], "behaviour_log_prob": exp["behaviour_log_prob"],
                       "learner_log_prob": logp, "reference_log_prob": route.old, "advantage": adv,
                       "target": target, "weight": sample.importance_weights[:, None]}
        if "alpha" in fresh_mb:
            replayed_mb["alpha"] = route.alpha
        if "clip_log_prob" in fresh_mb:
            replayed_mb["clip_log_prob"] = route.clip_old
        mb = jax.tree.map(lambda r, f: jnp.where(is_replay, r, f), replayed_mb, {**fresh_mb, "weight": ones})
        grads, _ = jax.grad(loss_fn_for(route.proximal), has_aux=True)(params, mb)
        params, opt_state, replay_opt_state = replay_methods.apply_update(
            hp, optimizer, sgd, params, opt_state, replay_opt_state, grads, kind)
        refreshed = replay_methods.refresh(buffer, hp, replay, sample.indices, _base_priority(config, exp, adv))
        replay = jax.tree.map(lambda r, o: jnp.where(is_replay, r, o), refreshed, replay)
        age_counts = age_counts.at[jnp.clip(sample.age, 0, h - 1)].add(is_replay.astype(jnp.int32))
        return params, opt_state, replay_opt_state, replay, age_counts

    params, opt_state, replay_opt_state, replay, age_counts = jax.lax.fori_loop(
        0, config.replay.extra_updates, extra_update,
        (state.params, state.opt_state, carry.opt_state, replay, carry.sampled_age_counts))
    extra = jnp.where(kind == UPDATE_NONE, 0, config.replay.extra_updates)
    return state.replace(params=params, opt_state=opt_state, replay=ReplayCarry(
        buffer=replay, opt_state=replay_opt_state, sampled_age_counts=age_counts)), extra


def update(config: TrainConfig, state: TrainState, batch: Batch, key, hparams: HyperParams) -> tuple[TrainState, dict]:
    """Batch start, old log-probs, advantages, the fresh passes, the replay updates, θ_ref and
    the ring push (module docstring)."""
    method = config.method_spec
    loss_hparams = hparams.replace(kl_coef=state.kl_coef)  # the losses see the current β
    logp_T, values_T, next_values_T = batch_start(config, state.params, batch.obs, batch.action, batch.next_obs)
    metrics = {f"lag/{k}": v for k, v in lag_metrics(
        batch.behaviour_log_prob, logp_T, batch.version, state.ring.latest_version).items()}
    rows = {name: getattr(batch, name) for name in ROW_FIELDS}
    route = select_route(config, ControlRouteSources(
        config=config, hparams=hparams, params=state.params, ring=state.ring, ewma_reference=state.ewma,
        rows=rows, learner_log_prob=logp_T, fresh=True), hparams.route)
    with_proxies = uses_proxies(config)

    def loss_fn_for(proximal):
        return make_loss_fn(config, hparams, loss_hparams, proximal, with_proxies)

    data = {"obs": batch.obs, "action": batch.action, "behaviour_log_prob": batch.behaviour_log_prob,
            "learner_log_prob": logp_T, "reference_log_prob": route.old}
    if with_proxies:
        data["alpha"] = route.alpha
    if splits_clip(config):  # the factorial routes: the clip centre apart from the mask's old log-probs
        data["clip_log_prob"] = route.clip_old
    seq = sequences(hparams.gamma, batch.reward, batch.terminated, batch.truncated)
    if method.advantages == "vtrace_per_step":
        data.update(seq, next_obs=batch.next_obs)
        adv = None
    else:
        adv, targets = frozen_advantages(config, seq, logp_T, batch.behaviour_log_prob, values_T, next_values_T)
        data.update(advantage=adv, target=targets)
        metrics["advantage_mean"] = jnp.mean(adv)
        metrics["advantage_std"] = jnp.std(adv)
    fresh_rows = data
    if method.minibatch_layout == "samples":
        data = jax.tree.map(lambda x: x.reshape(config.batch_size, *x.shape[2:]), data)
    (params, opt_state), step_metrics = sgd_passes(
        loss_fn_for(route.proximal), config.optimizer(hparams.learning_rate), state.params, state.opt_state,
        data, key, config.passes_per_batch_used, config.num_minibatches)
    metrics.update({f"loss/{k}": jnp.mean(v) for k, v in step_metrics.items()})
    updates = jnp.asarray(config.passes_per_batch_used * config.num_minibatches, jnp.int32)
    state = state.replace(params=params, opt_state=opt_state)
    if config.data_source_spec.buffered:
        state, extra = _replay_updates(config, state, hparams, loss_fn_for, rows, fresh_rows, adv, route.ewma, key)
        updates = updates + extra
    logp_last = log_probs(config, state.params, batch.obs, batch.action)
    metrics["lag/forward_tv"] = tv_estimate(logp_last - logp_T)
    metrics["lag/forward_tv_weighted"] = tv_estimate_weighted(logp_last - batch.behaviour_log_prob,
                                                              logp_T - batch.behaviour_log_prob)
    kl_coef = state.kl_coef
    if config.kl_adaptive is not None and "kl_penalty" in step_metrics:
        kl_coef = adaptive_kl_coefficient(kl_coef, jnp.mean(step_metrics["kl_penalty"][-1]), config.kl_adaptive)
    ewma = state.ewma
    if ewma is not None:
        ewma = jax.tree.map(lambda new, old: jnp.where(route.uses_ewma, new, old),
                            ewma_update(route.ewma, state.params, beta=hparams.ewma_beta), route.ewma)
    metrics.update({
        "updates": updates,
        "old_logits/forwards": route.forwards,
        "old_logits/reset": route.reset.astype(jnp.int32),
        "old_logits/log_rd_abs_true": jnp.mean(jnp.abs(batch.train_log_prob - batch.behaviour_log_prob)),
        "old_logits/staleness_log_ratio_abs": jnp.mean(jnp.abs(logp_T - batch.train_log_prob)),
    })
    state = state.replace(ring=version_ring.push(state.ring, state.params), kl_coef=kl_coef, ewma=ewma,
                          num_updates=state.num_updates + updates)
    return state, metrics


def train_iteration(config: TrainConfig, state: TrainState, key: chex.PRNGKey,
                    hparams: Optional[HyperParams] = None) -> tuple[TrainState, dict]:
    """One rollout, one batch of updates (and the replay updates), one ring push, then the
    learner evaluation when due (module docstring)."""
    hparams = HyperParams.from_config(config) if hparams is None else hparams
    key_roll, key_upd = jax.random.split(key)
    env_state, obs, batch, roll = rollout(config, state.ring, state.env_state, state.obs, key_roll, hparams.lag)
    count = roll.pop("episodes_completed")
    ret_sum = roll.pop("episode_return_sum")
    mean_return = jnp.where(count > 0, ret_sum / jnp.maximum(count, 1), state.last_return)
    state = state.replace(env_state=env_state, obs=obs, last_return=mean_return)
    state, metrics = update(config, state, batch, key_upd, hparams)
    metrics = {"episode_return": mean_return, "episodes_completed": count, **roll, **metrics}
    if config.eval_every:
        last_eval, eval_metrics = evaluate_learner(config, state.params, state.env_state.obs_stats,
                                                   state.ring.latest_version, state.last_eval, evaluation_key(key))
        state = state.replace(last_eval=last_eval)
        metrics.update(eval_metrics)
    return state, metrics


def drift_by_age(config: TrainConfig, params, replay: ReplayState) -> dict:
    """Staleness of the stored rows against the learner π_θ, by age ``[H]`` (−1: no row of that
    age), r = π_θ/β per step:

    * ``ess``: per-step ESS/n = (Σ r)²/(n Σ r²) over every step of the rows of that age;
    * ``ess_row``: trajectory-level ESS/n of the row weights w = Π_t r_t (a row is one env's T
      steps, the unit replay samples), (Σ w)²/(m Σ w²) over the m rows of that age (≥ 1/m);
      the sequence weight FreshPER's ESS ∝ exp(−KL) argument is about (arXiv 2604.16918 §3);
    * ``kl``: k3 KL(β‖π_θ) ≈ mean((r − 1) − log r) per step.
    """
    items = replay.experience
    h, t = config.replay.buffer_iterations, config.rollout_length
    rows = items["reward"].shape[0]
    flat = {k: items[k].reshape(rows * t, *items[k].shape[2:]) for k in ("obs", "action")}
    log_r = log_probs(config, params, flat["obs"], flat["action"]).reshape(rows, t) - items["behaviour_log_prob"]
    age = jnp.where(replay.valid, replay.latest_version - replay.insert_version, h)
    ages = jnp.clip(age, 0, h)  # h: the bin of empty slots (and of rows older than the buffer)
    r = jnp.exp(log_r)
    k3 = (r - 1.0) - log_r
    sums = jax.ops.segment_sum(jnp.stack([jnp.sum(r, 1), jnp.sum(r * r, 1), jnp.sum(k3, 1),
                                          jnp.full((rows,), float(t))], axis=1), ages, num_segments=h + 1)[:h]
    s, s2, kl, n = sums.T
    log_w = jnp.sum(log_r, 1)  # row weights in log space, scaled by their age's largest: no overflow
    top = jax.ops.segment_max(log_w, ages, num_segments=h + 1)
    w = jnp.exp(log_w - top[ages])
    w_sums = jax.ops.segment_sum(jnp.stack([w, w * w, jnp.ones_like(w)], axis=1), ages,
                                 num_segments=h + 1)[:h]
    ws, ws2, m = w_sums.T
    seen = n > 0
    return {"ess": jnp.where(seen, s * s / jnp.maximum(n * s2, 1e-30), -1.0),
            "ess_row": jnp.where(seen, ws * ws / jnp.maximum(m * ws2, 1e-30), -1.0),
            "kl": jnp.where(seen, kl / jnp.maximum(n, 1.0), -1.0)}


def train(config: TrainConfig, key: chex.PRNGKey, hparams: Optional[HyperParams] = None) -> TrainOutput:
    """A whole run; ``jax.jit(train, static_argnums=0)`` and ``jax.vmap(train, (None, 0))`` over keys.

    ``hparams`` (:class:`~fresh_rl.control.hyperparams.HyperParams`, default
    ``HyperParams.from_config(config)``) holds the traced hyperparameters: vmap over it too
    (``jax.vmap(train, (None, 0, 0))``) to run a seeds × values grid — lags, δ, learning rates,
    routes, replay methods — from one compilation. Concrete values are range-checked here
    (``ValueError`` naming the field).
    """
    hparams = HyperParams.from_config(config) if hparams is None else hparams
    hparams.validate(config)
    key_init, key_loop = split_run_key(key)
    state = init_state(config, key_init, hparams)
    keys = step_keys(key_loop, 0, config.num_iterations)

    def iteration(s, k):
        return train_iteration(config, s, k, hparams)

    every = config.replay.drift_every
    if not every:
        state, metrics = jax.lax.scan(iteration, state, keys)
        return TrainOutput(params=state.params, state=state, metrics=metrics)

    def chunk(s, chunk_keys):
        s, m = jax.lax.scan(iteration, s, chunk_keys)
        return s, (m, drift_by_age(config, s.params, s.replay.buffer))

    state, (metrics, drift) = jax.lax.scan(chunk, state, keys.reshape(-1, every, *keys.shape[1:]))
    metrics = {k: v.reshape(-1, *v.shape[2:]) for k, v in metrics.items()}
    metrics.update({f"drift/{k}": v for k, v in drift.items()})
    return TrainOutput(params=state.params, state=state, metrics=metrics)


__all__ = ["ROW_FIELDS", "ReplayCarry", "TrainOutput", "TrainState", "drift_by_age", "init_state", "sgd_passes", "update",
           "train", "train_iteration"]
