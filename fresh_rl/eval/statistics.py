"""Intervals and verdicts over seeds: Student-t intervals of seed means and of paired seed
differences, one pooled test per claim over its cells, Holm's correction across those cells.

Seeds are the independent unit. A comparison of arms a and b on the same seeds (same keys) is
decided on the per-seed differences d_s = a_s − b_s; a claim over several cells (tasks, lags,
learning rates) on the mean over its cells of each seed's differences, d̄_s = (1/C) Σ_c d_sc.
The interval of a mean over n seeds is Student's, x̄ ± t_{n−1, (1+c)/2} · s/√n (s the sample
standard deviation, ddof 1). A claim is *reproduced* when the interval excludes 0 on the claimed
side, *refuted* when it excludes 0 on the other, *undecided* when it spans 0; *not testable
here* is decided by the caller (a gate failed). Why Student-t and not the percentile bootstrap,
with the coverage measured by the tests: docs/statistics.md.
"""
from __future__ import annotations

import gc
import warnings

import numpy as np
from scipy import stats

from fresh_rl.validation import require_in_range

VERDICTS: tuple[str, ...] = ("reproduced", "refuted", "undecided", "not testable here")


def seed_interval(values, axis: int = 0, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over seeds (``axis``) with its Student-t ``confidence`` interval,
    ``x̄ ± t_{n−1, (1+c)/2} · s/√n``.

    Returns ``(mean, low, high)``, each shaped like ``values`` without ``axis`` (pointwise, so a
    learning curve ``[seeds, steps]`` gets a band). With one seed the bounds are NaN: one seed
    has no spread to estimate."""
    require_in_range("confidence", confidence, 0.0, 1.0, low_inclusive=False, high_inclusive=False)
    x = np.moveaxis(np.asarray(values, np.float64), axis, 0)
    n = x.shape[0]
    if n < 1:
        raise ValueError("seed_interval needs at least one seed along axis")
    mean = np.mean(x, axis=0)
    if n < 2:
        return mean, np.full_like(mean, np.nan), np.full_like(mean, np.nan)
    half = stats.t.ppf(0.5 + confidence / 2.0, n - 1) * stats.sem(x, axis=0)
    return mean, mean - half, mean + half


def verdict(low, high, claim_positive: bool):
    """``"reproduced"`` when ``[low, high]`` excludes 0 on the claimed side (above 0 for a
    claimed positive difference), ``"refuted"`` when it excludes 0 on the other, else
    ``"undecided"`` (NaN bounds too). Elementwise on arrays; a ``str`` for scalars."""
    low, high = np.asarray(low, np.float64), np.asarray(high, np.float64)
    claimed, other = (low > 0, high < 0) if claim_positive else (high < 0, low > 0)
    out = np.where(claimed, VERDICTS[0], np.where(other, VERDICTS[1], VERDICTS[2]))
    return str(out) if out.ndim == 0 else out


def _two_sided_p(differences: np.ndarray) -> np.ndarray:
    """p of the one-sample t test of mean 0 along axis 0 (scipy); 1 where it is undefined
    (every difference 0)."""
    with warnings.catch_warnings():  # identical differences: scipy warns of precision loss
        warnings.simplefilter("ignore", RuntimeWarning)
        p = stats.ttest_1samp(differences, 0.0, axis=0).pvalue
    return np.nan_to_num(np.asarray(p, np.float64), nan=1.0)


def paired_claim(a, b, claim_a_better: bool, confidence: float = 0.95) -> dict:
    """Verdict on "a > b" (``claim_a_better``) or "a < b" from per-seed paired scores.

    The Student-t interval (:func:`seed_interval`) of the differences ``a − b`` (seeds paired:
    the same index is the same seed) decides (:func:`verdict`). Returns ``{"difference", "low",
    "high", "p_value", "seeds", "verdict"}``; ``p_value`` is the two-sided one-sample t test of
    mean difference 0."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"paired_claim needs two [seeds] arrays of one shape, got {a.shape} and {b.shape}")
    d = a - b
    mean, low, high = (float(x) for x in seed_interval(d, confidence=confidence))
    p = float(_two_sided_p(d)) if d.size > 1 else 1.0
    return {"difference": mean, "low": low, "high": high, "p_value": p, "seeds": int(d.size),
            "verdict": verdict(low, high, claim_a_better)}


def holm(p_values, alpha: float = 0.05) -> np.ndarray:
    """Holm-adjusted p-values (``statsmodels.stats.multitest.multipletests(method="holm")``):
    rejecting where the adjusted p < α keeps the family-wise error rate ≤ α over the family."""
    from statsmodels.stats.multitest import multipletests  # imported lazily: statsmodels is large

    p = np.asarray(p_values, np.float64)
    if p.size == 0:
        return p
    gc.freeze()  # statsmodels' Holm branch calls gc.collect(): ~0.1 s a call with JAX loaded
    try:
        return multipletests(p, alpha=alpha, method="holm")[1]
    finally:
        gc.unfreeze()


def pooled_interval(differences, confidence: float = 0.95) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pooled rule's interval: ``differences [..., seeds, cells]`` (a − b per seed and
    cell) averaged over the cells per seed, ``d̄_s = (1/C) Σ_c d_sc``, then the Student-t
    interval over seeds (:func:`seed_interval`). Vectorised over the leading axes."""
    d = np.asarray(differences, np.float64)
    if d.ndim < 2:
        raise ValueError(f"pooled_interval needs [..., seeds, cells] differences, got shape {d.shape}")
    return seed_interval(d.mean(axis=-1), axis=-1, confidence=confidence)


def pooled_claim(differences, claim_positive: bool, confidence: float = 0.95) -> dict:
    """One verdict for a claim over several cells, and every cell's result Holm-corrected.

    ``differences [seeds, cells]``: a − b per seed (rows, the same seeds in every cell) and cell.
    The claim is decided by :func:`pooled_interval` (one test, so no correction is needed). Per
    cell: the difference, its Student-t interval, the two-sided t-test p, the Holm-adjusted p
    over the claim's cells (:func:`holm`, α = 1 − ``confidence``) and the cell's verdict at that
    level (the sign of the difference where the adjusted p < α, else undecided). Returns
    ``{"difference", "low", "high", "p_value", "seeds", "cells", "verdict", "per_cell": [...]}``."""
    d = np.asarray(differences, np.float64)
    if d.ndim != 2 or d.shape[0] < 1 or d.shape[1] < 1:
        raise ValueError(f"pooled_claim needs [seeds ≥ 1, cells ≥ 1] differences, got shape {d.shape}")
    mean, low, high = (float(x) for x in pooled_interval(d, confidence))
    seeds, cells = d.shape
    alpha = 1.0 - confidence
    p_cells = _two_sided_p(d) if seeds > 1 else np.ones(cells)
    p_holm = holm(p_cells, alpha)
    cell_mean, cell_low, cell_high = seed_interval(d, axis=0, confidence=confidence)
    sign_verdict = verdict(cell_mean, cell_mean, claim_positive)  # the side the point lies on
    per_cell = [{"difference": float(cell_mean[c]), "low": float(cell_low[c]), "high": float(cell_high[c]),
                 "p_value": float(p_cells[c]), "p_holm": float(p_holm[c]),
                 "verdict": str(sign_verdict[c]) if p_holm[c] < alpha else VERDICTS[2]}
                for c in range(cells)]
    p = float(_two_sided_p(d.mean(axis=1))) if seeds > 1 else 1.0
    return {"difference": mean, "low": low, "high": high, "p_value": p, "seeds": seeds, "cells": cells,
            "verdict": verdict(low, high, claim_positive), "per_cell": per_cell}


def holm_over_cells(rows: list[dict], family=("claim",), alpha: float = 0.05) -> list[dict]:
    """``rows`` (one per claim and cell, each with ``p_value`` and ``verdict``, e.g. from
    :func:`paired_claim`) with ``p_holm``: the p Holm-adjusted (:func:`holm`) over the testable
    rows of each family (rows sharing the ``family`` fields); a testable row's ``verdict`` is kept
    where p_holm < α and becomes *undecided* otherwise; *not testable here* rows get no p_holm.
    A claim over cells is decided by :func:`pooled_claim`, not by these."""
    out = [dict(r, p_holm="") for r in rows]
    for key in dict.fromkeys(tuple(r[f] for f in family) for r in out):
        testable = [r for r in out if tuple(r[f] for f in family) == key and r["verdict"] != VERDICTS[3]]
        for r, p in zip(testable, holm([r["p_value"] for r in testable], alpha)):
            r["p_holm"] = float(p)
            if p >= alpha:
                r["verdict"] = VERDICTS[2]
    return out


__all__ = ["VERDICTS", "holm", "holm_over_cells", "paired_claim", "pooled_claim", "pooled_interval", "seed_interval", "verdict"]
