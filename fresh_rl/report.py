"""Pieces the study reports share: intervals as table cells, Markdown tables, rows grouped by
named columns, where a value falls on a grid, the mean of an age histogram, score-against-axis
figures with intervals (a swept axis, τ), curves with 95% seed bands, and the README a study writes.

The study scripts under ``experiments/`` write their tables (``fresh_rl.provenance.write_csv``)
and READMEs from these, so every report spells an interval, a grid position and an age the same
way.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from fresh_rl.eval import seed_interval
from fresh_rl.provenance import provenance_line, write_atomic


def interval(values) -> tuple[float, float, float]:
    """Mean and 95% Student-t interval over seeds (:func:`fresh_rl.eval.seed_interval`) as floats."""
    return tuple(float(x) for x in seed_interval(np.asarray(values, np.float64)))


def interval_text(mean: float, low: float, high: float, digits: int = 1) -> str:
    """``"m [low, high]"`` with ``digits`` decimals."""
    return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence]) -> list[str]:
    """The lines of a Markdown table: header, rule, one line per row (each cell through ``str``)."""
    return [f"| {' | '.join(columns)} |", "|" + "---|" * len(columns),
            *(f"| {' | '.join(str(c) for c in row)} |" for row in rows)]


def grouped(rows: Iterable[Mapping], keys: Sequence[str]) -> dict[tuple, list[Mapping]]:
    """``rows`` grouped by their values of ``keys`` (a tuple per group), groups in first-seen order."""
    groups: dict[tuple, list[Mapping]] = {}
    for row in rows:
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    return groups


def plot_interval_curves(ax, xs: Sequence, series: Mapping[str, Sequence[Sequence[float]]], xlabel: str,
                         ylabel: str) -> None:
    """One curve per ``series`` entry (name → per-x seed values) on ``ax``: the mean with its 95%
    Student-t interval at each of ``xs`` (categorical positions, labelled by ``str``); an x without
    values is left out of its curve."""
    for name, cells in series.items():
        m = np.array([interval(c) if len(c) else (np.nan,) * 3 for c in cells])
        ax.errorbar(range(len(xs)), m[:, 0], yerr=[m[:, 0] - m[:, 1], m[:, 2] - m[:, 0]], marker="o", capsize=3,
                    label=name)
    ax.set_xticks(range(len(xs)), [str(x) for x in xs])
    ax.set(xlabel=xlabel, ylabel=ylabel)


def save_panels(path: Path, panels: Sequence, draw: Callable, width: float = 5.5, height: float = 4.0) -> None:
    """A row of one panel per item of ``panels`` (``draw(ax, item)`` fills each, titled by the
    item), the first panel's legend, saved at ``path`` (PNG, 110 dpi)."""
    save_panel_grid(path, [None], panels, lambda ax, _, item: titled(draw, ax, item), width, height)


def write_readme(out_dir: Path, title: str, header: Mapping, lines: Sequence[str], name: str = "README.md") -> str:
    """``out_dir/name`` (``README.md`` unless a study shares its folder): ``# title``, the
    provenance line of ``header`` (:func:`fresh_rl.provenance.provenance_line`), then ``lines``;
    written whole or not at all. Returns the text."""
    text = "\n".join([f"# {title}", "", provenance_line(header), *lines]) + "\n"
    write_atomic(Path(out_dir) / name, text)
    return text


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


def titled(draw: Callable, ax, item) -> None:
    """``draw(ax, item)``, then ``item`` as the panel's title."""
    draw(ax, item)
    ax.set_title(str(item))


def save_panel_grid(path: Path, rows: Sequence, columns: Sequence, draw: Callable, width: float = 5.0,
                    height: float = 3.5) -> None:
    """A grid of panels, one per (item of ``rows``, item of ``columns``) (``draw(ax, row, column)``
    fills each), the first panel's legend, saved at ``path`` (PNG, 110 dpi)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), len(columns), figsize=(width * len(columns), height * len(rows)),
                             squeeze=False)
    for i, row in enumerate(rows):
        for j, column in enumerate(columns):
            draw(axes[i, j], row, column)
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_seed_bands(ax, series: Mapping[str, tuple[Sequence[float], np.ndarray]], xlabel: str, ylabel: str,
                    alpha: float = 0.2) -> None:
    """One curve per ``series`` entry (name → (xs, values ``[seeds, len(xs)]``)) on ``ax``: the
    mean over seeds against x with its 95% Student-t band (:func:`fresh_rl.eval.seed_interval`)."""
    for name, (xs, values) in series.items():
        mean, low, high = seed_interval(np.asarray(values, np.float64), axis=0)
        ax.plot(xs, mean, label=name)
        ax.fill_between(xs, low, high, alpha=alpha)
    ax.set(xlabel=xlabel, ylabel=ylabel)


__all__ = ["grouped", "histogram_mean", "interval", "interval_text", "markdown_table", "plot_interval_curves",
           "plot_score_vs_tau", "plot_seed_bands", "position_on_grid", "save_panel_grid", "save_panels", "titled",
           "write_readme"]
