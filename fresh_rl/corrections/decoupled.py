"""Decoupled correction for asynchronous LLM RL (old-logit repair, arXiv 2605.12070).

The total ratio against the inference engine's behaviour probability factorises as

    π_θ/π_infer^(v) = r_d · r_s,   r_d = π_train^(v)/π_infer^(v),   r_s = π_θ/π_train^(v)

(docs/old_logits.md): ``r_d`` is the train–inference discrepancy at the *same*
parameter version v, ``r_s`` the policy staleness. The masked-importance-sampling (MIS) mask
and the optional truncated-IS (TIS) weight act on r_d only; the PPO clip acts on r_s only
(as ROLL's ``InferCorrectionHandler``). When the exact old logits π_train^(v) are
missing, a stand-in π_prox is passed as ``old_train_log_probs``: the EWMA reference
(:mod:`fresh_rl.corrections.ewma`) or one of the interpolation proxies below, which by
Proposition 1 only move the clip boundary (see :func:`loglinear_proxy_clip_interval`).

Inputs are ``[B, T]`` (sequences × tokens) with an explicit boolean token mask; the
sequence-level rules reduce over axis 1.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Union

import chex
import jax
import jax.numpy as jnp

from fresh_rl.corrections._validation import check_per_token
from fresh_rl.validation import require_bounds, require_choice, require_in_range
from fresh_rl.corrections.diagnostics import fraction, masked_sum, policy_diagnostics, valid_count
from fresh_rl.corrections.policy_losses import PPOClipConfig, clipped_surrogate, token_mean_loss

Bounds = Optional[tuple[float, float]]


@dataclasses.dataclass(frozen=True)
class MISConfig:
    """Train–inference mask rules on r_d; a token is kept only if every enabled rule keeps it.

    Bounds are ``(low, high)`` on a ratio (``None`` disables the rule); the rules follow ROLL's
    ``infer_correction`` options (docs/old_logits.md):

    Attributes:
      token_bounds: keep token t iff low ≤ r_d,t ≤ high. Default (0.5, 2.0) is the
        our reproduction default (docs/old_logits.md), not the paper's (unknown) value.
      sequence_sum_bounds: keep sequence i iff low ≤ exp(Σ_t log r_d,t) ≤ high (the
        sequence-level product ratio; ROLL ``enable_seq_reject="sequence"``).
      geometric_mean_bounds: keep sequence i iff low ≤ exp(mean_t log r_d,t) ≤ high
        (ROLL ``"geometric"``; ROLL suggests [1/max, max] with max in 1.0001–1.001).
      catastrophic_threshold: drop sequence i if any valid token has r_d < threshold
        (ROLL default 1e-4 when enabled).
    """

    token_bounds: Bounds = (0.5, 2.0)
    sequence_sum_bounds: Bounds = None
    geometric_mean_bounds: Bounds = None
    catastrophic_threshold: Optional[float] = None

    def __post_init__(self):
        require_bounds("token_bounds", self.token_bounds)
        require_bounds("sequence_sum_bounds", self.sequence_sum_bounds)
        require_bounds("geometric_mean_bounds", self.geometric_mean_bounds)
        if self.catastrophic_threshold is not None:
            require_in_range("catastrophic_threshold", self.catastrophic_threshold, 0.0, 1.0, low_inclusive=False)


def _log_bounds(bounds: tuple[float, float]) -> tuple[float, float]:
    """``(log low, log high)`` with log 0 = −∞."""
    low, high = bounds
    return (math.log(low) if low > 0 else -math.inf), (math.log(high) if high > 0 else -math.inf)


def _in_log_bounds(log_x: chex.Array, bounds: tuple[float, float]) -> chex.Array:
    """``low ≤ exp(log_x) ≤ high``, compared in log space (no overflow)."""
    low, high = _log_bounds(bounds)
    return (log_x >= low) & (log_x <= high)


def mis_mask(
    log_discrepancy: chex.Array, mask: chex.Array, config: MISConfig
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """The detached MIS keep-mask on ``log r_d = log π_train − log π_infer``, shape ``[B, T]``.

    Returns ``(kept, rejected)`` where ``kept = mask ∧ (all enabled rules keep)`` and
    ``rejected`` maps each enabled rule (``token``, ``sequence_sum``, ``geometric_mean``,
    ``catastrophic``) to the valid tokens it rejects (rules may overlap). Rules are defined
    in :class:`MISConfig` (docs/old_logits.md; ROLL ``InferCorrectionHandler``).
    """
    chex.assert_rank([log_discrepancy, mask], 2)
    log_rd = jnp.where(mask, jax.lax.stop_gradient(log_discrepancy), 0.0)
    rejected = {}
    if config.token_bounds is not None:
        rejected["token"] = ~_in_log_bounds(log_rd, config.token_bounds)
    seq_sum = jnp.sum(log_rd, axis=1, keepdims=True)
    if config.sequence_sum_bounds is not None:
        rejected["sequence_sum"] = jnp.broadcast_to(~_in_log_bounds(seq_sum, config.sequence_sum_bounds), mask.shape)
    if config.geometric_mean_bounds is not None:
        seq_len = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1)
        rejected["geometric_mean"] = jnp.broadcast_to(
            ~_in_log_bounds(seq_sum / seq_len, config.geometric_mean_bounds), mask.shape
        )
    if config.catastrophic_threshold is not None:
        bad_token = mask & (log_rd < math.log(config.catastrophic_threshold))
        rejected["catastrophic"] = jnp.broadcast_to(jnp.any(bad_token, axis=1, keepdims=True), mask.shape)
    rejected = {name: mask & flags for name, flags in rejected.items()}
    kept = mask
    for flags in rejected.values():
        kept = kept & ~flags
    return kept, rejected


def truncated_importance_weights(
    log_discrepancy: chex.Array, mask: chex.Array, cap: float, level: str = "token"
) -> tuple[chex.Array, chex.Array]:
    """TIS weights ``w = sg(min(r_d, C))`` (Yao et al. 2025; docs/old_logits.md), ``[B, T]``.

    ``level="token"`` uses the per-token r_d; ``level="sequence"`` uses the sequence ratio
    exp(Σ_t log r_d,t) for every token of the sequence (ROLL ``infer_is_mode``).
    ``cap = math.inf`` gives the untruncated behaviour weight of AReaL's decoupled objective.
    Returns ``(weights, truncated)``: masked tokens get weight 0; ``truncated`` flags the
    valid tokens whose weight the cap lowered.
    """
    chex.assert_rank([log_discrepancy, mask], 2)
    require_choice("level", level, ("token", "sequence"))
    log_rd = jnp.where(mask, jax.lax.stop_gradient(log_discrepancy), 0.0)
    if level == "sequence":
        log_rd = jnp.broadcast_to(jnp.sum(log_rd, axis=1, keepdims=True), mask.shape)
    log_cap = math.log(cap) if cap < math.inf else math.inf
    weights = jnp.where(mask, jnp.exp(jnp.minimum(log_rd, log_cap)), 0.0)
    return weights, mask & (log_rd > log_cap)


@dataclasses.dataclass(frozen=True)
class DecoupledPPOConfig:
    """Settings of :func:`decoupled_ppo_loss`.

    Attributes:
      clip: PPO clip on r_s only (ε_low, ε_high, dual clip).
      mis: mask rules on r_d (see :class:`MISConfig`); ``MISConfig(token_bounds=None)``
        disables masking.
      tis_cap: truncation C of the IS weight on r_d. ``None`` (default) applies no weight
        (ROLL with ``infer_is_mode=None``); ``math.inf`` applies the full weight r_d
        (AReaL's decoupled objective, used for Proposition 1).
      tis_level: ``"token"`` or ``"sequence"`` IS weight (see :func:`truncated_importance_weights`).
    """

    clip: PPOClipConfig = PPOClipConfig()
    mis: MISConfig = MISConfig()
    tis_cap: Optional[float] = None
    tis_level: str = "token"

    def __post_init__(self):
        if self.tis_cap is not None:
            require_in_range("tis_cap", self.tis_cap, 0.0, math.inf, low_inclusive=False)
        require_choice("tis_level", self.tis_level, ("token", "sequence"))


def decoupled_ppo_loss_sum(
    log_probs: chex.Array,
    old_train_log_probs: chex.Array,
    infer_log_probs: chex.Array,
    advantages: chex.Array,
    mask: Optional[chex.Array] = None,
    *,
    config: DecoupledPPOConfig = DecoupledPPOConfig(),
    clip_log_probs: Optional[chex.Array] = None,
) -> tuple[chex.Array, chex.Array, dict[str, chex.Array]]:
    """:func:`decoupled_ppo_loss` as ``(Σ_t m_t w_t ℓ_t, Σ_t m_t, metrics)``: the numerator and
    the kept-token count (loss = :func:`~fresh_rl.corrections.policy_losses.token_mean_loss`
    of the two).

    The MIS mask m and the TIS weight w are per token or per sequence (row), so the numerator
    of a batch split by rows is the sum of the parts' numerators; the loss of the whole batch
    (gradient accumulation) is ``Σ_parts numerator / max(Σ_parts count, 1)``, the count
    carrying no gradient (the mask is detached).
    """
    clip_log_probs = old_train_log_probs if clip_log_probs is None else clip_log_probs
    mask = check_per_token([log_probs, old_train_log_probs, infer_log_probs, advantages, clip_log_probs], mask,
                           min_rank=2)
    chex.assert_rank(log_probs, 2)
    log_probs = jnp.where(mask, log_probs, 0.0)
    old_train_log_probs = jnp.where(mask, jax.lax.stop_gradient(old_train_log_probs), 0.0)
    clip_log_probs = jnp.where(mask, jax.lax.stop_gradient(clip_log_probs), 0.0)
    infer_log_probs = jnp.where(mask, jax.lax.stop_gradient(infer_log_probs), 0.0)
    advantages = jnp.where(mask, jax.lax.stop_gradient(advantages), 0.0)

    log_rd = old_train_log_probs - infer_log_probs
    log_rs = log_probs - clip_log_probs
    kept, rejected = mis_mask(log_rd, mask, config.mis)
    if config.tis_cap is None:
        weights = jnp.ones_like(log_rd)
        truncated = jnp.zeros_like(mask)
    else:
        weights, truncated = truncated_importance_weights(log_rd, mask, config.tis_cap, config.tis_level)
    per_token, flags = clipped_surrogate(
        jnp.exp(log_rs), advantages, 1.0 - config.clip.epsilon_low, 1.0 + config.clip.epsilon_high,
        config.clip.dual_clip,
    )
    token_sum, token_count = masked_sum(weights * per_token, kept), valid_count(kept)

    active = fraction(kept, mask)
    metrics = {
        "loss": token_mean_loss(token_sum, token_count),
        "active_token_fraction": active,
        "active_fraction": active,
        **{f"reject_fraction_{name}": fraction(flags_, mask) for name, flags_ in rejected.items()},
        "clip_fraction": fraction(kept & (flags["clipped_low"] | flags["clipped_high"]), mask),
        "clip_fraction_low": fraction(kept & flags["clipped_low"], mask),
        "clip_fraction_high": fraction(kept & flags["clipped_high"], mask),
        "tis_truncated_fraction": fraction(truncated, mask),
        **policy_diagnostics(log_rs, mask),
        **{f"train_infer/{k}": v for k, v in policy_diagnostics(log_rd, mask).items()},
        **{f"total/{k}": v for k, v in policy_diagnostics(log_rd + log_rs, mask).items()},
    }
    if config.clip.dual_clip is not None:
        metrics["dual_clip_fraction"] = fraction(kept & flags["dual_clipped"], mask)
    return token_sum, token_count, metrics


def decoupled_ppo_loss(
    log_probs: chex.Array,
    old_train_log_probs: chex.Array,
    infer_log_probs: chex.Array,
    advantages: chex.Array,
    mask: Optional[chex.Array] = None,
    *,
    config: DecoupledPPOConfig = DecoupledPPOConfig(),
    clip_log_probs: Optional[chex.Array] = None,
) -> tuple[chex.Array, dict[str, chex.Array]]:
    """Decoupled PPO with MIS/TIS on r_d and the clip on r_s (docs/old_logits.md):

        r_d = π_old_train/π_infer (detached),  r_s = π_θ/π_old_train,
        m_t = MIS keep-mask on r_d,  w_t = sg(min(r_d, C)) or 1,
        L = −Σ_t m_t w_t min(r_s A_t, clip(r_s, 1 − ε_low, 1 + ε_high) A_t) / Σ_t m_t

    The denominator counts the kept tokens, as the paper's formula and ROLL's final loss
    mask do. With π_old_train = π_infer (r_d = 1) and 1 inside the token bounds this is
    :func:`ppo_clip_loss`. Metrics: ``active_token_fraction`` ρ_active = kept/valid (the EWMA
    reset trigger; also reported as ``active_fraction``), ``reject_fraction_<rule>``,
    ``clip_fraction*`` on r_s, ``tis_truncated_fraction``, the standard diagnostics of r_s
    (plain keys) and of r_d (``train_infer/…``) and of the total ratio (``total/…``).
    The numerator / count split: :func:`decoupled_ppo_loss_sum`.

    ``clip_log_probs`` (default ``old_train_log_probs``) separates the two roles the old
    log-probs play: the mask reads r_d = π_old_train/π_infer and the clip is centred on
    ``clip_log_probs``, r_s = π_θ/π_clip (the factorial routes of docs/old_logits.md, "Mask or
    clip"; then log r_d + log r_s is not log π_θ/π_infer).
    """
    _, _, metrics = decoupled_ppo_loss_sum(log_probs, old_train_log_probs, infer_log_probs, advantages, mask,
                                           config=config, clip_log_probs=clip_log_probs)
    return metrics["loss"], metrics


# --------------------------------------------------------------------------- interpolation proxies


def interpolation_weight(
    behaviour_versions: chex.Array,
    proximal_version: Union[int, chex.Array],
    current_version: Union[int, chex.Array],
) -> chex.Array:
    """Per-token weight ``α = (v_prox − v_behav)/(v_θ − v_behav)`` clipped to [0, 1] (A-3PO,
    arXiv 2512.06547; AReaL ``prox_logp_method``; docs/old_logits.md).

    ``behaviour_versions`` are the per-token version tags written by the sampler (integers).
    For tokens generated by the current version (v_θ = v_behav) the formula is 0/0; we set
    α = 0 there, i.e. π_prox = π_behav (our choice: the token has no staleness to split).
    """
    chex.assert_type(behaviour_versions, int)
    v_behav = behaviour_versions.astype(jnp.float32)
    span = jnp.asarray(current_version, jnp.float32) - v_behav
    alpha = (jnp.asarray(proximal_version, jnp.float32) - v_behav) / jnp.where(span == 0, 1.0, span)
    return jnp.where(span == 0, 0.0, jnp.clip(alpha, 0.0, 1.0))


def loglinear_proximal_log_probs(
    behaviour_log_probs: chex.Array, log_probs: chex.Array, alpha: chex.Array
) -> chex.Array:
    """Log-linear proxy ``log π_prox = log π_behav + α (sg(log π_θ) − log π_behav)`` (A-3PO)."""
    chex.assert_equal_shape([behaviour_log_probs, log_probs])
    return behaviour_log_probs + alpha * (jax.lax.stop_gradient(log_probs) - behaviour_log_probs)


def linear_proximal_log_probs(
    behaviour_log_probs: chex.Array, log_probs: chex.Array, alpha: chex.Array
) -> chex.Array:
    """Linear (probability-space) proxy ``π_prox = (1 − α) π_behav + α sg(π_θ)``, in log space (A-3PO)."""
    chex.assert_equal_shape([behaviour_log_probs, log_probs])
    alpha = jnp.asarray(alpha, jnp.float32)
    return jnp.logaddexp(
        jnp.log1p(-alpha) + behaviour_log_probs, jnp.log(alpha) + jax.lax.stop_gradient(log_probs)
    )


def loglinear_proxy_clip_interval(
    epsilon_low: float, epsilon_high: float, alpha: chex.Array
) -> tuple[chex.Array, chex.Array]:
    """Effective clip interval on the total ratio r = π_θ/π_behav under the log-linear proxy.

    With π_prox log-linear and the full behaviour weight sg(r_d) (TIS cap ∞), r_d = r^α and
    r_s = r^{1−α}: the decoupled loss has the value and gradient r A ∇log π_θ wherever r_s is
    unclipped, and zero gradient where r_s is clipped, i.e. exactly PPO-clip on r with

        [(1 − ε_low)^{1/(1−α)}, (1 + ε_high)^{1/(1−α)}]

    (our derivation of Proposition 1 of arXiv 2605.12070, whose exact statement is not
    known; docs/old_logits.md). α = 1 gives (0, ∞): never clipped.
    """
    exponent = 1.0 / (1.0 - jnp.asarray(alpha, jnp.float32))
    return jnp.power(1.0 - epsilon_low, exponent), jnp.power(1.0 + epsilon_high, exponent)


def linear_proxy_clip_interval(
    epsilon_low: float, epsilon_high: float, alpha: chex.Array
) -> tuple[chex.Array, chex.Array]:
    """Effective clip interval on r = π_θ/π_behav under the linear proxy (our derivation).

    Here r_d = (1 − α) + α r and r_s = r/((1 − α) + α r), which increases in r towards 1/α.
    Solving r_s = 1 ± ε for r:

        upper = (1 + ε_high)(1 − α)/(1 − α(1 + ε_high))  if α(1 + ε_high) < 1, else ∞
        lower = (1 − ε_low)(1 − α)/(1 − α(1 − ε_low))    (0 when α = 1)

    so the upper clip disappears once α ≥ 1/(1 + ε_high) and the interval is no longer a
    power of PPO's (docs/old_logits.md).
    """
    alpha = jnp.asarray(alpha, jnp.float32)
    up_den = 1.0 - alpha * (1.0 + epsilon_high)
    upper = jnp.where(up_den > 0, (1.0 + epsilon_high) * (1.0 - alpha) / jnp.where(up_den > 0, up_den, 1.0), jnp.inf)
    low_den = 1.0 - alpha * (1.0 - epsilon_low)
    lower = jnp.where(low_den > 0, (1.0 - epsilon_low) * (1.0 - alpha) / jnp.where(low_den > 0, low_den, 1.0), 0.0)
    return lower, upper
