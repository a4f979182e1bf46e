"""Policy-lag simulation: a ring of the last K parameter versions, per-actor-group delay
samplers (fixed, uniform, geometric) and measured per-batch lag metrics, and the
ESS time constant of stale data."""

from fresh_rl.lag import version_ring
from fresh_rl.lag.delay import (
    DELAY_KINDS,
    DelayConfig,
    actor_group_ids,
    expected_lag,
    lag_pmf,
    sample_lags,
)
from fresh_rl.lag.metrics import (
    BehaviourTags,
    fit_ess_time_constant,
    lag_metrics,
    lag_metrics_from_tags,
)
from fresh_rl.lag.version_ring import VersionRing

__all__ = [
    "DELAY_KINDS",
    "BehaviourTags",
    "DelayConfig",
    "VersionRing",
    "actor_group_ids",
    "expected_lag",
    "fit_ess_time_constant",
    "lag_metrics",
    "lag_metrics_from_tags",
    "lag_pmf",
    "sample_lags",
    "version_ring",
]
