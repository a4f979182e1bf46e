"""Qwen2 module: differential test vs transformers (committed fixture), loading, bad input."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fresh_rl.llm.checkpoint import (config_from_hf, load_hf_checkpoint, params_from_hf_tensors,
                                     params_to_hf_tensors, read_safetensors, write_safetensors)
from fresh_rl.llm.model import PRESETS, Qwen2Config, Qwen2LM, init_params, preset

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "qwen2_tiny")
STANDIN = os.path.join(os.path.dirname(__file__), "fixtures", "qwen2_bpe_tiny")
# init_params and the forwards below run jitted: eagerly, Flax dispatches every op of the
# scanned model on its own, which cost more than compiling the whole program once. jit changes
# which program evaluates the same operations, not what is compared (random init values differ
# from eager ones only in rounding, and no test compares them with stored numbers).
_init_params = jax.jit(init_params, static_argnums=0)


@pytest.mark.parametrize("folder", [FIXTURE, STANDIN], ids=["qwen2_tiny", "qwen2_bpe_tiny"])
def test_logits_match_transformers_reference(folder):
    """Fixtures made with transformers + torch: tests/fixtures/make_qwen2_reference.py (random
    ids, untied head) and make_bpe_standin.py (the BPE stand-in, tied embeddings, its own
    tokenizer's encodings)."""
    config, params = load_hf_checkpoint(folder)
    ref = np.load(os.path.join(folder, "reference.npz"))
    logits, _ = jax.jit(Qwen2LM(config).apply)(
        {"params": params}, jnp.asarray(ref["input_ids"]), jnp.asarray(ref["position_ids"]),
        jnp.asarray(ref["attention_mask"]))
    valid = ref["attention_mask"].astype(bool)
    err = np.abs(np.asarray(logits) - ref["logits"])[valid]
    assert np.abs(ref["logits"]).max() > 1.0  # the comparison is not between near-zero logits
    # torch vs XLA: √(1100 chained terms)·u ≈ 2e-6 of |logits| ≤ 5, + few-ulp exp/rsqrt: ≈ 2e-5
    assert err.max() < 1e-4, err.max()


def test_safetensors_roundtrip_and_export():
    config, params = load_hf_checkpoint(FIXTURE)
    original = read_safetensors(os.path.join(FIXTURE, "model.safetensors"))
    exported = params_to_hf_tensors(params, config)
    assert set(exported) == set(original)
    for name, array in original.items():
        np.testing.assert_array_equal(exported[name], array)


def test_bf16_safetensors_load(tmp_path):
    import ml_dtypes
    config, params = load_hf_checkpoint(FIXTURE)
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in params_to_hf_tensors(params,
                                                                              config).items()}
    write_safetensors(str(tmp_path / "model.safetensors"), tensors)
    loaded = params_from_hf_tensors(read_safetensors(str(tmp_path / "model.safetensors")), config)
    # one bf16 rounding: ≤ u_bf16 = 2^-8 ≈ 4e-3 relative
    np.testing.assert_allclose(loaded["norm"]["weight"], params["norm"]["weight"], rtol=1e-2)


def test_mismatched_shape_names_the_tensor(tmp_path):
    config, params = load_hf_checkpoint(FIXTURE)
    tensors = params_to_hf_tensors(params, config)
    tensors["model.layers.1.mlp.up_proj.weight"] = np.zeros((7, 64), np.float32)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*\(7, 64\)"):
        params_from_hf_tensors(tensors, config)
    del tensors["model.norm.weight"]
    with pytest.raises(ValueError, match="lacks tensors.*model.norm.weight"):
        params_from_hf_tensors(tensors, config)


