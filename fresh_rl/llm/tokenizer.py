"""Tokenizers: a built-in character tokenizer for our tasks and `tokenizers`' tokenizer.json.

Both implement `Tokenizer`: `encode(text) -> list[int]`, `decode(ids) -> str`, `vocab_size`,
`pad_id`, `bos_id`, `eos_id`. Tasks speak either through a
:class:`fresh_rl.llm.tasks.vocab.TaskVocab` built from one of them; internally they parse
text in the char tokenizer's ids. :meth:`HFTokenizer.from_pretrained` reads a Hugging Face
model folder (tokenizer.json, tokenizer_config.json's special tokens and chat template).
"""
from __future__ import annotations

import json
import os
import string
from typing import Protocol, Sequence


class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


# Specials first, then the 95 printable ASCII characters and newline: 99 ids, padded to 128
# (the tiny preset's vocab_size) so the embedding table has a friendly size.
_SPECIALS = ("<pad>", "<bos>", "<eos>")
_CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
assert set(string.digits) <= set(_CHARS)


class CharTokenizer:
    """One token per character of printable ASCII (+ newline); ids 0/1/2 are pad/bos/eos."""

    vocab_size = 128
    pad_id, bos_id, eos_id = 0, 1, 2
    alphabet = _CHARS  # the characters, in id order from 3

    def __init__(self):
        self._ids = {c: i + len(_SPECIALS) for i, c in enumerate(_CHARS)}
        self._chars = {i: c for c, i in self._ids.items()}

    def token_of(self, char: str) -> int:
        """Id of a single character (raises ValueError naming it when not in the vocabulary)."""
        if char not in self._ids:
            raise ValueError(f"character {char!r} is not in the CharTokenizer vocabulary "
                             "(printable ASCII and newline)")
        return self._ids[char]

    def encode(self, text: str) -> list[int]:
        return [self.token_of(c) for c in text]

    def decode(self, ids: Sequence[int], strict: bool = True) -> str:
        """Decodes ids; pad/bos are dropped, eos ends the text. Unknown ids raise ValueError
        (strict) or become '\ufffd' (for printing what an untrained model sampled)."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            if i not in self._chars and not strict:
                out.append("\ufffd")
            elif i not in self._chars:
                raise ValueError(f"token id {i} is not a CharTokenizer token "
                                 f"(valid ids: 0..{len(_SPECIALS) + len(_CHARS) - 1})")
            else:
                out.append(self._chars[i])
        return "".join(out)


CHAR_TOKENIZER = CharTokenizer()


class HFTokenizer:
    """Wraps a Hugging Face `tokenizer.json` (e.g. Qwen2.5's) via the `tokenizers` library."""

    def __init__(self, path: str, eos_token: str = "<|endoftext|>", pad_token: str | None = None,
                 bos_token: str | None = None, chat_template: str | None = None):
        from tokenizers import Tokenizer as _HFTokenizer  # runtime dependency for real models

        self.path = path
        try:
            self._tok = _HFTokenizer.from_file(path)
        except Exception as err:  # tokenizers raises a bare Exception on a malformed file
            raise ValueError(f"{path}: cannot read the tokenizer: {' '.join(str(err).split())}") from err
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._id(eos_token, "eos_token")
        self.pad_id = self._id(pad_token, "pad_token") if pad_token else self.eos_id
        self.bos_id = self._id(bos_token, "bos_token") if bos_token else self.eos_id
        self.chat_template = chat_template
        self.special_ids = frozenset(i for i, t in self._tok.get_added_tokens_decoder().items()
                                     if t.special)

    @classmethod
    def from_pretrained(cls, folder: str) -> "HFTokenizer":
        """The tokenizer of a Hugging Face model folder: tokenizer.json plus the eos / pad /
        bos tokens and chat template of tokenizer_config.json (the template may instead be
        in chat_template.jinja). ValueError naming the file if one is missing or malformed."""
        config_path = os.path.join(folder, "tokenizer_config.json")
        try:
            with open(config_path) as f:
                config = json.load(f)
        except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError
            raise ValueError(f"{config_path}: cannot read the tokenizer config: {err}") from err
        if not isinstance(config, dict):
            raise ValueError(f"{config_path}: must hold a JSON object, got {type(config).__name__}")

        def token(name):  # a plain string or, in older files, {"content": ...}
            value = config.get(name)
            return value.get("content") if isinstance(value, dict) else value

        template = config.get("chat_template")
        template_path = os.path.join(folder, "chat_template.jinja")
        if template is None and os.path.exists(template_path):
            with open(template_path) as f:
                template = f.read()
        if template is not None and not isinstance(template, str):
            raise ValueError(f"{config_path}: chat_template must be one template string "
                             f"(named templates are not supported), got {type(template).__name__}")
        if token("eos_token") is None:
            raise ValueError(f"{config_path} names no eos_token")
        return cls(os.path.join(folder, "tokenizer.json"), eos_token=token("eos_token"),
                   pad_token=token("pad_token"), bos_token=token("bos_token"),
                   chat_template=template)

    def token_id(self, token: str) -> int | None:
        """Id of a token of the vocabulary (special tokens included), None if absent."""
        return self._tok.token_to_id(token)

    def token_texts(self) -> list[str]:
        """The text of every id in [0, vocab_size) decoded alone (special tokens included;
        partial UTF-8 sequences of byte-level tokens decode to '\ufffd')."""
        return self._tok.decode_batch([[i] for i in range(self.vocab_size)],
                                      skip_special_tokens=False)

    def _id(self, token: str, field: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise ValueError(f"HFTokenizer {field}={token!r} is not in the tokenizer vocabulary")
        return i

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
