"""The text-environment interface shared by all tasks.

An environment is a `flax.struct.dataclass`: static settings are `pytree_node=False` fields
(validated at construction), data banks (e.g. GSM8K problems) are array leaves, so an env can
be passed straight through `jit`/`vmap`. All methods are pure and act on ONE episode (vmap
over a batch):

  reset(key)                          -> (obs [obs_len], obs_length, state)
  step(state, action [action_len], action_length)
                                      -> (obs [obs_len], obs_length, state, reward, done, info)
  expert_action(state)                -> (action [action_len], action_length)

Observations and actions are ids of the task's vocabulary (`env.vocab`, a
:class:`~fresh_rl.llm.tasks.vocab.TaskVocab`; the char tokenizer by default), right-padded.
`env.stop_tokens`, `env.pad_id` and `env.bos_id` are its end-of-turn ids (the sampler's stop
tokens), padding id and first transcript token; the rollout wraps each observation in the
vocabulary's chat framing (counted in `transcript_len`). An action must end with a stop
token (as the sampler emits it); an action without one (truncated) or that does not parse
gets `reward = -format_penalty` and `info["format_ok"] = False`.
`info` always holds `success` (bool: the task's verifiable success) and `format_ok`.
`expert_action` is the demonstration used for the supervised warm start; it is valid along the
expert's own trajectory (Sokoban replays the generator's solution).
"""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax

from fresh_rl.llm.tasks.vocab import TaskVocab


@runtime_checkable
class TextEnv(Protocol):
    vocab: TaskVocab
    stop_tokens: tuple[int, ...]
    pad_id: int
    bos_id: int
    obs_len: int
    action_len: int
    max_turns: int
    transcript_len: int  # bound on BOS + all (framed) observations and actions of one episode
    format_penalty: float

    def reset(self, key: jax.Array) -> tuple[jax.Array, jax.Array, Any]: ...

    def step(self, state: Any, action: jax.Array, action_length: jax.Array): ...

    def expert_action(self, state: Any) -> tuple[jax.Array, jax.Array]: ...


