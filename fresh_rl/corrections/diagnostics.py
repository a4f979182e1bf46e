"""Diagnostics shared by every loss: masked means, approximate KL, ESS, TV and ratio statistics.

All functions take a log-ratio ``log r = log π_θ − log π_ref`` (or weights) and an explicit
boolean ``mask`` of valid entries, any shape, and return scalars. They never carry gradient:
inputs are wrapped in ``stop_gradient`` so that metrics can be computed inside a loss
without changing its gradient.

References: J. Schulman, "Approximating KL Divergence" (2020, blog) for k1/k2/k3;
Kong (1992) / Owen (2013, ch. 9) for the effective sample size; VACO (arXiv 2603.01365,
the TV estimate of Eq. 5 of its ICLR 2026 submission; docs/vaco.md) for ``tv_estimate``;
Owen (2013, ch. 9) for its importance-sampled form ``tv_estimate_weighted``.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import chex
import jax
import jax.numpy as jnp

from fresh_rl.corrections._validation import check_per_token
from fresh_rl.validation import check_in_range


def masked_sum(x: chex.Array, mask: chex.Array) -> chex.Array:
    """``Σ_i m_i x_i`` with masked-out entries replaced by 0 (so NaN/inf there cannot leak)."""
    return jnp.sum(jnp.where(mask, x, 0.0))


def valid_count(mask: chex.Array) -> chex.Array:
    """``Σ_i m_i`` as float32."""
    return jnp.sum(mask.astype(jnp.float32))


def masked_mean(x: chex.Array, mask: chex.Array) -> chex.Array:
    """``Σ_i m_i x_i / max(Σ_i m_i, 1)``: the mean over valid entries, 0 if none is valid."""
    return masked_sum(x, mask) / jnp.maximum(valid_count(mask), 1.0)


def fraction(flags: chex.Array, mask: chex.Array) -> chex.Array:
    """Fraction of valid entries whose boolean ``flags`` is set (clip, mask, reject fractions)."""
    return masked_mean(flags.astype(jnp.float32), mask)


def tv_estimate(log_ratio: chex.Array, mask: Optional[chex.Array] = None) -> chex.Array:
    """Monte-Carlo total-variation estimate ``D̂ = ½ · mean_i |r_i − 1|``, ``r = exp(log_ratio)``.

    With actions drawn from π_ref this estimates TV(π_θ, π_ref) = ½ E_{π_ref}|π_θ/π_ref − 1|
    (VACO, arXiv 2603.01365, Eq. 5 of the submission; TVPO's ``tv``).
    """
    mask = check_per_token([log_ratio], mask)
    ratio = jnp.exp(jax.lax.stop_gradient(log_ratio))
    return 0.5 * masked_mean(jnp.abs(ratio - 1.0), mask)


def tv_estimate_weighted(log_ratio_p: chex.Array, log_ratio_q: chex.Array,
                         mask: Optional[chex.Array] = None) -> chex.Array:
    """Importance-sampled total variation between two policies from a third one's actions:
    ``½ · mean_i |p(a_i)/β(a_i) − q(a_i)/β(a_i)|`` with ``log_ratio_p = log p − log β`` and
    ``log_ratio_q = log q − log β``.

    With actions drawn from β this is unbiased for TV(p, q) = ½ E_β|p/β − q/β| wherever β covers
    p and q; a single draw is unbounded where β is improbable, the expectation is in [0, 1]. With
    q = β it is :func:`tv_estimate` of ``log_ratio_p``.
    """
    mask = check_per_token([log_ratio_p, log_ratio_q], mask)
    ratio_p = jnp.exp(jax.lax.stop_gradient(log_ratio_p))
    ratio_q = jnp.exp(jax.lax.stop_gradient(log_ratio_q))
    return 0.5 * masked_mean(jnp.abs(ratio_p - ratio_q), mask)


def approx_kl(log_ratio: chex.Array, mask: Optional[chex.Array] = None) -> dict[str, chex.Array]:
    """Sample estimates of KL(π_ref ‖ π_θ) from actions drawn from π_ref (Schulman 2020).

    With ``log r = log π_θ − log π_ref``:
      k1 = −log r            (unbiased, can be negative),
      k2 = ½ (log r)²        (biased, low variance, ≥ 0),
      k3 = (r − 1) − log r   (unbiased, low variance, ≥ 0).
    Returns the masked means under keys ``kl_k1``, ``kl_k2``, ``kl_k3``.
    """
    mask = check_per_token([log_ratio], mask)
    log_r = jnp.where(mask, jax.lax.stop_gradient(log_ratio), 0.0)
    return {
        "kl_k1": masked_mean(-log_r, mask),
        "kl_k2": masked_mean(0.5 * jnp.square(log_r), mask),
        "kl_k3": masked_mean(jnp.expm1(log_r) - log_r, mask),
    }


def effective_sample_size(weights: chex.Array, mask: Optional[chex.Array] = None) -> chex.Array:
    """Normalised effective sample size ``(Σ w)² / (N · Σ w²) ∈ (0, 1]`` of importance weights.

    Kish's ESS divided by the number N of valid entries (Kong 1992; verl reports the same
    quantity as ``rollout_is_eff_sample_size`` = 1/mean(w̃²) with w̃ = w/mean(w)).
    Equals 1 when all weights are equal. Returns 1 when no entry is valid. Valid weights must
    be >= 0 (concrete: ``ValueError``; traced: under :func:`fresh_rl.checked`).
    """
    mask = check_per_token([weights], mask)
    check_in_range("weights", weights, 0.0, math.inf, where=mask)
    w = jnp.where(mask, jax.lax.stop_gradient(weights), 0.0)
    n = valid_count(mask)
    sum_w = jnp.sum(w)
    sum_w2 = jnp.sum(jnp.square(w))
    ess = jnp.square(sum_w) / jnp.maximum(n * sum_w2, jnp.finfo(w.dtype).tiny)
    return jnp.where(n > 0, ess, 1.0)


def ratio_statistics(log_ratio: chex.Array, mask: Optional[chex.Array] = None) -> dict[str, chex.Array]:
    """Mean, standard deviation, min and max of ``r = exp(log_ratio)`` over valid entries.

    Keys ``ratio_mean``, ``ratio_std``, ``ratio_min``, ``ratio_max``, plus ``log_ratio_abs_mean``
    (mean |log r|, the drift measure to log for the EWMA reference; docs/old_logits.md).
    With no valid entry, min and max are reported as 1.
    """
    mask = check_per_token([log_ratio], mask)
    log_r = jnp.where(mask, jax.lax.stop_gradient(log_ratio), 0.0)
    ratio = jnp.exp(log_r)
    mean = masked_mean(ratio, mask)
    var = masked_mean(jnp.square(ratio - mean), mask)
    any_valid = jnp.any(mask)
    return {
        "ratio_mean": mean,
        "ratio_std": jnp.sqrt(var),
        "ratio_min": jnp.where(any_valid, jnp.min(jnp.where(mask, ratio, jnp.inf)), 1.0),
        "ratio_max": jnp.where(any_valid, jnp.max(jnp.where(mask, ratio, -jnp.inf)), 1.0),
        "log_ratio_abs_mean": masked_mean(jnp.abs(log_r), mask),
    }


def policy_diagnostics(log_ratio: chex.Array, mask: Optional[chex.Array] = None) -> dict[str, chex.Array]:
    """The ratio diagnostics every loss reports, for ``log r = log π_θ − log π_ref``.

    Keys: ``tv`` (½ mean|r − 1|), ``kl_k1``, ``kl_k2``, ``kl_k3``, ``ess`` (of the weights r),
    and the ``ratio_*`` statistics; see the individual functions for formulas.
    """
    mask = check_per_token([log_ratio], mask)
    return {
        "tv": tv_estimate(log_ratio, mask),
        **approx_kl(log_ratio, mask),
        "ess": effective_sample_size(jnp.exp(jnp.where(mask, log_ratio, 0.0)), mask),
        **ratio_statistics(log_ratio, mask),
    }


def version_lag_statistics(
    behaviour_versions: chex.Array,
    current_version: Union[int, chex.Array],
    mask: Optional[chex.Array] = None,
) -> dict[str, chex.Array]:
    """Policy-version lag ``current_version − v_behav`` of the valid samples / tokens.

    ``behaviour_versions`` are the integer version tags written at collection time (per
    sample, or per token for partial rollouts). Returns ``version_gap_mean`` and ``version_gap_max``
    (0 when nothing is valid) — the lag diagnostics every run logs (docs/README.md, conventions).
    """
    chex.assert_type(behaviour_versions, int)
    if mask is None:
        mask = jnp.ones(behaviour_versions.shape, dtype=bool)
    chex.assert_type(mask, bool)
    chex.assert_equal_shape([behaviour_versions, mask])
    lag = (jnp.asarray(current_version) - behaviour_versions).astype(jnp.float32)
    return {
        "version_gap_mean": masked_mean(lag, mask),
        "version_gap_max": jnp.max(jnp.where(mask, lag, 0.0), initial=0.0),
    }
