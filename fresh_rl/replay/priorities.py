"""Base priorities ``p_i^base`` for a stored trajectory, before age decay and exponent.

FreshPER (arXiv 2604.16918, authors' README) offers three sources, each ``|x| + ε``:
``|reward| + ε`` for critic-free methods (REINFORCE++, GRPO; the one the paper uses, with the
episode reward), ``|advantage| + ε`` for actor-critic methods and ``|TD error| + ε`` for
classical PER. ε = 1e-6 as in the authors' code. For per-token or per-step values the
magnitudes are reduced over the trajectory's valid steps; the reduction the paper uses for
advantages is not stated, so ``reduction`` is a knob and "mean" is our default.

``advantage_priority`` gives the critic-free ``|advantage| + ε`` of a trajectory from its return
and the group baseline stored with it when it was fresh (GRPO, arXiv 2402.03300 §4.1.2:
``A = (R − mean_g R)/(std_g R + eps)``), so the priority of a stored item can be rewritten
without the rest of its group.
"""

from __future__ import annotations

from typing import Literal

import chex
import jax
import jax.numpy as jnp

DEFAULT_PRIORITY_EPS = 1e-6


def magnitude_priority(
    values: jax.Array,
    mask: jax.Array | None = None,
    *,
    reduction: Literal["mean", "max", "sum"] = "mean",
    eps: float = DEFAULT_PRIORITY_EPS,
) -> jax.Array:
    """``p^base = reduce_t |x_t| + ε`` per trajectory.

    Args:
      values: ``[B]`` (episode reward) or ``[B, T]`` (advantages or TD errors per step/token).
      mask: ``[B, T]`` valid steps for 2-D values; ignored (must be None) for 1-D values.
      reduction: how a trajectory's step magnitudes are combined.
      eps: ε > 0 keeps every item sampleable.
    Returns:
      ``[B]`` float32 base priorities.
    """
    if not eps > 0:
        raise ValueError(f"eps must be in (0, inf), got {eps!r}")
    if reduction not in ("mean", "max", "sum"):
        raise ValueError(f"reduction must be 'mean', 'max' or 'sum', got {reduction!r}")
    values = jnp.asarray(values, jnp.float32)
    if values.ndim == 1:
        if mask is not None:
            raise ValueError("mask must be None for per-trajectory (1-D) values")
        return jnp.abs(values) + eps
    chex.assert_rank(values, 2)
    mask = jnp.ones_like(values, bool) if mask is None else jnp.asarray(mask, bool)
    chex.assert_equal_shape([values, mask])
    magnitudes = jnp.where(mask, jnp.abs(values), 0.0)
    if reduction == "sum":
        reduced = magnitudes.sum(-1)
    elif reduction == "max":
        reduced = magnitudes.max(-1)
    else:
        reduced = magnitudes.sum(-1) / jnp.maximum(mask.sum(-1), 1)
    return reduced + eps


def advantage_priority(
    returns: jax.Array,
    baseline: jax.Array,
    scale: jax.Array | None = None,
    *,
    std_eps: float = 1e-6,
    eps: float = DEFAULT_PRIORITY_EPS,
) -> jax.Array:
    """``p^base = |R − b| / (s + std_eps) + ε`` per trajectory (``|R − b| + ε`` without ``scale``).

    Args:
      returns: ``[B]`` episode returns R.
      baseline: ``[B]`` group baseline b stored with each trajectory (its group's mean return
        when it was sampled).
      scale: optional ``[B]`` group std s (GRPO's scale_by_std); None = Dr. GRPO's unscaled
        advantage.
      std_eps: added to s (1e-6, as the advantage functions of :mod:`fresh_rl.llm.advantages`).
      eps: ε > 0 keeps every item sampleable.
    Returns:
      ``[B]`` float32 base priorities.
    """
    if not std_eps >= 0:
        raise ValueError(f"std_eps must be in [0, inf), got {std_eps!r}")
    returns = jnp.asarray(returns, jnp.float32)
    chex.assert_rank(returns, 1)
    baseline = jnp.asarray(baseline, jnp.float32)
    chex.assert_equal_shape([returns, baseline])
    advantage = returns - baseline
    if scale is not None:
        scale = jnp.asarray(scale, jnp.float32)
        chex.assert_equal_shape([returns, scale])
        advantage = advantage / (scale + std_eps)
    return magnitude_priority(advantage, eps=eps)
