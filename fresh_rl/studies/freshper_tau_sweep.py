"""The τ sweep of FreshPER as its authors run it (arXiv 2604.16918), shared by the exact bandit bed
(``experiments/freshper_bandit.py``) and control (``experiments/freshper_control_tau.py``).

Arms: on-policy, 1 + K epochs, uniform replay, the authors' PER (``per_authors``, τ = ∞) and
``freshper_authors`` (PER's pipeline plus p·exp(−age/τ)) at every τ of the grid, in versions.
Each arm's learning rate is picked on tuning seeds; the tables here (tuning means, drift by age,
replayed ages, score against τ) and the README's score table are written alike by both studies,
a ``cell`` mapping (``{"task": …}`` in control, empty on the bed) leading each row.
"""
from __future__ import annotations

import math
import warnings
from typing import Mapping, Sequence

import numpy as np

from fresh_rl.report import interval, interval_text
from fresh_rl.results import NamedArrays

CONTROLS = ("onpolicy", "onpolicy_epochs", "uniform", "per_authors")
NO_REPLAY = ("onpolicy", "onpolicy_epochs")


def arms(taus: Sequence[float]) -> dict[str, tuple[str, float]]:
    """Arm name → (registry method of :mod:`fresh_rl.replay.methods`, τ in versions; ∞ for the arms
    without decay)."""
    out = {name: (name, math.inf) for name in CONTROLS}
    out.update({f"freshper_authors_tau{tau:g}": ("freshper_authors", tau) for tau in taus})
    return out


def tau_arms(named: Mapping[str, tuple[str, float]]) -> list[str]:
    """The arms on the τ axis: ``freshper_authors`` at τ ascending, then ``per_authors`` (τ = ∞)."""
    return [a for a in named if named[a][0] == "freshper_authors"] + ["per_authors"]


def picked_rates(tuned: NamedArrays, score_name: str) -> dict[str, float]:
    """Each arm's learning rate with the best tuning score: ``tuned[score_name]`` over the dims
    ``arm`` and ``learning_rate`` (seed means)."""
    rates = tuned.coords["learning_rate"]
    return {arm: rates[int(np.argmax(tuned.sel(arm=arm)[score_name]))] for arm in tuned.coords["arm"]}


def usual_rate(picked: Mapping[str, float], named: Mapping) -> float:
    """The learning rate most ``freshper_authors`` arms were tuned to (where the τ rules are read)."""
    rates = [picked[a] for a in named if named[a][0] == "freshper_authors"]
    return max(set(rates), key=rates.count)


