"""Ring of the last K parameter versions, for simulated backward policy lag.

Pure functions over a pytree ``VersionRing``: every leaf of ``state.params`` has a leading
axis K (one slot per stored version). ``push`` writes the learner's new parameters over the
oldest slot; ``get(state, k)`` returns the parameters ``k`` learner updates old, i.e. version
``v_latest − k``, which an actor group with backward lag ``k`` acts with (VACO's β_T against
π_T, docs/vaco.md). Everything works under ``jit``, ``vmap`` (one ring per seed) and
``donate_argnums`` (``push`` only writes one slot).

**Storage dtype.** ``init(params, K, dtype)`` may store the versions in a narrower dtype
(e.g. bfloat16: half the bytes of fp32); ``push`` casts the new parameters to it and the
readers get the stored dtype (cast up for an fp32 forward).

**Versions** are int32 counts of learner updates: ``init`` stores version 0, each ``push``
stores ``v_latest + 1``. Slot of lag ``k``: ``(head − k) mod K``.

**Early training (our choice).** Until K versions have been pushed the ring holds only
``available = v_latest + 1`` versions. A lag ``k ≥ available`` is clipped to the oldest held
version, ``k_eff = min(k, available − 1)``, the same rule a real asynchronous system follows
(an actor cannot act with a policy older than the initial one). The returned version tag
(``version_of`` / ``gather``) is always the version actually used, so measured lag is exact.

**Bad lag.** A lag outside ``[0, K − 1]`` raises ``ValueError`` when concrete; when traced it
is clipped into ``[0, available − 1]`` (the documented safe fallback).
"""

from __future__ import annotations

from typing import Any, Optional, Union

import chex
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fresh_rl.validation import is_traced


@struct.dataclass
class VersionRing:
    """The last K parameter versions.

    Attributes:
      params: pytree of ``[K, ...]`` arrays; slot ``i`` holds the parameters of ``versions[i]``.
      versions: ``[K]`` int32 version held by each slot (−1 for a slot never written).
      head: int32 slot of the newest version.
      latest_version: int32 ``v_latest``, the number of ``push`` calls since ``init``.
    """

    params: Any
    versions: jax.Array
    head: jax.Array
    latest_version: jax.Array

    @property
    def capacity(self) -> int:
        """K, the number of slots (static)."""
        return self.versions.shape[-1]


def _stored(x: Any, dtype: Optional[Any]) -> jax.Array:
    """``x`` as the ring stores it: a floating leaf in ``dtype`` (when given), others as is."""
    x = jnp.asarray(x)
    return x.astype(dtype) if dtype is not None and jnp.issubdtype(x.dtype, jnp.floating) else x


def init(params: Any, capacity: int, dtype: Optional[Any] = None) -> VersionRing:
    """Ring of ``capacity`` = K slots holding ``params`` as version 0 in slot 0, floating
    leaves stored in ``dtype`` (default: each leaf's own; integer leaves keep theirs).

    The other slots are filled with copies of ``params`` (so every slot is a valid pytree)
    but tagged version −1 and never returned: lags are clipped to held versions.
    """
    if not isinstance(capacity, (int, np.integer)) or isinstance(capacity, bool) or capacity < 1:
        raise ValueError(f"capacity must be an integer in [1, inf), got {capacity!r}")
    capacity = int(capacity)
    stacked = jax.tree.map(
        lambda x: jnp.broadcast_to(_stored(x, dtype), (capacity, *jnp.shape(x))), params
    )
    versions = jnp.full((capacity,), -1, jnp.int32).at[0].set(0)
    return VersionRing(
        params=stacked,
        versions=versions,
        head=jnp.zeros((), jnp.int32),
        latest_version=jnp.zeros((), jnp.int32),
    )


def push(state: VersionRing, params: Any) -> VersionRing:
    """Stores ``params`` as version ``v_latest + 1`` in the oldest slot (evicting it), cast to
    the ring's storage dtype.

    ``params`` must match the structure and shapes of the pytree given to ``init``.
    """
    chex.assert_trees_all_equal_shapes(params, jax.tree.map(lambda x: x[0], state.params))
    head = (state.head + 1) % state.capacity
    version = state.latest_version + 1
    new_params = jax.tree.map(lambda buf, x: buf.at[head].set(x.astype(buf.dtype)),
                              state.params, params)
    return state.replace(
        params=new_params,
        versions=state.versions.at[head].set(version),
        head=head,
        latest_version=version,
    )


def available_versions(state: VersionRing) -> jax.Array:
    """Number of distinct versions held: ``min(v_latest + 1, K)`` (int32)."""
    return jnp.minimum(state.latest_version + 1, state.capacity).astype(jnp.int32)


def effective_lag(state: VersionRing, lag: Union[int, chex.Array]) -> jax.Array:
    """``clip(lag, 0, available − 1)``: the lag actually served (int32, any shape).

    Concrete lags outside ``[0, K − 1]`` raise ``ValueError``; traced ones are clipped.
    """
    lag = jnp.asarray(lag)
    if not jnp.issubdtype(lag.dtype, jnp.integer):
        raise TypeError(f"lag must be an integer array, got dtype {lag.dtype}")
    if not is_traced(lag):
        lag_np = np.asarray(lag)
        if lag_np.size and (lag_np.min() < 0 or lag_np.max() > state.capacity - 1):
            raise ValueError(
                f"lag must be in [0, {state.capacity - 1}] (ring capacity K={state.capacity}), "
                f"got {lag_np.tolist()!r}"
            )
    return jnp.clip(lag.astype(jnp.int32), 0, available_versions(state) - 1)


def _slot(state: VersionRing, lag) -> jax.Array:
    """Slot of the (clipped) lag: ``(head − k_eff) mod K``."""
    return (state.head - effective_lag(state, lag)) % state.capacity


def get(state: VersionRing, lag: Union[int, chex.Array]) -> Any:
    """Parameters ``lag`` versions old (version ``v_latest − k_eff``); scalar ``lag``."""
    chex.assert_rank(jnp.asarray(lag), 0)
    slot = _slot(state, lag)
    return jax.tree.map(lambda buf: buf[slot], state.params)


def version_of(state: VersionRing, lag: Union[int, chex.Array]) -> jax.Array:
    """Version tag served for ``lag`` (any shape): ``v_latest − k_eff`` (int32)."""
    return state.versions[_slot(state, lag)]


def gather(state: VersionRing, lags: chex.Array) -> tuple[Any, jax.Array]:
    """One parameter version per actor group: ``lags`` ``[G]`` → (params ``[G, ...]``, versions ``[G]``).

    Row ``g`` equals ``get(state, lags[g])`` and its version tag ``version_of(state, lags[g])``;
    ``jax.vmap`` the acting function over the leading G axis of the returned params.
    """
    chex.assert_rank(jnp.asarray(lags), 1)
    slots = _slot(state, lags)
    params = jax.tree.map(lambda buf: jnp.take(buf, slots, axis=0), state.params)
    return params, state.versions[slots]
