"""Countdown ("make the target", as in TinyZero's RL task): single turn, generated in jit.

Example (num_count=3, max_number=9):
  "Numbers: 3 7 2 Target: 23 Use + - *.\n"
  expert: "7*3=21\n21+2=23\n#### 23"<eos>
An answer is zero or more step lines ``A<op>B=C`` (``<op>`` one of ``+ - *``; A, B, C unsigned
decimals, no spaces) each ended by a newline, then a final line ``#### V``, then a stop token.
It succeeds (reward 1) iff there is at least one step and at most ``num_count - 1`` (more can
never be valid), every step is correct (C = A op B) with A and B available (a source number or
an earlier step's result, each consumed at most once; two equal operands need two such items),
every number has at most ``value_digits`` digits (so results lie in [0, 10**value_digits);
negative results cannot be written), and V equals both the last step's result and the target.
Not every number has to be used. A well-formed answer that breaks a rule gets 0; one that does
not follow the grammar, or has no final stop token (truncated), gets -format_penalty.

Generator (reset): ``num_count`` numbers uniform in 1..max_number, then a random solution
using all of them: each step pairs two random items of the pool (the result replaces them)
with a random op; subtraction is written larger-first, and an op whose result is not in
[1, 10**value_digits) is replaced by the first of ``+``, ``-`` whose result is (``-`` of equal
operands, result 0, when none is). The target is the last result, so it is reachable and the
generator's solution is the expert demonstration.

Knobs (our choices): ``num_count`` in [2, 5] (default 3), ``max_number`` in [2, 99] (default
9), ``value_digits`` (digit width of every number, default 3) in [digits of max_number, 4]
(4 keeps products of two numbers in int32), ``format_penalty`` (default 0.15, as arithmetic).
``action_len`` fits every valid answer without leading zeros: ``num_count - 1`` step lines whose
numbers have at most as many digits as the largest reachable value (max_number ** num_count,
capped by value_digits).
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.llm.tasks import text
from fresh_rl.llm.tasks.vocab import CHAR_VOCAB, SpeaksVocab, TaskVocab
from fresh_rl.validation import require_in_range

OP_SYMBOL = "+-*"
_SYMBOL_T = jnp.asarray(text.const(OP_SYMBOL))
ANSWER_SYMBOLS = "0123456789=\n# "  # what answers are written in (with OP_SYMBOL)
PROMPT_HEAD, PROMPT_TARGET, PROMPT_TAIL = "Numbers:", " Target: ", " Use + - *.\n"
FINAL = "#### "


@flax.struct.dataclass
class CountdownState:
    numbers: jax.Array  # [num_count] source numbers
    target: jax.Array
    expert: jax.Array
    expert_length: jax.Array


def _concat(parts, size: int):
    """``[size]`` buffer of the ``(tokens, length)`` parts written one after another (one
    scatter; like repeated ``text.append``, tokens past ``size`` are dropped but counted)."""
    lengths = jnp.stack([jnp.asarray(length, jnp.int32) for _, length in parts])
    offsets = jnp.cumsum(lengths) - lengths
    tokens = jnp.concatenate([jnp.asarray(t, jnp.int32) for t, _ in parts])
    positions = jnp.concatenate([
        jnp.where(jnp.arange(len(t)) < lengths[i], offsets[i] + jnp.arange(len(t)), size)
        for i, (t, _) in enumerate(parts)])
    return jnp.zeros(size, jnp.int32).at[positions].set(tokens, mode="drop"), lengths.sum()


def _apply(op, a, b):
    return jnp.stack([a + b, a - b, a * b])[op]


@flax.struct.dataclass
class CountdownTask(SpeaksVocab):
    num_count: int = flax.struct.field(pytree_node=False, default=3)
    max_number: int = flax.struct.field(pytree_node=False, default=9)
    value_digits: int = flax.struct.field(pytree_node=False, default=3)
    format_penalty: float = flax.struct.field(pytree_node=False, default=0.15)
    vocab: TaskVocab = flax.struct.field(pytree_node=False, default=CHAR_VOCAB, repr=False)

    max_turns = 1

    def __post_init__(self):
        self.vocab.require_symbols("CountdownTask", ANSWER_SYMBOLS + OP_SYMBOL)
        require_in_range("CountdownTask.num_count", self.num_count, 2, 5)
        require_in_range("CountdownTask.max_number", self.max_number, 2, 99)
        require_in_range("CountdownTask.value_digits", self.value_digits,
                         len(str(self.max_number)), 4)
        require_in_range("CountdownTask.format_penalty", self.format_penalty, 0.0, 10.0)

    @property
    def number_digits(self) -> int:
        return len(str(self.max_number))

    @property
    def result_digits(self) -> int:
        """Digits of the largest value any answer can reach (and write)."""
        largest = max(self.max_number ** self.num_count, self.num_count * self.max_number)
        return min(self.value_digits, len(str(largest)))

    @property
    def obs_len(self) -> int:
        return (len(PROMPT_HEAD) + self.num_count * (1 + self.number_digits) + len(PROMPT_TARGET)
                + self.result_digits + len(PROMPT_TAIL))

    @property
    def action_len(self) -> int:
        d = self.result_digits
        return (self.num_count - 1) * (3 * d + 3) + len(FINAL) + d + 1

    @property
    def transcript_len(self) -> int:
        return 1 + self.obs_len + self.action_len + self.vocab.frame_len

    def reset(self, key):
        n, cap = self.num_count, 10 ** self.value_digits
        u = jax.random.uniform(key, (n, n + 1))  # one draw: numbers, pairings, ops

        def uniform_int(x, high):  # uniform in [0, high)
            return jnp.minimum(jnp.floor(x * high).astype(jnp.int32), high - 1)

        numbers = 1 + uniform_int(u[0, :n], self.max_number)
        priorities, ops = u[1:, :n], uniform_int(u[1:, n], 3)
        d, vocab = self.result_digits, self.vocab
        work = []  # (char ids, length) parts of the expert's answer
        pool, alive, result = numbers, jnp.ones(n, bool), numbers[0]
        for k in range(n - 1):
            i, j = jnp.argsort(jnp.where(alive, priorities[k], 2.0))[:2]
            a, b = jnp.maximum(pool[i], pool[j]), jnp.minimum(pool[i], pool[j])
            candidates = jnp.stack([ops[k], 0, 1])
            values = jax.vmap(_apply, (0, None, None))(candidates, a, b)
            fits = (values >= 1) & (values < cap)
            op = jnp.where(fits.any(), candidates[jnp.argmax(fits)], 1)
            result = _apply(op, a, b)
            pool, alive = pool.at[i].set(result), alive.at[j].set(False)
            work += [text.int_tokens(a, d), (_SYMBOL_T[op][None], 1), text.int_tokens(b, d),
                     (text.const("="), 1), text.int_tokens(result, d), (text.const("\n"), 1)]
        work += [(text.const(FINAL), len(FINAL)), text.int_tokens(result, d),
                 (np.asarray([text.EOS], np.int32), 1)]
        work, w = _concat(work, self.action_len)

        def number(value, digits):
            tokens, length = text.int_tokens(value, digits)
            return vocab.symbols(tokens), length

        def segment(fixed):
            ids = vocab.segment(fixed)
            return ids, len(ids)

        obs = [segment(PROMPT_HEAD)]
        for k in range(n):
            obs += [segment(" "), number(numbers[k], self.number_digits)]
        obs += [segment(PROMPT_TARGET), number(result, d), segment(PROMPT_TAIL)]
        obs, m = _concat(obs, self.obs_len)
        return obs, m, CountdownState(numbers=numbers, target=result,
                                      expert=vocab.symbols(work), expert_length=w)

    def score(self, state, chars, length):
        """(reward, success, format_ok) of an answer in char ids (module docstring)."""
        length, has_eos = text.strip_eos(chars, length)
        size = chars.shape[0]
        idx = jnp.arange(size)
        valid = idx < length
        digit = (chars >= text.DIGIT_0) & (chars <= text.DIGIT_0 + 9) & valid
        is_op = jnp.any(chars[:, None] == _SYMBOL_T, axis=1) & valid
        is_eq, is_nl = (chars == text.tok("=")) & valid, (chars == text.tok("\n")) & valid
        # Step lines: the op / '=' / newline characters come as (op, '=', newline)* and the
        # op and '=' have digits on both sides; everything else there is a digit.
        special = is_op | is_eq | is_nl
        rank = jnp.cumsum(special) - 1
        kind = jnp.where(is_op, 0, jnp.where(is_eq, 1, 2))
        neighbours = jnp.pad(digit, 1)[:-2] & jnp.pad(digit, 1)[2:]  # digits left and right
        last = jnp.max(jnp.where(is_nl, idx, -1)) + 1  # first char of the final line
        steps_region = idx < last
        lines_ok = jnp.all(~steps_region | (digit | special)) & jnp.all(
            ~special | (kind == rank % 3)) & jnp.all(~(is_op | is_eq) | neighbours)
        # Final line: "#### " then digits.
        rel = idx - last
        final_chars = jnp.asarray(text.const(FINAL))[jnp.clip(rel, 0, len(FINAL) - 1)]
        final_ok = (length - last > len(FINAL)) & jnp.all(
            ~(valid & (rel >= 0)) | jnp.where(rel < len(FINAL), chars == final_chars, digit))
        format_ok = has_eos & lines_ok & final_ok

        def nth(mask, j):
            return jnp.min(jnp.where(mask & (rank == j), idx, size))

        n, vd = self.num_count, self.value_digits
        num_steps = jnp.sum(is_nl)
        values = jnp.concatenate([state.numbers, jnp.zeros(n - 1, jnp.int32)])
        available = jnp.arange(2 * n - 1) < n
        ok, result, start = (num_steps >= 1) & (num_steps <= n - 1), jnp.int32(-1), 0

        def take(available, values, value, active):
            """Consumes the first available item equal to ``value`` (when ``active``)."""
            match = available & (values == value)
            first = jnp.arange(values.shape[0]) == jnp.argmax(match)
            return available & ~(first & match & active), match.any()

        for k in range(n - 1):
            op_at, eq_at, nl_at = nth(is_op, 3 * k), nth(is_eq, 3 * k + 1), nth(is_nl, 3 * k + 2)
            a, a_ok = text.parse_int(chars, start, op_at, vd)
            b, b_ok = text.parse_int(chars, op_at + 1, eq_at, vd)
            c, c_ok = text.parse_int(chars, eq_at + 1, nl_at, vd)
            op = jnp.argmax(_SYMBOL_T == jnp.take(chars, jnp.clip(op_at, 0, size - 1)))
            active = k < num_steps
            available, a_found = take(available, values, a, active)
            available, b_found = take(available, values, b, active)
            step_ok = a_ok & b_ok & c_ok & a_found & b_found & (_apply(op, a, b) == c)
            ok &= ~active | step_ok
            values = values.at[n + k].set(c)
            available = available.at[n + k].set(active)
            result = jnp.where(active, c, result)
            start = nl_at + 1
        final, final_value_ok = text.parse_int(chars, last + len(FINAL), length, vd)
        success = format_ok & ok & final_value_ok & (final == result) & (final == state.target)
        reward = jnp.where(format_ok, success.astype(jnp.float32), -self.format_penalty)
        return reward, success, format_ok

    def step(self, state, action, action_length):
        reward, success, ok = self.score(state, *self.vocab.to_chars(action, action_length))
        empty = jnp.zeros(self.obs_len, jnp.int32)
        return empty, jnp.int32(0), state, reward, jnp.bool_(True), {
            "success": success, "format_ok": ok}

    def expert_action(self, state):
        return state.expert, state.expert_length
