"""Pieces the study reports share: intervals as table cells, where a value falls on a grid, the
mean of an age histogram, and the τ-sweep figure.

The study scripts under ``experiments/`` write their tables (``fresh_rl.provenance.write_csv``)
and READMEs from these, so every report spells an interval, a grid position and an age the same
way.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from fresh_rl.eval import seed_interval


def interval(values) -> tuple[float, float, float]:
    """Mean and 95% Student-t interval over seeds (:func:`fresh_rl.eval.seed_interval`) as floats."""
    return tuple(float(x) for x in seed_interval(np.asarray(values, np.float64)))


def interval_text(mean: float, low: float, high: float, digits: int = 1) -> str:
    """``"m [low, high]"`` with ``digits`` decimals."""
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def position_on_grid(value: float, grid: Sequence[float]) -> str:
    """Where ``value`` falls on ``grid``: "(= 10, on the grid)", "(between 10 and 30)", "(above
    the largest finite τ, 100)", "(below the smallest τ, 1)"."""
    if value in grid:
        return f"(= {value:g}, on the grid)"
    if value > max(grid):
        return f"(above the largest finite τ, {max(grid):g})"
    if value < min(grid):
        return f"(below the smallest τ, {min(grid):g})"
    low = max(t for t in grid if t < value)
    return f"(between {low:g} and {min(t for t in grid if t > value):g})"


def histogram_mean(counts) -> float:
    """Mean bin index of a histogram over ages ``[..., H]`` (summed over leading axes); 0 if empty."""
    counts = np.asarray(counts, np.float64)
    return float((counts * np.arange(counts.shape[-1])).sum() / max(counts.sum(), 1))


def plot_score_vs_tau(ax, taus: Sequence[float], rows: Sequence[Mapping], controls: Mapping[str, float],
                      ylabel: str) -> None:
    """Score against τ on ``ax``: ``rows`` (τ ascending, then τ = ∞) with keys ``mean``,
    ``mean_low``, ``mean_high``; ∞ drawn one decade right of the largest τ; ``controls`` (name →
    score) as horizontal lines."""
    x = list(taus) + [10 * max(taus)]
    mean = np.array([r["mean"] for r in rows])
    err = np.array([[r["mean"] - r["mean_low"], r["mean_high"] - r["mean"]] for r in rows]).T
    ax.errorbar(x, mean, yerr=err, fmt="o-", capsize=3, label="freshper_authors (∞: per_authors)")
    for (name, value), style in zip(controls.items(), ("--", "-.", ":", (0, (1, 3)))):
        ax.axhline(value, ls=style, color="grey", label=name)
    ax.set(xscale="log", xlabel="τ (versions); rightmost point τ = ∞", ylabel=ylabel)
    ax.set_xticks(x, [f"{t:g}" for t in taus] + ["∞"])
    ax.minorticks_off()
    ax.legend(fontsize=7)


__all__ = ["histogram_mean", "interval", "interval_text", "plot_score_vs_tau", "position_on_grid"]
