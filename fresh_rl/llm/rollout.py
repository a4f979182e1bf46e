"""Batched multi-turn episodes of a text task, as one jittable scan over turns.

Transcript layout (right-padded with `env.pad_id`, `[B, env.transcript_len]`):
  bos, [first_prefix] obs_1 [obs_suffix], action_1, [turn_prefix] obs_2 [obs_suffix], action_2, ...
(no observation after the last action). `bos = env.bos_id` and the bracketed chat framing
come from the task vocabulary (:mod:`fresh_rl.llm.tasks.vocab`; none for the char
vocabulary); each action ends with one of `env.stop_tokens`.
`action_mask` marks the tokens the policy produced (what a policy-gradient loss trains on);
`behaviour_log_probs` holds the sampler's log-probs there (the inference-engine pi_infer).

A policy is `policy(key, tokens [B, T], lengths [B], env_states, turn) -> (actions [B, A],
action_lengths [B], action_logprobs [B, A], extras)`; `turn` is the int32 turn index and
`extras` a dict of per-token `[B, A]` arrays that are written at the action positions of the
transcript like the log-probs (`Episodes.token_extras`; e.g. the per-token policy-version
tags of the asynchronous pipeline, :mod:`fresh_rl.llm.async_pipeline`). A policy with an
`init_state(env, batch)` method is stateful: it is called with its state as a sixth argument
and returns the new state as a fifth output; the state rides in the scan carry
(:func:`run_episodes_with_policy_state` returns the final one). `model_policy` samples from
the LM (bf16, KV cache), `expert_policy` replays the task's demonstration (supervised warm
start); both return no extras.

Cache reuse across turns (`ModelPolicy.reuse_cache_across_turns`, the default): the model
policy keeps one KV cache per episode in its state (:class:`~fresh_rl.llm.sampler.TurnCache`)
and each turn prefills only the tokens appended since its last action (the observation and
its chat framing), then decodes the action into the following slots. Slot layout
(:class:`CacheLayout`), one block per segment in transcript order:

  [first prompt: P0] [action 0: A] [observation 1: O] [action 1: A] ... [action T-1: A]

P0 = 1 + |first_prefix| + obs_len + |obs_suffix|, O = |turn_prefix| + obs_len + |obs_suffix|,
A = max_new_tokens. A block holds its tokens right-aligned; its unused slots and an action's
slots after the stop token are masked (``kv_valid``), and RoPE positions count the row's valid
tokens, so attention sees exactly the tokens and positions of re-prefilling the transcript.
Prefill cost per episode: P0 + (T-1)·O slots instead of T·|transcript|. With
``reuse_cache_across_turns=False`` every turn re-prefills the whole left-padded transcript
(the reference; in bf16 the two differ at the last-bit level, since the softmax sums over a
differently sized masked cache). The asynchronous pipeline's ``versioned_policy`` stays
stateless and re-prefills: a row whose weight version changed between turns cannot reuse keys
and values computed with the older weights.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from fresh_rl.llm.model import Qwen2Config
from fresh_rl.llm.sampler import (SamplingConfig, TurnCache, decode_cache, generate,
                                  prefill_cache)
from fresh_rl.llm.tasks.vocab import check_model_vocab


@flax.struct.dataclass
class Episodes:
    tokens: jax.Array  # [B, T]
    mask: jax.Array  # [B, T]
    action_mask: jax.Array  # [B, T]
    behaviour_log_probs: jax.Array  # [B, T]
    rewards: jax.Array  # [B, max_turns] per-turn reward (0 after the episode ended)
    turn_mask: jax.Array  # [B, max_turns] turns that were played
    success: jax.Array  # [B] the task's verifiable success at any turn
    format_ok: jax.Array  # [B, max_turns]
    token_extras: dict = flax.struct.field(default_factory=dict)  # name -> [B, T], 0 off-action

    @property
    def returns(self):
        return self.rewards.sum(axis=1)


def write_span(buffer, start, values, count):
    """buffer[start:start+count] = values[:count] for one row (any dtype)."""
    m = values.shape[0]
    idx = jnp.where(jnp.arange(m) < count, start + jnp.arange(m), buffer.shape[0])
    return buffer.at[idx].set(values.astype(buffer.dtype), mode="drop")


def write_observation(tokens, lengths, prefix, obs, obs_len, suffix, shown):
    """Appends ``prefix, obs[:obs_len], suffix`` to the rows of ``tokens`` where ``shown``
    (the framing ``prefix``/``suffix`` are constant id arrays); returns (tokens, lengths)."""
    write, batch = jax.vmap(write_span), tokens.shape[0]
    segments = [(jnp.broadcast_to(jnp.asarray(x, jnp.int32), (batch, len(x))), len(x))
                for x in (prefix, suffix)]
    for segment, count in (segments[0], (obs, obs_len), segments[1]):
        if segment.shape[1]:  # no framing: nothing to write
            count = jnp.where(shown, count, 0)
            tokens, lengths = write(tokens, lengths, segment, count), lengths + count
    return tokens, lengths


def right_to_left_padded(tokens, lengths):
    """Moves each row's first `lengths[b]` tokens to the end: `(tokens, mask)` left-padded."""
    width = tokens.shape[1]
    mask = jnp.arange(width)[None] < lengths[:, None]
    shift = width - lengths
    roll = jax.vmap(lambda row, s: jnp.roll(row, s))
    return roll(tokens, shift), roll(mask, shift)


