"""Old-logit routes of the asynchronous pipeline and their costs (arXiv 2605.12070).

A token y_t sampled by the inference engine at policy version v needs the *training-side*
old log-prob log π_train^(v)(y_t) so that the decoupled loss can split the total ratio into
r_d = π_train^(v)/π_infer^(v) (MIS mask / TIS) and r_s = π_θ/π_train^(v) (PPO clip)
(papers/old_logits.md §1.2–1.3). Routes, selected by ``AsyncConfig.old_logit_route``:

* ``recompute_current`` — fp32 forward of the learner's *current* parameters θ_k: the
  failure of §1.5, r̂_d = r_d · π_train^(k)/π_train^(v) absorbs the staleness.
* ``snapshot`` (exact, §3.1) — the ring keeps the last W+1 versions; at train time one fp32
  forward per version present in the batch, each token keeping the value of its own
  version tag (:func:`snapshot_logprobs`).
* ``old_logit_model`` (exact, §3.2) — a dedicated fp32 copy that follows the inference
  version scores every segment when it finishes, during collection.
* ``interrupt`` (exact, §3.3) — before each weight switch, a forward over the in-flight
  prefixes with the still-resident version, during collection. In this single-process
  simulator the engine switches versions for all rows at once, so ``old_logit_model`` and
  ``interrupt`` run the same forward at the same point (``collect_segment_old_logprobs`` of
  :func:`fresh_rl.llm.async_pipeline.versioned_policy`); they differ in what a real system
  holds and pauses, which :func:`route_param_copies` and the overhead table account for.
* ``linear_proxy`` / ``loglinear_proxy`` (§2) — A-3PO interpolation between π_infer and the
  detached π_θ of each minibatch with α = (v_prox − v)/(v_θ − v), v_prox = k (the learner
  version at batch start, AReaL's "one step behind π_θ"), v_θ = k + 1 (:func:`proxy_alpha`);
  no forward pass.
* ``ewma`` / ``ewma_no_reset`` (§4.2) — fp32 forward of θ_ref, the EWMA of the learner's
  versions; ``ewma`` resets θ_ref ← θ_k when the active-token fraction under θ_ref falls
  below τ and then recomputes this batch with θ_k (our choice of the two options in §4.2),
  ``ewma_no_reset`` never resets (:func:`ewma_logprobs`).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from fresh_rl.corrections import (EWMAConfig, EWMAReference, MISConfig, ewma_maybe_reset,
                                  fraction, interpolation_weight, mis_mask)
from fresh_rl.lag.version_ring import VersionRing
from fresh_rl.llm.model import Qwen2Config
from fresh_rl.llm.sampler import token_logprobs_and_entropy

ROUTES = ("recompute_current", "snapshot", "old_logit_model", "interrupt", "linear_proxy",
          "loglinear_proxy", "ewma", "ewma_no_reset")
EXACT_ROUTES = ("snapshot", "old_logit_model", "interrupt")
COLLECTION_ROUTES = ("old_logit_model", "interrupt")  # old log-probs computed while sampling
PROXY_ROUTES = {"linear_proxy": "linear", "loglinear_proxy": "loglinear"}
EWMA_ROUTES = ("ewma", "ewma_no_reset")


def fp32_logprobs(params, model_config: Qwen2Config, tokens, mask, temperature: float):
    """``[B, T]`` training-engine (fp32) log-probs of ``tokens`` under ``params``."""
    return token_logprobs_and_entropy(params, model_config, tokens, mask,
                                      temperature=temperature)[0]


def snapshot_logprobs(ring: VersionRing, tokens, mask, versions, action_mask, *,
                      model_config: Qwen2Config, temperature: float):
    """Exact old log-probs from the version snapshots (old_logits.md §3.1).

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


def ewma_logprobs(reference: EWMAReference, params, tokens, mask, behaviour_logprobs,
                  action_mask, *, model_config: Qwen2Config, temperature: float,
                  mis: MISConfig, ewma: EWMAConfig):
    """Revised PPO-EWMA old log-probs π_ref = π_{θ_ref} with auto-reset (old_logits.md §4.2).

    ρ_active is the fraction of action tokens the MIS rules keep for
    r̃_d = π_ref/π_infer. If ``ewma.reset_active_fraction`` = τ is set and ρ_active < τ,
    θ_ref ← θ (``params``, the learner at batch start) and the batch is re-scored with it.
    Returns ``(old [B, T], reference, reset (bool), forwards)``.
    """
    forward = lambda p: fp32_logprobs(p, model_config, tokens, mask, temperature)  # noqa: E731
    old = forward(reference.params)
    if ewma.reset_active_fraction is None:
        return old, reference, jnp.zeros((), bool), jnp.ones((), jnp.int32)
    kept, _ = mis_mask(old - behaviour_logprobs, action_mask, mis)
    new_reference = ewma_maybe_reset(reference, params, fraction(kept, action_mask), ewma)
    reset = new_reference.reset_count > reference.reset_count
    old = jax.lax.cond(reset, lambda: forward(params), lambda: old)
    return old, new_reference, reset, 1 + reset.astype(jnp.int32)


def param_bytes(params: Any) -> int:
    """Bytes of one float32 (training-precision) copy of ``params``."""
    return int(sum(leaf.size * 4 for leaf in jax.tree_util.tree_leaves(params)))


def route_param_copies(route: str, staleness_window: int) -> int:
    """Parameter copies a route holds besides the learner's own (old_logits.md §3.4).

    snapshot: W + 1 (every version an in-flight or buffered token may carry, the current one
    included, since the learner overwrites it); old_logit_model: 1 (the dedicated replica);
    ewma / ewma_no_reset: 1 (θ_ref); the others: 0. The simulator's own ring of sampler
    versions (the inference engine) is not counted: a real system has it on other devices.
    """
    if route == "snapshot":
        return staleness_window + 1
    return 1 if route in ("old_logit_model",) + EWMA_ROUTES else 0


__all__ = ["COLLECTION_ROUTES", "EWMA_ROUTES", "EXACT_ROUTES", "PROXY_ROUTES", "ROUTES",
           "ewma_logprobs", "fp32_logprobs", "param_bytes", "proxy_alpha",
           "route_param_copies", "snapshot_logprobs"]
