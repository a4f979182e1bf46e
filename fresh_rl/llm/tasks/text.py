"""Jittable text helpers over the character tokenizer: building and parsing token arrays.

Token arrays are right-padded with PAD (0) and carry an explicit length. Tasks generate and
parse text in these char ids; what they show the model goes through their
:class:`fresh_rl.llm.tasks.vocab.TaskVocab` (``segment`` for fixed text, ``symbols`` for char
ids, ``to_chars`` for the model's actions).
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from fresh_rl.llm.tokenizer import CHAR_TOKENIZER

PAD, BOS, EOS = CHAR_TOKENIZER.pad_id, CHAR_TOKENIZER.bos_id, CHAR_TOKENIZER.eos_id
DIGIT_0 = CHAR_TOKENIZER.token_of("0")


def tok(char: str) -> int:
    return CHAR_TOKENIZER.token_of(char)


def const(text: str) -> np.ndarray:
    """Host-side constant token array for a fixed string."""
    return np.asarray(CHAR_TOKENIZER.encode(text), np.int32)


def append(buffer, length, segment, segment_length=None):
    """Writes `segment[:segment_length]` at `buffer[length:]`; returns (buffer, new length).

    Tokens that would fall past the end of `buffer` are dropped (callers size buffers so that
    this never happens; the returned length still counts them so a test can detect it).
    """
    segment = jnp.asarray(segment, jnp.int32)
    m = segment.shape[0]
    segment_length = m if segment_length is None else segment_length
    idx = jnp.where(jnp.arange(m) < segment_length, length + jnp.arange(m), buffer.shape[0])
    return buffer.at[idx].set(segment, mode="drop"), length + segment_length


def int_tokens(value, max_digits: int):
    """Decimal digits of a non-negative integer: (tokens [max_digits], length >= 1)."""
    if not 1 <= max_digits <= 9:
        raise ValueError(f"max_digits must be in [1, 9] (int32 arithmetic), got {max_digits}")
    powers = 10 ** np.arange(max_digits - 1, -1, -1, dtype=np.int32)
    value = jnp.asarray(value, jnp.int32)
    digits = (value // powers) % 10
    num_digits = jnp.maximum(1, max_digits - jnp.argmax(jnp.concatenate(
        [digits[:-1] != 0, jnp.array([True])])))
    shift = max_digits - num_digits
    shifted = jnp.roll(digits, -shift)
    return (DIGIT_0 + shifted).astype(jnp.int32), num_digits


def strip_eos(tokens, length):
    """(length without a final EOS, whether the text ended with EOS)."""
    ends_with_eos = (length > 0) & (tokens[jnp.maximum(length - 1, 0)] == EOS)
    return jnp.where(ends_with_eos, length - 1, length), ends_with_eos


def parse_int(tokens, start, end, max_digits: int):
    """Parses tokens[start:end] as `-?[0-9]+` (at most max_digits digits): (value, ok)."""
    idx = jnp.arange(tokens.shape[0])
    negative = (end > start) & (tokens[jnp.clip(start, 0, tokens.shape[0] - 1)] == tok("-"))
    first = start + negative.astype(jnp.int32)
    in_span = (idx >= first) & (idx < end)
    digit = tokens - DIGIT_0
    is_digit = (digit >= 0) & (digit <= 9)
    num_digits = end - first
    ok = (num_digits >= 1) & (num_digits <= max_digits) & jnp.all(is_digit | ~in_span)
    place = jnp.where(in_span, end - 1 - idx, 0)
    value = jnp.sum(jnp.where(in_span, jnp.clip(digit, 0, 9) * (10 ** jnp.minimum(place, 9)), 0))
    return jnp.where(negative, -value, value), ok


def starts_with(tokens, length, prefix: np.ndarray):
    """Whether tokens[:length] starts with the constant `prefix`."""
    n = len(prefix)
    return (length >= n) & jnp.all(tokens[:n] == prefix)


def span_equals(tokens, start, end, target, target_length):
    """Whether tokens[start:end] equals target[:target_length]."""
    idx = jnp.arange(target.shape[0])
    shifted = jnp.take(tokens, jnp.clip(start + idx, 0, tokens.shape[0] - 1))
    same = jnp.where(idx < target_length, shifted == target, True)
    return (end - start == target_length) & jnp.all(same)


GRID_PROMPT = "move:"


def grid_observation_len(rules: str, size: int) -> int:
    """Characters (a bound on the tokens) of a grid observation: the rules, ``size`` rows of
    ``size`` cells plus a newline, and the ``move:`` prompt."""
    return len(rules) + size * (size + 1) + len(GRID_PROMPT)


def grid_transcript_len(rules: str, obs_len: int, action_len: int, max_turns: int,
                        frame_len: int = 0) -> int:
    """BOS + the rules once + ``max_turns`` × (action + grid observation without the rules
    + ``frame_len`` chat-framing tokens)."""
    return 1 + len(rules) + max_turns * (action_len + obs_len - len(rules) + frame_len)


def grid_observation(grid, rules: str, with_rules, obs_len: int, vocab):
    """``[obs_len]`` model tokens and length: the rules (only when ``with_rules``), the
    ``[s, s]`` grid of cell char ids row by row, each row ended by a newline, then the
    ``move:`` prompt."""
    rows = jnp.concatenate([grid, jnp.full((grid.shape[0], 1), tok("\n"))], axis=1).reshape(-1)
    rules_ids = vocab.segment(rules)
    obs, n = append(jnp.zeros(obs_len, jnp.int32), 0, rules_ids,
                    jnp.where(with_rules, len(rules_ids), 0))
    obs, n = append(obs, n, vocab.symbols(rows))
    return append(obs, n, vocab.segment(GRID_PROMPT))