def left_padded_window(tokens, start, end, width: int):
    """Row b's tokens ``[start_b, end_b)`` right-aligned in ``width`` columns (at most the
    last ``width``); returns (tokens ``[B, width]``, mask), masked columns hold token 0."""
    count = jnp.clip(end - start, 0, width)
    first = (width - count)[:, None]
    columns = jnp.arange(width)[None]
    index = jnp.clip(end[:, None] - width + columns, 0, tokens.shape[1] - 1)
    mask = columns >= first
    return jnp.where(mask, jnp.take_along_axis(tokens, index, axis=1), 0), mask


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """Cache slots of one episode (module docstring): the first prompt block, then per turn
    an action block and (from turn 1) an observation block before it."""

    first_block: int  # P0: BOS, framing, the first observation
    observation_block: int  # O: framing and one observation
    action_block: int  # A: the sampler's max_new_tokens
    max_turns: int

    @classmethod
    def of(cls, env, action_block: int) -> "CacheLayout":
        vocab = env.vocab
        suffix = len(vocab.obs_suffix)
        return cls(first_block=1 + len(vocab.first_prefix) + env.obs_len + suffix,
                   observation_block=len(vocab.turn_prefix) + env.obs_len + suffix,
                   action_block=action_block, max_turns=env.max_turns)

    @property
    def num_slots(self) -> int:
        """S = P0 + T·A + (T-1)·O (no observation after the last action)."""
        return (self.first_block + self.max_turns * self.action_block
                + (self.max_turns - 1) * self.observation_block)

    def observation_slot(self, turn):
        """First slot of turn ``turn ≥ 1``'s observation block: P0 + t·A + (t-1)·O."""
        return self.first_block + turn * self.action_block + (turn - 1) * self.observation_block

    def action_slot(self, turn):
        """First slot of turn ``turn``'s action block: P0 + t·(A + O)."""
        return self.first_block + turn * (self.action_block + self.observation_block)


@flax.struct.dataclass
class ModelPolicyState:
    """The model policy's state across turns: its cache (None when re-prefilling) and
    prefill statistics (``prefill_slots``: positions run through a prefill, pads and holes
    included, i.e. its compute; ``prefill_tokens``: the valid ones), summed over the batch."""

    turn_cache: TurnCache | None
    prefill_slots: jax.Array
    prefill_tokens: jax.Array
    layout: CacheLayout | None = flax.struct.field(pytree_node=False, default=None)


