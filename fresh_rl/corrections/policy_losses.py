"""Policy losses: PPO-clip, PPO-KL, SPO, IMPALA policy gradient, VACO TV filter, DPPO binary TV.

Shared conventions:

* Inputs are per-sample (per-token) arrays of one shape, any rank ≥ 1 (``[B, T]`` for
  sequences, ``[N]`` for a flat control minibatch): ``log_probs`` = log π_θ(a|s) (carries the
  gradient), a reference log-probability (detached), ``advantages`` (detached) and an
  optional boolean ``mask`` of valid entries (default: all valid).
* Masked-out entries are replaced by 0 *before* any arithmetic, so whatever they hold
  (padding, NaN) changes neither the loss nor its gradient; their gradient is exactly 0.
* Aggregation is the token mean over valid entries, ``Σ_i m_i ℓ_i / Σ_i m_i``: samples that a
  clip or filter removes count as zero-gradient samples, they do not re-weight the others.
* Every sample mask / filter is computed from ``stop_gradient`` values (detached).
* Each loss returns ``(loss, metrics)``. Metrics always hold ``loss``, ``active_fraction``
  (valid samples kept by the loss's own sample mask — 1 for losses without one),
  ``clip_fraction`` or ``mask_fraction``, and :func:`policy_diagnostics` of the ratio
  (``tv``, ``kl_k1/k2/k3``, ``ess``, ``ratio_*``).
* Static settings are frozen dataclasses validated at construction (``ValueError`` naming
  the field and its range); pass them as static arguments under ``jit``.
* Scalar arguments that may be traced (``kl_coef``, ``delta``) are range-checked when
  concrete (``ValueError``); traced, they are checked only with ``jit_checks=True`` or under
  :func:`fresh_rl.checked` (a ``checkify`` check, :mod:`fresh_rl.validation`), else each loss
  documents what a bad value does.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Union

import chex
import jax
import jax.numpy as jnp

from fresh_rl.corrections._validation import check_per_token
from fresh_rl.validation import check_in_range, require_choice, require_in_range
from fresh_rl.corrections.diagnostics import (fraction, masked_mean, masked_sum, policy_diagnostics, tv_estimate,
                                              tv_estimate_weighted, valid_count)

Metrics = dict[str, chex.Array]


def _prepare(log_probs, reference_log_probs, advantages, mask):
    """Check inputs, zero masked entries (so garbage cannot reach values or gradients),
    detach the reference and the advantages. Returns (log_ratio, advantages, mask)."""
    mask = check_per_token([log_probs, reference_log_probs, advantages], mask)
    log_probs = jnp.where(mask, log_probs, 0.0)
    reference_log_probs = jnp.where(mask, jax.lax.stop_gradient(reference_log_probs), 0.0)
    advantages = jnp.where(mask, jax.lax.stop_gradient(advantages), 0.0)
    return log_probs - reference_log_probs, advantages, mask


def _with_diagnostics(loss, log_ratio, mask, kept, **extra) -> tuple[chex.Array, Metrics]:
    """``(loss, metrics)`` with the keys every loss reports: ``loss``, ``active_fraction`` =
    |kept| / |valid|, the loss-specific ``extra`` entries and :func:`policy_diagnostics`."""
    metrics = {
        "loss": loss,
        "active_fraction": fraction(kept, mask),
        **extra,
        **policy_diagnostics(log_ratio, mask),
    }
    return loss, metrics


# --------------------------------------------------------------------------- PPO-clip


@dataclasses.dataclass(frozen=True)
class PPOClipConfig:
    """PPO-clip settings (Schulman et al. 2017, arXiv 1707.06347, Eq. 7).

    Attributes:
      epsilon_low: ε_low ≥ 0, lower clip 1 − ε_low (must be < 1).
      epsilon_high: ε_high ≥ 0, upper clip 1 + ε_high (``math.inf`` = no upper clip);
        ε_high > ε_low is DAPO's "clip-higher" (arXiv 2503.14476).
      dual_clip: c > 1 or ``None``. Dual clip (Ye et al. 2020, arXiv 1912.09729, dual-clip PPO)
        bounds the loss of A < 0 samples at −c·A, so a huge ratio cannot dominate.
    """

    epsilon_low: float = 0.2
    epsilon_high: float = 0.2
    dual_clip: Optional[float] = None

    def __post_init__(self):
        require_in_range("epsilon_low", self.epsilon_low, 0.0, 1.0, high_inclusive=False)
        require_in_range("epsilon_high", self.epsilon_high, 0.0, math.inf)
        if self.dual_clip is not None:
            require_in_range("dual_clip", self.dual_clip, 1.0, math.inf, low_inclusive=False)


def clipped_surrogate(
    ratio: chex.Array,
    advantages: chex.Array,
    lower: Union[float, chex.Array],
    upper: Union[float, chex.Array],
    dual_clip: Optional[float] = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Per-sample PPO-clip loss ``max(−r A, −clip(r, lower, upper) A)`` and its clip flags.

    With dual clip c: for A < 0 the loss is further bounded, ``min(·, −c A)``.
    Flags (bool, detached): ``clipped_low`` (A < 0, r < lower), ``clipped_high`` (A > 0,
    r > upper) — the samples whose gradient the clip zeroes — and ``dual_clipped``
    (A < 0, r > c). Shared by :func:`ppo_clip_loss` and the decoupled loss.
    """
    per_sample = jnp.maximum(-ratio * advantages, -jnp.clip(ratio, lower, upper) * advantages)
    r = jax.lax.stop_gradient(ratio)
    flags = {
        "clipped_low": (advantages < 0) & (r < lower),
        "clipped_high": (advantages > 0) & (r > upper),
    }
    if dual_clip is not None:
        per_sample = jnp.where(advantages < 0, jnp.minimum(per_sample, -dual_clip * advantages), per_sample)
        flags["dual_clipped"] = (advantages < 0) & (r > dual_clip)
    return per_sample, flags