def test_config_from_hf_reads_both_rope_layouts():
    with open(os.path.join(FIXTURE, "config.json")) as f:
        hf = json.load(f)
    assert config_from_hf(hf).rope_theta == 5000.0
    old_style = {k: v for k, v in hf.items() if k != "rope_parameters"} | {"rope_theta": 7.0}
    assert config_from_hf(old_style).rope_theta == 7.0
    with pytest.raises(ValueError, match="RoPE scaling"):
        config_from_hf(hf | {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="use_sliding_window"):
        config_from_hf(hf | {"use_sliding_window": True})


def test_presets_and_bad_config():
    assert preset("qwen2.5-0.5b").num_key_value_heads == 2
    with pytest.raises(ValueError, match="unknown model preset 'qwen3'.*tiny"):
        preset("qwen3")
    with pytest.raises(ValueError, match="num_key_value_heads"):
        Qwen2Config(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                    num_attention_heads=4, num_key_value_heads=3, max_position_embeddings=8)
    with pytest.raises(ValueError, match="rms_norm_eps"):
        Qwen2Config(vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=8,
                    rms_norm_eps=0.0)


@pytest.mark.parametrize("name, low, high", [("qwen2.5-0.5b", 493e6, 495e6),
                                              ("qwen2.5-1.5b", 1.54e9, 1.55e9)])
def test_qwen25_preset_parameter_count(name, low, high):
    """Qwen2.5-0.5B has 494M parameters and Qwen2.5-1.5B 1.54B (tied embeddings, as their
    model cards state); checked by shape only."""
    shapes = jax.eval_shape(lambda: init_params(PRESETS[name], jax.random.PRNGKey(0)))
    count = sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes))
    assert low < count < high, count


def test_padding_does_not_change_valid_logits():
    """Left padding plus explicit mask and positions gives the unpadded row's logits."""
    config = preset("tiny")
    params = _init_params(config, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (1, 6), 3, 100)
    apply = jax.jit(Qwen2LM(config).apply)
    plain, _ = apply({"params": params}, tokens, jnp.arange(6)[None], jnp.ones((1, 6), bool))
    padded_tokens = jnp.concatenate([jnp.zeros((1, 3), tokens.dtype), tokens], axis=1)
    mask = jnp.arange(9)[None] >= 3
    positions = jnp.maximum(jnp.cumsum(mask, axis=1) - 1, 0)
    padded, _ = apply({"params": params}, padded_tokens, positions, mask)
    # 9 vs 6 positions, two programs: √(5000 chained terms)·u ≈ 4e-6 of Σ|terms| ≲ 2 → 8e-6, 2×
    np.testing.assert_allclose(padded[:, 3:], plain, atol=2e-5)


def _small(num_layers):
    return Qwen2Config(vocab_size=32, hidden_size=16, intermediate_size=32,
                       num_hidden_layers=num_layers, num_attention_heads=2,
                       num_key_value_heads=1, max_position_embeddings=16)


def test_program_size_does_not_grow_with_depth():
    """One scanned layer: the lowered forward + gradient has the same number of lines for 2 and
    8 layers (the unrolled model grew by one layer body per layer)."""
    def lowered_lines(config):
        tokens = jnp.zeros((2, 6), jnp.int32)
        mask = jnp.ones((2, 6), bool)

        def loss(params):
            logits, _ = Qwen2LM(config).apply({"params": params}, tokens,
                                              jnp.arange(6)[None].repeat(2, 0), mask)
            return jnp.sum(logits)

        params = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
        return jax.jit(jax.grad(loss)).lower(params).as_text().count("\n")

    assert lowered_lines(_small(2)) == lowered_lines(_small(8))


