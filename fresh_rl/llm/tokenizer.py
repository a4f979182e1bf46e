"""Tokenizers: a built-in character tokenizer for our tasks and `tokenizers`' tokenizer.json.

Both implement `Tokenizer`: `encode(text) -> list[int]`, `decode(ids) -> str`, `vocab_size`,
`pad_id`, `bos_id`, `eos_id`. Task environments build their token arrays inside `jit` from the
character table (`CharTokenizer.token_of`), so the char tokenizer is the one the tasks speak.
"""
from __future__ import annotations

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
                 bos_token: str | None = None):
        from tokenizers import Tokenizer as _HFTokenizer  # runtime dependency for real models

        self._tok = _HFTokenizer.from_file(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        self.eos_id = self._id(eos_token, "eos_token")
        self.pad_id = self._id(pad_token, "pad_token") if pad_token else self.eos_id
        self.bos_id = self._id(bos_token, "bos_token") if bos_token else self.eos_id

    def _id(self, token: str, field: str) -> int:
        i = self._tok.token_to_id(token)
        if i is None:
            raise ValueError(f"HFTokenizer {field}={token!r} is not in the tokenizer vocabulary")
        return i

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=True)
