"""The old-logit route claims decided per cell (fresh_rl.eval.route_claims)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fresh_rl.eval import holm_over_cells
from fresh_rl.eval.route_claims import (FACTORIAL_CONTRASTS, MIDPOINT, MIN_MASKED_FRACTION, RECOVERY_CLAIMS,
                                        ROUTE_CLAIMS, decide_route_claims, factorial_effects)

SEEDS = 6


def _cell(returns: dict, active: dict):
    """``metric_of`` over per-route per-seed arrays (a route missing from ``returns``: not run)."""
    def metric_of(route, metric):
        table = returns if metric == "return" else active
        return None if route not in table else np.asarray(table[route], np.float64)
    return metric_of


def _noise(scale, seed):
    return scale * np.random.default_rng(seed).standard_normal(SEEDS)


def test_recovery_is_the_route_against_the_midpoint_of_snapshot_and_recompute_current():
    """"Recovers > 50%" of snapshot's gain ⇔ the route beats (snapshot + recompute_current)/2,
    paired by seed: EWMA at 70% of the gap on every seed is reproduced, at 30% refuted."""
    current = np.array([100.0, 120.0, 90.0, 110.0])
    snapshot = current + np.array([40.0, 60.0, 50.0, 30.0])
    noise = np.array([1.0, -1.0, 2.0, -2.0])
    for share, expected in ((0.7, "reproduced"), (0.3, "refuted")):
        returns = {"recompute_current": current, "snapshot": snapshot,
                   "ewma": current + share * (snapshot - current) + noise}
        rows = decide_route_claims(_cell(returns, {}), masked_fraction=0.2, claims=ROUTE_CLAIMS[:1])
        gain, row = rows  # snapshot > recompute_current opens the gate
        assert gain["verdict"] == "reproduced"
        assert (row["a"], row["b"], row["verdict"]) == ("ewma", MIDPOINT, expected)
        # float64 host arithmetic (no XLA): a few ulps ≪ approx's default rel 1e-6
        assert row["difference"] == pytest.approx(np.mean((share - 0.5) * (snapshot - current) + noise))


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
    expected.update({c[0]: "undecided" for c in ran if {c[1], c[2]} == {"ewma", "ewma_no_reset"}})
    expected.update({c[0]: "reproduced" for c in RECOVERY_CLAIMS})
    assert verdict == expected
    for r in rows[:len(ran)]:
        assert r["low"] <= r["difference"] <= r["high"]
        # float64 means of the same 6 values (no XLA): a few ulps ≪ approx's default rel 1e-6
        assert r["mean_a"] == pytest.approx(np.mean(returns[r["a"]] if r["metric"] == "return" else active[r["a"]]))


def test_an_uncollapsed_mask_or_no_gap_makes_a_cell_not_testable():
    base = 0.4 + _noise(0.01, 0)
    returns = {"recompute_current": base, "snapshot": base + 0.3, "ewma": base + 0.2}
    active = {r: np.ones(SEEDS) for r in returns}
    masked = MIN_MASKED_FRACTION / 2
    rows = decide_route_claims(_cell(returns, active), masked_fraction=masked)
    assert rows and all(r["verdict"] == "not testable here" for r in rows)
    assert all(r["gate"] == f"recompute_current masks {masked:.3f} < {MIN_MASKED_FRACTION}" for r in rows)
    # the mask collapsed but the exact route gains nothing: no gain for the recovery to split
    returns["snapshot"] = base - 0.01
    rows = decide_route_claims(_cell(returns, active), masked_fraction=0.2)
    recovery = [r for r in rows if r["b"] == MIDPOINT]
    assert [r["a"] for r in recovery] == ["ewma"]
    assert recovery[0]["verdict"] == "not testable here" and "no gain to recover" in recovery[0]["gate"]
    assert all(not r["gate"] for r in rows if r["b"] != MIDPOINT)


def test_holm_over_cells_adjusts_each_claim_over_its_testable_cells():
    """Three cells of one claim: a strong effect survives Holm, a marginal one (p ≈ 0.03 alone)
    does not; a gated cell keeps its verdict and gets no adjusted p."""
    def row(p, verdict, gate=""):
        return {"claim": "c", "p_value": p, "verdict": verdict, "gate": gate}
    rows = holm_over_cells([row(0.001, "reproduced"), row(0.03, "reproduced"), row(0.5, "undecided"),
                            row(1.0, "not testable here", "masks 0.01 < 0.05")])
    assert [r["verdict"] for r in rows] == ["reproduced", "undecided", "undecided", "not testable here"]
    # float64 Holm products of decimal p-values: ≤ 2 ulps ≪ approx's default rel 1e-6
    assert [r["p_holm"] for r in rows[:3]] == pytest.approx([0.003, 0.06, 0.5]) and rows[3]["p_holm"] == ""


def test_every_claimed_route_is_a_repair_route_of_the_shared_registry():
    """The claims name routes of the one registry every trainer shares
    (fresh_rl.corrections.routes), among the repair routes the route grids run."""
    from fresh_rl.corrections.routes import REPAIR_ROUTES
    named = {r for _, a, b, _, _ in ROUTE_CLAIMS for r in (a, b)} | {r for _, r in RECOVERY_CLAIMS}
    assert named | {"snapshot", "recompute_current"} <= set(REPAIR_ROUTES)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 12), st.integers(0, 2**31 - 1))
def test_factorial_effects_split_the_gap_and_match_numpy(n, seed):
    """The two main effects add up to the total gap SS − CC (an identity of the per-seed means, so
    exact up to float64 rounding of four sums: ≤ 1e-12 of scores ≤ 10 here), every row is the
    paired mean of a's arms minus b's with a Student-t interval around it, and the interaction
    row is half of SS − SC − CS + CC."""
    rng = np.random.default_rng(seed)
    values = {arm: rng.normal(0, 3, n) for arm in ("snapshot", "mask_snapshot_clip_current",
                                                   "mask_current_clip_snapshot", "recompute_current")}
    rows = {r["contrast"]: r for r in factorial_effects(values)}
    assert set(rows) == set(FACTORIAL_CONTRASTS) and all(r["seeds"] == n for r in rows.values())
    ss, sc, cs, cc = (values[a] for a in ("snapshot", "mask_snapshot_clip_current", "mask_current_clip_snapshot",
                                          "recompute_current"))
    total = rows["total gap (snapshot − recompute_current)"]["difference"]
    assert total == pytest.approx(float(np.mean(ss - cc)), abs=1e-12)
    assert rows["mask main effect"]["difference"] + rows["clip main effect"]["difference"] == pytest.approx(total, abs=1e-12)
    assert rows["interaction (half contrast)"]["difference"] == pytest.approx(float(np.mean(ss - sc - cs + cc)) / 2,
                                                                             abs=1e-12)
    for r in rows.values():
        assert r["low"] <= r["difference"] <= r["high"]
