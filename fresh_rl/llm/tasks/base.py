"""The text-environment interface shared by all tasks.

An environment is a `flax.struct.dataclass`: static settings are `pytree_node=False` fields
(validated at construction), data banks (e.g. GSM8K problems) are array leaves, so an env can
be passed straight through `jit`/`vmap`. All methods are pure and act on ONE episode (vmap
over a batch):

  reset(key)                          -> (obs [obs_len], obs_length, state)
  step(state, action [action_len], action_length)
                                      -> (obs [obs_len], obs_length, state, reward, done, info)
  expert_action(state)                -> (action [action_len], action_length)

Observations and actions are char-tokenizer ids, right-padded with PAD. An action must end with
EOS (as the sampler emits it with EOS as stop token); an action without EOS (truncated) or that
does not parse gets `reward = -format_penalty` and `info["format_ok"] = False`.
`info` always holds `success` (bool: the task's verifiable success) and `format_ok`.
`expert_action` is the demonstration used for the supervised warm start; it is valid along the
expert's own trajectory (Sokoban replays the generator's solution).
"""
from __future__ import annotations

from typing import Any, Protocol

import jax


class TextEnv(Protocol):
    obs_len: int
    action_len: int
    max_turns: int
    transcript_len: int  # bound on BOS + all observations and actions of one episode
    format_penalty: float

    def reset(self, key: jax.Array) -> tuple[jax.Array, jax.Array, Any]: ...

    def step(self, state: Any, action: jax.Array, action_length: jax.Array): ...

    def expert_action(self, state: Any) -> tuple[jax.Array, jax.Array]: ...