def token_mean_loss(token_sum: chex.Array, token_count: chex.Array) -> chex.Array:
    """``Σ / max(N, 1)``: a token-mean loss from its numerator and token count (0 with no token)."""
    return token_sum / jnp.maximum(token_count, 1.0)


def ppo_clip_loss_sum(
    log_probs: chex.Array,
    old_log_probs: chex.Array,
    advantages: chex.Array,
    mask: Optional[chex.Array] = None,
    *,
    config: PPOClipConfig = PPOClipConfig(),
) -> tuple[chex.Array, chex.Array, Metrics]:
    """:func:`ppo_clip_loss` as ``(Σ_i m_i ℓ_i, Σ_i m_i, metrics)``: the numerator and the token
    count of the mean (loss = :func:`token_mean_loss` of the two).

    For a batch split into parts (gradient accumulation), the loss of the whole batch is
    ``Σ_parts numerator / max(Σ_parts count, 1)``; the count carries no gradient.
    """
    log_ratio, advantages, mask = _prepare(log_probs, old_log_probs, advantages, mask)
    per_sample, flags = clipped_surrogate(
        jnp.exp(log_ratio), advantages, 1.0 - config.epsilon_low, 1.0 + config.epsilon_high, config.dual_clip
    )
    extra = {
        "clip_fraction": fraction(flags["clipped_low"] | flags["clipped_high"], mask),
        "clip_fraction_low": fraction(flags["clipped_low"], mask),
        "clip_fraction_high": fraction(flags["clipped_high"], mask),
    }
    if config.dual_clip is not None:
        extra["dual_clip_fraction"] = fraction(flags["dual_clipped"], mask)
    token_sum, token_count = masked_sum(per_sample, mask), valid_count(mask)
    _, metrics = _with_diagnostics(token_mean_loss(token_sum, token_count), log_ratio, mask, mask,
                                   **extra)
    return token_sum, token_count, metrics


