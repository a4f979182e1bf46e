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
tags of the asynchronous pipeline, :mod:`fresh_rl.llm.async_pipeline`). `model_policy`
samples from the LM (bf16, KV cache), `expert_policy` replays the task's demonstration
(supervised warm start); both return no extras.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from fresh_rl.llm.model import Qwen2Config
from fresh_rl.llm.sampler import SamplingConfig, generate
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


@dataclasses.dataclass(frozen=True, eq=False)
class ModelPolicy:
    """LM policy: samples the next action from the transcript. `run_episodes` checks that
    the model and the sampler's stop tokens match the task's vocabulary."""

    params: Any
    model_config: Qwen2Config
    sampling: SamplingConfig

    def check(self, env) -> None:
        """ValueError unless the model speaks `env.vocab` and stops on its stop tokens."""
        check_model_vocab(env, self.model_config)
        if not set(env.stop_tokens) <= set(self.sampling.stop_tokens):
            raise ValueError(f"SamplingConfig.stop_tokens {self.sampling.stop_tokens} must "
                             f"contain the stop tokens {env.stop_tokens} of "
                             f"{type(env).__name__}'s vocabulary {env.vocab.source!r}")

    def __call__(self, key, tokens, lengths, states, turn):
        del states, turn
        prompt, prompt_mask = right_to_left_padded(tokens, lengths)
        gen = generate(self.params, self.model_config, self.sampling, prompt, prompt_mask, key)
        return gen.tokens, gen.lengths, gen.logprobs, {}


def model_policy(params, model_config: Qwen2Config, sampling: SamplingConfig) -> ModelPolicy:
    return ModelPolicy(params, model_config, sampling)


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

    def pad_action(x):
        return jnp.pad(x, ((0, 0), (0, env.action_len - x.shape[1])))

    def turn(carry, xs):
        key, turn_index = xs
        tokens, lengths, action_mask, behaviour, extras, states, done = carry
        active = ~done
        actions, action_lengths, logprobs, new_extras = policy(key, tokens, lengths, states,
                                                               turn_index)
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
        return (tokens, lengths, action_mask, behaviour, extras, states, done), out

    # The extras' names and dtypes come from one abstract call of the policy (no compute).
    spec = jax.eval_shape(policy, k_policy, tokens, lengths, states, jnp.zeros((), jnp.int32))[3]
    extras = {name: jnp.zeros((batch, width), value.dtype) for name, value in spec.items()}
    init = (tokens, lengths, action_mask, behaviour, extras, states, jnp.zeros(batch, bool))
    xs = (jax.random.split(k_policy, env.max_turns), jnp.arange(env.max_turns, dtype=jnp.int32))
    (tokens, lengths, action_mask, behaviour, extras, _, _), (rewards, active, success, fmt) = \
        jax.lax.scan(turn, init, xs)
    return Episodes(tokens=tokens, mask=jnp.arange(width)[None] < lengths[:, None],
                    action_mask=action_mask, behaviour_log_probs=behaviour, rewards=rewards.T,
                    turn_mask=active.T, success=success.any(axis=0), format_ok=fmt.T,
                    token_extras=extras)
