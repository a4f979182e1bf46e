"""GSM8K-style arithmetic word problems (single turn), procedurally generated in jit.

Example (digits=2, steps=2):
  "Eva has 47 coins. They give away 12. Then they have 3 times as many. How many coins now?\n"
  expert: "47-12=35 35*3=105 #### 105"<eos>
The answer is the integer after the LAST '#' (spaces skipped), GSM8K's "#### <answer>" form.
Reward: 1 if it equals the ground truth, 0 if it is a different integer, -format_penalty if
the response has no '#', no parseable integer after it, or no final EOS.
Knobs: `digits` (operand size) and `steps` (number of operations; each is +, - or x2/x3).
"""
from __future__ import annotations


import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.llm.tasks import text
from fresh_rl.llm.tasks.vocab import CHAR_VOCAB, SpeaksVocab, TaskVocab
from fresh_rl.validation import require_in_range

NAMES = ("Tom", "Ann", "Bob", "Eva", "Sam", "Liz")
ITEMS = ("apples", "pens", "cups", "eggs", "books", "coins")
# Operation i: "<prefix><n><suffix>" in the question and "<cur><symbol><n>=<new> " in the work.
OP_PREFIX = (" They get ", " They give away ", " Then they have ")
OP_SUFFIX = (" more.", ".", " times as many.")
OP_SYMBOL = "+-*"
_SYMBOL_T = jnp.asarray(text.const(OP_SYMBOL))
ANSWER_SYMBOLS = "0123456789-=# "  # what answers are written in (with OP_SYMBOL)


@flax.struct.dataclass
class ArithmeticState:
    answer: jax.Array
    expert: jax.Array
    expert_length: jax.Array


def parse_final_answer(tokens, length, max_digits: int):
    """GSM8K answer parse: integer after the last '#', spaces skipped. Returns (value, ok)."""
    length, has_eos = text.strip_eos(tokens, length)
    idx = jnp.arange(tokens.shape[0])
    is_hash = (tokens == text.tok("#")) & (idx < length)
    last_hash = jnp.max(jnp.where(is_hash, idx, -1))
    non_space = (idx > last_hash) & (idx < length) & (tokens != text.tok(" "))
    start = jnp.min(jnp.where(non_space, idx, length))
    value, ok = text.parse_int(tokens, start, length, max_digits)
    return value, ok & has_eos & (last_hash >= 0)


def score_answer(tokens, length, answer, max_digits: int, format_penalty: float, vocab):
    """(reward, success, format_ok) for a final-answer response of model ``tokens`` in
    ``vocab`` (shared with GSM8K)."""
    value, ok = parse_final_answer(*vocab.to_chars(tokens, length), max_digits)
    success = ok & (value == answer)
    reward = jnp.where(ok, success.astype(jnp.float32), -format_penalty)
    return reward, success, ok