def ppo_clip_loss(
    log_probs: chex.Array,
    old_log_probs: chex.Array,
    advantages: chex.Array,
    mask: Optional[chex.Array] = None,
    *,
    config: PPOClipConfig = PPOClipConfig(),
) -> tuple[chex.Array, Metrics]:
    """PPO-clip: ``L = −mean_i min(r_i A_i, clip(r_i, 1 − ε_low, 1 + ε_high) A_i)``.

    ``r = π_θ/π_old = exp(log_probs − old_log_probs)`` (Schulman et al. 2017, Eq. 7), with
    asymmetric ε (DAPO) and optional dual clip (Ye et al. 2020); see :class:`PPOClipConfig`.
    Metrics add ``clip_fraction``, ``clip_fraction_low``, ``clip_fraction_high`` and, with
    dual clip, ``dual_clip_fraction``. The numerator / count split: :func:`ppo_clip_loss_sum`.
    """
    _, _, metrics = ppo_clip_loss_sum(log_probs, old_log_probs, advantages, mask, config=config)
    return metrics["loss"], metrics


# --------------------------------------------------------------------------- PPO-KL

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_penalty(log_ratio: chex.Array, estimator: str) -> chex.Array:
    """Per-sample estimate of KL(π_old ‖ π_θ) from ``log r = log π_θ − log π_old``, with gradient.

    k1 = −log r, k2 = ½ (log r)², k3 = (r − 1) − log r (Schulman 2020). With actions drawn
    from π_old, k1 and k3 give unbiased gradients of KL(π_old ‖ π_θ); k2's gradient is that
    of ½ E(log r)², equal to first order.
    """
    require_choice("estimator", estimator, KL_ESTIMATORS)
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * jnp.square(log_ratio)
    return jnp.expm1(log_ratio) - log_ratio


@dataclasses.dataclass(frozen=True)
class PPOKLConfig:
    """PPO-KL settings (Schulman et al. 2017, §4).

    Attributes:
      kl_estimator: per-sample KL estimator in the penalty, one of ``"k1"``, ``"k2"``, ``"k3"``
        (see :func:`kl_penalty`). Default ``"k3"`` (unbiased, non-negative) is our choice;
        the PPO paper uses the exact KL over actions, which needs full distributions.
    """

    kl_estimator: str = "k3"

    def __post_init__(self):
        require_choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)


def ppo_kl_loss(
    log_probs: chex.Array,
    old_log_probs: chex.Array,
    advantages: chex.Array,
    mask: Optional[chex.Array] = None,
    *,
    kl_coef: Union[float, chex.Array],
    config: PPOKLConfig = PPOKLConfig(),
    jit_checks: bool = False,
) -> tuple[chex.Array, Metrics]:
    """PPO with a KL penalty: ``L = −mean_i [r_i A_i − β · k(log r_i)]`` (Schulman et al. 2017, Eq. 8).

    ``β = kl_coef`` ∈ [0, ∞) is either fixed or adaptive (a traced scalar updated between
    iterations by :func:`adaptive_kl_coefficient`); a concrete β out of range raises
    ``ValueError``, a traced one only with ``jit_checks`` or ``fresh_rl.checked`` (a negative β rewards
    divergence, a NaN one makes the loss NaN). ``k`` is the estimator of
    :class:`PPOKLConfig`. Metrics add ``kl_coef`` and ``kl_penalty`` (mean k).
    """
    check_in_range("kl_coef", kl_coef, 0.0, math.inf, high_inclusive=False, jit_checks=jit_checks)
    log_ratio, advantages, mask = _prepare(log_probs, old_log_probs, advantages, mask)
    penalty = kl_penalty(log_ratio, config.kl_estimator)
    loss = masked_mean(-jnp.exp(log_ratio) * advantages + kl_coef * penalty, mask)
    return _with_diagnostics(
        loss, log_ratio, mask, mask,
        kl_coef=jnp.asarray(kl_coef, jnp.float32),
        kl_penalty=jax.lax.stop_gradient(masked_mean(penalty, mask)),
    )


@dataclasses.dataclass(frozen=True)
class AdaptiveKLConfig:
    """Adaptive KL coefficient rule of PPO (Schulman et al. 2017, §4).

    After each policy update, with measured KL d: if d < target/tolerance then β ← β/factor;
    if d > target·tolerance then β ← β·factor. The paper's values are tolerance 1.5,
    factor 2; ``target`` (d_targ) has no paper default and must be given.
    """

    target: float
    tolerance: float = 1.5
    factor: float = 2.0

    def __post_init__(self):
        require_in_range("target", self.target, 0.0, math.inf, low_inclusive=False)
        require_in_range("tolerance", self.tolerance, 1.0, math.inf)
        require_in_range("factor", self.factor, 1.0, math.inf)


