"""Qwen2-architecture decoder-only causal LM in Flax linen.

Architecture (Qwen2 / Qwen2.5): token embedding -> L x [RMSNorm -> GQA self-attention with
RoPE (q/k/v with bias, o without) -> residual -> RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm
-> LM head (optionally tied to the embedding).

Attention works in "cache slots": the keys of a call are either the tokens of the call itself
(no cache, slot t = position in the call) or a KV cache of `S` slots into which the call
writes its tokens at `cache_index`. A query at slot q sees key slot s iff `s <= q` and the key
slot is valid (`kv_valid[b, s]`), so left-padded prompts and per-row lengths are explicit masks.
Positions (for RoPE) are passed explicitly, per row.

Layers are one ``nn.scan`` over a single decoder layer: the parameters of all L layers are
stacked under ``params["layers"]`` with a leading axis of length L (``stack_layers`` /
``unstack_layers`` convert from and to the per-layer ``layers_{i}`` layout of earlier versions
and of Hugging Face checkpoints), so a program holds one copy of the layer, and its trace and
compile time do not grow with depth. ``remat=True`` rematerialises each layer's activations in
the backward pass (memory O(1) layers instead of O(L), one extra forward).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import chex
import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.validation import require_int

# Finite "minus infinity" so that a fully masked row gives a uniform (not NaN) softmax.
_MASK_VALUE = -1e30


@dataclasses.dataclass(frozen=True)
class Qwen2Config:
    """Static Qwen2 hyperparameters (names follow the Hugging Face config.json keys)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            # NumPy / JAX integers are stored as Python ints (the config is a static jit argument)
            object.__setattr__(self, name, require_int(f"Qwen2Config.{name}", getattr(self, name), 1))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"Qwen2Config.hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"Qwen2Config.num_attention_heads ({self.num_attention_heads}) must be divisible "
                f"by num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"Qwen2Config head_dim = hidden_size / num_attention_heads must be "
                             f"even for RoPE, got {self.head_dim}")
        if not self.rope_theta > 0:
            raise ValueError(f"Qwen2Config.rope_theta must be > 0, got {self.rope_theta}")
        if not self.rms_norm_eps > 0:
            raise ValueError(f"Qwen2Config.rms_norm_eps must be > 0, got {self.rms_norm_eps}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


PRESETS: dict[str, Qwen2Config] = {
    # Character-level model that trains on a laptop CPU (~0.8M parameters).
    "tiny": Qwen2Config(vocab_size=128, hidden_size=128, intermediate_size=384,
                        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-6,
                        tie_word_embeddings=True),
    # The BPE warm start's model (experiments/llm_warm_start.py --scale bpe): the BPE stand-in's
    # vocabulary (tests/fixtures/qwen2_bpe_tiny, 704 rows) and GQA (4 heads / 2 KV heads) at
    # 4.9M parameters, sized by measurement to train in ~40 min on 2 CPU cores
    # (results/llm_warm_start_bpe/sizing.md).
    "bpe-5m": Qwen2Config(vocab_size=704, hidden_size=256, intermediate_size=768,
                          num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=1024, rope_theta=10000.0, rms_norm_eps=1e-6,
                          tie_word_embeddings=True),
    # Qwen2.5-0.5B (values of its published config.json).
    "qwen2.5-0.5b": Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                num_hidden_layers=24, num_attention_heads=14,
                                num_key_value_heads=2, max_position_embeddings=32768,
                                rope_theta=1000000.0, rms_norm_eps=1e-6,
                                tie_word_embeddings=True),
    # Qwen2.5-1.5B (its published config.json; max_position_embeddings changes no parameter
    # shape: 32768 as the 0.5B preset and the Instruct model, the base model lists 131072).
    "qwen2.5-1.5b": Qwen2Config(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                                num_hidden_layers=28, num_attention_heads=12,
                                num_key_value_heads=2, max_position_embeddings=32768,
                                rope_theta=1000000.0, rms_norm_eps=1e-6,
                                tie_word_embeddings=True),
}


def preset(name: str) -> Qwen2Config:
    """Returns the named preset config; raises ValueError listing the known names."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known presets: {sorted(PRESETS)}")
    return PRESETS[name]


@flax.struct.dataclass
class KVCache:
    """Per-layer keys/values, `[L, B, S, H_kv, D]`, in the sampler's compute dtype."""

    keys: jax.Array
    values: jax.Array

    @classmethod
    def zeros(cls, config: Qwen2Config, batch: int, num_slots: int, dtype: Any) -> "KVCache":
        shape = (config.num_hidden_layers, batch, num_slots, config.num_key_value_heads,
                 config.head_dim)
        return cls(keys=jnp.zeros(shape, dtype), values=jnp.zeros(shape, dtype))


