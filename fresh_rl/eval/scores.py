"""Scores of a run's learning curve: the untrained policy's return and the final return."""
from __future__ import annotations

import numpy as np


def final_score(returns: np.ndarray) -> np.ndarray:
    """Mean over the last 10% of iterations (at least one); NaN for a diverged run."""
    n = max(1, returns.shape[-1] // 10)
    return returns[..., -n:].mean(axis=-1)


def initial_score(returns: np.ndarray, episodes_completed: np.ndarray) -> np.ndarray:
    """Mean return of the first iteration in which a run completed an episode (the untrained
    policy; iterations before it carry the placeholder 0)."""
    first = np.argmax(np.cumsum(episodes_completed, axis=-1) > 0, axis=-1)
    return np.take_along_axis(returns, first[..., None], axis=-1)[..., 0]
