"""experiments/vaco_forward_lag.py run as a user runs it (``--scale ci``): equal tuning grids on
other seeds, every cell at the pick, the measured lags per run, the warm-up that keeps lagged
actors off θ0, resumption. Slow lane: 14 programs compile (≈ 1.5–3 min on 2 cores)."""
from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, run_study):
    out = tmp_path_factory.mktemp("vaco_forward_lag")
    return out, run_study("vaco_forward_lag", "ci", out)


def test_every_method_is_tuned_on_other_seeds_with_a_grid_of_its_own_and_scored_at_its_pick(ci_run, csv_rows):
    out, _ = ci_run
    runs, tuning = csv_rows(out / "runs.csv"), csv_rows(out / "tuning.csv")
    assert {int(r["seed"]) for r in tuning} == {0} and {int(r["seed"]) for r in runs} == {1, 2}
    assert {r["lag"] for r in tuning} == {"2"}  # the middle cell: lag 2 of (0, 2), M = 4
    for method in ("ppo_clip", "vaco"):
        best = max((r for r in tuning if r["method"] == method), key=lambda r: float(r["mean_return"]))
        scored = {(r["knob"], r["learning_rate"]) for r in runs if r["method"] == method and r["tuned_knob"] == "True"}
        assert scored == {(best["knob"], best["learning_rate"])}, method


def test_cells_report_versions_and_measured_lags(ci_run, csv_rows):
    out, _ = ci_run
    runs = csv_rows(out / "runs.csv")
    assert {r["backward"] for r in runs} == {"0", "2", "mixture"}
    assert {int(r["versions"]) for r in runs} == {12}
    for r in runs:
        gap = float(r["version_gap"])
        # the warm-up (2 versions) keeps lag 0 on-policy and a lag of 2 below 2 on average
        assert (gap == 0.0) if r["backward"] == "0" else (0.0 < gap < 2.0), r
        assert float(r["forward_tv"]) >= 0.0
        assert int(r["diverged_at"]) == -1  # no ci run diverges (the rule: test_forward_lag_study.py)
    # VACO's δ curve and both ablations at the middle M
    methods = {(r["method"], r["knob"]) for r in runs}
    assert {("vaco", k) for k in ("0.05", "0.1", "0.2", "0.4")} <= methods
    assert {m for m, _ in methods} >= {"vaco_align_only", "vaco_filter_only"}
    for name in ("score_vs_forward_lag.png", "score_vs_backward_lag.png", "score_vs_tv.png", "README.md"):
        assert (out / name).stat().st_size > 0
    cells = [line for line in (out / "README.md").read_text().splitlines() if line.startswith("| CartPole-v1 | ")]
    assert cells and not any("nan" in line for line in cells)  # a measure a method lacks reads "–"


def test_every_cell_reports_the_importance_sampled_forward_tv_from_reruns_of_its_scoring_runs(ci_run, csv_rows):
    out, _ = ci_run
    runs, measured = csv_rows(out / "runs.csv"), csv_rows(out / "forward_tv.csv")
    cell = ("method", "backward", "updates")
    assert {r["seed"] for r in measured} == {"1"}  # the first scoring seed (forward_tv_seeds = 1)
    assert {tuple(r[k] for k in cell) for r in measured} == {
        tuple(r[k] for k in cell) for r in runs if r["tuned_knob"] == "True" and r["method"] in ("ppo_clip", "vaco")}
    for r in measured:
        # a mean of non-negative per-draw terms ½|π_θ/β − π_T/β|: finite and ≥ 0. Unbiased for a TV, so ≤ 1
        # in expectation only; no finite-sample upper bound holds (its exactness is tested against
        # NumPy categoricals in test_corrections_diagnostics.py).
        weighted = float(r["forward_tv_weighted"])
        assert math.isfinite(weighted) and weighted >= 0.0, r
        if r["backward"] == "0":  # on-policy: the two estimators are one formula (test_control_train.py)
            assert weighted > 0.0 and float(r["forward_tv"]) > 0.0
    text = (out / "README.md").read_text()
    assert "## Forward TV at each batch's last update, both estimators" in text and "reproduce their scoring run" in text


def test_rerun_restores_every_stage(ci_run, run_study):
    out, _ = ci_run
    runs = (out / "runs.csv").read_text()
    again = run_study("vaco_forward_lag", "ci", out)
    assert "tuning 1/" not in again.stderr and "scoring 4/" not in again.stderr and "forward_tv 2/" not in again.stderr
    assert (out / "runs.csv").read_text() == runs
