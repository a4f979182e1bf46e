"""Revised PPO-EWMA reference parameters (old-logit repair, arXiv 2605.12070; docs/old_logits.md).

A trainer-side parameter copy θ_ref stands in for the missing old-logit policy:

    θ_ref ← β θ_ref + (1 − β) θ            (once per policy version; Hilton et al. 2021)
    θ_ref ← θ  if ρ_active < τ             (auto-reset)

π_ref = π_{θ_ref} is then passed as ``old_train_log_probs`` to
:func:`fresh_rl.corrections.decoupled.decoupled_ppo_loss`. The EWMA's centre of mass lies
β/(1 − β) updates in the past, so β is chosen from the staleness window W to place the
reference near the behaviour versions of the data (:func:`ewma_beta_from_staleness`).
The update granularity (per optimiser step or per policy version) is unknown in the paper;
the caller decides by when it calls :func:`ewma_update` (per version is the suggestion).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import chex
import jax
import jax.numpy as jnp
from flax import struct

from fresh_rl.validation import check_in_range, require_choice, require_in_range

BETA_RULES = ("centre_of_mass", "mean_age", "one_minus_inverse")


def ewma_beta_from_staleness(staleness_window: float, rule: str = "centre_of_mass") -> float:
    """β from the staleness window W (the maximum version lag), by a documented rule.

    The paper's formula is unknown (docs/old_logits.md); the rules match the EWMA centre of
    mass β/(1 − β) to an age:
      ``"centre_of_mass"`` (default): β = W/(W + 1), centre of mass W;
      ``"mean_age"``: β = W/(W + 2), centre of mass W/2 (mean age of uniformly stale data);
      ``"one_minus_inverse"``: β = 1 − 1/W, centre of mass W − 1 (needs W ≥ 1).
    W = 0 (synchronous) gives β = 0, i.e. θ_ref = θ, for the first two rules.
    """
    require_choice("rule", rule, BETA_RULES)
    low = 1.0 if rule == "one_minus_inverse" else 0.0
    require_in_range("staleness_window", staleness_window, low, math.inf)
    if rule == "centre_of_mass":
        return staleness_window / (staleness_window + 1.0)
    if rule == "mean_age":
        return staleness_window / (staleness_window + 2.0)
    return 1.0 - 1.0 / staleness_window


@dataclasses.dataclass(frozen=True)
class EWMAConfig:
    """Settings of the EWMA reference.

    Attributes:
      beta: β ∈ [0, 1]; see :func:`ewma_beta_from_staleness` (use :meth:`from_staleness`).
      reset_active_fraction: τ ∈ [0, 1] or ``None`` (no reset). Reset θ_ref ← θ when the
        active-token fraction falls below τ. The paper's τ is unknown; the default 0.9 is
        our placeholder (docs/old_logits.md; 0.9–0.95 suits a token MIS mask [0.5, 2]).
    """

    beta: float
    reset_active_fraction: Optional[float] = 0.9

    def __post_init__(self):
        require_in_range("beta", self.beta, 0.0, 1.0)
        if self.reset_active_fraction is not None:
            require_in_range("reset_active_fraction", self.reset_active_fraction, 0.0, 1.0)

    @classmethod
    def from_staleness(
        cls, staleness_window: float, rule: str = "centre_of_mass", reset_active_fraction: Optional[float] = 0.9
    ) -> "EWMAConfig":
        """Config with β = :func:`ewma_beta_from_staleness` (W, rule)."""
        return cls(ewma_beta_from_staleness(staleness_window, rule), reset_active_fraction)


@struct.dataclass
class EWMAReference:
    """θ_ref (a parameter pytree like θ) and the number of auto-resets so far (for logging)."""

    params: Any
    reset_count: chex.Array


def init_ewma_reference(params: Any, dtype: Optional[Any] = None) -> EWMAReference:
    """θ_ref = θ_0 (docs/old_logits.md, "Revised PPO-EWMA") stored in ``dtype`` (default: each
    leaf's own; e.g. bfloat16 halves the copy), a copy with its own buffers (a state holding
    θ and θ_ref can be donated to a jitted step without aliasing the two)."""
    return EWMAReference(params=jax.tree_util.tree_map(lambda p: jnp.array(p, dtype), params),
                         reset_count=jnp.zeros((), jnp.int32))


def ewma_update(
    reference: EWMAReference, params: Any, config: Optional[EWMAConfig] = None, beta: Optional[chex.Array] = None
) -> EWMAReference:
    """``θ_ref ← β θ_ref + (1 − β) θ`` as one ``tree_map`` (Hilton et al. 2021, arXiv 2110.00641, PPO-EWMA).

    ``beta`` (optional, may be traced, e.g. derived from a staleness window held in state)
    replaces ``config.beta`` (one of the two must be given); it must lie in [0, 1] (concrete: ``ValueError``;
    traced: checked under :func:`fresh_rl.checked`). Each leaf is combined in at least
    float32 and cast back to θ_ref's storage dtype. A bfloat16 θ_ref (of fp32 θ) rounds every mix to 8
    significant bits: a step (1 − β)(θ − θ_ref) under half a bf16 ulp (2⁻⁹ to 2⁻⁸ of |θ_ref|) is lost, so
    θ_ref may trail θ by up to about 2⁻⁸ |θ| / (1 − β) per leaf; float32 storage has no such floor.
    """
    chex.assert_trees_all_equal_shapes(reference.params, params)
    if beta is None:
        if config is None:
            raise ValueError("ewma_update needs config or beta")
        beta = config.beta
    else:
        check_in_range("beta", beta, 0.0, 1.0)

    def mix(ref, p):
        compute = jnp.promote_types(ref.dtype, jnp.float32)
        return (beta * ref.astype(compute) + (1.0 - beta) * p.astype(compute)).astype(ref.dtype)

    return reference.replace(params=jax.tree_util.tree_map(mix, reference.params, params))


def ewma_maybe_reset(
    reference: EWMAReference,
    params: Any,
    active_fraction: chex.Array,
    config: Optional[EWMAConfig] = None,
    threshold: Optional[chex.Array] = None,
) -> EWMAReference:
    """Auto-reset: ``θ_ref ← θ`` if ``active_fraction < τ`` (jittable, no Python branch on data).

    ``active_fraction`` is ρ_active from :func:`decoupled_ppo_loss` computed with the current
    θ_ref. ``threshold`` (optional, may be traced, e.g. a hyperparameter held in state)
    replaces ``config.reset_active_fraction`` and must lie in [0, 1] (checked as ``beta`` in
    :func:`ewma_update`); with neither (or ``reset_active_fraction=None``) the reference is
    returned unchanged. θ_ref keeps its storage dtype (θ is cast to it).
    """
    if threshold is None:
        threshold = None if config is None else config.reset_active_fraction
    else:
        check_in_range("threshold", threshold, 0.0, 1.0)
    if threshold is None:
        return reference
    chex.assert_trees_all_equal_shapes(reference.params, params)
    reset = jnp.asarray(active_fraction) < threshold
    new_params = jax.tree_util.tree_map(lambda ref, p: jnp.where(reset, p.astype(ref.dtype), ref),
                                        reference.params, params)
    return EWMAReference(params=new_params, reset_count=reference.reset_count + reset.astype(jnp.int32))
