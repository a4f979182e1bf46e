"""Scores of learning curves, intervals and verdicts over seeds, and rliable aggregates over tasks."""
from fresh_rl.eval.aggregates import (
    AGGREGATE_METRICS,
    aggregate_intervals,
    improvement_intervals,
    iqm,
    normalize_scores,
    optimality_gap,
    probability_of_improvement,
)
from fresh_rl.eval.scores import (eval_area_under_curve, eval_final_score, eval_first_score, eval_initial_score,
                                  eval_mean_score, final_score, initial_score, learner_scores)
from fresh_rl.eval.statistics import (VERDICTS, holm, holm_over_cells, paired_claim, pooled_claim, pooled_interval,
                                      seed_interval, verdict)

__all__ = [
    "AGGREGATE_METRICS",
    "VERDICTS",
    "aggregate_intervals",
    "eval_area_under_curve",
    "eval_final_score",
    "eval_first_score",
    "eval_initial_score",
    "eval_mean_score",
    "final_score",
    "holm",
    "holm_over_cells",
    "improvement_intervals",
    "initial_score",
    "learner_scores",
    "iqm",
    "normalize_scores",
    "optimality_gap",
    "paired_claim",
    "pooled_claim",
    "pooled_interval",
    "probability_of_improvement",
    "seed_interval",
    "verdict",
]