def rope_cos_sin(positions: jax.Array, head_dim: int, theta: float):
    """RoPE tables `[B, T, D]` (float32): angle_{t,i} = pos_t * theta^(-2i/D), duplicated halves."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    angles = positions.astype(jnp.float32)[..., None] * inv_freq
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate-half RoPE on `x: [B, T, H, D]`: x*cos + [-x2, x1]*sin, computed in float32."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    out = xf * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)


class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps), normalised in float32 then cast back."""

    eps: float
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        weight = self.param("weight", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        xf = x.astype(jnp.float32)
        normed = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return weight.astype(self.dtype) * normed.astype(self.dtype)


def _dense(features, use_bias, dtype, name):
    return nn.Dense(features, use_bias=use_bias, dtype=dtype, param_dtype=jnp.float32,
                    kernel_init=nn.initializers.normal(0.02), name=name)


class Attention(nn.Module):
    """Grouped-query self-attention with RoPE and an optional KV cache (see module docstring)."""

    config: Qwen2Config
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, cos, sin, kv_valid, cache_kv=None, cache_index=0):
        cfg = self.config
        b, t, _ = x.shape
        h, hkv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        q = _dense(h * d, True, self.dtype, "q_proj")(x).reshape(b, t, h, d)
        k = _dense(hkv * d, True, self.dtype, "k_proj")(x).reshape(b, t, hkv, d)
        v = _dense(hkv * d, True, self.dtype, "v_proj")(x).reshape(b, t, hkv, d)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache_kv is None:
            keys, values = k, v
            query_slots = jnp.arange(t)
        else:
            cache_k, cache_v = cache_kv
            keys = jax.lax.dynamic_update_slice(cache_k, k.astype(cache_k.dtype),
                                                (0, cache_index, 0, 0))
            values = jax.lax.dynamic_update_slice(cache_v, v.astype(cache_v.dtype),
                                                  (0, cache_index, 0, 0))
            query_slots = cache_index + jnp.arange(t)
        num_slots = keys.shape[1]
        visible = (jnp.arange(num_slots)[None, :] <= query_slots[:, None])[None]  # [1, T, S]
        visible = visible & kv_valid[:, None, :].astype(bool)  # [B, T, S]
        q = q.reshape(b, t, hkv, h // hkv, d)
        scores = jnp.einsum("btkgd,bskd->bkgts", q, keys.astype(self.dtype),
                            preferred_element_type=jnp.float32) / jnp.sqrt(jnp.float32(d))
        scores = jnp.where(visible[:, None, None], scores, _MASK_VALUE)
        probs = jax.nn.softmax(scores, axis=-1).astype(self.dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, values.astype(self.dtype))
        out = _dense(cfg.hidden_size, False, self.dtype, "o_proj")(out.reshape(b, t, h * d))
        return out, (keys, values)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), no biases."""

    config: Qwen2Config
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        gate = _dense(cfg.intermediate_size, False, self.dtype, "gate_proj")(x)
        up = _dense(cfg.intermediate_size, False, self.dtype, "up_proj")(x)
        return _dense(cfg.hidden_size, False, self.dtype, "down_proj")(nn.silu(gate) * up)


class DecoderLayer(nn.Module):
    config: Qwen2Config
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x, cos, sin, kv_valid, cache_kv=None, cache_index=0):
        eps = self.config.rms_norm_eps
        attn_out, new_kv = Attention(self.config, self.dtype, name="self_attn")(
            RMSNorm(eps, self.dtype, name="input_layernorm")(x), cos, sin, kv_valid,
            cache_kv, cache_index)
        x = x + attn_out
        x = x + MLP(self.config, self.dtype, name="mlp")(
            RMSNorm(eps, self.dtype, name="post_attention_layernorm")(x))
        return x, (new_kv if cache_kv is not None else None)


class Qwen2LM(nn.Module):
    """Causal LM. Parameters are float32; `dtype` is the compute dtype (bfloat16 for sampling).

    __call__(tokens [B,T], positions [B,T], kv_valid [B,S], cache: KVCache|None, cache_index,
             logits_for) -> (out, new cache or None), ``out`` by ``logits_for``:
      "all": logits ``[B,T,V]`` float32; "last": logits of the last position only ``[B,1,V]``
      (a prefill needs no more, and skips the ``[B,T,V]`` head); "none": the final normed
      hidden states ``[B,T,H]`` in ``dtype`` (apply the head with :meth:`logits`, e.g. in
      sequence chunks).
    Without a cache, S == T and kv_valid marks the valid (non-pad) tokens.
    """

    config: Qwen2Config
    dtype: Any = jnp.float32
    remat: bool = False

    def setup(self):
        cfg = self.config
        self.embed_tokens = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=self.dtype,
                                     param_dtype=jnp.float32,
                                     embedding_init=nn.initializers.normal(0.02))
        layer = nn.remat(DecoderLayer) if self.remat else DecoderLayer
        # carry x; broadcast cos, sin, kv_valid, cache_index; scan over the per-layer cache
        self.layers = nn.scan(layer, variable_axes={"params": 0}, split_rngs={"params": True},
                              in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, 0,
                                       nn.broadcast),
                              length=cfg.num_hidden_layers)(cfg, self.dtype)
        self.norm = RMSNorm(cfg.rms_norm_eps, self.dtype)
        if not cfg.tie_word_embeddings:
            self.lm_head = _dense(cfg.vocab_size, False, self.dtype, None)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """LM head on final hidden states ``[..., H]`` → float32 logits ``[..., V]``."""
        if self.config.tie_word_embeddings:
            return self.embed_tokens.attend(hidden).astype(jnp.float32)
        return self.lm_head(hidden).astype(jnp.float32)

    def __call__(self, tokens, positions, kv_valid, cache: KVCache | None = None,
                 cache_index=0, logits_for: str = "all"):
        cfg = self.config
        chex.assert_rank([tokens, positions, kv_valid], 2)
        chex.assert_equal_shape([tokens, positions])
        if logits_for not in ("all", "last", "none"):
            raise ValueError(f"logits_for must be 'all', 'last' or 'none', got {logits_for!r}")
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        layer_kv = None if cache is None else (cache.keys, cache.values)
        x, new_kv = self.layers(self.embed_tokens(tokens), cos, sin, kv_valid, layer_kv,
                                cache_index)
        if logits_for == "last":
            x = x[:, -1:]
        x = self.norm(x)
        new_cache = None if cache is None else KVCache(*new_kv)
        return (x if logits_for == "none" else self.logits(x)), new_cache


def stack_layers(params) -> dict:
    """Per-layer layout ``{"layers_0": p_0, …, "layers_{L−1}": p_{L−1}, …}`` → the scanned
    layout ``{"layers": stack(p_0 … p_{L−1}), …}`` (leading axis L on every layer leaf)."""
    names = sorted((k for k in params if k.startswith("layers_")), key=lambda k: int(k[7:]))
    if not names:
        return dict(params)
    if names != [f"layers_{i}" for i in range(len(names))]:
        raise ValueError(f"layer parameters must be layers_0 … layers_{{L-1}}, got {names}")
    out = {k: v for k, v in params.items() if not k.startswith("layers_")}
    stack = lambda *xs: np.stack(xs) if isinstance(xs[0], np.ndarray) else jnp.stack(xs)  # noqa: E731
    out["layers"] = jax.tree_util.tree_map(stack, *[params[n] for n in names])
    return out


def unstack_layers(params) -> dict:
    """Inverse of :func:`stack_layers`: the scanned layout → ``layers_{i}`` per layer."""
    out = {k: v for k, v in params.items() if k != "layers"}
    depth = jax.tree_util.tree_leaves(params["layers"])[0].shape[0]
    for i in range(depth):
        out[f"layers_{i}"] = jax.tree_util.tree_map(lambda x, i=i: x[i], params["layers"])
    return out


def init_params(config: Qwen2Config, key: jax.Array):
    """Random float32 parameters (normal(0.02) weights, zero biases, unit norms)."""
    tokens = jnp.zeros((1, 2), jnp.int32)
    return Qwen2LM(config).init(key, tokens, tokens, jnp.ones((1, 2), bool))["params"]


def cast_params(params, dtype):
    """Casts floating parameters to `dtype` (e.g. the bf16 copy used by the sampler)."""
    return jax.tree_util.tree_map(lambda p: p.astype(dtype), params)
