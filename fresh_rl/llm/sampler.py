"""Inference engine (bf16 KV-cache sampler) and training engine (fp32 log-probs and entropy).

The sampler runs the model with bfloat16 weights and activations; the training forward runs
it in float32. Their log-probs of the same tokens differ, so the train-inference ratio
r_d = pi_train / pi_infer (docs/old_logits.md) is real rather than injected.

Sequence layout: prompts are LEFT-padded `[B, P]` with an explicit `prompt_mask`; the
sampler writes generated tokens to cache slots P..P+N-1 and RoPE positions
`prompt_len_b + t`, so `concat(prompt, generation)` with `concat(prompt_mask, gen.mask)` is
exactly what the training forward consumes (`positions = cumsum(mask) - 1`).

Multi-turn sequences keep a :class:`TurnCache` across calls: :func:`prefill_cache` appends the
tokens that arrived since the last call, :func:`decode_cache` samples into the following slots
(the layout of the slots is the caller's: :class:`fresh_rl.llm.rollout.ModelPolicy`).
"""
from __future__ import annotations

import dataclasses
import functools

import chex
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.llm.model import KVCache, Qwen2Config, Qwen2LM, cast_params
from fresh_rl.validation import require_int


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """Static sampling settings.

    temperature 0 means greedy; top_k 0 and top_p 1 disable those filters. `stop_tokens`
    end a row (the stop token is kept, with mask 1). `dtype` is the inference compute dtype.
    `logit_noise_std` σ ≥ 0 adds i.i.d. N(0, σ²) noise to every next-token logit before
    sampling (the recorded log-probs are those of the noisy distribution): an extra
    train–inference mismatch on top of bf16 that mimics MoE routing noise (our stand-in;
    0 = off, the default).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop_tokens: tuple[int, ...] = ()
    pad_id: int = 0
    dtype: str = "bfloat16"
    logit_noise_std: float = 0.0

    def __post_init__(self):
        # NumPy / JAX integers are stored as Python ints (the config is a static jit argument)
        object.__setattr__(self, "max_new_tokens", require_int(
            "SamplingConfig.max_new_tokens", self.max_new_tokens, 1))
        object.__setattr__(self, "top_k", require_int("SamplingConfig.top_k (0 = off)", self.top_k, 0))
        if not self.temperature >= 0:
            raise ValueError(f"SamplingConfig.temperature must be >= 0 (0 = greedy), "
                             f"got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingConfig.top_p must be in (0, 1], got {self.top_p}")
        if not self.logit_noise_std >= 0:
            raise ValueError(f"SamplingConfig.logit_noise_std must be >= 0, "
                             f"got {self.logit_noise_std}")
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(f"SamplingConfig.dtype must be 'bfloat16' or 'float32', "
                             f"got {self.dtype!r}")


@flax.struct.dataclass
class Generation:
    """Sampler output, all `[B, N]` except `lengths [B]`.

    logprobs: log-prob of each token under the distribution it was drawn from (after
    temperature / top-k / top-p; for greedy, the temperature-1 distribution), 0 where masked.
    """

    tokens: jax.Array
    logprobs: jax.Array
    mask: jax.Array
    lengths: jax.Array


def positions_from_mask(mask: jax.Array) -> jax.Array:
    """RoPE positions of a left- or right-padded batch: cumsum(mask) - 1, clipped at 0."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=1) - 1, 0)


def _check_inputs(model_config: Qwen2Config, prompt_tokens, prompt_mask, total_len: int):
    chex.assert_rank([prompt_tokens, prompt_mask], 2)
    chex.assert_equal_shape([prompt_tokens, prompt_mask])
    if total_len > model_config.max_position_embeddings:
        raise ValueError(f"prompt length + new tokens = {total_len} exceeds the context "
                         f"max_position_embeddings={model_config.max_position_embeddings}")
    if not isinstance(prompt_tokens, jax.core.Tracer):
        tokens = np.asarray(prompt_tokens)
        valid = np.asarray(prompt_mask).astype(bool)
        bad = valid & ((tokens < 0) | (tokens >= model_config.vocab_size))
        if bad.any():
            raise ValueError(f"prompt token {tokens[bad][0]} is out of the vocabulary "
                             f"[0, {model_config.vocab_size})")
        if not valid[:, -1].all():
            raise ValueError("prompts must be left-padded: prompt_mask[:, -1] must be 1 "
                             "for every row")


