"""Qwen2-architecture decoder-only causal LM in Flax linen.

Architecture (Qwen2 / Qwen2.5): token embedding -> L x [RMSNorm -> GQA self-attention with
RoPE (q/k/v with bias, o without) -> residual -> RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm
-> LM head (optionally tied to the embedding).

Attention works in "cache slots": the keys of a call are either the tokens of the call itself
(no cache, slot t = position in the call) or a KV cache of `S` slots into which the call
writes its tokens at `cache_index`. A query at slot q sees key slot s iff `s <= q` and the key
slot is valid (`kv_valid[b, s]`), so left-padded prompts and per-row lengths are explicit masks.
Positions (for RoPE) are passed explicitly, per row.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import chex
import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

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
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"Qwen2Config.{name} must be an integer >= 1, got {value!r}")
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
    # Qwen2.5-0.5B (values of its published config.json).
    "qwen2.5-0.5b": Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                                num_hidden_layers=24, num_attention_heads=14,
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
        return x, new_kv


class Qwen2LM(nn.Module):
    """Causal LM. Parameters are float32; `dtype` is the compute dtype (bfloat16 for sampling).

    __call__(tokens [B,T], positions [B,T], kv_valid [B,S], cache: KVCache|None, cache_index)
      -> (logits [B,T,V] float32, new cache or None).
    Without a cache, S == T and kv_valid marks the valid (non-pad) tokens.
    """

    config: Qwen2Config
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, tokens, positions, kv_valid, cache: KVCache | None = None,
                 cache_index=0):
        cfg = self.config
        chex.assert_rank([tokens, positions, kv_valid], 2)
        chex.assert_equal_shape([tokens, positions])
        embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=self.dtype,
                         param_dtype=jnp.float32, embedding_init=nn.initializers.normal(0.02),
                         name="embed_tokens")
        x = embed(tokens)
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        new_keys, new_values = [], []
        for i in range(cfg.num_hidden_layers):
            layer_kv = None if cache is None else (cache.keys[i], cache.values[i])
            x, (k, v) = DecoderLayer(cfg, self.dtype, name=f"layers_{i}")(
                x, cos, sin, kv_valid, layer_kv, cache_index)
            new_keys.append(k)
            new_values.append(v)
        x = RMSNorm(cfg.rms_norm_eps, self.dtype, name="norm")(x)
        if cfg.tie_word_embeddings:
            logits = embed.attend(x)
        else:
            logits = _dense(cfg.vocab_size, False, self.dtype, "lm_head")(x)
        new_cache = None if cache is None else KVCache(jnp.stack(new_keys), jnp.stack(new_values))
        return logits.astype(jnp.float32), new_cache


def init_params(config: Qwen2Config, key: jax.Array):
    """Random float32 parameters (normal(0.02) weights, zero biases, unit norms)."""
    tokens = jnp.zeros((1, 2), jnp.int32)
    return Qwen2LM(config).init(key, tokens, tokens, jnp.ones((1, 2), bool))["params"]


def cast_params(params, dtype):
    """Casts floating parameters to `dtype` (e.g. the bf16 copy used by the sampler)."""
    return jax.tree_util.tree_map(lambda p: p.astype(dtype), params)
