"""Tokenizers: built-in char tokenizer and tokenizer.json through `tokenizers`."""
import json
import os

import pytest
from hypothesis import given, strategies as st

from fresh_rl.llm.tokenizer import CHAR_TOKENIZER, HFTokenizer

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "qwen2_tiny")
PRINTABLE = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126) | st.just("\n"))


@given(PRINTABLE)
def test_char_roundtrip(text):
    ids = CHAR_TOKENIZER.encode(text)
    assert len(ids) == len(text)
    assert all(3 <= i < CHAR_TOKENIZER.vocab_size for i in ids)
    assert CHAR_TOKENIZER.decode(ids) == text


def test_char_specials_and_errors():
    ids = CHAR_TOKENIZER.encode("ab")
    assert CHAR_TOKENIZER.decode([CHAR_TOKENIZER.bos_id] + ids + [CHAR_TOKENIZER.eos_id] + ids) \
        == "ab"
    with pytest.raises(ValueError, match="'é' is not in the CharTokenizer vocabulary"):
        CHAR_TOKENIZER.encode("café")
    with pytest.raises(ValueError, match="token id 120 is not a CharTokenizer token"):
        CHAR_TOKENIZER.decode([120])


def test_hf_tokenizer_json():
    tok = HFTokenizer(os.path.join(FIXTURE, "tokenizer.json"))
    with open(os.path.join(FIXTURE, "tokenizer_expected.json")) as f:
        expected = json.load(f)
    for case in expected:
        assert tok.encode(case["text"]) == case["ids"]
        assert tok.decode(case["ids"]) == case["text"]
    assert tok.eos_id == 1 and tok.vocab_size <= 300
    with pytest.raises(ValueError, match="pad_token='<nope>'"):
        HFTokenizer(os.path.join(FIXTURE, "tokenizer.json"), pad_token="<nope>")


def test_hf_tokenizer_from_pretrained_names_the_bad_file(tmp_path):
    with pytest.raises(ValueError, match="tokenizer_config.json: cannot read"):
        HFTokenizer.from_pretrained(str(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "x"}],
                                                                 "eos_token": "<|endoftext|>"}))
    with pytest.raises(ValueError, match="chat_template must be one template string"):
        HFTokenizer.from_pretrained(str(tmp_path))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": None}))
    with pytest.raises(ValueError, match="names no eos_token"):
        HFTokenizer.from_pretrained(str(tmp_path))
