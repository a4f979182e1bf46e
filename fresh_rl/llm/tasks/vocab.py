"""Task vocabularies: the token tables a text task speaks, built on the host from a tokenizer.

Tasks generate and score text in the char tokenizer's ids (``fresh_rl.llm.tasks.text``) and
talk to the model through a :class:`TaskVocab`:

* fixed text (rules, question templates, item names) -> ``segment(text)``: the tokenizer's own
  encoding of the segment, cached; a prompt is a concatenation of such segments;
* variable symbols (digits, grid cells, name letters, moves; the expert's actions) ->
  ``symbols(char_ids)``: one model token per character, a table gather inside ``jit``; every
  symbol a task emits must be one token (:meth:`TaskVocab.require_symbols` raises otherwise);
* model actions -> ``to_chars(tokens, length)``: every token id replaced by its decoded
  characters (``[vocab_size, max_token_chars]`` table; stop tokens become the char EOS, text
  outside printable ASCII or longer than ``max_token_chars`` one :data:`UNKNOWN_CHAR`, which
  never parses), so answers parse the same whatever the tokenization;
* transcripts -> ``bos_id`` first, each observation wrapped in the chat template's turn
  framing (``first_prefix`` / ``turn_prefix`` before it, ``obs_suffix`` = the assistant
  header after it), actions ending with the model's end-of-turn token ``stop_tokens[0]``.

:data:`CHAR_VOCAB` (the char tokenizer: no framing, EOS = 2) reproduces the tasks' original
token ids exactly. :meth:`TaskVocab.from_pretrained` reads a Hugging Face model folder.
``vocab_size`` is the embedding size of the model the vocabulary is for (config.json's,
which may exceed the tokenizer's); :func:`check_model_vocab` rejects any other model.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Optional, Sequence

import jax.numpy as jnp
import numpy as np

from fresh_rl.llm.tokenizer import CHAR_TOKENIZER, HFTokenizer, Tokenizer
from fresh_rl.validation import require_in_range

UNKNOWN_CHAR = CHAR_TOKENIZER.vocab_size - 1  # a char id outside the char alphabet
_CHAR_EOS, _CHAR_PAD = CHAR_TOKENIZER.eos_id, CHAR_TOKENIZER.pad_id
_CHAT_SENTINELS = ("@@FRESH_RL_USER_1@@", "@@FRESH_RL_ASSISTANT@@", "@@FRESH_RL_USER_2@@")


def render_chat_template(template: str, messages: list[dict], **variables) -> str:
    """A Jinja chat template rendered as transformers renders it (sandboxed, ``trim_blocks``
    and ``lstrip_blocks``, ``raise_exception`` available), with the generation prompt."""
    import jinja2
    import jinja2.sandbox

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True,
                                                               lstrip_blocks=True)
    environment.globals["raise_exception"] = raise_exception
    return environment.from_string(template).render(messages=messages,
                                                    add_generation_prompt=True, **variables)


def chat_framing(template: str, end_text: str, **variables) -> tuple[str, str, str]:
    """(first_prefix, turn_prefix, obs_suffix) texts of a chat template: the rendering of
    [user o1, assistant a1, user o2] + generation prompt must read
    ``first_prefix o1 obs_suffix a1 end_text turn_prefix o2 obs_suffix``; a template that
    renders otherwise (e.g. an assistant header other than its generation prompt) raises."""
    u1, a1, u2 = _CHAT_SENTINELS
    one = render_chat_template(template, [{"role": "user", "content": u1}], **variables)
    two = render_chat_template(template, [{"role": "user", "content": u1},
                                          {"role": "assistant", "content": a1},
                                          {"role": "user", "content": u2}], **variables)
    if one.count(u1) != 1:
        raise ValueError("the chat template does not render the user message verbatim once")
    first_prefix, obs_suffix = one.split(u1)
    head = first_prefix + u1 + obs_suffix + a1
    between = two[len(head):].split(u2)
    if not two.startswith(head) or len(between) != 2 or between[1] != obs_suffix \
            or not between[0].startswith(end_text):
        raise ValueError(f"the chat template is not turn-by-turn (the rendering {two!r} is not "
                         f"first_prefix, o1, {obs_suffix!r}, a1, {end_text!r}, turn_prefix, o2, "
                         f"{obs_suffix!r}); unsupported")
    return first_prefix, between[0][len(end_text):], obs_suffix


def _framing_texts(tokenizer, chat_template, end_id: int) -> tuple[str, str, str]:
    """:func:`chat_framing` of a tokenizer's template ("", "", "" without one)."""
    if chat_template is None:
        return "", "", ""
    text = lambda i: tokenizer.decode([i], skip_special_tokens=False)  # noqa: E731
    return chat_framing(chat_template, text(end_id), eos_token=text(tokenizer.eos_id))


