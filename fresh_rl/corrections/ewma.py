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

BETA_RULES = ("mean_age", "window", "half_window", "one_minus_inverse")
"""β rules of :func:`ewma_beta_from_staleness`: ``"mean_age"`` is the default of every code path
(control and LLM); the others are named variants (docs/old_logits.md, "One β rule")."""


def ewma_beta_from_staleness(staleness_window: float, rule: str = "mean_age",
                             mean_age: Optional[float] = None) -> float:
    """β of the EWMA reference from the staleness of the data, by a documented rule.

    The paper's formula is unknown (docs/old_logits.md). The EWMA of versions θ_v has its centre
    of mass β/(1 − β) versions in the past; each rule places it at an age:
      ``"mean_age"`` (the default): at the data's mean version lag ā, β = ā/(ā + 1) — ā =
        ``mean_age``, else W (every datum W versions old, a fixed lag). A fixed lag W gives
        W/(W + 1), a uniform lag U{0..W} (ā = W/2) gives W/(W + 2), a geometric lag of mean m
        gives m/(m + 1);
      ``"window"``: at the window W whatever the lag distribution, β = W/(W + 1);
      ``"half_window"``: at W/2 whatever the lag distribution, β = W/(W + 2);
      ``"one_minus_inverse"``: at W − 1, β = 1 − 1/W (needs W ≥ 1).
    W = 0 (synchronous) gives β = 0, i.e. θ_ref = θ, for every rule but the last.
    """
    require_choice("rule", rule, BETA_RULES)
    low = 1.0 if rule == "one_minus_inverse" else 0.0
    require_in_range("staleness_window", staleness_window, low, math.inf)
    if rule == "mean_age":
        age = staleness_window if mean_age is None else mean_age
        require_in_range("mean_age", age, 0.0, staleness_window)
        return age / (age + 1.0)
    if rule == "window":
        return staleness_window / (staleness_window + 1.0)
    if rule == "half_window":
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
        cls, staleness_window: float, rule: str = "mean_age", reset_active_fraction: Optional[float] = 0.9,
        mean_age: Optional[float] = None,
    ) -> "EWMAConfig":
        """Config with β = :func:`ewma_beta_from_staleness` (W, rule, mean age)."""
        return cls(ewma_beta_from_staleness(staleness_window, rule, mean_age), reset_active_fraction)


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
