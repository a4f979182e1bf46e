"""Interval estimates over seeds and tasks (Agarwal et al. 2021, "Deep RL at the edge of the
statistical precipice", arXiv 2108.13264; the rliable aggregates VACO reports: median, IQM, mean,
optimality gap, and the probability of improvement of one method over another).

Scores are NumPy arrays ``[runs, tasks]`` of normalised final returns; a *run* is one seed.
Intervals are rliable's stratified percentile bootstrap (runs resampled with replacement within
each task, tasks kept fixed). These aggregates are for three or more tasks; with fewer, report
per-task Student-t intervals (:mod:`fresh_rl.eval.statistics`, docs/statistics.md).
"""
from __future__ import annotations

from typing import Hashable, Mapping

import numpy as np
from scipy import stats

from fresh_rl.validation import require_in_range, require_int

AGGREGATE_METRICS: tuple[str, ...] = ("median", "iqm", "mean", "optimality_gap")


def iqm(scores: np.ndarray) -> float:
    """Interquartile mean of all ``runs × tasks`` scores: the 25%-trimmed mean."""
    return float(stats.trim_mean(np.asarray(scores).reshape(-1), proportiontocut=0.25))


def optimality_gap(scores: np.ndarray, threshold: float = 1.0) -> float:
    """``γ − mean(min(score, γ))``: how far the scores fall short of the threshold γ (default 1)."""
    return float(threshold - np.mean(np.minimum(scores, threshold)))


def _aggregates(scores: np.ndarray) -> np.ndarray:
    """[median, IQM, mean, optimality gap] of one ``[runs, tasks]`` score matrix.

    rliable's definitions: the median is over the per-task mean scores; the mean is the mean of
    the per-task means (equal to the pooled mean when every task has the same number of runs);
    IQM and the optimality gap pool all run × task scores.
    """
    return np.array([
        float(np.median(np.mean(scores, axis=0))),
        iqm(scores),
        float(np.mean(scores)),
        optimality_gap(scores),
    ])


def _score_pair(scores_x, scores_y) -> tuple[np.ndarray, np.ndarray]:
    """Both matrices as float64, checked to be ``[runs ≥ 1, tasks]`` over the same tasks."""
    x, y = np.asarray(scores_x, np.float64), np.asarray(scores_y, np.float64)
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1] or min(x.shape[0], y.shape[0]) < 1:
        raise ValueError(f"probability_of_improvement needs [runs ≥ 1, tasks] matrices with the same "
                         f"tasks, got shapes {x.shape} and {y.shape}")
    return x, y


def probability_of_improvement(scores_x: np.ndarray, scores_y: np.ndarray) -> float:
    """P(X > Y): the chance that a run of X beats a run of Y on a task drawn uniformly.

    ``P(X > Y) = (1/M) Σ_m (1/(N_m K_m)) Σ_i Σ_j S(x_im, y_jm)`` with ``S(a, b) = 1`` if a > b,
    ½ if a = b, 0 otherwise (the Mann–Whitney U statistic per task, averaged over the M tasks;
    arXiv 2108.13264, "probability of improvement"). ``scores_x`` is ``[N runs, M tasks]``,
    ``scores_y`` ``[K runs, M tasks]``; run counts may differ. P(X > Y) + P(Y > X) = 1.
    """
    x, y = _score_pair(scores_x, scores_y)
    diff = x[:, None, :] - y[None, :, :]  # [N, K, M]
    wins = (diff > 0) + 0.5 * (diff == 0)
    return float(np.mean(np.mean(wins, axis=(0, 1))))


def normalize_scores(returns: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Min–max normalisation per task, ``(R − low)/(high − low)``, broadcast over the last axis."""
    low = np.asarray(low, np.float64)
    high = np.asarray(high, np.float64)
    if np.any(high <= low):
        raise ValueError(f"normalize_scores needs high > low for every task, got low={low}, high={high}")
    return (np.asarray(returns, np.float64) - low) / (high - low)


def _check_interval_args(confidence: float, reps: int) -> None:
    require_in_range("confidence", confidence, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    require_int("reps", reps, 1)


def _seeded_interval_estimates(score_dict, func, confidence: float, reps: int, seed: int):
    """rliable's ``get_interval_estimates`` reproducible from ``seed`` alone.

    rliable 1.2's stratified bootstrap draws its indices from the global NumPy RNG and ignores
    ``random_state``: the global RNG is seeded for the call and the caller's state restored.
    """
    from rliable import library as rly  # imported lazily: pulls in arch and pandas

    caller_state = np.random.get_state()
    np.random.seed(seed)
    try:
        return rly.get_interval_estimates(score_dict, func, reps=reps,
                                          confidence_interval_size=confidence,
                                          random_state=np.random.RandomState(seed))
    finally:
        np.random.set_state(caller_state)


def aggregate_intervals(
    score_dict: Mapping[str, np.ndarray], confidence: float = 0.95, reps: int = 2000, seed: int = 0,
) -> dict[str, dict[str, tuple[float, float, float]]]:
    """rliable aggregates with stratified-bootstrap intervals for every method.

    Args:
      score_dict: method → ``[runs, tasks]`` normalised scores (runs may differ per method).
    Returns:
      method → metric (``AGGREGATE_METRICS``) → ``(point, low, high)``. The median is the median
      over tasks of the per-task mean (rliable's definition); the optimality gap uses γ = 1.
    """
    _check_interval_args(confidence, reps)
    for name, scores in score_dict.items():
        if np.ndim(scores) != 2 or np.shape(scores)[0] < 1:
            raise ValueError(f"score_dict[{name!r}] must be [runs ≥ 1, tasks], got shape {np.shape(scores)}")
    points, intervals = _seeded_interval_estimates(
        {k: np.asarray(v, np.float64) for k, v in score_dict.items()}, _aggregates, confidence, reps,
        seed)
    return {
        name: {m: (float(points[name][i]), float(intervals[name][0, i]), float(intervals[name][1, i]))
               for i, m in enumerate(AGGREGATE_METRICS)}
        for name in score_dict
    }


def improvement_intervals(
    pairs: Mapping[Hashable, tuple[np.ndarray, np.ndarray]], confidence: float = 0.95,
    reps: int = 2000, seed: int = 0,
) -> dict[Hashable, tuple[float, float, float]]:
    """:func:`probability_of_improvement` with stratified-bootstrap intervals for keyed pairs.

    Args:
      pairs: key (e.g. ``("vaco", "ppo_clip")``) → ``(scores_x, scores_y)``, each
        ``[runs, tasks]`` with the same tasks; X's and Y's runs are resampled independently
        within each task.
    Returns:
      key → ``(P(X > Y), low, high)``, each pair bootstrapped from ``seed`` on its own (a pair's
      interval does not depend on the others). A lower bound above ½ says X beats Y on a random
      task more often than not at this confidence.
    """
    _check_interval_args(confidence, reps)
    checked = {key: _score_pair(x, y) for key, (x, y) in pairs.items()}  # names bad shapes first
    out = {}
    for key, pair in checked.items():
        points, intervals = _seeded_interval_estimates({"pair": pair}, probability_of_improvement,
                                                       confidence, reps, seed)
        low, high = np.ravel(intervals["pair"])
        out[key] = (float(points["pair"]), float(low), float(high))
    return out