def adaptive_kl_coefficient(
    kl_coef: chex.Array, measured_kl: chex.Array, config: AdaptiveKLConfig
) -> chex.Array:
    """One step of PPO's adaptive β rule (see :class:`AdaptiveKLConfig`); jittable."""
    kl_coef = jnp.asarray(kl_coef, jnp.float32)
    return jnp.where(
        measured_kl < config.target / config.tolerance,
        kl_coef / config.factor,
        jnp.where(measured_kl > config.target * config.tolerance, kl_coef * config.factor, kl_coef),
    )


# --------------------------------------------------------------------------- SPO


@dataclasses.dataclass(frozen=True)
class SPOConfig:
    """SPO settings (Xie et al. 2024, "Simple Policy Optimization", arXiv 2401.16025).

    Attributes:
      epsilon: ε > 0, the ratio-deviation scale of the quadratic penalty.
    """

    epsilon: float = 0.2

    def __post_init__(self):
        require_in_range("epsilon", self.epsilon, 0.0, math.inf, low_inclusive=False)


def spo_loss(
    log_probs: chex.Array,
    old_log_probs: chex.Array,
    advantages: chex.Array,
    mask: Optional[chex.Array] = None,
    *,
    config: SPOConfig = SPOConfig(),
) -> tuple[chex.Array, Metrics]:
    """SPO: ``L = −mean_i [r_i A_i − |A_i|/(2ε) · (r_i − 1)²]`` (Xie et al. 2024, arXiv 2401.16025).

    The quadratic penalty's optimum in r is ``1 + ε·sign(A)``, so SPO keeps ratios near the
    clip boundary without zeroing gradients. Metrics add ``clip_fraction``, here the fraction
    of samples outside ``[1 − ε, 1 + ε]`` (no gradient is zeroed; it is a drift measure).
    """
    log_ratio, advantages, mask = _prepare(log_probs, old_log_probs, advantages, mask)
    ratio = jnp.exp(log_ratio)
    objective = ratio * advantages - jnp.abs(advantages) / (2.0 * config.epsilon) * jnp.square(ratio - 1.0)
    outside = jnp.abs(jax.lax.stop_gradient(ratio) - 1.0) > config.epsilon
    return _with_diagnostics(
        masked_mean(-objective, mask), log_ratio, mask, mask, clip_fraction=fraction(outside, mask)
    )


# --------------------------------------------------------------------------- IMPALA


def impala_policy_gradient_loss(
    log_probs: chex.Array,
    behaviour_log_probs: chex.Array,
    pg_advantages: chex.Array,
    mask: Optional[chex.Array] = None,
) -> tuple[chex.Array, Metrics]:
    """IMPALA policy gradient: ``L = −mean_i sg(Â_i) · log π_θ(a_i|s_i)`` (Espeholt et al. 2018, arXiv 1802.01561, §4.2).

    ``pg_advantages`` already contain the truncated weight ρ_i (take
    :attr:`VTraceOutput.impala_advantages`). ``behaviour_log_probs`` (log μ) only feeds the
    diagnostics of ``log π_θ − log μ``; it does not enter the loss.
    """
    log_ratio, advantages, mask = _prepare(log_probs, behaviour_log_probs, pg_advantages, mask)
    loss = masked_mean(-advantages * jnp.where(mask, log_probs, 0.0), mask)
    return _with_diagnostics(loss, log_ratio, mask, mask)


# --------------------------------------------------------------------------- VACO


