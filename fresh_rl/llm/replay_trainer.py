"""Experience replay in the LLM RL loop: on-policy, standard PER and FreshPER (arXiv 2604.16918).

One jitted iteration at learner version k (the authors' loop; docs/freshper.md, "The replay loop"):

1. **fresh step**: collect a batch and update on it once, exactly as the asynchronous
   pipeline does (:func:`fresh_rl.llm.async_pipeline.prepare`; W = 0 is the synchronous
   trainer, W > 0 / partial rollouts / every old-logit route stay available).
2. **store** the fresh batch in a trajectory buffer (:mod:`fresh_rl.replay`): tokens, masks,
   the sampler's log-probs π_infer, the route's fp32 old log-probs π_old (the behaviour
   policy of the stored tokens, FreshPER's ``behavior_log_probs``), per-token version tags,
   returns, success and the fresh advantages. Insert version t_i = the oldest version tag of
   the trajectory; base priority ``|return| + ε`` (the paper's REINFORCE++ choice) or
   ``|advantage| + ε``::

       p_i(t) = p_i^base · exp(−(t − t_i)/τ),     P(i) ∝ p_i(t)^α

3. **K replay updates**, each on a separate batch of ``batch_size`` trajectories sampled from
   the buffer (stratified PER sampling; uniform for ``sampling="uniform"``), with the run's
   policy loss ``RLConfig.loss`` (:data:`fresh_rl.llm.policy_losses.LOSSES`). The ratio
   reference of a replayed token is its **stored** π_old (never recomputed), so the decoupled
   loss clips r_s = π_θ/π_old(t_i) against the version that generated it and the MIS mask on
   r_d = π_old/π_infer still sees only the train–inference discrepancy; ``vaco`` realigns the
   replay batch's advantages with min(ρ̄, π_old/π_infer) and filters on π_θ/π_old(t_i), the
   drift since the stored route's version (our reading: VACO's π_T is the learner at batch
   start, which a replay batch's stored π_old only is for the fresh batch of
   ``recompute_current``); ``ppo_clip`` clips π_θ/π_infer. Advantages are
   recomputed on the replay batch (REINFORCE++ batch normalisation, as the authors' code
   does) or the stored fresh ones are reused (``replay_advantages="stored"``, needed for
   GRPO, whose groups a replay batch does not keep). Optional PER importance weights
   ``w_i = (N·P(i))^(−β)/max_j w_j`` scale each sequence's advantages, which equals weighting
   its loss term since w_i ≥ 0 (β constant or annealed linearly to ``is_beta_final``).
   With ``priority="advantage"`` or ``new_item_priority="max"`` (the authors' PER pipeline:
   new items at the running max priority) the sampled items' priorities are refreshed
   to their base priority afterwards.
4. **finish**: the learner after all 1 + K updates becomes version k + 1 (ring push, EWMA).

The fresh step's old log-probs come from the pipeline's route (``AsyncConfig.old_logit_route``,
:data:`fresh_rl.corrections.routes.ROUTES`; e.g. ``ewma``), so a loss, a route and the
FreshPER buffer compose in one run; :func:`fresh_rl.llm.policy_losses.check_route` refuses a
loss × route pair that does not fit.

Age is counted in iterations (policy versions), the authors' outer-step clock: one iteration
is 1 + K updates, so τ = 500 in the paper is 500 iterations. Standard PER is
``sampling="per"`` (or ``"freshper"`` with τ = ∞); on-policy is K = 0 (with ``fresh_epochs =
1 + K``: on-policy at the replay methods' number of optimizer updates).

**Online τ (beyond the paper).** With ``auto_tau`` the buffer's τ follows the measured drift:
after each replay update the token-level ``kl_k3`` of r_s between the learner and the stored
behaviour policy and the batch's mean age give κ̂ = KL/age (KL per version, assuming the linear
growth of docs/freshper.md, "Why an exponential"); an exponential moving average of κ̂ sets
``τ = 1/(c·κ̂)`` (ESS/n ≈ exp(−c·KL), c = ``auto_tau_ess_coefficient``; 1 is our choice), clipped
to ``auto_tau_bounds``.

**τ lives in one place**: ``state.hparams.age_decay_tau`` (:class:`fresh_rl.llm.hparams.LLMHyperParams`;
∞ for ``sampling`` other than ``"freshper"``), traced, so one compiled program serves every τ
(:func:`set_initial_tau` stacks rows with different τ). The buffer keeps α/τ as its own leaf
for its time-invariant keys; :func:`with_age_decay_tau` writes both together, and the logged
``age_decay_tau`` is read from the hyperparameters.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.corrections import approx_kl
from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm.hparams import LLMHyperParams
from fresh_rl.llm.model import Qwen2Config
from fresh_rl.llm.policy_losses import check_route
from fresh_rl.llm.sampler import token_logprobs_and_entropy
from fresh_rl.llm.trainer import (Batch, RLConfig, cached_build, compute_advantages,
                                  loop_keys, owned_copy, program_config, stack_rows, update)
from fresh_rl.replay import ReplayConfig, ReplayState, make_trajectory_buffer
from fresh_rl.sweep.loop import run_loop
from fresh_rl.validation import require_choice, require_in_range, require_int

SAMPLINGS = ("uniform", "per", "freshper")
PRIORITIES = ("reward", "advantage")
REPLAY_ADVANTAGES = ("recompute", "stored")
NEW_ITEM_PRIORITIES = ("given", "max")


@dataclasses.dataclass(frozen=True)
class LLMReplayConfig:
    """Static replay settings; bad values raise ``ValueError`` naming the field.

    Attributes:
      replay_updates: K ≥ 0 replay updates per iteration (0 = on-policy; the paper's K is
        not known, the authors' default is 1).
      capacity: trajectories kept (FIFO eviction; the paper's 50 000 is far above our runs).
      sampling: ``"uniform"``, ``"per"`` (standard PER) or ``"freshper"``.
      priority_exponent: α (0.6 in the paper).
      age_decay_tau: default of ``hparams.age_decay_tau``, τ > 0 in iterations (``inf`` =
        standard PER); the initial τ with ``auto_tau``.
      priority: base priority ``"reward"`` (|return| + ε, the paper's) or ``"advantage"``
        (|sequence advantage| + ε, refreshed after each replay).
      priority_eps: ε (1e-6 as the authors' code).
      importance_correction: scale replayed advantages by the PER importance weights.
      is_beta, is_beta_final, is_beta_anneal_iterations: β of the weights (0.4 in the
        paper), annealed linearly to ``is_beta_final`` over that many iterations (0 =
        constant, as the authors' code; the README's 0.4 → 1 schedule length is not known).
      replay_advantages: ``"recompute"`` (REINFORCE++ batch normalisation of the replay
        batch's returns; needs ``estimator="reinforce_pp"`` with batch grouping) or
        ``"stored"`` (the advantages computed when the batch was fresh).
      auto_tau: set τ online from the measured drift (module docstring).
      auto_tau_ess_coefficient: c in τ = 1/(c·κ̂) (our choice 1; the ESS argument of
        docs/freshper.md puts c at order 1–2).
      auto_tau_momentum: EMA momentum of κ̂ (our choice 0.9).
      auto_tau_bounds: (τ_min, τ_max) clip of the online τ.
      new_item_priority: ``"given"`` (a new trajectory enters at its base priority) or
        ``"max"`` (the FreshPER authors' PER pipeline: it enters at the running max priority
        and every sampled trajectory's priority is refreshed to its base priority after the
        replay update; with ``sampling="freshper"`` that is FreshPER as its authors run it,
        with ``"per"`` their PER baseline).
      fresh_epochs: epochs of the fresh step on the fresh batch (None: ``RLConfig.epochs``).
        With ``replay_updates = 0`` and ``fresh_epochs = 1 + K`` it is the on-policy control
        that makes as many optimizer updates per iteration as a replay method with K (our
        matched control; the paper compares against plain on-policy only).
    """

    replay_updates: int = 1
    capacity: int = 1024
    sampling: str = "freshper"
    priority_exponent: float = 0.6
    age_decay_tau: float = 500.0
    priority: str = "reward"
    priority_eps: float = 1e-6
    importance_correction: bool = True
    is_beta: float = 0.4
    is_beta_final: float = 0.4
    is_beta_anneal_iterations: int = 0
    replay_advantages: str = "recompute"
    auto_tau: bool = False
    auto_tau_ess_coefficient: float = 1.0
    auto_tau_momentum: float = 0.9
    auto_tau_bounds: tuple[float, float] = (1.0, 1e4)
    fresh_epochs: Optional[int] = None
    new_item_priority: str = "given"

    def __post_init__(self):
        require_int("LLMReplayConfig.replay_updates", self.replay_updates, 0)
        require_choice("LLMReplayConfig.new_item_priority", self.new_item_priority, NEW_ITEM_PRIORITIES)
        require_int("LLMReplayConfig.capacity", self.capacity, 1)
        require_choice("LLMReplayConfig.sampling", self.sampling, SAMPLINGS)
        require_in_range("LLMReplayConfig.priority_exponent", self.priority_exponent, 0.0, 1.0)
        require_in_range("LLMReplayConfig.age_decay_tau", self.age_decay_tau, 0.0, math.inf,
                         low_inclusive=False)
        require_choice("LLMReplayConfig.priority", self.priority, PRIORITIES)
        require_in_range("LLMReplayConfig.priority_eps", self.priority_eps, 0.0, math.inf)
        require_in_range("LLMReplayConfig.is_beta", self.is_beta, 0.0, 1.0)
        require_in_range("LLMReplayConfig.is_beta_final", self.is_beta_final, 0.0, 1.0)
        require_int("LLMReplayConfig.is_beta_anneal_iterations", self.is_beta_anneal_iterations,
                    0)
        require_choice("LLMReplayConfig.replay_advantages", self.replay_advantages,
                       REPLAY_ADVANTAGES)
        if self.auto_tau and self.sampling != "freshper":
            raise ValueError(f"LLMReplayConfig.auto_tau needs sampling='freshper', got "
                             f"{self.sampling!r}")
        require_in_range("LLMReplayConfig.auto_tau_ess_coefficient",
                         self.auto_tau_ess_coefficient, 0.0, math.inf, low_inclusive=False)
        require_in_range("LLMReplayConfig.auto_tau_momentum", self.auto_tau_momentum, 0.0, 1.0,
                         high_inclusive=False)
        if self.fresh_epochs is not None:
            require_int("LLMReplayConfig.fresh_epochs", self.fresh_epochs, 1)
        low, high = self.auto_tau_bounds
        if not 0 < low <= high:
            raise ValueError(f"LLMReplayConfig.auto_tau_bounds must satisfy 0 < min <= max, "
                             f"got {self.auto_tau_bounds!r}")

    def buffer_config(self, batch_size: int) -> ReplayConfig:
        return ReplayConfig(capacity=self.capacity, sample_batch_size=batch_size,
                            sampling=self.sampling, priority_exponent=self.priority_exponent,
                            importance_exponent=self.is_beta, age_decay_tau=self.age_decay_tau,
                            new_item_priority=self.new_item_priority)

    @property
    def refreshes(self) -> bool:
        """Whether sampled trajectories get their priority rewritten after a replay update."""
        return self.priority == "advantage" or self.new_item_priority == "max"

    def beta_at(self, iteration):
        """β of iteration ``iteration`` (traced allowed)."""
        if self.is_beta_anneal_iterations == 0:
            return jnp.float32(self.is_beta)
        frac = jnp.minimum(iteration / self.is_beta_anneal_iterations, 1.0)
        return jnp.float32(self.is_beta) + (self.is_beta_final - self.is_beta) * frac


def check_compatible(config: RLConfig, replay_config: LLMReplayConfig) -> None:
    """Raises ``ValueError`` for trainer / replay settings that do not fit together."""
    if replay_config.replay_advantages == "recompute" and not (
            config.estimator == "reinforce_pp" and config.reinforce_pp_grouping == "batch"):
        raise ValueError("LLMReplayConfig.replay_advantages='recompute' needs "
                         "RLConfig.estimator='reinforce_pp' with reinforce_pp_grouping='batch' "
                         "(a replay batch does not keep GRPO's prompt groups); use 'stored'")
    if replay_config.capacity < config.batch_size:
        raise ValueError(f"LLMReplayConfig.capacity must be >= the batch size "
                         f"{config.batch_size}, got {replay_config.capacity}")


@flax.struct.dataclass
class ReplayLoopState:
    """The pipeline state (learner, version ring, EWMA, the run's hyperparameters), the
    trajectory buffer, the iteration counter and the online drift estimate κ̂ (KL per version;
    0 until first measured). ``state.hparams`` is the pipeline's :class:`LLMHyperParams`
    (window, EWMA β / reset threshold and τ), stored once."""

    pipeline: ap.AsyncState
    replay: ReplayState
    iteration: jax.Array
    kl_per_version: jax.Array

    @property
    def hparams(self) -> LLMHyperParams:
        return self.pipeline.hparams


def stored_item(width: int) -> dict[str, jax.Array]:
    """One stored trajectory (the buffer's example item) for transcripts of ``width`` tokens."""
    f32, i32 = jnp.zeros((width,), jnp.float32), jnp.zeros((width,), jnp.int32)
    return {"tokens": i32, "mask": jnp.zeros((width,), bool),
            "action_mask": jnp.zeros((width,), bool), "behaviour_log_probs": f32,
            "old_logprobs": f32, "advantages": f32, "version": i32,
            "returns": jnp.zeros((), jnp.float32), "success": jnp.zeros((), bool)}


def init_state(config: RLConfig, async_config: ap.AsyncConfig, replay_config: LLMReplayConfig,
               params, env, window: Optional[int] = None, *,
               hparams: Optional[LLMHyperParams] = None) -> ReplayLoopState:
    """A fresh run from ``params``: ``hparams`` default
    ``LLMHyperParams.from_config(async_config, replay_config, window=window)``; the buffer's
    α/τ is written from ``hparams.age_decay_tau``. ``params`` and ``hparams`` are copied
    (:func:`fresh_rl.llm.async_pipeline.init_state`): the donating iteration consumes the
    state, never the caller's arrays."""
    check_compatible(config, replay_config)
    if hparams is None:
        hparams = LLMHyperParams.from_config(async_config, replay_config, window=window)
    elif window is not None:
        raise ValueError("init_state: pass window inside hparams, not both")
    pipeline = ap.init_state(config, async_config, params, hparams=hparams)
    buffer = make_trajectory_buffer(replay_config.buffer_config(config.batch_size))
    replay = buffer.init(stored_item(env.transcript_len))
    state = ReplayLoopState(pipeline=pipeline, replay=replay,
                            iteration=jnp.zeros((), jnp.int32),
                            kl_per_version=jnp.zeros((), jnp.float32))
    state = with_age_decay_tau(state, replay_config, config.batch_size,
                               pipeline.hparams.age_decay_tau)  # the state's own copy
    # the buffer's eager rebase leaves t_ref and the latest version in one buffer; the donating
    # iteration needs one buffer per leaf (fresh_rl.llm.trainer.owned_copy)
    state = state.replace(replay=owned_copy(state.replay))
    leaf = jax.tree_util.tree_leaves(params)[0]
    return jax.device_put(state, getattr(leaf, "sharding", None) or jax.devices()[0])


def with_age_decay_tau(state: ReplayLoopState, replay_config: LLMReplayConfig,
                       batch_size: int, tau) -> ReplayLoopState:
    """``state`` with τ = ``tau`` (traced allowed) in its hyperparameters and its buffer's
    α/τ (an O(capacity) rebuild of the keys; the buffer is left alone without FreshPER decay)."""
    pipeline = state.pipeline.replace(hparams=state.hparams.replace(
        age_decay_tau=jnp.asarray(tau, jnp.float32)))
    replay = state.replay
    if replay_config.sampling == "freshper":
        buffer = make_trajectory_buffer(replay_config.buffer_config(batch_size))
        replay = buffer.set_age_decay_tau(replay, tau)
    return state.replace(pipeline=pipeline, replay=replay)


def sequence_advantage(advantages, action_mask):
    """``[B]`` mean token advantage of each trajectory (its response-level advantage)."""
    weight = action_mask.astype(jnp.float32)
    return (advantages * weight).sum(axis=1) / jnp.maximum(weight.sum(axis=1), 1.0)


def base_priority(replay_config: LLMReplayConfig, returns, advantages, action_mask):
    value = returns if replay_config.priority == "reward" else sequence_advantage(advantages,
                                                                                  action_mask)
    return jnp.abs(value) + replay_config.priority_eps


def insert_versions(versions, action_mask, learner_version):
    """``[B]`` t_i: the oldest version tag among a trajectory's action tokens."""
    return jnp.min(jnp.where(action_mask, versions, learner_version), axis=1)


def replay_batch(experience: dict, weights, *, config: RLConfig,
                 replay_config: LLMReplayConfig) -> Batch:
    """The training batch of sampled trajectories: stored π_infer and π_old, advantages
    recomputed or stored, times the PER importance weights when enabled."""
    action_mask = experience["action_mask"]
    if replay_config.replay_advantages == "recompute":
        advantages = compute_advantages(config, experience["returns"], action_mask)
    else:
        advantages = experience["advantages"]
    if replay_config.importance_correction:
        advantages = advantages * weights[:, None]
    return Batch(tokens=experience["tokens"], mask=experience["mask"], action_mask=action_mask,
                 behaviour_log_probs=experience["behaviour_log_probs"],
                 old_logprobs=experience["old_logprobs"],
                 advantages=jnp.where(action_mask, advantages, 0.0))


REPLAY_METRICS = ("loss", "kl_k3", "ess", "clip_fraction", "active_token_fraction",
                  "age_mean", "age_max", "importance_weight_mean", "success_rate")


def iteration(state: ReplayLoopState, key, *, config: RLConfig, async_config: ap.AsyncConfig,
              replay_config: LLMReplayConfig, env, model_config: Qwen2Config):
    """fresh step → store → K replay updates → finish (module docstring).

    Metrics: the async pipeline's (fresh batch; :func:`fresh_rl.llm.async_pipeline.iteration`)
    plus ``replay/<name>`` averaged over the K replay updates (0 when none ran): the loss,
    ``kl_k3`` / ``ess`` of r_s = π_θ/π_old against the stored behaviour policy, the clip and
    active-token fractions, the sampled items' ``age_mean`` / ``age_max``, the mean importance
    weight and their training success; ``replay/updates`` (replay updates that ran),
    ``buffer_size``, ``age_decay_tau`` (``state.hparams.age_decay_tau`` after this iteration;
    inf without decay),
    ``kl_per_version`` (κ̂) and ``is_beta``.
    """
    buffer = make_trajectory_buffer(replay_config.buffer_config(config.batch_size))
    pipeline = state.pipeline
    learner_version = pipeline.ring.latest_version
    fresh = ap.prepare(pipeline, key, config=config, async_config=async_config, env=env,
                       model_config=model_config)
    proximal = async_config.route.proximal
    fresh_config = (config if replay_config.fresh_epochs is None
                    else dataclasses.replace(config, epochs=replay_config.fresh_epochs))
    train, fresh_update = update(pipeline.train, fresh.batch, ap.update_key(key), config=fresh_config,
                                 model_config=model_config, proximal=proximal)
    metrics = ap.fresh_metrics(fresh, fresh_update, learner_version, config=config)

    episodes, batch = fresh.episodes, fresh.batch
    versions = episodes.token_extras["version"]
    item = {"tokens": batch.tokens, "mask": batch.mask, "action_mask": batch.action_mask,
            "behaviour_log_probs": batch.behaviour_log_probs, "old_logprobs": batch.old_logprobs,
            "advantages": batch.advantages,
            "version": jnp.where(batch.action_mask, versions, 0),
            "returns": episodes.returns.astype(jnp.float32), "success": episodes.success}
    replay = buffer.add(state.replay, item,
                        insert_versions(versions, batch.action_mask, learner_version),
                        base_priority(replay_config, item["returns"], batch.advantages,
                                      batch.action_mask))
    beta = replay_config.beta_at(state.iteration)
    kl_per_version = state.kl_per_version

    def replay_step(carry, j):
        train, replay, kl_per_version = carry
        k_sample, k_update = jax.random.split(jax.random.fold_in(key, 3 + j))
        sample = buffer.sample(replay, k_sample, beta, current_version=learner_version)
        rbatch = replay_batch(sample.experience, sample.importance_weights, config=config,
                              replay_config=replay_config)
        ready = buffer.can_sample(replay)
        new_train, m = update(train, rbatch, k_update, config=config, model_config=model_config)
        train = jax.tree_util.tree_map(lambda a, b: jnp.where(ready, a, b), new_train, train)
        if replay_config.refreshes:
            fresh_adv = replay_batch(sample.experience, jnp.ones_like(sample.importance_weights),
                                     config=config, replay_config=replay_config).advantages
            replay = buffer.set_priorities(
                replay, sample.indices,
                base_priority(replay_config, sample.experience["returns"], fresh_adv,
                              sample.experience["action_mask"]))
        age = sample.age.astype(jnp.float32)
        if replay_config.auto_tau:
            measured = m["kl_k3"] / jnp.maximum(jnp.mean(age), 1.0)
            seen = kl_per_version > 0
            kl_per_version = jnp.where(
                ready & (jnp.mean(age) > 0),
                jnp.where(seen, replay_config.auto_tau_momentum * kl_per_version
                          + (1 - replay_config.auto_tau_momentum) * measured, measured),
                kl_per_version)
        step = {"loss": m["loss"], "kl_k3": m["kl_k3"], "ess": m["ess"],
                "clip_fraction": m["clip_fraction"],
                "active_token_fraction": m["active_token_fraction"],
                "age_mean": jnp.mean(age), "age_max": jnp.max(age),
                "importance_weight_mean": jnp.mean(sample.importance_weights),
                "success_rate": jnp.mean(sample.experience["success"].astype(jnp.float32))}
        step = {name: jnp.where(ready, value, 0.0) for name, value in step.items()}
        return (train, replay, kl_per_version), (step, ready)

    if replay_config.replay_updates:
        (train, replay, kl_per_version), (steps, ready) = jax.lax.scan(
            replay_step, (train, replay, kl_per_version),
            jnp.arange(replay_config.replay_updates, dtype=jnp.int32))
        count = jnp.sum(ready.astype(jnp.float32))
        for name in REPLAY_METRICS:
            metrics[f"replay/{name}"] = jnp.sum(steps[name]) / jnp.maximum(count, 1.0)
    else:  # on-policy: no replay program is built (an empty scan still compiles its body)
        count = jnp.float32(0.0)
        metrics.update({f"replay/{name}": jnp.float32(0.0) for name in REPLAY_METRICS})
    pipeline = ap.finish(pipeline, train, fresh.ewma, async_config=async_config)
    state = state.replace(pipeline=pipeline, replay=replay, iteration=state.iteration + 1,
                          kl_per_version=kl_per_version)
    if replay_config.auto_tau:
        low, high = replay_config.auto_tau_bounds
        tau = jnp.where(kl_per_version > 0,
                        jnp.clip(1.0 / (replay_config.auto_tau_ess_coefficient
                                        * jnp.maximum(kl_per_version, 1e-12)), low, high),
                        state.hparams.age_decay_tau)
        state = with_age_decay_tau(state, replay_config, config.batch_size, tau)
    metrics.update({"replay/updates": count,
                    "buffer_size": state.replay.num_valid.astype(jnp.float32),
                    "age_decay_tau": state.hparams.age_decay_tau,
                    "kl_per_version": kl_per_version, "is_beta": beta})
    return state, metrics


def make_iteration(config: RLConfig, async_config: ap.AsyncConfig,
                   replay_config: LLMReplayConfig, env, model_config: Qwen2Config,
                   num_seeds: Optional[int] = None):
    """Jitted ``(state, key) -> (state, metrics)`` (vmapped over seeds with ``num_seeds``),
    cached and state-donating like :func:`fresh_rl.llm.trainer.make_iteration`; ``ValueError``
    for settings that do not fit (:func:`check_compatible`, the loss × route check
    :func:`fresh_rl.llm.policy_losses.check_route`)."""
    check_compatible(config, replay_config)
    check_route(config.loss, async_config.old_logit_route)
    if async_config.route.splits_clip:
        raise ValueError(f"RLConfig.loss={config.loss!r} with AsyncConfig.old_logit_route="
                         f"{async_config.old_logit_route!r}: a factorial route centres the clip on other old "
                         "log-probs than the mask's, and the replay buffer stores one old log-prob array per "
                         "trajectory; choose another route (the async pipeline runs it)")
    config = program_config(config)  # the learning rate is read from the state

    def build():
        fn = lambda state, key: iteration(state, key, config=config,  # noqa: E731
                                          async_config=async_config,
                                          replay_config=replay_config, env=env,
                                          model_config=model_config)
        return jax.jit(fn if num_seeds is None else jax.vmap(fn), donate_argnums=0)

    return cached_build(("replay", config, async_config, replay_config, env, model_config,
                         num_seeds), build)


def train_loop(config: RLConfig, async_config: ap.AsyncConfig, replay_config: LLMReplayConfig,
               seeds, num_iterations: int, *, params, env, model_config: Qwen2Config,
               window: Optional[int] = None, hparams: Optional[LLMHyperParams] = None,
               state: Optional[ReplayLoopState] = None, checkpointer=None,
               checkpoint_every: Optional[int] = None, log=None):
    """Runs ``num_iterations`` iterations through the one host loop
    :func:`fresh_rl.sweep.run_loop`.

    ``seeds``: an int (one run) or a sequence of ints, one row each, vmapped in one program
    (a seed may repeat: a τ ablation started from ``state`` with per-row τ, see
    :func:`set_initial_tau`, uses common seeds), or run keys
    (:func:`fresh_rl.llm.trainer.loop_keys`). ``state`` (default :func:`init_state` with
    ``window`` / ``hparams``, stacked once per row) must have the rows' leading axis.
    Checkpoint/resume covers the whole state: params, optimizer, buffer, version ring, EWMA
    reference, hyperparameters, counters, drift estimate.
    """
    key_loop, num_seeds = loop_keys(seeds)
    step_fn = make_iteration(config, async_config, replay_config, env, model_config, num_seeds)
    if state is None:
        state = stack_rows(init_state(config, async_config, replay_config, params, env, window,
                                      hparams=hparams), num_seeds)
    return run_loop(step_fn, state, key_loop, num_iterations, checkpointer=checkpointer,
                    checkpoint_every=checkpoint_every, log=log)


def set_initial_tau(state: ReplayLoopState, replay_config: LLMReplayConfig,
                    batch_size: int, taus) -> ReplayLoopState:
    """Stacks ``state`` (unbatched) once per τ in ``taus`` with that τ (hyperparameters and
    buffer, :func:`with_age_decay_tau`): one compiled FreshPER program then runs a τ ablation."""
    taus = [float(t) for t in taus]
    if any(not t > 0 for t in taus):  # NaN fails too
        raise ValueError(f"age_decay_tau must be in (0, inf], got {taus}")
    stacked = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *[
        with_age_decay_tau(state, replay_config, batch_size, tau) for tau in taus])
    # committed like init_state's leaves, so the run reuses the compiled iteration
    leaf = jax.tree_util.tree_leaves(state.pipeline.train.params)[0]
    return jax.device_put(stacked, getattr(leaf, "sharding", None) or jax.devices()[0])


def drift_by_age(params, replay: ReplayState, *, config: RLConfig, model_config: Qwen2Config,
                 now) -> dict[str, jax.Array]:
    """Per stored trajectory (``[C]``; ``valid`` marks the stored ones): its age
    ``now − t_i`` (``now``: the learner's version, i.e. the iterations done) and, over its
    action tokens, KL(π_old ‖ π_θ) estimates (``kl_k1``, ``kl_k3`` of
    :func:`fresh_rl.corrections.approx_kl`, r = π_θ/π_old against the stored behaviour
    policy), the weight sums Σr, Σr² and token count (token ESS of any group of
    trajectories: (Σ Σr)² / (n · Σ Σr²)) and Σ log r (the sequence weight Π r = exp Σ log r of
    the trajectory-level ESS, :func:`ess_by_age`). One fp32 forward over the whole buffer
    (docs/freshper.md: ESS/n ≈ exp(−c·KL), KL growing with age)."""
    experience = replay.experience
    logp, _ = token_logprobs_and_entropy(params, model_config, experience["tokens"],
                                         experience["mask"], temperature=config.temperature)
    mask = experience["action_mask"] & replay.valid[:, None]
    log_ratio = jnp.where(mask, logp - experience["old_logprobs"], 0.0)
    ratio = jnp.where(mask, jnp.exp(log_ratio), 0.0)
    kl = jax.vmap(approx_kl)(log_ratio, mask)
    return {"valid": replay.valid & mask.any(axis=1),
            "age": (now - replay.insert_version).astype(jnp.float32),
            "kl_k1": kl["kl_k1"], "kl_k3": kl["kl_k3"],
            "ratio_sum": ratio.sum(axis=1), "ratio_sq_sum": jnp.square(ratio).sum(axis=1),
            "log_ratio_sum": log_ratio.sum(axis=1), "tokens": mask.sum(axis=1).astype(jnp.float32)}


def ess_by_age(drift: dict, row_mask) -> list[dict]:
    """Token ESS/n, sequence ESS/n (of the trajectories' weights Π r, over the m trajectories of
    that age: ≥ 1/m) and token-weighted KL (k1, k3) of the stored trajectories grouped by age,
    pooled over the rows in ``row_mask`` (``drift``: host arrays of :func:`drift_by_age`,
    vmapped over rows)."""
    valid = drift["valid"] & np.asarray(row_mask)[:, None]
    out = []
    for age in np.unique(drift["age"][valid]):
        sel = valid & (drift["age"] == age)
        s, s2, n = drift["ratio_sum"][sel].sum(), drift["ratio_sq_sum"][sel].sum(), \
            drift["tokens"][sel].sum()
        log_w = np.asarray(drift["log_ratio_sum"][sel], np.float64) if "log_ratio_sum" in drift else None
        w = None if log_w is None else np.exp(log_w - log_w.max())
        out.append({"age": int(age), "trajectories": int(sel.sum()), "tokens": int(n),
                    "ess_fraction": float(s * s / max(n * s2, 1e-30)),
                    "sequence_ess_fraction": (float(w.sum() ** 2 / (w.size * (w * w).sum()))
                                              if w is not None else math.nan),
                    **{k: float(np.average(drift[k][sel], weights=drift["tokens"][sel]))
                       for k in ("kl_k1", "kl_k3")}})
    return out


def fit_decay(points: list[dict]) -> dict:
    """Least squares through the origin of −log(ESS/n) = λ·age and KL = κ·age over the
    :func:`ess_by_age` points (weighted by trajectories); τ ≈ 1/λ or 1/κ."""
    age = np.array([p["age"] for p in points], float)
    w = np.array([p["trajectories"] for p in points], float)
    neg_log_ess = -np.log(np.clip([p["ess_fraction"] for p in points], 1e-12, 1.0))
    kl = np.array([p["kl_k3"] for p in points])
    denom = max(float(np.sum(w * age * age)), 1e-12)
    lam = float(np.sum(w * age * neg_log_ess) / denom)
    kappa = float(np.sum(w * age * kl) / denom)
    return {"ess_decay_rate": lam, "tau_from_ess": 1.0 / lam if lam > 0 else math.inf,
            "kl_per_version": kappa, "tau_from_kl": 1.0 / kappa if kappa > 0 else math.inf}


__all__ = ["LLMReplayConfig", "REPLAY_METRICS", "ReplayLoopState", "base_priority",
           "check_compatible", "drift_by_age", "ess_by_age", "fit_decay", "init_state",
           "insert_versions", "iteration", "make_iteration", "replay_batch",
           "sequence_advantage", "set_initial_tau", "stored_item", "train_loop",
           "with_age_decay_tau"]
