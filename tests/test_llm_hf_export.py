"""save_hf_model: our parameters as a Hugging Face Qwen2 folder with its tokenizer (round trip
through load_hf_model, atomic replacement, refusals; transformers reads it, a slow check)."""
import json
import os

import jax
import numpy as np
import pytest

from fresh_rl.llm.checkpoint import (EXPORT_METADATA, load_hf_checkpoint, load_hf_model,
                                     read_safetensors, save_hf_model)
from fresh_rl.llm.model import Qwen2Config, init_params
from fresh_rl.llm.tasks.vocab import TaskVocab

STANDIN = os.path.join(os.path.dirname(__file__), "fixtures", "qwen2_bpe_tiny")


def _vocab_identity(vocab: TaskVocab):
    arrays = (vocab.first_prefix, vocab.turn_prefix, vocab.obs_suffix, vocab.char_ids,
              *vocab.token_chars)
    return ((vocab.vocab_size, vocab.pad_id, vocab.bos_id, vocab.stop_tokens,
             vocab.max_token_chars, vocab.chat_template),
            [np.asarray(a).tolist() for a in arrays])


def test_save_hf_model_roundtrips_params_and_vocab_bit_exactly(tmp_path):
    config, params, vocab = load_hf_model(STANDIN)
    # Trained-looking parameters, not the fixture's own bytes: perturb every leaf.
    params = jax.tree_util.tree_map(lambda x: np.asarray(x) * 1.5 + 0.01, params)
    out = save_hf_model(str(tmp_path / "model"), config, params, STANDIN,
                        metadata={"step": 7})
    names = set(os.listdir(out))
    assert names == {"config.json", "model.safetensors", "generation_config.json",
                     "tokenizer.json", "tokenizer_config.json", EXPORT_METADATA}
    assert sorted(os.listdir(tmp_path)) == ["model"]  # no staging folder left behind
    mask = os.umask(0o022)
    os.umask(mask)  # written through temporary files, yet with open()'s permissions, not 0600
    assert {os.stat(os.path.join(out, name)).st_mode & 0o777 for name in names} == {0o666 & ~mask}
    loaded_config, loaded, loaded_vocab = load_hf_model(out)
    assert loaded_config == config
    leaves, loaded_leaves = (jax.tree_util.tree_flatten_with_path(t)[0] for t in (params, loaded))
    assert [p for p, _ in leaves] == [p for p, _ in loaded_leaves]
    for (path, a), (_, b) in zip(leaves, loaded_leaves):
        assert b.dtype == np.float32
        np.testing.assert_array_equal(a, b, err_msg=str(path))
    assert _vocab_identity(loaded_vocab) == _vocab_identity(vocab)
    with open(os.path.join(out, "config.json")) as f:
        written = json.load(f)
    with open(os.path.join(STANDIN, "config.json")) as f:
        fixture = json.load(f)  # as transformers 5 wrote it
    same = {k: v for k, v in fixture.items() if k not in ("initializer_range", "max_window_layers",
                                                          "transformers_version")}
    assert {k: written.get(k) for k in same} == same
    assert read_safetensors(os.path.join(out, "model.safetensors"))  # readable
    with open(os.path.join(out, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    assert header["__metadata__"] == {"format": "pt"}  # as transformers' save_pretrained


def test_save_hf_model_replaces_a_model_folder_and_refuses_anything_else(tmp_path):
    config = Qwen2Config(vocab_size=704, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64)
    first, second = (init_params(config, jax.random.PRNGKey(i)) for i in (0, 1))
    target = str(tmp_path / "model")
    save_hf_model(target, config, first, STANDIN)
    save_hf_model(target, config, second, STANDIN)  # an HF folder: replaced
    _, loaded = load_hf_checkpoint(target)
    np.testing.assert_array_equal(loaded["norm"]["weight"], np.asarray(second["norm"]["weight"]))
    np.testing.assert_array_equal(loaded["embed_tokens"]["embedding"],
                                  np.asarray(second["embed_tokens"]["embedding"]))
    assert sorted(os.listdir(tmp_path)) == ["model"]
    other = tmp_path / "results"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a Hugging Face model folder"):
        save_hf_model(str(other), config, first, STANDIN)
    (other / "config.json").write_text("{}")
    (other / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileExistsError, match="refusing to overwrite"):  # notes.txt is not HF
        save_hf_model(str(other), config, first, STANDIN)
    assert (other / "notes.txt").read_text() == "keep me"
    with pytest.raises(FileNotFoundError, match="lacks tokenizer.json"):
        save_hf_model(str(tmp_path / "new"), config, first, str(tmp_path))
    bad = jax.tree_util.tree_map(lambda x: np.full(x.shape, np.nan, np.float32), first)
    with pytest.raises(ValueError, match="non-finite"):
        save_hf_model(str(tmp_path / "new"), config, bad, STANDIN)
    assert sorted(os.listdir(tmp_path)) == ["model", "results"]


@pytest.mark.slow
def test_transformers_loads_the_folder_with_our_logits(tmp_path):
    """Reference check (torch + transformers, the `reference` extra; skipped without them)."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import jax.numpy as jnp
    import torch

    from fresh_rl.llm.model import Qwen2LM
    config = Qwen2Config(vocab_size=704, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    params = jax.tree_util.tree_map(  # O(1) logits, non-trivial norms and biases
        lambda x: np.asarray(x) * 4.0 + 0.05, init_params(config, jax.random.PRNGKey(3)))
    out = save_hf_model(str(tmp_path / "model"), config, params, STANDIN)
    model = transformers.Qwen2ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Tom has 17 apples."}],
                                         tokenize=False, add_generation_prompt=True)
    ids = np.asarray([tokenizer.encode(text, add_special_tokens=False)])
    assert ids.shape[1] > 5
    with torch.no_grad():
        reference = model(torch.as_tensor(ids)).logits.numpy()
    positions = np.arange(ids.shape[1])[None]
    ours, _ = Qwen2LM(config).apply({"params": params}, jnp.asarray(ids), jnp.asarray(positions),
                                    jnp.ones(ids.shape, bool))
    assert np.abs(reference).max() > 1.0
    # torch vs XLA: √(1200 chained terms)·u ≈ 2e-6 of Σ|terms| (≲ 20, weights ×4) ≈ 4e-5 + ulps
    np.testing.assert_allclose(np.asarray(ours), reference, atol=1e-4, rtol=1e-4)