@dataclasses.dataclass(frozen=True)
class VACOConfig:
    """VACO TV-filter settings (Honari et al. 2026, arXiv 2603.01365; docs/vaco.md).

    Attributes:
      delta: threshold δ > 0 (the paper uses 0.2; its scale is unresolved, see below).
      threshold_convention: how δ is read, as the paper's scale is unknown:
        ``"tv"`` (default, our choice) — filter when D̂ = ½·mean|r − 1| > δ;
        ``"l1"`` — δ is an L1 budget, filter when mean|r − 1| > δ, i.e. D̂ > δ/2 (TVPO's
        ``clip_ratio`` convention). Report which one a run used.
      reference: the π_ref of the ratio r = π_θ/π_ref: ``"learner_start"`` (default, π_T,
        forward lag only, docs/vaco.md) or ``"behaviour"`` (β, total lag).
      importance_weighted_tv: estimate D̂ = ½·mean(w|r − 1|) with w = π_T/β (detached), an
        unbiased estimate of TV(π_θ, π_T) when actions come from β. Whether the paper
        does this is unknown; off by default. Needs ``reference="learner_start"``.
    """

    delta: float = 0.2
    threshold_convention: str = "tv"
    reference: str = "learner_start"
    importance_weighted_tv: bool = False

    def __post_init__(self):
        require_in_range("delta", self.delta, 0.0, math.inf, low_inclusive=False)
        require_choice("threshold_convention", self.threshold_convention, ("tv", "l1"))
        require_choice("reference", self.reference, ("learner_start", "behaviour"))
        if self.importance_weighted_tv and self.reference != "learner_start":
            raise ValueError("importance_weighted_tv requires reference='learner_start', got 'behaviour'")

    def threshold(self, delta: Union[float, chex.Array]) -> Union[float, chex.Array]:
        """A δ (float or traced) expressed on the D̂ = ½·mean|r − 1| scale of this convention."""
        return delta if self.threshold_convention == "tv" else 0.5 * delta

    @property
    def tv_threshold(self) -> float:
        """``config.delta`` on the D̂ scale."""
        return self.threshold(self.delta)


def tv_filter_mask(
    log_ratio: chex.Array,
    advantages: chex.Array,
    mask: chex.Array,
    tv: chex.Array,
    tv_threshold: float,
) -> chex.Array:
    """VACO's detached keep-mask: all valid samples if ``tv ≤ tv_threshold``, else those with
    ``Â · sign(r − 1) ≤ 0`` (docs/vaco.md: drop samples whose gradient would raise the TV
    estimate). Samples with r = 1 or Â = 0 are always kept."""
    log_ratio = jax.lax.stop_gradient(log_ratio)
    pushes_outward = jax.lax.stop_gradient(advantages) * jnp.sign(log_ratio) > 0
    return mask & ~((tv > tv_threshold) & pushes_outward)


def vaco_policy_loss(
    log_probs: chex.Array,
    learner_start_log_probs: chex.Array,
    behaviour_log_probs: chex.Array,
    advantages: chex.Array,
    mask: Optional[chex.Array] = None,
    *,
    config: VACOConfig = VACOConfig(),
    delta: Optional[chex.Array] = None,
    jit_checks: bool = False,
) -> tuple[chex.Array, Metrics]:
    """VACO policy loss: unclipped IS policy gradient with the per-minibatch TV filter.

        r_i = π_θ/π_ref,  D̂ = ½ · mean_i |r_i − 1|  (detached),
        m_i = 1 if D̂ ≤ δ else 1[Â_i · sign(r_i − 1) ≤ 0],
        L = −(1/N) Σ_i m_i r_i Â_i                     (N = valid samples)

    (arXiv 2603.01365, Eqs. 5, 15, 16 of its ICLR 2026 submission as reconstructed in
    docs/vaco.md; the worked examples of TVPO fix the sign rule.) ``advantages`` are the frozen
    realigned advantages (:func:`vtrace` output). Normalising by N valid rather than by the
    kept count is our choice. ``delta``: δ ∈ (0, ∞] as a plain scalar (may be traced: one
    compile for a δ sweep; ``math.inf`` never filters), read under
    ``config.threshold_convention``; ``None`` uses ``config.delta``. A concrete δ out of range
    raises ``ValueError``; a traced one only with ``jit_checks`` or ``fresh_rl.checked`` (else δ ≤ 0
    filters whenever D̂ > 0 and NaN never filters, like ∞). Metrics add
    ``tv_filter_estimate`` (D̂ as compared with δ), ``filter_on`` (D̂ above threshold),
    ``mask_fraction`` and ``backward_ratio_mean`` (mean π_T/β, the backward-lag weight).
    """
    if delta is not None:
        check_in_range("delta", delta, 0.0, math.inf, low_inclusive=False, jit_checks=jit_checks)
    mask = check_per_token([log_probs, learner_start_log_probs, behaviour_log_probs, advantages], mask)
    reference = learner_start_log_probs if config.reference == "learner_start" else behaviour_log_probs
    log_ratio, advantages, mask = _prepare(log_probs, reference, advantages, mask)
    backward_log_ratio = jax.lax.stop_gradient(
        jnp.where(mask, learner_start_log_probs - behaviour_log_probs, 0.0)
    )
    ratio = jnp.exp(log_ratio)
    if config.importance_weighted_tv:  # ½·mean|π_θ/β − π_T/β|: TV(π_θ, π_T) importance-sampled from β's actions
        tv = tv_estimate_weighted(log_ratio + backward_log_ratio, backward_log_ratio, mask)
    else:
        tv = tv_estimate(log_ratio, mask)
    threshold = config.threshold(config.delta if delta is None else delta)
    kept = tv_filter_mask(log_ratio, advantages, mask, tv, threshold)
    loss = masked_mean(jnp.where(kept, -ratio * advantages, 0.0), mask)
    return _with_diagnostics(
        loss, log_ratio, mask, kept,
        tv_filter_estimate=tv,
        filter_on=(tv > threshold).astype(jnp.float32),
        mask_fraction=fraction(mask & ~kept, mask),
        backward_ratio_mean=masked_mean(jnp.exp(backward_log_ratio), mask),
    )