def mean_by_age(x: np.ndarray) -> np.ndarray:
    """Mean of drift snapshots ``x [seed, snapshot, age]`` over seeds and snapshots, by age; a
    negative entry is an age the snapshot had not reached (left out; NaN where no snapshot reached it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.where(x >= 0, x, np.nan), axis=(0, 1))


def tuning_rows(named: Mapping, tuned: NamedArrays, picked: Mapping, tuning_seeds: int, score_name: str,
                cell: Mapping = {}) -> list[dict]:
    """``tuning.csv``: the seed-mean tuning score ``tuned[score_name]`` (dims ``arm``,
    ``learning_rate``) of every arm and rate, the pick marked."""
    return [{**cell, "arm": arm, "method": named[arm][0], "tau": named[arm][1], "learning_rate": lr,
             "tuning_seeds": tuning_seeds, score_name: float(tuned.sel(arm=arm, learning_rate=lr)[score_name]),
             "picked": lr == picked[arm]}
            for arm in named for lr in tuned.coords["learning_rate"]]


def ess_rows(drift: Mapping[float, Mapping], cell: Mapping = {}) -> list[dict]:
    """``ess_vs_age.csv``: per learning rate and age, the trajectory and per-step ESS/n, KL and the
    two τ fits of the drift curves (``drift[lr]`` with ``ess_trajectory``, ``ess_step``, ``kl``,
    ``tau_trajectory``, ``tau_step``)."""
    return [{**cell, "learning_rate": lr, "age": a, "ess_fraction": float(d["ess_trajectory"][a]),
             "ess_step_fraction": float(d["ess_step"][a]), "kl": float(d["kl"][a]),
             "tau_trajectory": d["tau_trajectory"], "tau_step": d["tau_step"]}
            for lr, d in drift.items() for a in range(d["ess_step"].size)]


def sampled_age_rows(named: Mapping, picked: Mapping, totals: NamedArrays, cell: Mapping = {}) -> list[dict]:
    """``sampled_age.csv``: the fraction of replayed rows per age of every replaying arm
    (``totals["sampled_age_counts"]``: dim ``arm``, then age; summed over the scoring seeds)."""
    rows = []
    for arm in (a for a in named if named[a][0] not in NO_REPLAY):
        counts = totals.sel(arm=arm)["sampled_age_counts"]
        rows += [{**cell, "arm": arm, "method": named[arm][0], "learning_rate": picked[arm], "age": a,
                  "fraction": float(counts[a] / max(counts.sum(), 1))} for a in range(counts.size)]
    return rows


def score_rows(named: Mapping, picked: Mapping, runs: Sequence[Mapping], scores: tuple[str, str],
               sampled_age: Mapping[str, float], buffer: int, cell: Mapping = {}) -> dict[str, dict]:
    """Arm → its ``score_vs_tau.csv`` row: the mean and final score (``scores``: the run columns)
    with 95% Student-t intervals over the scoring ``runs``, the mean replayed age, the buffer span
    over τ (0 for τ = ∞) and the replayed-age gap to ``per_authors``, |age − age_PER| / age_PER."""
    per_age, table = sampled_age["per_authors"], {}
    for arm, (_, tau) in named.items():
        rows = [r for r in runs if r["arm"] == arm]
        m, f = (interval([r[key] for r in rows]) for key in scores)
        table[arm] = {**cell, "arm": arm, "tau": tau, "learning_rate": picked[arm], "mean": m[0], "mean_low": m[1],
                      "mean_high": m[2], "final": f[0], "final_low": f[1], "final_high": f[2],
                      "sampled_age": sampled_age[arm], "buffer_over_tau": buffer / tau if math.isfinite(tau) else 0.0,
                      "age_gap_vs_per": abs(sampled_age[arm] - per_age) / max(per_age, 1e-12)}
    return table


def score_lines(table: Mapping[str, Mapping], on_tau_axis: Sequence[str], digits: int, leading: Sequence = ()) -> list[str]:
    """The rows of the README's score table: per arm (after the ``leading`` cells) its tuned rate,
    mean and final score with intervals (``digits`` decimals), mean replayed age and, for the arms
    ``on_tau_axis``, buffer span / τ and the replayed-age gap to ``per_authors``."""
    lines = []
    for arm, r in table.items():
        cells = [*leading, arm, r["learning_rate"], interval_text(r["mean"], r["mean_low"], r["mean_high"], digits),
                 interval_text(r["final"], r["final_low"], r["final_high"], digits), f"{r['sampled_age']:.1f}"]
        lines.append(f"| {' | '.join(str(c) for c in cells)} | " + (
            f"{r['buffer_over_tau']:.0f} | {100 * r['age_gap_vs_per']:.0f}% |" if arm in on_tau_axis else " | |"))
    return lines


def plot_ess_by_age(ax, drift: Mapping[float, Mapping], taus: Sequence[float], ylabel: str) -> None:
    """Trajectory (solid) and per-step (dotted) ESS/n against age per learning rate, with their τ
    fits in the legend; the τ grid as grey lines."""
    for lr, d in drift.items():
        line, = ax.plot(d["ess_trajectory"], label=f"lr {lr}: trajectory (τ {d['tau_trajectory']:.1f})")
        ax.plot(d["ess_step"], ":", color=line.get_color(), label=f"lr {lr}: per step (τ {d['tau_step']:.1f})")
    for tau in taus:
        ax.axvline(tau, color="grey", lw=0.5)
    ax.set(xlabel="age (versions); grey: the τ grid", ylabel=ylabel, xscale="symlog")


__all__ = ["CONTROLS", "NO_REPLAY", "arms", "ess_rows", "mean_by_age", "picked_rates", "plot_ess_by_age",
           "sampled_age_rows", "score_lines", "score_rows", "tau_arms", "tuning_rows", "usual_rate"]
