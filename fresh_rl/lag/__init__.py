"""Policy-lag simulation: a ring of the last K parameter versions, per-actor-group delay
samplers (fixed, uniform, geometric) and measured per-batch lag metrics."""

from fresh_rl.lag import version_ring
from fresh_rl.lag.delay import (
    DELAY_KINDS,
    DelayConfig,
    actor_group_ids,
    lag_pmf,
    sample_lags,
)
from fresh_rl.lag.metrics import BehaviourTags, lag_metrics, lag_metrics_from_tags
from fresh_rl.lag.version_ring import VersionRing

__all__ = [
    "DELAY_KINDS",
    "BehaviourTags",
    "DelayConfig",
    "VersionRing",
    "actor_group_ids",
    "lag_metrics",
    "lag_metrics_from_tags",
    "lag_pmf",
    "sample_lags",
    "version_ring",
]
