"""Aggregate statistics over seeds and tasks (rliable-style) and the plots built on them."""
from fresh_rl.eval.aggregates import (
    AGGREGATE_METRICS,
    aggregate_intervals,
    iqm,
    normalize_scores,
    optimality_gap,
    seed_interval,
)

__all__ = [
    "AGGREGATE_METRICS",
    "aggregate_intervals",
    "iqm",
    "normalize_scores",
    "optimality_gap",
    "seed_interval",
]