@dataclasses.dataclass(frozen=True)
class TaskVocab:
    """See the module docstring. Fields identify the vocabulary (equal fields: equal
    vocabularies, one compilation); the tokenizer and its tables are derived attributes (the
    ``tokenizer`` and ``chat_template`` init-only arguments are kept as attributes, so
    ``dataclasses.replace``, e.g. to a wider ``vocab_size``, rebuilds from the same ones).
    ``max_token_chars`` (our default 16) bounds the characters kept per token when parsing."""

    source: str  # "char" or the tokenizer's folder
    vocab_size: int
    pad_id: int
    bos_id: int
    stop_tokens: tuple[int, ...]
    max_token_chars: int = 16
    tokenizer: dataclasses.InitVar[Optional[Tokenizer]] = None  # None: the char tokenizer
    chat_template: dataclasses.InitVar[Optional[str]] = None

    def __post_init__(self, tokenizer, chat_template):
        require_in_range("TaskVocab.max_token_chars", self.max_token_chars, 1, 255)
        if not self.stop_tokens:
            raise ValueError(f"TaskVocab {self.source!r} needs at least one stop token")
        if tokenizer is None and not self.is_char:
            raise ValueError(f"TaskVocab {self.source!r} needs its tokenizer (only the 'char' "
                             f"vocabulary defaults to the char tokenizer): build it with "
                             f"TaskVocab.from_pretrained")
        tokenizer = CHAR_TOKENIZER if tokenizer is None else tokenizer
        size = tokenizer.vocab_size
        if self.vocab_size < size:
            raise ValueError(f"TaskVocab {self.source!r}: vocab_size {self.vocab_size} is smaller "
                             f"than its tokenizer's {size} ids")
        attributes = {"tokenizer": tokenizer, "chat_template": chat_template, "_segments": {}}
        first, turn, suffix = (np.asarray(tokenizer.encode(t), np.int32) for t in
                               _framing_texts(tokenizer, chat_template, self.stop_tokens[0]))
        if chat_template is not None and len(first):  # its first token opens the transcript
            if first[0] != self.bos_id:
                raise ValueError(f"TaskVocab {self.source!r}: bos_id {self.bos_id} is not the "
                                 f"first token {first[0]} of the chat template's rendering")
            first = first[1:]
        attributes.update(first_prefix=first, turn_prefix=turn, obs_suffix=suffix)
        char_ids = np.full(CHAR_TOKENIZER.vocab_size, -1, np.int32)
        for c in CHAR_TOKENIZER.alphabet:
            ids = tokenizer.encode(c)
            if len(ids) == 1 and tokenizer.decode(ids) == c:
                char_ids[CHAR_TOKENIZER.token_of(c)] = ids[0]
        char_ids[_CHAR_EOS], char_ids[_CHAR_PAD] = self.stop_tokens[0], self.pad_id
        attributes["char_ids"] = char_ids
        if not self.is_char:
            attributes["token_chars"] = self._token_char_table(tokenizer)
        for name, value in attributes.items():
            object.__setattr__(self, name, value)

    def _token_char_table(self, tokenizer):
        """([vocab_size, K] char ids of each token's text, [vocab_size] counts), uint8 (char
        ids are < 128) so that a 150k-token table is a 2.4 MB constant."""
        k = self.max_token_chars
        table = np.zeros((self.vocab_size, k), np.uint8)
        counts = np.ones(self.vocab_size, np.uint8)
        table[:, 0] = UNKNOWN_CHAR
        specials = getattr(tokenizer, "special_ids", frozenset())
        for i, text in enumerate(tokenizer.token_texts()):
            if i in self.stop_tokens:
                table[i, 0] = _CHAR_EOS
            elif i not in specials and 0 < len(text) <= k and all(
                    c == "\n" or " " <= c <= "~" for c in text):
                table[i, :len(text)] = CHAR_TOKENIZER.encode(text)
                counts[i] = len(text)
        return table, counts

    @classmethod
    def from_pretrained(cls, folder: str, max_token_chars: int = 16) -> "TaskVocab":
        """The vocabulary of a Hugging Face model folder: tokenizer.json and
        tokenizer_config.json (eos / pad tokens, chat template), the model's vocab_size from
        config.json and extra stop ids from generation_config.json's ``eos_token_id``."""
        tokenizer = HFTokenizer.from_pretrained(folder)

        def read(name):
            path = os.path.join(folder, name)
            if not os.path.exists(path):
                return {}
            with open(path) as f:
                return json.load(f)

        vocab_size = read("config.json").get("vocab_size") or tokenizer.vocab_size
        extra = read("generation_config.json").get("eos_token_id") or []
        extra = [extra] if isinstance(extra, int) else list(extra)
        stops = tuple(dict.fromkeys([tokenizer.eos_id] + extra))
        opening = _framing_texts(tokenizer, tokenizer.chat_template, stops[0])[0]
        bos = (tokenizer.encode(opening) or [tokenizer.bos_id])[0]  # the template's first token
        return cls(source=folder, vocab_size=int(vocab_size), pad_id=tokenizer.pad_id,
                   bos_id=int(bos), stop_tokens=stops, max_token_chars=max_token_chars,
                   tokenizer=tokenizer, chat_template=tokenizer.chat_template)

    @property
    def is_char(self) -> bool:
        return self.source == "char"

    @property
    def frame_len(self) -> int:
        """Framing tokens around one observation (bound over the first and later turns)."""
        return max(len(self.first_prefix), len(self.turn_prefix)) + len(self.obs_suffix)

    def segment(self, text: str) -> np.ndarray:
        """The tokenizer's ids of a fixed text (cached); raises ValueError if they do not
        decode back to it or outnumber its characters (buffers are sized in characters)."""
        if text not in self._segments:
            ids = self.tokenizer.encode(text)
            if self.tokenizer.decode(ids) != text or len(ids) > len(text):
                raise ValueError(f"task text {text!r} is not expressible in the task vocabulary "
                                 f"{self.source!r}: it encodes to ids {ids}")
            self._segments[text] = np.asarray(ids, np.int32)
        return self._segments[text]

    def segment_table(self, texts: Sequence[str]):
        """Right-padded ``[K, max_len]`` table of the segments of ``texts`` and lengths."""
        rows = [self.segment(t) for t in texts]
        table = np.zeros((len(rows), max(map(len, rows))), np.int32)
        for i, row in enumerate(rows):
            table[i, :len(row)] = row
        return jnp.asarray(table), jnp.asarray([len(r) for r in rows], jnp.int32)

    def require_symbols(self, owner: str, symbols: str) -> None:
        """ValueError naming ``owner`` (the task) and this vocabulary unless every character
        of ``symbols`` is one token."""
        for c in symbols:
            if self.char_ids[CHAR_TOKENIZER.token_of(c)] < 0:
                raise ValueError(f"{owner} cannot be expressed in the task vocabulary "
                                 f"{self.source!r}: symbol {c!r} encodes to ids "
                                 f"{self.tokenizer.encode(c)}, not one token")

    def symbols(self, char_ids):
        """Model ids of char-tokenizer ids, one token each (the char EOS becomes
        ``stop_tokens[0]``, PAD ``pad_id``); jittable."""
        if self.is_char:
            return jnp.asarray(char_ids, jnp.int32)
        return jnp.asarray(self.char_ids)[char_ids]

    def to_chars(self, tokens, length):
        """(char ids ``[A * max_token_chars]``, their count) of ``tokens[:length]``, each
        token replaced by its text (module docstring); identity for the char vocabulary."""
        if self.is_char:
            return tokens, length
        table, counts = (jnp.asarray(x) for x in self.token_chars)
        a, k = tokens.shape[0], self.max_token_chars
        counts = jnp.where(jnp.arange(a) < length, counts[tokens].astype(jnp.int32), 0)
        starts = jnp.cumsum(counts) - counts
        offset = jnp.arange(k)[None]
        idx = jnp.where(offset < counts[:, None], starts[:, None] + offset, a * k)
        chars = jnp.zeros(a * k, jnp.int32).at[idx.reshape(-1)].set(
            table[tokens].reshape(-1).astype(jnp.int32), mode="drop")
        return chars, counts.sum()

    def decode(self, ids) -> str:
        """Text of model ids, special tokens kept (for tests and logs)."""
        ids = [int(i) for i in ids]
        if self.is_char:
            return CHAR_TOKENIZER.decode(ids, strict=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)