@dataclasses.dataclass(frozen=True, eq=False)
class ModelPolicy:
    """LM policy: samples the next action from the transcript. `run_episodes` checks that
    the model and the sampler's stop tokens match the task's vocabulary.

    ``reuse_cache_across_turns`` (default True): keep the KV cache across turns and prefill
    only the new tokens (module docstring); False re-prefills the whole transcript each turn.
    """

    params: Any
    model_config: Qwen2Config
    sampling: SamplingConfig
    reuse_cache_across_turns: bool = True

    def check(self, env) -> None:
        """ValueError unless the model speaks `env.vocab` and stops on its stop tokens."""
        check_model_vocab(env, self.model_config)
        if not set(env.stop_tokens) <= set(self.sampling.stop_tokens):
            raise ValueError(f"SamplingConfig.stop_tokens {self.sampling.stop_tokens} must "
                             f"contain the stop tokens {env.stop_tokens} of "
                             f"{type(env).__name__}'s vocabulary {env.vocab.source!r}")

    def init_state(self, env, batch: int) -> ModelPolicyState:
        zero = jnp.zeros((), jnp.int32)
        if not self.reuse_cache_across_turns:
            return ModelPolicyState(None, zero, zero)
        layout = CacheLayout.of(env, self.sampling.max_new_tokens)
        if env.transcript_len + layout.action_block > self.model_config.max_position_embeddings:
            raise ValueError(f"transcript_len + max_new_tokens = "
                             f"{env.transcript_len + layout.action_block} exceeds the context "
                             f"max_position_embeddings="
                             f"{self.model_config.max_position_embeddings}")
        turn_cache = TurnCache.empty(self.model_config, batch, layout.num_slots,
                                     self.sampling.dtype)
        return ModelPolicyState(turn_cache, zero, zero, layout)

    def __call__(self, key, tokens, lengths, states, turn, policy_state: ModelPolicyState):
        del states
        if policy_state.turn_cache is None:
            prompt, prompt_mask = right_to_left_padded(tokens, lengths)
            gen = generate(self.params, self.model_config, self.sampling, prompt, prompt_mask,
                           key)
            return gen.tokens, gen.lengths, gen.logprobs, {}, policy_state.replace(
                prefill_slots=policy_state.prefill_slots + prompt.size,
                prefill_tokens=policy_state.prefill_tokens + lengths.sum())
        layout = policy_state.layout

        def prefill(width, slot):
            def run(turn_cache):
                block, mask = left_padded_window(tokens, turn_cache.next_position, lengths,
                                                 width)
                logits, turn_cache = prefill_cache(self.params, self.model_config,
                                                   self.sampling, turn_cache, block, mask,
                                                   slot)
                return logits, turn_cache, jnp.int32(block.size), mask.sum(dtype=jnp.int32)
            return run

        # Rows that finished keep decoding into their cache; their tokens are never written.
        logits, turn_cache, slots, count = jax.lax.cond(
            turn == 0, prefill(layout.first_block, 0),
            prefill(layout.observation_block, layout.observation_slot(turn)),
            policy_state.turn_cache)
        gen, turn_cache = decode_cache(self.params, self.model_config, self.sampling,
                                       turn_cache, logits, layout.action_slot(turn), key)
        return gen.tokens, gen.lengths, gen.logprobs, {}, policy_state.replace(
            turn_cache=turn_cache, prefill_slots=policy_state.prefill_slots + slots,
            prefill_tokens=policy_state.prefill_tokens + count)


def model_policy(params, model_config: Qwen2Config, sampling: SamplingConfig,
                 reuse_cache_across_turns: bool = True) -> ModelPolicy:
    return ModelPolicy(params, model_config, sampling, reuse_cache_across_turns)


def expert_policy(env):
    def policy(key, tokens, lengths, states, turn):
        del key, tokens, lengths, turn
        actions, action_lengths = jax.vmap(env.expert_action)(states)
        return actions, action_lengths, jnp.zeros(actions.shape, jnp.float32), {}

    return policy


def run_episodes(env, policy, key, batch: int, reset_keys=None) -> Episodes:
    """Plays `batch` episodes of `env` with `policy` (pure; jit it with env/policy closed).

    ``reset_keys`` (``[batch]`` keys, optional) sets each row's start state explicitly, e.g.
    repeated keys for GRPO groups that share a prompt; by default they derive from ``key``.
    """
    return run_episodes_with_policy_state(env, policy, key, batch, reset_keys)[0]


