"""Scores of learning curves and aggregate statistics over seeds and tasks (rliable-style)."""
from fresh_rl.eval.aggregates import (
    AGGREGATE_METRICS,
    aggregate_intervals,
    improvement_intervals,
    iqm,
    normalize_scores,
    optimality_gap,
    paired_claim,
    probability_of_improvement,
    seed_interval,
)
from fresh_rl.eval.scores import (eval_area_under_curve, eval_final_score, eval_initial_score, final_score,
                                  initial_score)

__all__ = [
    "AGGREGATE_METRICS",
    "aggregate_intervals",
    "eval_area_under_curve",
    "eval_final_score",
    "eval_initial_score",
    "final_score",
    "improvement_intervals",
    "initial_score",
    "iqm",
    "normalize_scores",
    "optimality_gap",
    "paired_claim",
    "probability_of_improvement",
    "seed_interval",
]