CHAR_VOCAB = TaskVocab(source="char", vocab_size=CHAR_TOKENIZER.vocab_size,
                       pad_id=CHAR_TOKENIZER.pad_id, bos_id=CHAR_TOKENIZER.bos_id,
                       stop_tokens=(CHAR_TOKENIZER.eos_id,), max_token_chars=1)


class SpeaksVocab:
    """Mixin of the tasks: the ids the sampler and the rollout need, from ``self.vocab``.

    ``data_in_vocab``: the task holds array data already encoded in its vocabulary (e.g. the
    GSM8K problem bank), so :func:`with_vocab` cannot relabel it."""

    data_in_vocab = False

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        return self.vocab.stop_tokens

    @property
    def pad_id(self) -> int:
        return self.vocab.pad_id

    @property
    def bos_id(self) -> int:
        return self.vocab.bos_id


def with_vocab(env, vocab: TaskVocab):
    """``env`` speaking ``vocab`` (a task of the same settings). A task whose data is encoded
    in its vocabulary (``data_in_vocab``, e.g. a GSM8K bank) must be rebuilt instead
    (``Gsm8kTask.from_records(..., vocab=vocab)``)."""
    if getattr(env, "data_in_vocab", False) and env.vocab != vocab:
        raise ValueError(f"{type(env).__name__}'s problem bank is encoded in the vocabulary "
                         f"{env.vocab.source!r}: rebuild it with from_records(..., vocab=) for "
                         f"{vocab.source!r}")
    return env.replace(vocab=vocab)


def check_model_vocab(env, model_config) -> None:
    """ValueError naming both unless ``env`` speaks the vocabulary the model was built for."""
    vocab = env.vocab
    if vocab.vocab_size != model_config.vocab_size:
        raise ValueError(
            f"{type(env).__name__} speaks the task vocabulary {vocab.source!r} (vocab_size "
            f"{vocab.vocab_size}) but the model has vocab_size {model_config.vocab_size}: build "
            f"the task with the model's tokenizer (TaskVocab.from_pretrained(model folder))")


__all__ = ["CHAR_VOCAB", "SpeaksVocab", "TaskVocab", "UNKNOWN_CHAR", "chat_framing",
           "check_model_vocab", "render_chat_template", "with_vocab"]