def run_episodes_with_policy_state(env, policy, key, batch: int, reset_keys=None):
    """:func:`run_episodes` and the policy's final state (None for a stateless policy)."""
    if isinstance(policy, ModelPolicy):
        policy.check(env)
    width, vocab = env.transcript_len, env.vocab
    k_reset, k_policy = jax.random.split(key)
    if reset_keys is None:
        reset_keys = jax.random.split(k_reset, batch)
    obs, obs_len, states = jax.vmap(env.reset)(reset_keys)
    tokens = jnp.full((batch, width), env.pad_id, jnp.int32).at[:, 0].set(env.bos_id)
    tokens, lengths = write_observation(tokens, jnp.ones(batch, jnp.int32), vocab.first_prefix,
                                        obs, obs_len, vocab.obs_suffix, jnp.ones(batch, bool))
    action_mask = jnp.zeros((batch, width), bool)
    behaviour = jnp.zeros((batch, width), jnp.float32)
    if hasattr(policy, "init_state"):
        step_policy, policy_state = policy, policy.init_state(env, batch)
    else:
        def step_policy(key, tokens, lengths, states, turn, policy_state):
            return (*policy(key, tokens, lengths, states, turn), policy_state)
        policy_state = None

    def pad_action(x):
        return jnp.pad(x, ((0, 0), (0, env.action_len - x.shape[1])))

    def turn(carry, xs):
        key, turn_index = xs
        tokens, lengths, action_mask, behaviour, extras, states, done, policy_state = carry
        active = ~done
        actions, action_lengths, logprobs, new_extras, policy_state = step_policy(
            key, tokens, lengths, states, turn_index, policy_state)
        if actions.shape[1] != env.action_len:
            actions = pad_action(actions)
        written = jnp.where(active, action_lengths, 0)
        tokens = jax.vmap(write_span)(tokens, lengths, actions, written)
        action_mask = jax.vmap(write_span)(action_mask, lengths, jnp.ones_like(actions, bool),
                                       written)
        behaviour = jax.vmap(write_span)(behaviour, lengths, logprobs, written)
        extras = {name: jax.vmap(write_span)(extras[name], lengths, pad_action(new_extras[name]),
                                         written) for name in extras}
        lengths = lengths + written
        obs, obs_len, new_states, reward, step_done, info = jax.vmap(env.step)(
            states, actions, action_lengths)
        states = jax.tree_util.tree_map(
            lambda new, old: jnp.where(active.reshape((-1,) + (1,) * (new.ndim - 1)), new, old),
            new_states, states)
        done = done | step_done
        tokens, lengths = write_observation(tokens, lengths, vocab.turn_prefix, obs, obs_len,
                                            vocab.obs_suffix, active & ~done)
        out = (jnp.where(active, reward, 0.0), active, active & info["success"],
               active & info["format_ok"])
        return (tokens, lengths, action_mask, behaviour, extras, states, done,
                policy_state), out

    # The extras' names and dtypes come from one abstract call of the policy (no compute).
    spec = jax.eval_shape(step_policy, k_policy, tokens, lengths, states,
                          jnp.zeros((), jnp.int32), policy_state)[3]
    extras = {name: jnp.zeros((batch, width), value.dtype) for name, value in spec.items()}
    init = (tokens, lengths, action_mask, behaviour, extras, states, jnp.zeros(batch, bool),
            policy_state)
    xs = (jax.random.split(k_policy, env.max_turns), jnp.arange(env.max_turns, dtype=jnp.int32))
    (tokens, lengths, action_mask, behaviour, extras, _, _, policy_state), \
        (rewards, active, success, fmt) = jax.lax.scan(turn, init, xs)
    return Episodes(tokens=tokens, mask=jnp.arange(width)[None] < lengths[:, None],
                    action_mask=action_mask, behaviour_log_probs=behaviour, rewards=rewards.T,
                    turn_mask=active.T, success=success.any(axis=0), format_ok=fmt.T,
                    token_extras=extras), policy_state