@flax.struct.dataclass
class ArithmeticTask(SpeaksVocab):
    digits: int = flax.struct.field(pytree_node=False, default=2)
    steps: int = flax.struct.field(pytree_node=False, default=2)
    format_penalty: float = flax.struct.field(pytree_node=False, default=0.15)
    vocab: TaskVocab = flax.struct.field(pytree_node=False, default=CHAR_VOCAB, repr=False)

    max_turns = 1

    @property
    def transcript_len(self) -> int:
        return 1 + self.obs_len + self.action_len + self.vocab.frame_len

    def __post_init__(self):
        self.vocab.require_symbols("ArithmeticTask", ANSWER_SYMBOLS + OP_SYMBOL)
        require_in_range("ArithmeticTask.digits", self.digits, 1, 4)
        require_in_range("ArithmeticTask.steps", self.steps, 1, 4)
        require_in_range("ArithmeticTask.format_penalty", self.format_penalty, 0.0, 10.0)

    @property
    def answer_digits(self) -> int:
        return len(str((10 ** self.digits - 1) * 3 ** self.steps))

    @property
    def obs_len(self) -> int:
        n = self.answer_digits
        longest_op = max(len(p) + len(s) for p, s in zip(OP_PREFIX, OP_SUFFIX)) + n
        return (max(map(len, NAMES)) + len(" has ") + self.digits + 1 + max(map(len, ITEMS))
                + 1 + self.steps * longest_op + len(" How many ") + max(map(len, ITEMS))
                + len(" now?\n"))

    @property
    def action_len(self) -> int:
        return self.steps * (3 * self.answer_digits + 3) + len("#### ") + self.answer_digits + 1

    def reset(self, key):
        k_name, k_item, k_start, k_ops, k_amounts = jax.random.split(key, 5)
        low, high = (10 ** (self.digits - 1) if self.digits > 1 else 1), 10 ** self.digits
        name = jax.random.randint(k_name, (), 0, len(NAMES))
        item = jax.random.randint(k_item, (), 0, len(ITEMS))
        start = jax.random.randint(k_start, (), low, high)
        ops = jax.random.randint(k_ops, (self.steps,), 0, 3)
        u = jax.random.uniform(k_amounts, (self.steps,))

        def apply_op(current, op_u):
            op, u = op_u
            amount = jnp.stack([low + jnp.floor(u * (high - low)).astype(jnp.int32),
                                jnp.floor(u * (jnp.minimum(current, high - 1) + 1)).astype(
                                    jnp.int32),
                                2 + (u > 0.5).astype(jnp.int32)])[op]
            new = jnp.stack([current + amount, current - amount, current * amount])[op]
            return new, (amount, new)

        answer, (amounts, values) = jax.lax.scan(apply_op, start, (ops, u))
        digits, vocab = self.answer_digits, self.vocab
        names, name_lengths = vocab.segment_table(NAMES)
        items, item_lengths = vocab.segment_table(ITEMS)
        prefixes, prefix_lengths = vocab.segment_table(OP_PREFIX)
        suffixes, suffix_lengths = vocab.segment_table(OP_SUFFIX)

        def number(value):
            tokens, length = text.int_tokens(value, digits)
            return vocab.symbols(tokens), length

        obs, n = jnp.zeros(self.obs_len, jnp.int32), 0
        obs, n = text.append(obs, n, names[name], name_lengths[name])
        obs, n = text.append(obs, n, vocab.segment(" has "))
        obs, n = text.append(obs, n, *number(start))
        obs, n = text.append(obs, n, vocab.segment(" "))
        obs, n = text.append(obs, n, items[item], item_lengths[item])
        obs, n = text.append(obs, n, vocab.segment("."))
        work, w = jnp.zeros(self.action_len, jnp.int32), 0
        current = start
        for i in range(self.steps):
            op = ops[i]
            obs, n = text.append(obs, n, prefixes[op], prefix_lengths[op])
            obs, n = text.append(obs, n, *number(amounts[i]))
            obs, n = text.append(obs, n, suffixes[op], suffix_lengths[op])
            work, w = text.append(work, w, *text.int_tokens(current, digits))
            work, w = text.append(work, w, _SYMBOL_T[op][None])
            work, w = text.append(work, w, *text.int_tokens(amounts[i], digits))
            work, w = text.append(work, w, text.const("="))
            work, w = text.append(work, w, *text.int_tokens(values[i], digits))
            work, w = text.append(work, w, text.const(" "))
            current = values[i]
        obs, n = text.append(obs, n, vocab.segment(" How many "))
        obs, n = text.append(obs, n, items[item], item_lengths[item])
        obs, n = text.append(obs, n, vocab.segment(" now?\n"))
        work, w = text.append(work, w, text.const("#### "))
        work, w = text.append(work, w, *text.int_tokens(answer, digits))
        work, w = text.append(work, w, np.asarray([text.EOS], np.int32))
        return obs, n, ArithmeticState(answer=answer, expert=vocab.symbols(work), expert_length=w)

    def step(self, state, action, action_length):
        reward, success, ok = score_answer(action, action_length, state.answer,
                                           self.answer_digits + 1, self.format_penalty,
                                           self.vocab)
        empty = jnp.zeros(self.obs_len, jnp.int32)
        return empty, jnp.int32(0), state, reward, jnp.bool_(True), {
            "success": success, "format_ok": ok}

    def expert_action(self, state):
        return state.expert, state.expert_length