def _filter_and_sample(logits, key, sampling: SamplingConfig):
    """Draws one token per row from logits `[B, V]`; returns (token, its log-prob)."""
    if sampling.temperature == 0:
        token = jnp.argmax(logits, axis=-1)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
    scaled = logits / sampling.temperature
    if sampling.top_k:
        kth = jax.lax.top_k(scaled, sampling.top_k)[0][:, -1:]
        scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    if sampling.top_p < 1.0:
        # Keep the smallest prefix of the sorted distribution whose mass reaches top_p.
        sorted_logits = jnp.sort(scaled, axis=-1)[:, ::-1]
        sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        keep = mass_before < sampling.top_p
        threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        scaled = jnp.where(scaled < threshold, -jnp.inf, scaled)
    logp = jax.nn.log_softmax(scaled, axis=-1)
    token = jax.random.categorical(key, scaled, axis=-1)
    return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]


def _row_limits(max_new_per_row, batch, n):
    if max_new_per_row is None:
        return jnp.full((batch,), n, jnp.int32)
    chex.assert_shape(max_new_per_row, (batch,))
    return jnp.minimum(max_new_per_row.astype(jnp.int32), n)


def _decode_loop(step_logits, first_logits, key, sampling, row_limit, state):
    """Shared scan: sample, record, advance; `step_logits(state, token, t, active)`.
    Returns (generation, the final state)."""
    n = sampling.max_new_tokens
    stops = jnp.asarray(sampling.stop_tokens or (-1,), jnp.int32)

    def body(carry, t):
        state, logits, done, key = carry
        key, sub = jax.random.split(key)
        if sampling.logit_noise_std > 0:
            noise = jax.random.normal(jax.random.fold_in(sub, 1), logits.shape, jnp.float32)
            logits = logits.astype(jnp.float32) + sampling.logit_noise_std * noise
        token, logp = _filter_and_sample(logits, sub, sampling)
        active = ~done
        token = jnp.where(active, token, sampling.pad_id).astype(jnp.int32)
        logp = jnp.where(active, logp, 0.0)
        done = done | (active & jnp.isin(token, stops)) | (t + 1 >= row_limit)
        state, logits = step_logits(state, token, t, active)
        return (state, logits, done, key), (token, logp, active)

    done0 = row_limit <= 0
    (state, _, _, _), (tokens, logps, mask) = jax.lax.scan(
        body, (state, first_logits, done0, key), jnp.arange(n))
    tokens, logps, mask = tokens.T, logps.T, mask.T
    return Generation(tokens=tokens, logprobs=logps.astype(jnp.float32), mask=mask,
                      lengths=mask.sum(axis=1).astype(jnp.int32)), state


def _inference_model(params, model_config, sampling):
    """The module and its parameters cast to the sampler's dtype (bf16: the inference engine)."""
    dtype = jnp.dtype(sampling.dtype)
    return Qwen2LM(model_config, dtype=dtype), {"params": cast_params(params, dtype)}


@flax.struct.dataclass
class TurnCache:
    """A KV cache that a sequence keeps across calls (multi-turn rollouts).

    ``kv_valid [B, S]`` marks the slots that hold tokens of the sequence (holes and pads are
    masked), ``next_position [B]`` = the number of valid slots = the RoPE position of the
    row's next token. Attention sees only valid slots at or before a query's slot, so a
    sequence spread over the slots with holes is the same sequence as its compact form.
    """

    cache: KVCache
    kv_valid: jax.Array
    next_position: jax.Array

    @classmethod
    def empty(cls, model_config: Qwen2Config, batch: int, num_slots: int, dtype: str):
        return cls(cache=KVCache.zeros(model_config, batch, num_slots, jnp.dtype(dtype)),
                   kv_valid=jnp.zeros((batch, num_slots), bool),
                   next_position=jnp.zeros(batch, jnp.int32))


def _prefill(model, variables, turn_cache: TurnCache, tokens, mask, slot):
    """Writes the left-padded block ``tokens [B, N]`` (``mask``) at slots ``slot..slot+N-1``
    with positions ``next_position + cumsum(mask) - 1``; returns (logits of the block's last
    slot ``[B, V]``, the cache)."""
    kv_valid = jax.lax.dynamic_update_slice(turn_cache.kv_valid, mask.astype(bool), (0, slot))
    positions = turn_cache.next_position[:, None] + positions_from_mask(mask)
    logits, cache = model.apply(variables, tokens, positions, kv_valid, turn_cache.cache, slot,
                                logits_for="last")
    count = mask.astype(jnp.int32).sum(axis=1)
    return logits[:, -1], TurnCache(cache, kv_valid, turn_cache.next_position + count)


