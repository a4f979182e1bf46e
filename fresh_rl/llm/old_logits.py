"""The LLM pipeline's side of the old-log-prob routes (arXiv 2605.12070) and their costs.

A token y_t sampled by the inference engine at policy version v needs the *training-side*
old log-prob log π_train^(v)(y_t) so that the decoupled loss can split the total ratio into
r_d = π_train^(v)/π_infer^(v) (MIS mask / TIS) and r_s = π_θ/π_train^(v) (PPO clip)
(docs/old_logits.md). The routes themselves, and what each needs, are the one registry every
trainer shares, :data:`fresh_rl.corrections.routes.ROUTES` (selected by
``AsyncConfig.old_logit_route``). A route calls its trainer's
:class:`~fresh_rl.corrections.routes.RouteSources`; :class:`RouteContext` is the LLM
pipeline's, and this module holds the forward passes behind it:

* ``stored_behaviour`` — the sampler's bf16 log-probs π_infer (route ``behaviour``: r_d ≡ 1).
* ``current`` — fp32 forward of the learner's parameters θ_k at batch start
  (``recompute_current``: r̂_d = r_d · π_train^(k)/π_train^(v) absorbs the staleness).
* ``snapshot`` (exact) — the ring keeps the last W+1 versions; one fp32 forward per version
  present in the batch, each token keeping the value of its own version tag
  (:func:`snapshot_logprobs`).
* ``collected`` (exact) — the fp32 log-probs the sampler wrote for each finished segment
  under its own version (``old_logit_model`` and ``interrupt``). In this single-process
  simulator the engine switches versions for all rows at once, so the two routes run the
  same forward at the same point (``collect_segment_old_logprobs`` of
  :func:`fresh_rl.llm.async_pipeline.versioned_policy`); they differ in what a real system
  holds and pauses, which the registry's ``param_copies`` and the overhead table account for.
* ``proxy_alpha`` — α = (k − v)/(k + 1 − v) of the A-3PO interpolation proxies
  (``linear_proxy`` / ``loglinear_proxy``, Proposition 1; :func:`proxy_alpha`); the loss
  interpolates per minibatch, no forward pass.
* ``ewma`` — fp32 forward of θ_ref, the EWMA of the learner's versions (revised PPO-EWMA);
  with ``reset``, θ_ref ← θ_k when the active-token fraction under θ_ref falls below
  ``hparams.ewma_reset_threshold`` and the batch is re-scored with θ_k (our choice of the two
  options; docs/old_logits.md) (:func:`ewma_logprobs`).

The pipeline reads only the registry (parameter copies with one actor group, collection-time
scoring, the proximal proxy of the loss, whether θ_ref is carried), so a route registered with
:func:`fresh_rl.corrections.routes.register_route` runs here with no other edit.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp

from fresh_rl.corrections import (EWMAReference, MISConfig, ewma_maybe_reset, fraction,
                                  interpolation_weight, mis_mask)
from fresh_rl.corrections.routes import RouteOutput
from fresh_rl.lag.version_ring import VersionRing
from fresh_rl.llm.model import Qwen2Config, cast_params
from fresh_rl.llm.sampler import token_logprobs_and_entropy


def fp32_logprobs(params, model_config: Qwen2Config, tokens, mask, temperature: float):
    """``[B, T]`` training-engine (fp32) log-probs of ``tokens`` under ``params``, cast up to
    float32 first (a bf16-stored snapshot or θ_ref runs the same fp32 forward)."""
    return token_logprobs_and_entropy(cast_params(params, jnp.float32), model_config, tokens,
                                      mask, temperature=temperature)[0]


def snapshot_logprobs(ring: VersionRing, tokens, mask, versions, action_mask, *,
                      model_config: Qwen2Config, temperature: float):
    """Exact old log-probs from the version snapshots (docs/old_logits.md, routes).

    For each ring slot whose version tags some action token, one fp32 forward of the full
    sequences with that version; token t keeps the value of the slot with
    ``versions[t]``. Slots not used by the batch are skipped (``lax.cond``; under ``vmap``
    both branches run). Returns ``(old [B, T], forwards)`` with ``forwards`` the number of
    versions evaluated.
    """
    def one_slot(old, slot):
        version = ring.versions[slot]
        rows = action_mask & (versions == version) & (version >= 0)
        used = jnp.any(rows)
        params = jax.tree_util.tree_map(lambda buf: buf[slot], ring.params)
        logp = jax.lax.cond(used, lambda: fp32_logprobs(params, model_config, tokens, mask,
                                                        temperature),
                            lambda: jnp.zeros(tokens.shape, jnp.float32))
        return jnp.where(rows, logp, old), used

    old, used = jax.lax.scan(one_slot, jnp.zeros(tokens.shape, jnp.float32),
                             jnp.arange(ring.capacity))
    return old, jnp.sum(used.astype(jnp.int32))


def proxy_alpha(versions, action_mask, learner_version):
    """Per-token α = (k − v)/(k + 1 − v) of the interpolation proxies (0 off the actions).

    v = the token's version tag, k = ``learner_version`` (the proximal version: the
    parameters at batch start), k + 1 = the version being optimised
    (:func:`fresh_rl.corrections.interpolation_weight`; AReaL ``prox_logp_method``).
    """
    alpha = interpolation_weight(versions, learner_version, learner_version + 1)
    return jnp.where(action_mask, alpha, 0.0)


def ewma_logprobs(reference: EWMAReference, params, tokens, mask, behaviour_log_probs,
                  action_mask, *, model_config: Qwen2Config, temperature: float,
                  mis: MISConfig, reset_threshold=None):
    """Revised PPO-EWMA old log-probs π_ref = π_{θ_ref} with auto-reset (docs/old_logits.md).

    ρ_active is the fraction of action tokens the MIS rules keep for
    r̃_d = π_ref/π_infer. If ``reset_threshold`` = τ_reset is given (may be traced) and
    ρ_active < τ_reset, θ_ref ← θ (``params``, the learner at batch start) and the batch is
    re-scored with it. Returns ``(old [B, T], reference, reset (bool), forwards)``.
    """
    forward = lambda p: fp32_logprobs(p, model_config, tokens, mask, temperature)  # noqa: E731
    old = forward(reference.params)
    if reset_threshold is None:
        return old, reference, jnp.zeros((), bool), jnp.ones((), jnp.int32)
    kept, _ = mis_mask(old - behaviour_log_probs, action_mask, mis)
    new_reference = ewma_maybe_reset(reference, params, fraction(kept, action_mask),
                                     threshold=reset_threshold)
    reset = new_reference.reset_count > reference.reset_count
    old = jax.lax.cond(reset, lambda: forward(params), lambda: old)
    return old, new_reference, reset, 1 + reset.astype(jnp.int32)


def param_bytes(params: Any, dtype: Optional[Any] = None) -> int:
    """Bytes of one copy of ``params`` stored in ``dtype`` (default: each leaf's own dtype;
    4 per entry for the fp32 training parameters, 2 for bfloat16)."""
    return int(sum(leaf.size * jnp.dtype(dtype or leaf.dtype).itemsize
                   for leaf in jax.tree_util.tree_leaves(params)))


# --------------------------------------------------------------------------- route sources


@dataclasses.dataclass(frozen=True)
class RouteContext:
    """The LLM pipeline's :class:`~fresh_rl.corrections.routes.RouteSources` (traced arrays
    inside the jitted iteration).

    Attributes:
      params: the learner's parameters θ_k at batch start.
      ring: the version ring (the sampler's weights and the snapshots).
      ewma_reference: θ_ref (:class:`~fresh_rl.corrections.EWMAReference`) for routes with
        ``uses_ewma``, else ``None``.
      hparams: the run's :class:`fresh_rl.llm.hparams.LLMHyperParams` (traced scalars).
      episodes: the collected :class:`~fresh_rl.llm.rollout.Episodes`.
      action_mask: ``[B, T]`` action tokens of played turns.
      behaviour_log_probs: ``[B, T]`` sampler log-probs π_infer (0 off the actions).
      versions: ``[B, T]`` int32 version tag of each action token.
      config, model_config: the trainer's static settings.
      segments: the static number of decoding segments an episode can have (turns × chunks).
    """

    params: Any
    ring: VersionRing
    ewma_reference: Optional[EWMAReference]
    hparams: Any
    episodes: Any
    action_mask: jax.Array
    behaviour_log_probs: jax.Array
    versions: jax.Array
    config: Any
    model_config: Qwen2Config
    segments: int

    def forward(self, params) -> jax.Array:
        """``[B, T]`` fp32 log-probs of the batch under ``params``."""
        return fp32_logprobs(params, self.model_config, self.episodes.tokens,
                             self.episodes.mask, self.config.temperature)

    def stored_behaviour(self) -> jax.Array:
        return self.behaviour_log_probs

    def current(self) -> RouteOutput:
        return RouteOutput(old=self.forward(self.params), forwards=jnp.ones((), jnp.int32))

    def snapshot(self) -> RouteOutput:
        old, forwards = snapshot_logprobs(self.ring, self.episodes.tokens, self.episodes.mask,
                                          self.versions, self.action_mask,
                                          model_config=self.model_config,
                                          temperature=self.config.temperature)
        return RouteOutput(old=old, forwards=forwards)

    def collected(self) -> RouteOutput:
        """The segment log-probs the sampler wrote; one forward per segment that has tokens."""
        segments = self.episodes.token_extras["segment"]
        used = jax.vmap(lambda s: jnp.any(self.action_mask & (segments == s)))(
            jnp.arange(1, self.segments + 1))
        return RouteOutput(old=self.episodes.token_extras["old_logprobs"],
                           forwards=jnp.sum(used.astype(jnp.int32)))

    def proxy_alpha(self) -> jax.Array:
        return proxy_alpha(self.versions, self.action_mask, self.ring.latest_version)

    def ewma(self, reset: bool) -> RouteOutput:
        old, reference, did_reset, forwards = ewma_logprobs(
            self.ewma_reference, self.params, self.episodes.tokens, self.episodes.mask,
            self.behaviour_log_probs, self.action_mask, model_config=self.model_config,
            temperature=self.config.temperature, mis=self.config.mis,
            reset_threshold=self.hparams.ewma_reset_threshold if reset else None)
        return RouteOutput(old=old, forwards=forwards, ewma=reference, reset=did_reset)


__all__ = ["RouteContext", "ewma_logprobs", "fp32_logprobs", "param_bytes", "proxy_alpha",
           "snapshot_logprobs"]
