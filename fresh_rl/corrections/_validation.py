"""Array checks at the public edges of the corrections modules (chex shape / dtype asserts,
run at trace time, so free inside ``jit``). Configuration checks live in
:mod:`fresh_rl.validation`."""
from __future__ import annotations

from typing import Optional, Sequence

import chex
import jax.numpy as jnp


def check_per_token(
    float_arrays: Sequence[chex.Array],
    mask: Optional[chex.Array],
    *,
    min_rank: int = 1,
) -> chex.Array:
    """Assert that per-token inputs share one shape and are floats; return the bool mask.

    A missing mask means "every entry is valid" and is returned as an all-True array.
    """
    chex.assert_type(list(float_arrays), float)
    chex.assert_equal_shape(list(float_arrays))
    chex.assert_rank(float_arrays[0], set(range(min_rank, 8)))
    if mask is None:
        return jnp.ones(float_arrays[0].shape, dtype=bool)
    chex.assert_type(mask, bool)
    chex.assert_equal_shape([float_arrays[0], mask])
    return mask