def _decode_into(model, variables, sampling, turn_cache: TurnCache, first_logits, slot, key,
                 row_limit):
    """Decodes ``sampling.max_new_tokens`` steps into slots ``slot, slot+1, …`` (token t at
    position ``next_position + t``; a row's slots after its stop are masked); returns
    (generation, the cache holding the generated tokens)."""
    start = turn_cache.next_position

    def step(state, token, t, active):
        cache, kv_valid = state
        kv_valid = jax.lax.dynamic_update_slice(kv_valid, active[:, None], (0, slot + t))
        logits, cache = model.apply(variables, token[:, None], (start + t)[:, None], kv_valid,
                                    cache, slot + t)
        return (cache, kv_valid), logits[:, 0]

    gen, (cache, kv_valid) = _decode_loop(step, first_logits, key, sampling, row_limit,
                                          (turn_cache.cache, turn_cache.kv_valid))
    return gen, TurnCache(cache, kv_valid, start + gen.lengths)


@functools.partial(jax.jit, static_argnames=("model_config", "sampling"))
def _generate_cached(params, model_config, sampling, prompt_tokens, prompt_mask, key,
                     max_new_per_row):
    model, variables = _inference_model(params, model_config, sampling)
    b, p = prompt_tokens.shape
    empty = TurnCache.empty(model_config, b, p + sampling.max_new_tokens, sampling.dtype)
    logits, turn_cache = _prefill(model, variables, empty, prompt_tokens, prompt_mask, 0)
    gen, _ = _decode_into(model, variables, sampling, turn_cache, logits, p, key,
                          _row_limits(max_new_per_row, b, sampling.max_new_tokens))
    return gen


@functools.partial(jax.jit, static_argnames=("model_config", "sampling"))
def prefill_cache(params, model_config: Qwen2Config, sampling: SamplingConfig,
                  turn_cache: TurnCache, tokens, mask, slot):
    """Appends the left-padded block ``tokens [B, N]`` (``mask``) to the cached sequences
    at slots ``slot..slot+N-1``; returns (next-token logits ``[B, V]`` after each row's last
    token — of the block's last slot, so a row with no new token gets meaningless logits —,
    the cache). The caller owns the slot layout: blocks in attention order, no overlap."""
    model, variables = _inference_model(params, model_config, sampling)
    return _prefill(model, variables, turn_cache, tokens, mask, slot)


@functools.partial(jax.jit, static_argnames=("model_config", "sampling"))
def decode_cache(params, model_config: Qwen2Config, sampling: SamplingConfig,
                 turn_cache: TurnCache, logits, slot, key, max_new_per_row=None):
    """Samples ``sampling.max_new_tokens`` steps from ``logits [B, V]`` into slots
    ``slot..slot+max_new_tokens-1`` (after every slot in use); returns (Generation, cache).
    :func:`prefill_cache` then this on an empty cache is :func:`generate`; on valid slots
    equal to a fresh prompt it equals :func:`generate` on that prompt up to the summation
    order of the softmax over a differently sized masked cache (fp32 log-probs: < 1e-6
    apart in tests/test_llm_multiturn_cache.py)."""
    model, variables = _inference_model(params, model_config, sampling)
    return _decode_into(model, variables, sampling, turn_cache, logits, slot, key,
                        _row_limits(max_new_per_row, logits.shape[0], sampling.max_new_tokens))


@functools.partial(jax.jit, static_argnames=("model_config", "sampling"))
def _generate_uncached(params, model_config, sampling, prompt_tokens, prompt_mask, key,
                       max_new_per_row):
    model, variables = _inference_model(params, model_config, sampling)
    b, p = prompt_tokens.shape
    n = sampling.max_new_tokens
    buffer = jnp.concatenate([prompt_tokens, jnp.full((b, n), sampling.pad_id,
                                                      prompt_tokens.dtype)], axis=1)
    valid = jnp.concatenate([prompt_mask.astype(bool), jnp.zeros((b, n), bool)], axis=1)

    def full_forward_logits(buffer, valid, slot):
        logits, _ = model.apply(variables, buffer, positions_from_mask(valid), valid)
        return jax.lax.dynamic_index_in_dim(logits, slot, axis=1, keepdims=False)

    def step(state, token, t, active):
        buffer, valid = state
        buffer = jax.lax.dynamic_update_slice(buffer, token[:, None].astype(buffer.dtype),
                                              (0, p + t))
        valid = jax.lax.dynamic_update_slice(valid, active[:, None], (0, p + t))
        return (buffer, valid), full_forward_logits(buffer, valid, p + t)

    return _decode_loop(step, full_forward_logits(buffer, valid, p - 1), key, sampling,
                        _row_limits(max_new_per_row, b, n), (buffer, valid))[0]


