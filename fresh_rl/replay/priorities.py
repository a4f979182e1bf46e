"""Base priorities ``p_i^base`` for a stored trajectory, before age decay and exponent.

FreshPER (arXiv 2604.16918, authors' README) offers three sources, each ``|x| + ε``:
``|reward| + ε`` for critic-free methods (REINFORCE++, GRPO; the one the paper uses, with the
episode reward), ``|advantage| + ε`` for actor-critic methods and ``|TD error| + ε`` for
classical PER. ε = 1e-6 as in the authors' code. For per-token or per-step values the
magnitudes are reduced over the trajectory's valid steps; the reduction the paper uses for
advantages is not stated, so ``reduction`` is a knob and "mean" is our default.
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
