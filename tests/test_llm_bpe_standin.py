"""The real-format BPE stand-in checkpoint (tests/fixtures/qwen2_bpe_tiny, made by
tests/fixtures/make_bpe_standin.py with transformers): loading, tokenizer, logits."""
import json
import os

from fresh_rl.llm.checkpoint import load_hf_checkpoint
from fresh_rl.llm.tokenizer import HFTokenizer

STANDIN = os.path.join(os.path.dirname(__file__), "fixtures", "qwen2_bpe_tiny")
with open(os.path.join(STANDIN, "reference.json")) as f:
    REFERENCE = json.load(f)


def test_standin_is_a_small_standard_folder():
    names = set(os.listdir(STANDIN))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= names
    assert sum(os.path.getsize(os.path.join(STANDIN, n)) for n in names) < 1 << 20


def test_standin_loads_as_a_tied_qwen2_with_a_padded_vocabulary():
    """Its logits against transformers: tests/test_llm_model.py (both fixtures)."""
    config, params = load_hf_checkpoint(STANDIN)
    assert config.tie_word_embeddings and config.vocab_size == 704
    assert params["embed_tokens"]["embedding"].shape == (704, config.hidden_size)


def test_standin_tokenizer_matches_transformers_and_roundtrips():
    tok = HFTokenizer.from_pretrained(STANDIN)
    assert (tok.eos_id, tok.pad_id, tok.vocab_size) == (2, 0, 640)
    assert tok.special_ids == {0, 1, 2} and "<|im_start|>" in tok.chat_template
    for case in REFERENCE["encodings"]:
        assert tok.encode(case["text"]) == case["ids"]
        assert tok.decode(case["ids"]) == case["text"]
    for chat in REFERENCE["chats"]:  # the specials survive an encode / decode round trip
        ids = tok.encode(chat["text"])
        assert ids.count(tok.token_id("<|im_start|>")) == chat["text"].count("<|im_start|>")
        assert tok.decode(ids, skip_special_tokens=False) == chat["text"]