def test_scanned_and_remat_model_equals_the_unrolled_layers():
    """The scanned model (with and without remat) against the layers applied one by one in
    Python from the stacked parameters: logits and every parameter gradient."""
    from fresh_rl.llm.model import DecoderLayer, RMSNorm, rope_cos_sin
    config = _small(3)
    params = _init_params(config, jax.random.PRNGKey(0))
    assert jax.tree_util.tree_leaves(params["layers"])[0].shape[0] == 3
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 5), 0, 32)
    positions = jnp.arange(5)[None].repeat(2, 0)
    mask = jnp.arange(5)[None] >= jnp.array([0, 2])[:, None]

    def unrolled(params):
        embedding = params["embed_tokens"]["embedding"]
        x = embedding[tokens]
        cos, sin = rope_cos_sin(positions, config.head_dim, config.rope_theta)
        for i in range(config.num_hidden_layers):
            layer = jax.tree_util.tree_map(lambda p: p[i], params["layers"])
            x, _ = DecoderLayer(config).apply({"params": layer}, x, cos, sin, mask)
        return RMSNorm(config.rms_norm_eps).apply({"params": params["norm"]}, x) @ embedding.T

    def scanned(params, remat):
        return Qwen2LM(config, remat=remat).apply({"params": params}, tokens, positions,
                                                  mask)[0]

    def grads_and_logits(forward):
        """One jitted program per model: the gradient of Σ sin(logits) and, as its auxiliary
        output, the logits of the same forward. The unrolled model still applies the layers
        one by one (Python unrolls the loop while tracing); running it eagerly dispatched
        every op separately, most of this test's time. jit changes no operation, only which
        program evaluates it, and the bounds below are already two-program bounds."""
        return jax.jit(jax.grad(lambda p: (jnp.sum(jnp.sin(logits := forward(p))), logits),
                                has_aux=True))(params)

    reference_grads, reference = grads_and_logits(unrolled)
    for remat in (False, True):
        grads, logits = grads_and_logits(lambda p: scanned(p, remat))
        # scan vs unrolled layers: √(440 chained terms)·u ≈ 1.3e-6 of Σ|terms| ≲ 0.4 → 5e-7
        np.testing.assert_allclose(logits, reference, rtol=1e-5, atol=1e-6)
        for a, b in zip(jax.tree_util.tree_leaves(grads),
                        jax.tree_util.tree_leaves(reference_grads)):
            # backward: √(2·440 terms · 10 tokens)·u ≈ 6e-6 of the leaf's scale (3e-3 … 29)
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=max(1e-6, 1e-5 * np.abs(b).max()))


def test_head_options_keep_the_logits():
    config = _small(3)
    params = _init_params(config, jax.random.PRNGKey(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 5), 0, 32)
    positions, mask = jnp.arange(5)[None].repeat(2, 0), jnp.ones((2, 5), bool)
    model = Qwen2LM(config)

    @jax.jit
    def heads(params):
        every, _ = model.apply({"params": params}, tokens, positions, mask)
        last, _ = model.apply({"params": params}, tokens, positions, mask, logits_for="last")
        hidden, _ = model.apply({"params": params}, tokens, positions, mask, logits_for="none")
        return every, last, model.apply({"params": params}, hidden, method=Qwen2LM.logits)

    every, last, from_hidden = heads(params)
    # same backbone ops; norm and head re-sum 16 terms for this shape: ≤ 2·16·u·0.4 ≈ 8e-7
    np.testing.assert_allclose(last, every[:, -1:], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(from_hidden, every, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="logits_for must be"):
        model.apply({"params": params}, tokens, positions, mask, logits_for="first")


def test_per_layer_checkpoints_restore_into_the_scanned_layout(tmp_path):
    """A parameter checkpoint in the per-layer layout of earlier versions (layers_{i}) restores,
    checksum verified, as the stacked layout; stack/unstack are inverse."""
    from fresh_rl.llm.model import stack_layers, unstack_layers
    from fresh_rl.llm.warm_start import restore_params, save_params
    config = _small(3)
    params = _init_params(config, jax.random.PRNGKey(0))
    per_layer = unstack_layers(params)
    assert sorted(k for k in per_layer if k.startswith("layers")) == ["layers_0", "layers_1",
                                                                       "layers_2"]
    jax.tree_util.tree_map(np.testing.assert_array_equal, stack_layers(per_layer), params)
    save_params(str(tmp_path / "old"), per_layer)
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           restore_params(str(tmp_path / "old"), config), params)
    save_params(str(tmp_path / "new"), params)
    jax.tree_util.tree_map(np.testing.assert_array_equal,
                           restore_params(str(tmp_path / "new"), config), params)
    with pytest.raises(ValueError, match="layers_0 … layers_"):
        stack_layers({"layers_0": per_layer["layers_0"], "layers_2": per_layer["layers_2"]})
