"""GSM8K-format jsonl loader and a jittable task that draws problems from the loaded bank.

GSM8K lines are `{"question": str, "answer": "<rationale> #### <integer>"}`; the integer may
contain thousands separators ("1,234"). We ship no data: users point `load_gsm8k_jsonl` at
their own copy. Questions are encoded with the task vocabulary's tokenizer (with the char
vocabulary they must be printable ASCII); answers score like `ArithmeticTask` (integer after
the last '#').
"""
from __future__ import annotations

import json

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.llm.tasks import text
from fresh_rl.llm.tasks.arithmetic import ANSWER_SYMBOLS, score_answer
from fresh_rl.llm.tasks.vocab import CHAR_VOCAB, SpeaksVocab, TaskVocab
from fresh_rl.validation import require_in_range


def load_gsm8k_jsonl(path: str) -> list[tuple[str, int]]:
    """Returns [(question, integer answer)]; raises ValueError naming the bad line."""
    records = []
    with open(path) as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
                question, answer = item["question"], item["answer"]
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{line_number}: not a GSM8K record ({err})") from err
            if "####" not in answer:
                raise ValueError(f"{path}:{line_number}: answer has no '#### <integer>' part")
            final = answer.rsplit("####", 1)[1].strip().replace(",", "")
            try:
                records.append((question.strip(), int(final)))
            except ValueError as err:
                raise ValueError(f"{path}:{line_number}: final answer {final!r} is not an "
                                 "integer") from err
    return records


@flax.struct.dataclass
class Gsm8kState:
    answer: jax.Array
    index: jax.Array


@flax.struct.dataclass
class Gsm8kTask(SpeaksVocab):
    """Single-turn task over a problem bank (`questions [N, obs_len]` model tokens, lengths,
    answers)."""

    questions: jax.Array
    question_lengths: jax.Array
    answers: jax.Array
    answer_digits: int = flax.struct.field(pytree_node=False, default=9)
    format_penalty: float = flax.struct.field(pytree_node=False, default=0.15)
    vocab: TaskVocab = flax.struct.field(pytree_node=False, default=CHAR_VOCAB, repr=False)

    max_turns = 1
    data_in_vocab = True  # the bank is encoded when built (with_vocab refuses to relabel it)

    @property
    def transcript_len(self) -> int:
        return 1 + self.obs_len + self.action_len + self.vocab.frame_len

    @classmethod
    def from_records(cls, records, max_question_chars: int = 400, format_penalty: float = 0.15,
                     vocab: TaskVocab = CHAR_VOCAB):
        """Encodes (question, answer) pairs with ``vocab``; questions get a trailing newline.

        Raises ValueError on a question longer than `max_question_chars` tokens or (char
        vocabulary) with characters outside the char tokenizer.
        """
        if not records:
            raise ValueError("Gsm8kTask.from_records needs at least one record")
        questions = np.zeros((len(records), max_question_chars), np.int32)
        lengths = np.zeros(len(records), np.int32)
        for i, (question, _) in enumerate(records):
            ids = vocab.tokenizer.encode(question + "\n")
            if len(ids) > max_question_chars:
                raise ValueError(f"question {i} has {len(ids)} tokens > "
                                 f"max_question_chars={max_question_chars}")
            questions[i, :len(ids)] = ids
            lengths[i] = len(ids)
        answers = np.asarray([a for _, a in records], np.int64)
        if np.abs(answers).max() >= 10 ** 9:
            raise ValueError("Gsm8kTask answers must have at most 9 digits")
        return cls(jnp.asarray(questions), jnp.asarray(lengths),
                   jnp.asarray(answers, jnp.int32), format_penalty=format_penalty, vocab=vocab)

    def __post_init__(self):
        self.vocab.require_symbols("Gsm8kTask", ANSWER_SYMBOLS)
        require_in_range("Gsm8kTask.format_penalty", self.format_penalty, 0.0, 10.0)

    @property
    def obs_len(self) -> int:
        return self.questions.shape[-1]

    @property
    def action_len(self) -> int:
        return 256  # room for a short rationale before "#### <answer>"

    def reset(self, key):
        index = jax.random.randint(key, (), 0, self.answers.shape[0])
        return (self.questions[index], self.question_lengths[index],
                Gsm8kState(answer=self.answers[index], index=index))

    def step(self, state, action, action_length):
        reward, success, ok = score_answer(action, action_length, state.answer,
                                           self.answer_digits, self.format_penalty, self.vocab)
        empty = jnp.zeros(self.obs_len, jnp.int32)
        return empty, jnp.int32(0), state, reward, jnp.bool_(True), {
            "success": success, "format_ok": ok}

    def expert_action(self, state):
        """'#### <answer>' + EOS (the rationale is not kept in the bank)."""
        action, n = text.append(jnp.zeros(self.action_len, jnp.int32), 0, text.const("#### "))
        value = jnp.abs(state.answer)
        action, n = text.append(action, n, text.const("-"), (state.answer < 0).astype(jnp.int32))
        action, n = text.append(action, n, *text.int_tokens(value, self.answer_digits))
        action, n = text.append(action, n, np.asarray([text.EOS], np.int32))
        return self.vocab.symbols(action), n