# --------------------------------------------------------------------------- DPPO binary TV


@dataclasses.dataclass(frozen=True)
class DPPOBinaryTVConfig:
    """DPPO Binary-TV thresholds (Qi et al. 2026, arXiv 2602.04879; docs/anchors.md).

    Attributes:
      delta_low: δ_low > 0, how far the sampled token's probability may fall below the
        reference for A < 0 samples.
      delta_high: δ_high > 0, how far it may rise above the reference for A > 0 samples.
    The paper's values are not in our notes, so both must be given explicitly.
    """

    delta_low: float
    delta_high: float

    def __post_init__(self):
        require_in_range("delta_low", self.delta_low, 0.0, 1.0, low_inclusive=False)
        require_in_range("delta_high", self.delta_high, 0.0, 1.0, low_inclusive=False)


def dppo_binary_tv_loss(
    log_probs: chex.Array,
    reference_log_probs: chex.Array,
    advantages: chex.Array,
    mask: Optional[chex.Array] = None,
    *,
    config: DPPOBinaryTVConfig,
) -> tuple[chex.Array, Metrics]:
    """DPPO Binary-TV: a per-token mask on the sampled token's probability change.

        Δ_i = π_θ(a_i) − π_ref(a_i)   (probabilities, detached)
        m_i = 0 if (A_i > 0 and Δ_i > δ_high) or (A_i < 0 and Δ_i < −δ_low), else 1
        L = −(1/N) Σ_i m_i r_i A_i

    (arXiv 2602.04879, the Binary-TV variant). Unlike VACO the mask is per token and always
    on; unlike PPO-clip it acts on |Δπ| rather than on the ratio. The reference is the
    rollout policy in the paper (``_recompute`` variants use the trainer's old policy): the
    caller chooses by what it passes. Metrics add ``mask_fraction``.
    """
    log_ratio, advantages, mask = _prepare(log_probs, reference_log_probs, advantages, mask)
    prob_change = jax.lax.stop_gradient(
        jnp.where(mask, jnp.exp(log_probs) - jnp.exp(reference_log_probs), 0.0)
    )
    outward = ((advantages > 0) & (prob_change > config.delta_high)) | (
        (advantages < 0) & (prob_change < -config.delta_low)
    )
    kept = mask & ~outward
    loss = masked_mean(jnp.where(kept, -jnp.exp(log_ratio) * advantages, 0.0), mask)
    return _with_diagnostics(loss, log_ratio, mask, kept, mask_fraction=fraction(mask & ~kept, mask))
