"""Per-actor-group backward-lag samplers: fixed k, uniform over [k_min, k_max], geometric.

Each actor group acts with the parameter version ``k`` learner updates old, ``k`` drawn
independently per group and per call of ``sample_lags`` (the trainer decides how often to
redraw; docs/vaco.md, "Policy lag"). Target distributions on ``{0, …, K − 1}``::

    fixed      P(k) = 1[k = k0]
    uniform    P(k) = 1 / (k_max − k_min + 1)              for k_min ≤ k ≤ k_max
    geometric  P(k) = (1 − q) q^k / (1 − q^K),  q = μ/(1 + μ)   for 0 ≤ k ≤ K − 1

The geometric parameter μ is the mean of the *untruncated* geometric law on {0, 1, …}
(our choice; the truncated mean is slightly smaller, see ``lag_pmf``); truncation at K − 1
renormalises (conditions on k ≤ K − 1) rather than piling the tail on K − 1.

**Early training.** With only ``available < K`` versions in the ring, a drawn lag is clipped
to ``available − 1`` (the oldest version held), exactly what ``version_ring.get`` would
serve, so ``sample_lags`` never returns a lag the ring cannot hold.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal, Optional, Union

import chex
import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.validation import require_choice, require_in_range, require_int

DelayKind = Literal["fixed", "uniform", "geometric"]
DELAY_KINDS: tuple[str, ...] = ("fixed", "uniform", "geometric")


@dataclasses.dataclass(frozen=True)
class DelayConfig:
    """Static configuration of the per-group lag distribution (hashable: a valid jit static).

    Attributes:
      kind: "fixed", "uniform" or "geometric".
      ring_size: K, the version-ring capacity; every lag lies in [0, K − 1].
      lag: k0 for "fixed".
      min_lag, max_lag: k_min ≤ k_max for "uniform".
      mean_lag: μ ≥ 0 for "geometric" (mean before truncation at K − 1).
    Use the ``fixed`` / ``uniform`` / ``geometric`` constructors.
    """

    kind: DelayKind = "fixed"
    ring_size: int = 1
    lag: int = 0
    min_lag: int = 0
    max_lag: int = 0
    mean_lag: float = 0.0

    def __post_init__(self):
        require_choice("kind", self.kind, DELAY_KINDS)
        require_int("ring_size", self.ring_size, 1, math.inf)
        top = self.ring_size - 1
        if self.kind == "fixed":
            require_int("lag", self.lag, 0, top)
        elif self.kind == "uniform":
            require_int("min_lag", self.min_lag, 0, top)
            require_int("max_lag", self.max_lag, self.min_lag, top)
        else:
            if isinstance(self.mean_lag, bool) or not isinstance(
                self.mean_lag, (int, float, np.integer, np.floating)
            ):
                raise ValueError(f"mean_lag must be a number in [0, inf), got {self.mean_lag!r}")
            require_in_range("mean_lag", float(self.mean_lag), 0.0, math.inf, high_inclusive=False)

    @classmethod
    def fixed(cls, lag: int, ring_size: int) -> "DelayConfig":
        return cls(kind="fixed", ring_size=ring_size, lag=lag)

    @classmethod
    def uniform(cls, min_lag: int, max_lag: int, ring_size: int) -> "DelayConfig":
        return cls(kind="uniform", ring_size=ring_size, min_lag=min_lag, max_lag=max_lag)

    @classmethod
    def geometric(cls, mean_lag: float, ring_size: int) -> "DelayConfig":
        return cls(kind="geometric", ring_size=ring_size, mean_lag=float(mean_lag))

    @property
    def geometric_ratio(self) -> float:
        """q = μ / (1 + μ): P(k + 1)/P(k) of the geometric law."""
        return float(self.mean_lag) / (1.0 + float(self.mean_lag))


def expected_lag(config: DelayConfig) -> float:
    """Mean version lag Σ_k k·p(k) of :func:`lag_pmf`, in closed form (no ``[K]`` array, so a
    huge ring fails in validation, not in allocation): the fixed lag; (min + max)/2 of the
    uniform one; q/(1 − q) − K q^K/(1 − q^K) of the geometric one truncated to the K = ring
    versions, q = :attr:`DelayConfig.geometric_ratio`."""
    if config.kind == "fixed":
        return float(config.lag)
    if config.kind == "uniform":
        return (config.min_lag + config.max_lag) / 2.0
    q, k = config.geometric_ratio, config.ring_size
    return q / (1.0 - q) - k * q ** k / (1.0 - q ** k) if q > 0 else 0.0


def lag_pmf(config: DelayConfig, available_versions: Optional[int] = None) -> np.ndarray:
    """Exact ``[K]`` float64 pmf of ``sample_lags`` (clipped to ``available − 1`` if given)."""
    k = np.arange(config.ring_size)
    if config.kind == "fixed":
        pmf = (k == config.lag).astype(np.float64)
    elif config.kind == "uniform":
        inside = (k >= config.min_lag) & (k <= config.max_lag)
        pmf = inside / inside.sum()
    else:
        q = config.geometric_ratio
        pmf = (1.0 - q) * q ** k.astype(np.float64)
        pmf = pmf / pmf.sum()
    if available_versions is not None:
        top = int(np.clip(available_versions, 1, config.ring_size)) - 1
        pmf = pmf.copy()
        pmf[top] = pmf[top:].sum()
        pmf[top + 1:] = 0.0
    return pmf


def sample_lags(
    key: chex.PRNGKey,
    config: DelayConfig,
    num_groups: int,
    available_versions: Union[int, chex.Array, None] = None,
    fixed_lag: Union[int, chex.Array, None] = None,
) -> jax.Array:
    """``[num_groups]`` int32 lags, i.i.d. from ``config``, clipped to ``available − 1``.

    ``fixed_lag`` (``kind="fixed"`` only; may be traced, e.g. one value per point of a vmapped
    sweep) replaces ``config.lag``; it is clipped to ``[0, K − 1]`` since a traced value cannot
    be validated here.

    ``available_versions`` (e.g. ``version_ring.available_versions(ring)``, may be traced) is
    the number of versions the ring holds; ``None`` means K. ``config`` and ``num_groups`` are
    static. Geometric draws use the inverse CDF of the truncated law,
    ``k = ⌊log(1 − u(1 − q^K)) / log q⌋``, ``u ~ U[0, 1)``.
    """
    require_int("num_groups", num_groups, 1, math.inf)
    shape = (num_groups,)
    if fixed_lag is not None and config.kind != "fixed":
        raise ValueError(f"fixed_lag needs delay kind 'fixed', got {config.kind!r}")
    if config.kind == "fixed":
        lag = config.lag if fixed_lag is None else jnp.clip(
            jnp.asarray(fixed_lag, jnp.int32), 0, config.ring_size - 1)
        lags = jnp.full(shape, lag, jnp.int32)
    elif config.kind == "uniform":
        lags = jax.random.randint(key, shape, config.min_lag, config.max_lag + 1, jnp.int32)
    else:
        q = config.geometric_ratio
        if q == 0.0:
            lags = jnp.zeros(shape, jnp.int32)
        else:
            u = jax.random.uniform(key, shape, jnp.float32)
            tail = 1.0 - q ** config.ring_size  # mass of {0, …, K − 1} under the full law
            raw = jnp.floor(jnp.log1p(-u * tail) / math.log(q))
            lags = jnp.clip(raw, 0, config.ring_size - 1).astype(jnp.int32)  # float rounding guard
    if available_versions is None:
        return lags
    top = jnp.clip(jnp.asarray(available_versions, jnp.int32), 1, config.ring_size) - 1
    return jnp.minimum(lags, top)


def actor_group_ids(num_actors: int, num_groups: int) -> np.ndarray:
    """``[num_actors]`` group of each actor (environment): contiguous equal blocks.

    ``group_versions[actor_group_ids(n, G)]`` broadcasts per-group version tags to actors.
    ``num_groups`` must divide ``num_actors`` (our choice: equal-sized groups).
    """
    require_int("num_groups", num_groups, 1, math.inf)
    require_int("num_actors", num_actors, num_groups, math.inf)
    if num_actors % num_groups:
        raise ValueError(
            f"num_groups must divide num_actors={num_actors}, got num_groups={num_groups}"
        )
    return np.repeat(np.arange(num_groups, dtype=np.int32), num_actors // num_groups)
