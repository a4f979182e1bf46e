"""The old-logit route claims decided per cell (fresh_rl.eval.route_claims)."""
import numpy as np
import pytest

from fresh_rl.eval.route_claims import (MIN_MASKED_FRACTION, RECOVERY_CLAIMS, ROUTE_CLAIMS, claim_summary,
                                        decide_route_claims, recovery_fraction)

SEEDS = 6


def _cell(returns: dict, active: dict):
    """``metric_of`` over per-route per-seed arrays (a route missing from ``returns``: not run)."""
    def metric_of(route, metric):
        table = returns if metric == "return" else active
        return None if route not in table else np.asarray(table[route], np.float64)
    return metric_of


def _noise(scale, seed):
    return scale * np.random.default_rng(seed).standard_normal(SEEDS)


def test_recovery_fraction_of_paired_runs():
    """EWMA halfway between recompute_current and snapshot on every seed recovers 0.5; the
    interval covers the point and is degenerate when every seed says the same."""
    current = np.array([100.0, 120.0, 90.0, 110.0])
    snapshot = current + np.array([40.0, 60.0, 50.0, 30.0])
    out = recovery_fraction(current + 0.5 * (snapshot - current), snapshot, current)
    assert out["difference"] == pytest.approx(0.5)
    assert out["low"] == pytest.approx(0.5) and out["high"] == pytest.approx(0.5)
    noisy = recovery_fraction(current + np.array([10.0, 50.0, 5.0, 30.0]), snapshot, current)
    assert noisy["low"] <= noisy["difference"] <= noisy["high"]


def test_a_cell_that_shows_the_paper_decides_every_claim_it_ran():
    """snapshot far above recompute_current, EWMA (identical with and without reset) at 90% of the
    gap, the linear proxy masking more than snapshot: the claims come out as the paper states
    them, the log-linear proxy's claims are skipped (not run), and ``ewma`` vs ``ewma_no_reset``
    (the same runs) does not separate."""
    base = 0.4 + _noise(0.01, 0)
    ewma = base + 0.27 + _noise(0.002, 1)
    returns = {"recompute_current": base, "snapshot": base + 0.3, "ewma": ewma, "ewma_no_reset": ewma,
               "linear_proxy": base + 0.1 + _noise(0.002, 2)}
    active = {"recompute_current": np.full(SEEDS, 0.8), "snapshot": np.ones(SEEDS),
              "ewma": np.full(SEEDS, 0.99), "ewma_no_reset": np.full(SEEDS, 0.99),
              "linear_proxy": 0.9 + _noise(0.01, 3)}
    rows = decide_route_claims(_cell(returns, active), masked_fraction=0.2)
    ran = [c for c in ROUTE_CLAIMS if c[1] in returns and c[2] in returns]
    assert [r["claim"] for r in rows] == [c[0] for c in ran] + [c[0] for c in RECOVERY_CLAIMS]
    verdict = {r["claim"]: r["verdict"] for r in rows}
    expected = {c[0]: "reproduced" for c in ran}
    expected.update({c[0]: "not separated" for c in ran if {c[1], c[2]} == {"ewma", "ewma_no_reset"}})
    expected.update({c[0]: "reproduced" for c in RECOVERY_CLAIMS})
    assert verdict == expected
    for r in rows[:len(ran)]:
        assert r["low"] <= r["difference"] <= r["high"]
        assert r["mean_a"] == pytest.approx(np.mean(returns[r["a"]] if r["metric"] == "return" else active[r["a"]]))


def test_an_uncollapsed_mask_or_no_gap_makes_a_cell_untestable():
    base = 0.4 + _noise(0.01, 0)
    returns = {"recompute_current": base, "snapshot": base + 0.3, "ewma": base + 0.2}
    active = {r: np.ones(SEEDS) for r in returns}
    masked = MIN_MASKED_FRACTION / 2
    rows = decide_route_claims(_cell(returns, active), masked_fraction=masked)
    assert rows and all(r["verdict"] == f"untestable here (recompute_current masks {masked:.3f})"
                        for r in rows)
    # the mask collapsed but the exact route gains nothing: the recovery has no gap to divide
    returns["snapshot"] = base - 0.01
    rows = decide_route_claims(_cell(returns, active), masked_fraction=0.2)
    recovery = [r for r in rows if r["metric"] == "recovered fraction"]
    assert [r["a"] for r in recovery] == ["ewma"]
    assert recovery[0]["verdict"] == "untestable here (snapshot does not beat recompute_current: no gap)"


def test_claim_summary_counts_every_cell_once():
    def row(claim, verdict, window):
        return {"claim": claim, "metric": "return", "verdict": verdict, "window": window}
    rows = [row("a", "reproduced", 1), row("a", "refuted", 4), row("a", "not separated", 16),
            row("b", "reproduced", 1), row("b", "untestable here (x)", 4),
            row("c", "untestable here (x)", 1),
            row("d", "not separated", 1)]
    summary = {r["claim"]: r for r in claim_summary(rows, lambda r: f"W={r['window']}")}
    assert summary["a"]["overall"] == "mixed (2 of 3 testable cells decide)"
    assert summary["a"]["decided_cells"] == "W=1: reproduced; W=4: refuted"
    assert summary["b"]["overall"] == "reproduced (1 of 1 testable cells decide)"
    assert summary["c"]["overall"] == "untestable here"
    assert summary["d"]["overall"] == "not separated (0 of 1 testable cells decide)"
    for r in summary.values():
        assert r["reproduced"] + r["refuted"] + r["not separated"] + r["untestable"] == r["cells"]
