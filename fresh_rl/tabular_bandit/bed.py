"""An exact stale-buffer test bed for replay in critic-free policy-gradient RL (FreshPER).

**Why tabular.** FreshPER (arXiv 2604.16918) argues from the effective sample size of stale
data; with an LLM policy that ESS can only be estimated. Here the policy is a table, so every
quantity the argument needs is exact: the expected reward, the true policy gradient, and
KL(β‖π) and ESS/n of every stored behaviour policy β against the learner π.

**Environment.** One prompt; a response is a sequence of T tokens from A actions (defaults
4 × 8, 8^4 = 4096 sequences). The reward is graded and sparse: ``R = k/T`` with k the length of
the longest prefix that matches a fixed target ``a*_t = (5t + 3) mod A`` (our choice), so
R = 0 unless the first token is right.

**Policy.** Position-wise softmax over a logits table ``θ ∈ R^{T×A}``:
``π(a_1..a_T) = Π_t softmax(θ_t)(a_t)`` (our choice over a per-prefix table: it keeps KL and
ESS in closed form). Then, exactly,

    J(θ)         = (1/T) Σ_k Π_{t≤k} π_t(a*_t)                       expected reward
    KL(β‖π)      = Σ_t Σ_a β_t(a) log(β_t(a)/π_t(a))
    ESS/n(β, π)  = (E_β w)² / E_β w² = 1 / Π_t Σ_a π_t(a)²/β_t(a)    w = π(seq)/β(seq)

(ESS/n of whole-sequence weights, the population version of Kish's ESS; E_β w = 1.) The
per-step counterpart weighs each token alone, w_t = π_t(a_t)/β_t(a_t):
``ESS_t/n = 1 / Σ_a π_t(a)²/β_t(a)``, averaged over the T positions
(:func:`step_ess_fraction`); the sequence ESS is the product of the T per-position terms, so it
falls about T times faster in the exponent.

**Training** (one iteration = one policy version, the buffer's age unit): sample B sequences
from π (the behaviour β = π at that moment), advantages ``A = (R − mean R)/(std R + 1e-6)``
over the batch (GRPO with one group, equal to REINFORCE++'s batch normalisation for a single
prompt), one PPO-clip update on the fresh batch (ratio 1: the plain policy gradient), insert
the batch into the buffer, then K further updates. What the K updates are is the *method*, a
set of traced hyperparameters (:class:`BedHParams`), so every method, learning rate and τ of a
study is a row of one vmapped, once-compiled program:

The methods (:mod:`fresh_rl.replay.methods`, shared with the control study):

* ``extra="none"`` (on-policy, 1 update per batch), ``"epochs"`` (K more epochs on the fresh
  batch: exactly K + 1 updates per batch, ratio against β), ``"replay"`` (K updates, each on a
  batch sampled from the buffer, PPO-clip ratio against the *stored* behaviour log-probs,
  advantages recomputed on the replay batch, scaled by the PER weights w_i as the authors do).
* Replay sampling (:mod:`fresh_rl.replay`, one "freshper" buffer): uniform (every priority 1),
  PER with given priorities (τ = ∞), the authors' PER (new items at the running max priority,
  only sampled items refreshed), FreshPER (τ finite); β = 0 turns the IS weights off.
* Replay optimiser (``replay_optimizer``): ``"shared"`` (one Adam state for all updates, as the
  authors), ``"separate"`` (a second Adam state for replay updates) or ``"sgd"`` (replay updates
  are plain SGD), to separate momentum carried by Adam from the data replayed.

Base priorities: ``"return"`` (|R| + ε, the paper's REINFORCE++ choice) or ``"advantage"``
(|R − b|/(s + 1e-6) + ε with the batch mean b and std s stored with the item,
:func:`fresh_rl.replay.advantage_priority`).
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

from fresh_rl.corrections import PPOClipConfig, ppo_clip_loss
from fresh_rl.replay import (ReplayConfig, ReplayState, advantage_priority, magnitude_priority,
                             make_trajectory_buffer)
from fresh_rl.replay import methods as replay_methods
from fresh_rl.replay.methods import (UPDATE_FRESH, UPDATE_REPLAY, ReplayHParams, replay_hparams,
                                     stack_replay_hparams, update_kind)
from fresh_rl.sweep.keys import split_run_key, step_key
from fresh_rl.validation import require_choice, require_in_range, require_int

PRIORITY_SOURCES = ("return", "advantage")


@dataclasses.dataclass(frozen=True)
class BedConfig:
    """Static shape and structure of the bed (traced settings are :class:`BedHParams`).

    Attributes:
      num_steps: T, tokens per response.
      num_actions: A, vocabulary size.
      batch_size: B, responses per iteration (also the replay batch).
      num_iterations: policy versions per run; a multiple of ``log_every``.
      extra_updates: K, updates after the fresh one (epochs or replay batches; the method's
        ``extra`` decides which, or none).
      buffer_iterations: H, iterations the FIFO buffer holds (capacity B·H); also the ages at
        which ESS/KL are reported (0 … H − 1).
      log_every: iterations between exact ESS/KL-by-age snapshots.
      priority: base-priority source, "return" or "advantage".
      priority_exponent, importance_exponent_default, min_decayed_priority: the buffer's α, the
        β of methods with IS, the decayed-priority floor (:class:`fresh_rl.replay.ReplayConfig`).
      buffer_sampling: "freshper" (τ a traced hyperparameter) or "per" (no decay at all; for
        the τ = ∞ equivalence test).
      clip_epsilon: PPO-clip ε.
    """

    num_steps: int = 4
    num_actions: int = 8
    batch_size: int = 32
    num_iterations: int = 200
    extra_updates: int = 2
    buffer_iterations: int = 128
    log_every: int = 20
    priority: Literal["return", "advantage"] = "return"
    priority_exponent: float = 0.6
    importance_exponent_default: float = 0.4
    min_decayed_priority: float = 1e-8
    buffer_sampling: Literal["freshper", "per"] = "freshper"
    clip_epsilon: float = 0.2

    def __post_init__(self):
        require_int("BedConfig.num_steps", self.num_steps, 1)
        require_int("BedConfig.num_actions", self.num_actions, 2)
        require_int("BedConfig.batch_size", self.batch_size, 2)
        require_int("BedConfig.num_iterations", self.num_iterations, 1)
        require_int("BedConfig.extra_updates", self.extra_updates, 0)
        require_int("BedConfig.buffer_iterations", self.buffer_iterations, 1)
        require_int("BedConfig.log_every", self.log_every, 1)
        if self.num_iterations % self.log_every:
            raise ValueError(f"BedConfig.num_iterations={self.num_iterations} must be a multiple "
                             f"of BedConfig.log_every={self.log_every}")
        require_choice("BedConfig.priority", self.priority, PRIORITY_SOURCES)
        require_choice("BedConfig.buffer_sampling", self.buffer_sampling, ("freshper", "per"))
        require_in_range("BedConfig.clip_epsilon", self.clip_epsilon, 0.0, 1.0,
                         high_inclusive=False)

    @property
    def replay_config(self) -> ReplayConfig:
        return ReplayConfig(
            capacity=self.batch_size * self.buffer_iterations, sample_batch_size=self.batch_size,
            sampling=self.buffer_sampling, priority_exponent=self.priority_exponent,
            importance_exponent=self.importance_exponent_default, age_decay_tau=math.inf,
            new_item_priority="given", min_decayed_priority=self.min_decayed_priority)

    @property
    def target(self) -> jax.Array:
        """``[T]`` the rewarded sequence a*."""
        return (5 * jnp.arange(self.num_steps) + 3) % self.num_actions


@struct.dataclass
class BedHParams:
    """Traced settings of one run (scalars; leading grid axis under ``vmap``).

    Attributes:
      learning_rate: Adam (and SGD) step size: the drift knob.
      replay: the method's :class:`fresh_rl.replay.methods.ReplayHParams`.
    """

    learning_rate: jax.Array
    replay: ReplayHParams


def method_hparams(method: str, learning_rate: float, tau_fit: float = math.inf,
                   replay_optimizer: str = "shared",
                   importance_exponent: float = 0.4) -> dict:
    """Scalar hyperparameters of one registry method: ``learning_rate`` and the
    :func:`fresh_rl.replay.methods.replay_hparams` fields."""
    require_in_range("learning_rate", learning_rate, 0.0, math.inf, low_inclusive=False)
    return {"learning_rate": float(learning_rate),
            **replay_hparams(method, tau_fit, replay_optimizer, importance_exponent)}


def stack_hparams(rows) -> BedHParams:
    """``BedHParams`` with a leading axis from a sequence of :func:`method_hparams` dicts."""
    rows = list(rows)
    return BedHParams(learning_rate=jnp.asarray([r["learning_rate"] for r in rows], jnp.float32),
                      replay=stack_replay_hparams(rows))


# ------------------------------------------------------------------------------ exact quantities


def log_policy(logits: jax.Array) -> jax.Array:
    """``[T, A]`` log π_t(a)."""
    return jax.nn.log_softmax(logits, axis=-1)


def token_log_probs(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """``[B, T]`` log π_t(a_t) of sequences ``tokens`` ``[B, T]``."""
    chex.assert_rank(tokens, 2)
    return log_policy(logits)[jnp.arange(tokens.shape[1])[None, :], tokens]


def sample_sequences(key: jax.Array, logits: jax.Array, batch_size: int) -> jax.Array:
    """``[B, T]`` sequences from π by inverse CDF (one uniform per token; on CPU this compiles
    ~10x faster than ``jax.random.categorical``'s Gumbel trick)."""
    u = jax.random.uniform(key, (batch_size, logits.shape[0], 1))
    cdf = jnp.cumsum(jnp.exp(log_policy(logits)), axis=-1)
    return jnp.minimum(jnp.sum(cdf[None] < u, axis=-1), logits.shape[1] - 1).astype(jnp.int32)


def sequence_rewards(tokens: jax.Array, target: jax.Array) -> jax.Array:
    """``[B]`` R = (matched prefix length)/T."""
    matched = jnp.cumprod(tokens == target[None, :], axis=1)
    return matched.sum(axis=1).astype(jnp.float32) / tokens.shape[1]


def expected_reward(logits: jax.Array, target: jax.Array) -> jax.Array:
    """Exact J(θ) = (1/T) Σ_k Π_{t≤k} π_t(a*_t)."""
    p_target = jnp.exp(log_policy(logits)[jnp.arange(target.shape[0]), target])
    return jnp.mean(jnp.cumprod(p_target))


def kl_divergence(behaviour_logits: jax.Array, logits: jax.Array) -> jax.Array:
    """Exact KL(β‖π) of the sequence distributions (sum over positions)."""
    log_b, log_p = log_policy(behaviour_logits), log_policy(logits)
    return jnp.sum(jnp.exp(log_b) * (log_b - log_p))


def _log_step_second_moments(behaviour_logits: jax.Array, logits: jax.Array) -> jax.Array:
    """``[T]`` log E_β[w_t²] = log Σ_a π_t(a)²/β_t(a) of the per-position weights w_t = π_t/β_t."""
    log_b, log_p = log_policy(behaviour_logits), log_policy(logits)
    return jax.nn.logsumexp(2 * log_p - log_b, axis=-1)


def ess_fraction(behaviour_logits: jax.Array, logits: jax.Array) -> jax.Array:
    """Exact ESS/n = 1/E_β[w²] of sequence weights w = π/β: ``exp(−Σ_t log Σ_a π²/β)``."""
    return jnp.exp(-_log_step_second_moments(behaviour_logits, logits).sum())


def step_ess_fraction(behaviour_logits: jax.Array, logits: jax.Array) -> jax.Array:
    """Exact per-step ESS/n: the mean over positions t of ``1 / Σ_a π_t(a)²/β_t(a)``, the ESS of
    single-token weights π_t/β_t (what a token-level correction sees)."""
    return jnp.mean(jnp.exp(-_log_step_second_moments(behaviour_logits, logits)))


# ------------------------------------------------------------------------------ training


@struct.dataclass
class BedState:
    """Everything one run carries between iterations.

    Attributes:
      params: ``[T, A]`` logits θ.
      opt_state: Adam state of fresh updates (and replay updates under "shared").
      replay_opt_state: Adam state of replay updates under "separate".
      buffer: the trajectory buffer (items: tokens, behaviour log-probs, reward, baseline, std).
      history: ``[H, T, A]`` ring of the behaviour logits of the last H iterations.
      iteration: policy version of the next batch.
      sampled_age_counts: ``[H]`` replayed items per age, summed over the run.
      num_updates: optimizer updates applied so far.
    """

    params: jax.Array
    opt_state: optax.OptState
    replay_opt_state: optax.OptState
    buffer: ReplayState
    history: jax.Array
    iteration: jax.Array
    sampled_age_counts: jax.Array
    num_updates: jax.Array


def optimizer(learning_rate) -> optax.GradientTransformation:
    """Adam with step size ``learning_rate`` (traced; the state does not depend on it)."""
    return optax.chain(optax.scale_by_adam(), optax.scale_by_learning_rate(learning_rate))


def _example_item(config: BedConfig) -> dict:
    t = config.num_steps
    return {"tokens": jnp.zeros((t,), jnp.int32), "behaviour_log_probs": jnp.zeros((t,)),
            "reward": jnp.zeros(()), "baseline": jnp.zeros(()), "scale": jnp.zeros(())}


def init_state(config: BedConfig, hp: BedHParams) -> BedState:
    """Uniform policy (θ = 0), empty buffer with τ = ``hp.replay.age_decay_tau``."""
    buffer = make_trajectory_buffer(config.replay_config)
    replay = buffer.init(_example_item(config))
    if config.buffer_sampling == "freshper":
        replay = buffer.set_age_decay_tau(replay, hp.replay.age_decay_tau)
    params = jnp.zeros((config.num_steps, config.num_actions), jnp.float32)
    return BedState(
        params=params, opt_state=optimizer(hp.learning_rate).init(params),
        replay_opt_state=optimizer(hp.learning_rate).init(params),
        buffer=replay,
        history=jnp.zeros((config.buffer_iterations, *params.shape), jnp.float32),
        iteration=jnp.zeros((), jnp.int32),
        sampled_age_counts=jnp.zeros((config.buffer_iterations,), jnp.int32),
        num_updates=jnp.zeros((), jnp.int32))


def _normalized_advantages(rewards):
    return (rewards - rewards.mean()) / (rewards.std() + 1e-6)


def _base_priority(config: BedConfig, items: dict) -> jax.Array:
    if config.priority == "return":
        return magnitude_priority(items["reward"])
    return advantage_priority(items["reward"], items["baseline"], items["scale"])


def _loss(config: BedConfig, params, tokens, behaviour_log_probs, advantages):
    log_probs = token_log_probs(params, tokens)
    token_advantages = jnp.broadcast_to(advantages[:, None], log_probs.shape)
    eps = config.clip_epsilon
    return ppo_clip_loss(log_probs, behaviour_log_probs, token_advantages,
                         config=PPOClipConfig(epsilon_low=eps, epsilon_high=eps))[0]


def _cosine(a, b):
    return jnp.sum(a * b) / jnp.maximum(jnp.linalg.norm(a) * jnp.linalg.norm(b), 1e-30)


def insert(config: BedConfig, hp: BedHParams, replay: ReplayState, items: dict,
           version) -> ReplayState:
    """Adds a fresh batch with its ``config.priority`` base priority under the method's rule
    (:func:`fresh_rl.replay.methods.insert`)."""
    return replay_methods.insert(make_trajectory_buffer(config.replay_config), hp.replay, replay,
                                 items, version, _base_priority(config, items))


def refresh(config: BedConfig, hp: BedHParams, replay: ReplayState, indices,
            items: dict) -> ReplayState:
    """Rewrites the sampled items' priorities when the method refreshes
    (:func:`fresh_rl.replay.methods.refresh`)."""
    return replay_methods.refresh(make_trajectory_buffer(config.replay_config), hp.replay, replay,
                                  indices, _base_priority(config, items))


def apply_update(hp: BedHParams, params, opt_state, replay_opt_state, grads, kind):
    """One Adam (or SGD) update at ``hp.learning_rate`` (:func:`fresh_rl.replay.methods.apply_update`)."""
    return replay_methods.apply_update(hp.replay, optimizer(hp.learning_rate),
                                       optax.sgd(hp.learning_rate), params, opt_state,
                                       replay_opt_state, grads, kind)


def make_iteration(config: BedConfig):
    """``iteration(state, hp, key) -> (state, metrics)``: one policy version (module docstring)."""
    buffer = make_trajectory_buffer(config.replay_config)
    grad_fn = jax.grad(lambda p, *a: _loss(config, p, *a))
    true_grad = jax.grad(expected_reward)

    def iteration(state: BedState, hp: BedHParams, key):
        k_batch, k_replay = jax.random.split(key)
        t, h = state.iteration, config.buffer_iterations
        behaviour = state.params
        tokens = sample_sequences(k_batch, behaviour, config.batch_size)
        rewards = sequence_rewards(tokens, config.target)
        advantages = _normalized_advantages(rewards)
        behaviour_log_probs = token_log_probs(behaviour, tokens)
        ones = jnp.ones((config.batch_size,), jnp.float32)
        items = {"tokens": tokens, "behaviour_log_probs": behaviour_log_probs, "reward": rewards,
                 "baseline": rewards.mean() * ones, "scale": rewards.std() * ones}
        grads = grad_fn(state.params, tokens, behaviour_log_probs, advantages)
        params, opt_state, replay_opt_state = apply_update(
            hp, state.params, state.opt_state, state.replay_opt_state, grads, UPDATE_FRESH)
        replay = insert(config, hp, state.buffer, items, t)
        kind = update_kind(hp.replay)
        is_replay = kind == UPDATE_REPLAY

        def extra_update(j, carry):
            params, opt_state, replay_opt_state, replay, age_counts, cos_sum = carry
            sample = buffer.sample(replay, jax.random.fold_in(k_replay, j),
                                   importance_exponent=hp.replay.importance_exponent)
            exp = sample.experience
            pick = lambda replayed, fresh: jnp.where(is_replay, replayed, fresh)  # noqa: E731
            grads = grad_fn(params, pick(exp["tokens"], tokens),
                            pick(exp["behaviour_log_probs"], behaviour_log_probs),
                            pick(_normalized_advantages(exp["reward"])
                                 * sample.importance_weights, advantages))
            cos_sum = cos_sum + jnp.where(
                kind > 0, _cosine(-grads, true_grad(params, config.target)), 0.0)
            params, opt_state, replay_opt_state = apply_update(
                hp, params, opt_state, replay_opt_state, grads, kind)
            replay = jax.tree.map(lambda r, o: jnp.where(is_replay, r, o),
                                  refresh(config, hp, replay, sample.indices, exp), replay)
            age_counts = age_counts.at[jnp.clip(sample.age, 0, h - 1)].add(
                is_replay.astype(jnp.int32))
            return params, opt_state, replay_opt_state, replay, age_counts, cos_sum

        carry = (params, opt_state, replay_opt_state, replay, state.sampled_age_counts,
                 jnp.zeros(()))
        params, opt_state, replay_opt_state, replay, age_counts, cos_sum = jax.lax.fori_loop(
            0, config.extra_updates, extra_update, carry)
        updates = 1 + jnp.where(kind > 0, config.extra_updates, 0)
        state = BedState(
            params=params, opt_state=opt_state, replay_opt_state=replay_opt_state, buffer=replay,
            history=state.history.at[t % h].set(behaviour), iteration=t + 1,
            sampled_age_counts=age_counts, num_updates=state.num_updates + updates)
        metrics = {"expected_reward": expected_reward(params, config.target),
                   "batch_reward": rewards.mean(), "updates": updates,
                   "extra_update_cosine": cos_sum / max(config.extra_updates, 1)}
        return state, metrics

    return iteration


def drift_by_age(config: BedConfig, state: BedState) -> dict:
    """Exact ``ess`` (whole-sequence weights), ``ess_step`` (per-step weights,
    :func:`step_ess_fraction`) and ``kl`` ``[H]`` of the behaviour policy of age a = 0 … H − 1
    (the batch sampled a iterations before the latest) against the current policy; −1 (not NaN:
    runs are checkpointed through the non-finite guard) for ages not yet reached."""
    h = config.buffer_iterations
    ages = jnp.arange(h)
    latest = state.iteration - 1
    behaviours = state.history[(latest - ages) % h]
    ok = ages <= latest
    ess = jax.vmap(ess_fraction, in_axes=(0, None))(behaviours, state.params)
    ess_step = jax.vmap(step_ess_fraction, in_axes=(0, None))(behaviours, state.params)
    kl = jax.vmap(kl_divergence, in_axes=(0, None))(behaviours, state.params)
    return {"ess": jnp.where(ok, ess, -1.0), "ess_step": jnp.where(ok, ess_step, -1.0),
            "kl": jnp.where(ok, kl, -1.0)}


def train(config: BedConfig, key: jax.Array, hp: BedHParams) -> dict:
    """One whole run, jittable and vmappable over (key, hp). Key schedule of
    :mod:`fresh_rl.sweep.keys`: iteration i uses ``step_key(key_loop, i)``.

    Returns:
      ``expected_reward``, ``batch_reward``, ``updates``, ``extra_update_cosine``
      ``[num_iterations]``; ``ess_by_age``, ``ess_step_by_age``, ``kl_by_age``
      ``[num_iterations/log_every, H]``
      (snapshots after iterations log_every, 2·log_every, …); ``sampled_age_counts`` ``[H]``;
      ``num_updates`` and ``adam_count`` (Adam's own step counter of the shared state).
    """
    _, key_loop = split_run_key(key)
    iteration = make_iteration(config)

    def one(state, _):
        state, metrics = iteration(state, hp, step_key(key_loop, state.iteration))
        return state, metrics

    def chunk(state, _):
        state, metrics = jax.lax.scan(one, state, None, length=config.log_every)
        return state, (metrics, drift_by_age(config, state))

    state, (metrics, drift) = jax.lax.scan(
        chunk, init_state(config, hp), None, length=config.num_iterations // config.log_every)
    out = {k: v.reshape(-1) for k, v in metrics.items()}
    out.update(ess_by_age=drift["ess"], ess_step_by_age=drift["ess_step"], kl_by_age=drift["kl"],
               sampled_age_counts=state.sampled_age_counts, num_updates=state.num_updates,
               adam_count=state.opt_state[0].count)
    return out


__all__ = ["BedConfig", "BedHParams", "BedState", "apply_update", "drift_by_age", "ess_fraction",
           "expected_reward", "init_state", "insert", "kl_divergence",
           "make_iteration", "method_hparams", "optimizer", "refresh", "sample_sequences",
           "sequence_rewards", "stack_hparams", "step_ess_fraction", "token_log_probs", "train"]
