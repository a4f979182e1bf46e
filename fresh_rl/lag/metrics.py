"""Per-batch measured lag: version gap, TV(π_T, β), ESS and approximate KL.

Every sample (or token, for partial rollouts) carries the behaviour log-prob
``log β(a|s)`` and the policy version that generated it (``BehaviourTags``). At the start of
optimisation on a batch the learner evaluates ``log π_T(a|s)`` on the same actions; with
``r = π_T/β = exp(log π_T − log β)`` (actions drawn from β)::

    version_gap  = v_T − v_β                     (mean and max over valid entries)
    tv           = ½ · mean |r − 1|              TV(π_T, β) estimate (VACO's backward lag)
    ess          = (Σ r)² / (N Σ r²) ∈ (0, 1]    normalised effective sample size of r
    kl_k1/k2/k3  = Schulman's estimates of KL(β ‖ π_T)

The formulas are those of ``fresh_rl.corrections.diagnostics`` (used here, not re-derived).
:func:`fit_ess_time_constant` fits the decay of ESS/n with the age of stored data.
"""

from __future__ import annotations

import math
from typing import Optional, Union

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fresh_rl.corrections.diagnostics import (
    approx_kl,
    effective_sample_size,
    fraction,
    tv_estimate,
    version_lag_statistics,
)
from fresh_rl.corrections._validation import check_per_token


@struct.dataclass
class BehaviourTags:
    """What an actor stores with every sample (or token).

    Attributes:
      log_prob: ``[...]`` float ``log β(a|s)`` of the action taken, under the acting version.
      version: ``[...]`` int32 policy version that acted (``version_ring.version_of``).
    """

    log_prob: jax.Array
    version: jax.Array


def lag_metrics(
    behaviour_log_probs: chex.Array,
    learner_log_probs: chex.Array,
    behaviour_versions: chex.Array,
    learner_version: Union[int, chex.Array],
    mask: Optional[chex.Array] = None,
) -> dict[str, jax.Array]:
    """Measured backward lag of one batch (scalars; no gradient flows through them).

    Args:
      behaviour_log_probs: ``[...]`` ``log β(a|s)`` stored at collection time.
      learner_log_probs: ``[...]`` ``log π_T(a|s)`` of the same actions under the learner.
      behaviour_versions: ``[...]`` int version tags, same shape.
      learner_version: the learner's version ``v_T`` (scalar).
      mask: optional ``[...]`` bool of valid entries (padding, finished episodes).

    Returns:
      ``version_gap_mean``, ``version_gap_max``, ``stale_fraction`` (share of valid entries with
      gap > 0), ``tv``, ``ess``, ``kl_k1``, ``kl_k2``, ``kl_k3``. With no valid entry: gaps,
      TV and KL are 0 and ESS is 1.
    """
    mask = check_per_token([behaviour_log_probs, learner_log_probs], mask)
    chex.assert_equal_shape([behaviour_log_probs, behaviour_versions])
    chex.assert_rank(jnp.asarray(learner_version), 0)
    log_ratio = jax.lax.stop_gradient(learner_log_probs - behaviour_log_probs)
    gaps = version_lag_statistics(behaviour_versions, learner_version, mask)
    ratio = jnp.exp(jnp.where(mask, log_ratio, 0.0))  # no inf from padded entries
    return {
        "version_gap_mean": gaps["version_gap_mean"],
        "version_gap_max": gaps["version_gap_max"],
        "stale_fraction": fraction(behaviour_versions != learner_version, mask),
        "tv": tv_estimate(log_ratio, mask),
        "ess": effective_sample_size(ratio, mask),
        **approx_kl(log_ratio, mask),
    }


def lag_metrics_from_tags(
    tags: BehaviourTags,
    learner_log_probs: chex.Array,
    learner_version: Union[int, chex.Array],
    mask: Optional[chex.Array] = None,
) -> dict[str, jax.Array]:
    """``lag_metrics`` with the behaviour log-probs and versions taken from ``tags``."""
    return lag_metrics(tags.log_prob, learner_log_probs, tags.version, learner_version, mask)


def fit_ess_time_constant(ages: np.ndarray, ess: np.ndarray, min_ess: float = 0.05) -> float:
    """Host-side τ_fit of stale data, ESS/n(age) ≈ exp(−age/τ) (the drift time scale FreshPER's
    τ is set against, arXiv 2604.16918 §3): least squares of log ESS/n on age through the origin,
    ``τ = −Σ a² / Σ a log e``, over ages ≥ 1 with ESS/n ≥ ``min_ess`` (our choice: below that
    the ESS carries no usable data and its log is dominated by the tail). ``inf`` when
    nothing decays."""
    ages, ess = np.asarray(ages, np.float64), np.asarray(ess, np.float64)
    keep = (ages >= 1) & np.isfinite(ess) & (ess >= min_ess)
    slope = np.sum(ages[keep] * np.log(ess[keep]))
    return math.inf if slope >= 0 else float(-np.sum(ages[keep] ** 2) / slope)