def generate(params, model_config: Qwen2Config, sampling: SamplingConfig, prompt_tokens,
             prompt_mask, key, max_new_per_row=None, use_cache: bool = True) -> Generation:
    """Samples continuations of left-padded prompts `[B, P]` (jitted; KV cache by default).

    `max_new_per_row [B]` caps each row's length (<= sampling.max_new_tokens).
    `use_cache=False` recomputes the whole prefix every step (reference / benchmark baseline).
    """
    _check_inputs(model_config, prompt_tokens, prompt_mask,
                  prompt_tokens.shape[1] + sampling.max_new_tokens)
    fn = _generate_cached if use_cache else _generate_uncached
    return fn(params, model_config, sampling, prompt_tokens, prompt_mask, key, max_new_per_row)


def join_prompt_and_generation(prompt_tokens, prompt_mask, generation: Generation):
    """Concatenates prompt and generation into the `[B, P+N]` tokens / mask of the trainer."""
    tokens = jnp.concatenate([prompt_tokens, generation.tokens.astype(prompt_tokens.dtype)], 1)
    mask = jnp.concatenate([prompt_mask.astype(bool), generation.mask.astype(bool)], axis=1)
    return tokens, mask


# Tokens per chunk of the training forward's LM head (our default: 4096 tokens of fp32 logits
# are 2.5 GB at Qwen2.5's V = 151,936, against ~70 GB for a 128 × 142 minibatch in one piece).
LOGPROB_CHUNK_TOKENS = 4096


def _head_logprobs_and_entropy(model, params, hidden, targets, temperature):
    """log π(target) and H(π) of ``[N, H]`` hidden states (π = softmax(head(h) / temperature))."""
    logits = model.apply({"params": params}, hidden, method=Qwen2LM.logits) / temperature
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, targets[:, None], axis=-1)[:, 0]
    return logp, -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)


def token_logprobs_and_entropy(params, model_config: Qwen2Config, tokens, mask,
                               temperature: float = 1.0,
                               chunk_tokens: int = LOGPROB_CHUNK_TOKENS, remat: bool = False,
                               dtype: str = "float32"):
    """Training-engine forward in float32 (``dtype``: the compute dtype, e.g. ``"bfloat16"``
    for a bf16 update; the log-softmax stays float32).

    Returns `(logprobs, entropy)`, both `[B, T]`: entry t refers to the distribution
    softmax(logits_{t-1} / temperature) that predicts token t from tokens < t;
    logprobs[b, t] = log pi(tokens[b, t] | tokens[b, <t]), entropy[b, t] = H(that distribution).
    Entries are 0 where token t or token t-1 is masked (and at t = 0).

    The LM head runs on ``chunk_tokens`` (row, position) pairs at a time, each chunk
    rematerialised in the backward pass, so no ``[B, T, V]`` float32 array exists (peak
    ``chunk_tokens · V``); a batch of at most ``chunk_tokens`` predicted tokens is one chunk.
    ``remat`` rematerialises each decoder layer in the backward pass (``Qwen2LM.remat``).
    """
    chex.assert_rank([tokens, mask], 2)
    chex.assert_equal_shape([tokens, mask])
    if tokens.shape[1] > model_config.max_position_embeddings:
        raise ValueError(f"sequence length {tokens.shape[1]} exceeds the context "
                         f"max_position_embeddings={model_config.max_position_embeddings}")
    if not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be an integer >= 1, got {chunk_tokens!r}")
    mask = mask.astype(bool)
    model = Qwen2LM(model_config, dtype=jnp.dtype(dtype), remat=remat)
    hidden, _ = model.apply({"params": params}, tokens, positions_from_mask(mask), mask,
                            logits_for="none")
    b, t = tokens.shape
    hidden = hidden[:, :-1].reshape(b * (t - 1), -1)
    targets = tokens[:, 1:].reshape(-1)
    count = b * (t - 1)
    if count <= chunk_tokens:
        logp, entropy = _head_logprobs_and_entropy(model, params, hidden, targets, temperature)
    else:
        chunks = -(-count // chunk_tokens)
        pad = chunks * chunk_tokens - count
        hidden = jnp.pad(hidden, ((0, pad), (0, 0))).reshape(chunks, chunk_tokens, -1)
        targets = jnp.pad(targets, (0, pad)).reshape(chunks, chunk_tokens)
        head = jax.checkpoint(lambda h, y: _head_logprobs_and_entropy(model, params, h, y,
                                                                      temperature))
        _, (logp, entropy) = jax.lax.scan(lambda c, xs: (c, head(*xs)), None,
                                          (hidden, targets))
        logp, entropy = logp.reshape(-1)[:count], entropy.reshape(-1)[:count]
    valid = mask[:, 1:] & mask[:, :-1]
    pad = jnp.zeros((b, 1), jnp.float32)
    return (jnp.concatenate([pad, jnp.where(valid, logp.reshape(b, t - 1), 0.0)], axis=1),
            jnp.concatenate([pad, jnp.where(valid, entropy.reshape(b, t - 1), 0.0)], axis=1))
