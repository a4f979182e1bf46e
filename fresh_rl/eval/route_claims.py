"""The missing-old-logit paper's route claims (arXiv 2605.12070) as seed-paired tests.

One grid cell (a task, a staleness window W, a learning rate, ...) runs every route on the same
seeds. A claim compares two routes there on one metric: ``"return"`` (the learner's score:
mean evaluation return in control, the LLM learner's verifiable success rate) or ``"active"``
(the run's mean active-token fraction ρ_active). The difference a − b is decided by
:func:`fresh_rl.eval.paired_claim`. Route names are those of both route
registries (``fresh_rl.control.old_logits_train`` and ``fresh_rl.llm.old_logits``); this module
knows only the names.

A cell where recompute_current (current weights standing in for the old ones) masks under
:data:`MIN_MASKED_FRACTION` of the samples cannot test a route claim: the mask has not
collapsed, so the mechanism the claims are about is not acting there. The threshold is our
choice (the paper gives none).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from fresh_rl.eval.aggregates import paired_claim

ROUTE_CLAIMS = (
    # (claim, route a, route b, a better?, metric)
    ("mask collapse costs reward: snapshot > recompute_current", "snapshot", "recompute_current", True, "return"),
    ("EWMA (reset) > recompute_current", "ewma", "recompute_current", True, "return"),
    ("EWMA (no reset) > recompute_current", "ewma_no_reset", "recompute_current", True, "return"),
    ("EWMA (reset) loses reward against snapshot", "ewma", "snapshot", False, "return"),
    ("EWMA (no reset) loses reward against snapshot", "ewma_no_reset", "snapshot", False, "return"),
    ("proxies only move the clip boundary: log-linear proxy keeps fewer samples than snapshot",
     "loglinear_proxy", "snapshot", False, "active"),
    ("proxies only move the clip boundary: linear proxy keeps fewer samples than snapshot",
     "linear_proxy", "snapshot", False, "active"),
    ("log-linear proxy < snapshot in reward", "loglinear_proxy", "snapshot", False, "return"),
    ("linear proxy < snapshot in reward", "linear_proxy", "snapshot", False, "return"),
    ("reset restores coverage: EWMA ρ_active with reset > without", "ewma", "ewma_no_reset", True, "active"),
    ("reset helps reward: EWMA with reset > without", "ewma", "ewma_no_reset", True, "return"),
)
RECOVERY_CLAIMS = tuple(
    (f"{name} recovers most (> 50%) of the exact route's reward over recompute_current", route)
    for name, route in (("EWMA (reset)", "ewma"), ("EWMA (no reset)", "ewma_no_reset")))
"""(claim, route): (route − recompute_current)/(snapshot − recompute_current) of the returns
has its 95% interval above 0.5 (reproduced) or below it (refuted)."""
MIN_MASKED_FRACTION = 0.05
"""Below this fraction of samples masked by recompute_current, a cell cannot test a route claim."""


def recovery_fraction(ewma, snapshot, current, reps: int = 2000, seed: int = 0) -> dict:
    """(ewma − current)/(snapshot − current) of the seed means, with a percentile bootstrap over
    seeds resampled jointly (the runs are paired by seed)."""
    ewma, snapshot, current = (np.asarray(x, np.float64) for x in (ewma, snapshot, current))
    idx = np.random.default_rng(seed).integers(0, ewma.size, size=(reps, ewma.size))
    gap = snapshot[idx].mean(1) - current[idx].mean(1)
    boot = (ewma[idx].mean(1) - current[idx].mean(1)) / np.where(gap == 0, np.nan, gap)
    low, high = np.nanpercentile(boot, [2.5, 97.5])
    point = (ewma.mean() - current.mean()) / (snapshot.mean() - current.mean())
    return {"difference": float(point), "low": float(low), "high": float(high)}


def decide_route_claims(metric_of: Callable[[str, str], Optional[np.ndarray]], masked_fraction: float,
                        claims=ROUTE_CLAIMS, recovery_claims=RECOVERY_CLAIMS,
                        min_masked_fraction: float = MIN_MASKED_FRACTION) -> list[dict]:
    """One cell's verdict rows: every claim of ``claims`` whose two routes the cell ran, then
    ``recovery_claims``.

    ``metric_of(route, metric)``: that route's per-seed values (``[seeds]``, the seeds in the same
    order for every route), or None when the cell did not run the route. ``masked_fraction``:
    the fraction of samples recompute_current masks in this cell. Rows: ``claim, a, b, metric,
    mean_a, mean_b, difference, low, high, verdict``."""
    untestable = (f"untestable here (recompute_current masks {masked_fraction:.3f})"
                  if masked_fraction < min_masked_fraction else None)
    rows, gap = [], None
    for claim, a, b, a_better, metric in claims:
        sa, sb = metric_of(a, metric), metric_of(b, metric)
        if sa is None or sb is None:
            continue
        row = paired_claim(sa, sb, a_better)
        if (a, b, metric) == ("snapshot", "recompute_current", "return"):
            gap = dict(row)  # the exact route's gain the recovery claims divide by
        if untestable:
            row["verdict"] = untestable
        rows.append({"claim": claim, "a": a, "b": b, "metric": metric,
                     "mean_a": float(np.mean(sa)), "mean_b": float(np.mean(sb)), **row})
    for claim, route in recovery_claims:
        returns = [metric_of(r, "return") for r in (route, "snapshot", "recompute_current")]
        if any(r is None for r in returns):
            continue
        row = recovery_fraction(*returns)
        if untestable:
            row["verdict"] = untestable
        elif gap is None or gap["low"] <= 0:
            row["verdict"] = "untestable here (snapshot does not beat recompute_current: no gap)"
        else:
            row["verdict"] = ("reproduced" if row["low"] > 0.5 else "refuted" if row["high"] < 0.5
                              else "not separated")
        rows.append({"claim": claim, "a": route, "b": "snapshot vs recompute_current",
                     "metric": "recovered fraction", "mean_a": float(np.mean(returns[0])),
                     "mean_b": float(np.mean(returns[1])), **row})
    return rows


def claim_summary(verdict_rows: list[dict], cell_label: Callable[[dict], str]) -> list[dict]:
    """One row per claim over its cells: how many cells reproduce, refute, do not separate or
    cannot test it, and the overall reading: *reproduced* / *refuted* when some testable cells
    decide it one way and none the other, *mixed* when cells decide both ways, *not separated*
    when no cell decides, *untestable here* when no cell can test it. ``cell_label(row)`` names
    a deciding cell in ``decided_cells``."""
    rows = []
    for claim in dict.fromkeys(r["claim"] for r in verdict_rows):
        cells = [r for r in verdict_rows if r["claim"] == claim]
        count = {v: sum(r["verdict"] == v for r in cells) for v in ("reproduced", "refuted", "not separated")}
        untestable = len(cells) - sum(count.values())
        testable = len(cells) - untestable
        if count["reproduced"] and count["refuted"]:
            overall = "mixed"
        elif count["reproduced"] or count["refuted"]:
            overall = "reproduced" if count["reproduced"] else "refuted"
        else:
            overall = "not separated" if count["not separated"] else "untestable here"
        if testable:
            overall += f" ({count['reproduced'] + count['refuted']} of {testable} testable cells decide)"
        decided = [f"{cell_label(r)}: {r['verdict']}" for r in cells if r["verdict"] in ("reproduced", "refuted")]
        rows.append({"claim": claim, "metric": cells[0]["metric"], "cells": len(cells), **count,
                     "untestable": untestable, "overall": overall, "decided_cells": "; ".join(decided)})
    return rows


__all__ = ["MIN_MASKED_FRACTION", "RECOVERY_CLAIMS", "ROUTE_CLAIMS", "claim_summary",
           "decide_route_claims", "recovery_fraction"]
