"""Hugging Face Qwen2 checkpoints (config.json + *.safetensors) <-> our Flax parameters.

The safetensors format is read directly (8-byte little-endian header size, JSON header of
`name -> {dtype, shape, data_offsets}`, raw little-endian bytes), with `ml_dtypes` for
bfloat16, so real bf16 checkpoints load without torch. Sharded checkpoints are found through
`model.safetensors.index.json`.

Name mapping (HF -> ours; HF Linear weights are `[out, in]`, Flax Dense kernels `[in, out]`):
  model.embed_tokens.weight                      -> embed_tokens/embedding
  model.layers.{i}.self_attn.{q,k,v}_proj.{weight,bias} -> layers_{i}/self_attn/{q,k,v}_proj/{kernel,bias}
  model.layers.{i}.self_attn.o_proj.weight        -> layers_{i}/self_attn/o_proj/kernel
  model.layers.{i}.mlp.{gate,up,down}_proj.weight -> layers_{i}/mlp/{...}_proj/kernel
  model.layers.{i}.{input,post_attention}_layernorm.weight -> layers_{i}/{...}/weight
  model.norm.weight -> norm/weight;  lm_head.weight -> lm_head/kernel (absent when tied)
"""
from __future__ import annotations

import json
import os
import struct

import jax
import ml_dtypes
import numpy as np

from fresh_rl.llm.model import Qwen2Config, init_params

_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
           "F64": np.float64, "I64": np.int64, "I32": np.int32}
_DTYPE_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Reads every tensor of one .safetensors file into numpy arrays."""
    with open(path, "rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_size))
        data = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']!r}; "
                             f"supported: {sorted(_DTYPES)}")
        start, end = info["data_offsets"]
        array = np.frombuffer(data[start:end], dtype=_DTYPES[info["dtype"]])
        tensors[name] = array.reshape(info["shape"])
    return tensors


def write_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    """Writes numpy arrays as one .safetensors file (readable by HF `safetensors`)."""
    header, chunks, offset = {}, [], 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        raw = array.tobytes()
        header[name] = {"dtype": _DTYPE_NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header_bytes = json.dumps(header).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        f.writelines(chunks)


def config_from_hf(hf: dict) -> Qwen2Config:
    """Builds a Qwen2Config from a parsed HF config.json; rejects features we do not implement."""
    if hf.get("model_type", "qwen2") != "qwen2":
        raise ValueError(f"config.json model_type must be 'qwen2', got {hf.get('model_type')!r}")
    if hf.get("use_sliding_window", False):
        raise ValueError("config.json use_sliding_window=true is not supported (Qwen2.5 "
                         "checkpoints ship with false)")
    # transformers < 5 writes rope_theta (+ rope_scaling); >= 5 writes rope_parameters.
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"config.json RoPE scaling {rope!r} is not supported (default only)")
    rope_theta = float(hf.get("rope_theta", rope.get("rope_theta", 10000.0)))
    fields = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "max_position_embeddings")
    missing = [f for f in fields if f not in hf]
    if missing:
        raise ValueError(f"config.json lacks required fields {missing}")
    head_dim = hf.get("head_dim", hf["hidden_size"] // hf["num_attention_heads"])
    if head_dim * hf["num_attention_heads"] != hf["hidden_size"]:
        raise ValueError(f"config.json head_dim={head_dim} != hidden_size/num_attention_heads")
    return Qwen2Config(**{f: int(hf[f]) for f in fields},
                       rope_theta=rope_theta,
                       rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                       tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)))


def _hf_to_ours(config: Qwen2Config) -> dict[str, tuple[tuple[str, ...], bool]]:
    """HF tensor name -> (our parameter path, transpose?)."""
    table = {"model.embed_tokens.weight": (("embed_tokens", "embedding"), False),
             "model.norm.weight": (("norm", "weight"), False)}
    if not config.tie_word_embeddings:
        table["lm_head.weight"] = (("lm_head", "kernel"), True)
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", f"layers_{i}"
        for proj in ("q_proj", "k_proj", "v_proj"):
            table[hf + f"self_attn.{proj}.weight"] = ((ours, "self_attn", proj, "kernel"), True)
            table[hf + f"self_attn.{proj}.bias"] = ((ours, "self_attn", proj, "bias"), False)
        table[hf + "self_attn.o_proj.weight"] = ((ours, "self_attn", "o_proj", "kernel"), True)
        for proj in ("gate_proj", "up_proj", "down_proj"):
            table[hf + f"mlp.{proj}.weight"] = ((ours, "mlp", proj, "kernel"), True)
        for norm in ("input_layernorm", "post_attention_layernorm"):
            table[hf + f"{norm}.weight"] = ((ours, norm, "weight"), False)
    return table


def _expected_shapes(config: Qwen2Config) -> dict[tuple[str, ...], tuple[int, ...]]:
    shapes = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))
    flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
    return {tuple(k.key for k in path): tuple(leaf.shape) for path, leaf in flat}


def params_from_hf_tensors(tensors: dict[str, np.ndarray], config: Qwen2Config,
                           dtype=np.float32) -> dict:
    """Maps HF-named tensors to our nested parameter dict; checks names and shapes."""
    table = _hf_to_ours(config)
    expected = _expected_shapes(config)
    ignored = {"lm_head.weight"} if config.tie_word_embeddings else set()
    unknown = sorted(set(tensors) - set(table) - ignored)
    if unknown:
        raise ValueError(f"checkpoint has tensors this Qwen2Config does not use: {unknown[:5]}"
                         f"{' ...' if len(unknown) > 5 else ''}")
    missing = sorted(set(table) - set(tensors))
    if missing:
        raise ValueError(f"checkpoint lacks tensors: {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}")
    params: dict = {}
    for hf_name, (path, transpose) in table.items():
        array = np.asarray(tensors[hf_name])
        if transpose:
            array = array.T
        if array.shape != expected[path]:
            raise ValueError(f"checkpoint tensor {hf_name!r} has shape "
                             f"{tuple(tensors[hf_name].shape)}, the config expects "
                             f"{expected[path][::-1] if transpose else expected[path]}")
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = array.astype(dtype)
    return params


def params_to_hf_tensors(params: dict, config: Qwen2Config) -> dict[str, np.ndarray]:
    """Inverse of `params_from_hf_tensors` (exports our parameters under HF names)."""
    out = {}
    for hf_name, (path, transpose) in _hf_to_ours(config).items():
        node = params
        for key in path:
            node = node[key]
        array = np.asarray(node)
        out[hf_name] = array.T if transpose else array
    return out


def load_hf_checkpoint(directory: str, dtype=np.float32) -> tuple[Qwen2Config, dict]:
    """Loads `directory/config.json` and its safetensors (single file or sharded index)."""
    with open(os.path.join(directory, "config.json")) as f:
        config = config_from_hf(json.load(f))
    index_path = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        tensors.update(read_safetensors(os.path.join(directory, name)))
    return config, params_from_hf_tensors(tensors, config, dtype)
