"""Scores of a run's learning curve: the untrained policy's return, the final return, and the
first, initial and final scores and area of a learner-evaluation curve.

Learner-evaluation curves (``eval/return_…`` of :func:`fresh_rl.control.train.train`) hold a
value on every iteration, carried forward between evaluations; ``eval/valid`` marks the
iterations that evaluated. The ``eval_*`` scores read only those points.
"""
from __future__ import annotations

import numpy as np

from fresh_rl.results import NamedArrays


def final_score(returns: np.ndarray) -> np.ndarray:
    """Mean over the last 10% of iterations (at least one); NaN for a diverged run."""
    n = max(1, returns.shape[-1] // 10)
    return returns[..., -n:].mean(axis=-1)


def initial_score(returns: np.ndarray, episodes_completed: np.ndarray) -> np.ndarray:
    """Mean return of the first iteration in which a run completed an episode (the untrained
    policy; iterations before it carry the placeholder 0)."""
    first = np.argmax(np.cumsum(episodes_completed, axis=-1) > 0, axis=-1)
    return np.take_along_axis(returns, first[..., None], axis=-1)[..., 0]


def _eval_rows(values, valid, score) -> np.ndarray:
    """``score(iterations, points)`` per run of ``values [..., I]`` over its ``valid`` points."""
    values = np.asarray(values, np.float64)
    valid = np.broadcast_to(np.asarray(valid).astype(bool), values.shape)
    if values.ndim == 0 or not valid.any(axis=-1).all():
        raise ValueError("valid must mark at least one evaluation point along the last axis of "
                         f"values (shape {values.shape}) in every run")
    rows = zip(values.reshape(-1, values.shape[-1]), valid.reshape(-1, values.shape[-1]))
    scores = [score(np.flatnonzero(ok), v[ok]) for v, ok in rows]
    return np.asarray(scores).reshape(values.shape[:-1])


def eval_final_score(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Mean of the last 10% of a run's evaluation points (at least one), per run ``[...]``.

    ``values [..., I]`` (e.g. ``eval/return_deterministic``), ``valid`` (``eval/valid``)
    broadcastable to it."""
    return _eval_rows(values, valid, lambda _, y: y[-max(1, len(y) // 10):].mean())


def eval_first_score(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """A run's first evaluation point, per run ``[...]``: the learner closest to untrained, in
    the evaluation mode of ``values`` (normalise a final :func:`eval_final_score` with this, not
    with the stochastic actors' training return, so both ends use one mode)."""
    return _eval_rows(values, valid, lambda _, y: y[0])


def eval_initial_score(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Mean of the first 10% of a run's evaluation points (at least one), per run ``[...]``:
    the early learner, the counterpart of :func:`eval_final_score` (whether a task learns at
    all within the budget is final − initial)."""
    return _eval_rows(values, valid, lambda _, y: y[:max(1, len(y) // 10)].mean())


def eval_mean_score(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Mean over all of a run's evaluation points, per run ``[...]``: how fast the learner
    learns (steadier than a final score when final returns are bimodal, as on CartPole)."""
    return _eval_rows(values, valid, lambda _, y: y.mean())


def learner_scores(runs: NamedArrays) -> NamedArrays:
    """Per run (over ``runs``' dims) the ``final`` learner score, the last point of
    ``eval/return_deterministic``, and its ``mean`` over the run's ``eval/valid`` points (learning
    speed; 0 for a run without one)."""
    ret, valid = runs["eval/return_deterministic"], runs["eval/valid"].astype(bool)
    return NamedArrays(runs.dims, runs.coords, {"final": ret[..., -1],
                                                "mean": np.where(valid, ret, 0).sum(-1) / np.maximum(valid.sum(-1), 1)})


def eval_area_under_curve(values: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Area under the evaluation curve normalised by iterations: the trapezoid integral of
    the points ``(i, values_i)`` over the valid iterations i, divided by ``i_last − i_first``
    (the mean height of the piecewise-linear curve; the value itself for one point), per run."""
    def area(x, y):
        if len(x) == 1:
            return y[0]
        return np.sum((y[1:] + y[:-1]) * np.diff(x)) / (2.0 * (x[-1] - x[0]))
    return _eval_rows(values, valid, area)
