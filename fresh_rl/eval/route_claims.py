"""The missing-old-logit paper's route claims (arXiv 2605.12070) as seed-paired tests.

One grid cell (a task, a staleness window W, a learning rate, ...) runs every route on the same
seeds. A claim compares two routes there on one metric: ``"return"`` (the learner's score:
mean evaluation return in control, the LLM learner's verifiable success rate) or ``"active"``
(the run's mean active-token fraction ρ_active). The difference a − b is decided by
:func:`fresh_rl.eval.paired_claim` (Student-t on the seed-paired differences). Route names are those of the one route
registry every trainer shares (``fresh_rl.corrections.routes``); this module knows only the
names.

A cell where recompute_current (current weights standing in for the old ones) masks under
:data:`MIN_MASKED_FRACTION` of the samples cannot test a route claim: the mask has not
collapsed, so the mechanism the claims are about is not acting there. The threshold is our
choice (the paper gives none).
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from fresh_rl.eval.statistics import VERDICTS, paired_claim, seed_interval

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
"""(claim, route): the route recovers more than half of snapshot's gain over recompute_current,
(route − rc)/(snapshot − rc) > ½, tested as the paired difference route − (snapshot + rc)/2 > 0
(the same inequality where snapshot > rc, and a plain Student-t test: no ratio of noisy means)."""
MIN_MASKED_FRACTION = 0.05
"""Below this fraction of samples masked by recompute_current, a cell cannot test a route claim."""
MIDPOINT = "midpoint of snapshot and recompute_current"
"""Arm b of the recovery claims."""
TARGET_RESET_RATE = 0.2
"""The reset rate an EWMA reset threshold is calibrated to (resets per iteration): our choice,
inside the 5–50% gate of the reset claims, a reset every ~5 iterations."""
FACTORIAL_ARMS: tuple[str, ...] = ("snapshot", "mask_snapshot_clip_current", "mask_current_clip_snapshot",
                                   "recompute_current")
"""The mask × clip factorial's four routes as (mask source, clip centre): SS, SC, CS, CC, with S =
snapshot's old log-probs and C = the current weights' (docs/old_logits.md, "Mask or clip")."""
_SS, _SC, _CS, _CC = FACTORIAL_ARMS
FACTORIAL_CONTRASTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "total gap (snapshot − recompute_current)": ((_SS,), (_CC,)),
    "mask main effect": ((_SS, _SC), (_CS, _CC)),
    "clip main effect": ((_SS, _CS), (_SC, _CC)),
    "interaction (half contrast)": ((_SS, _CC), (_SC, _CS)),
}
"""The factorial's contrasts, name → (arms a, arms b): the per-seed mean of a's arms minus that of
b's (:data:`FACTORIAL_ARMS`). The two main effects add up to the
total gap SS − CC; the interaction row is half the contrast SS − SC − CS + CC."""


def factorial_effects(values: dict[str, np.ndarray]) -> list[dict]:
    """Every :data:`FACTORIAL_CONTRASTS` row from ``values`` (route → per-seed scores, the seeds in
    the same order for every route): ``contrast, difference, low, high`` (95% Student-t on the
    seed-paired differences, :func:`fresh_rl.eval.seed_interval`)."""
    rows = []
    for name, (a, b) in FACTORIAL_CONTRASTS.items():
        d = np.mean([values[r] for r in a], axis=0) - np.mean([values[r] for r in b], axis=0)
        mean, low, high = (float(x) for x in seed_interval(d))
        rows.append({"contrast": name, "difference": mean, "low": low, "high": high, "seeds": int(d.size)})
    return rows


def reset_rates(rows, thresholds) -> dict[float, float]:
    """Threshold → the mean ``reset_rate`` of the ``rows`` (calibration runs) at that ``threshold``."""
    return {t: float(np.mean([r["reset_rate"] for r in rows if r["threshold"] == t])) for t in thresholds}


def nearest_reset_rate(rates: dict[float, float], target: float = TARGET_RESET_RATE) -> float:
    """The threshold of ``rates`` (threshold → measured reset rate) whose rate is nearest
    ``target``; the first in ``rates``' order on a tie."""
    return min(rates, key=lambda t: abs(rates[t] - target))


def decide_route_claims(metric_of: Callable[[str, str], Optional[np.ndarray]], masked_fraction: float,
                        claims=ROUTE_CLAIMS, recovery_claims=RECOVERY_CLAIMS,
                        min_masked_fraction: float = MIN_MASKED_FRACTION) -> list[dict]:
    """One cell's rows: every claim of ``claims`` whose two routes the cell ran, then
    ``recovery_claims``, each decided by :func:`fresh_rl.eval.paired_claim` (Student-t on the
    paired seed differences).

    ``metric_of(route, metric)``: that route's per-seed values (``[seeds]``, the seeds in the same
    order for every route), or None when the cell did not run the route. ``masked_fraction``:
    the fraction of samples recompute_current masks in this cell; under ``min_masked_fraction``
    every row is *not testable here* and ``gate`` says why, as it does for a recovery claim where
    snapshot does not beat recompute_current. Rows: ``claim, a, b, metric, mean_a, mean_b,
    difference, low, high, p_value, seeds, verdict, gate``."""
    gate = (f"recompute_current masks {masked_fraction:.3f} < {min_masked_fraction}"
            if masked_fraction < min_masked_fraction else "")
    rows, gap = [], None
    for claim, a, b, a_better, metric in claims:
        sa, sb = metric_of(a, metric), metric_of(b, metric)
        if sa is None or sb is None:
            continue
        row = paired_claim(sa, sb, a_better)
        if (a, b, metric) == ("snapshot", "recompute_current", "return"):
            gap = row  # the exact route's gain the recovery claims split in half
        rows.append({"claim": claim, "a": a, "b": b, "metric": metric,
                     "mean_a": float(np.mean(sa)), "mean_b": float(np.mean(sb)), **row, "gate": gate})
    for claim, route in recovery_claims:
        returns = [metric_of(r, "return") for r in (route, "snapshot", "recompute_current")]
        if any(r is None for r in returns):
            continue
        midpoint = (returns[1] + returns[2]) / 2.0
        row = {"claim": claim, "a": route, "b": MIDPOINT, "metric": "return",
               "mean_a": float(np.mean(returns[0])), "mean_b": float(np.mean(midpoint)),
               **paired_claim(returns[0], midpoint, True), "gate": gate}
        if not gate and (gap is None or gap["low"] <= 0):
            row["gate"] = "snapshot does not beat recompute_current (no gain to recover)"
        rows.append(row)
    for row in rows:
        if row["gate"]:
            row["verdict"] = VERDICTS[3]
    return rows


__all__ = ["FACTORIAL_ARMS", "FACTORIAL_CONTRASTS", "MIDPOINT", "MIN_MASKED_FRACTION", "RECOVERY_CLAIMS",
           "ROUTE_CLAIMS", "TARGET_RESET_RATE", "decide_route_claims", "factorial_effects", "nearest_reset_rate", "reset_rates"]
