"""experiments/old_logits_factorial.py run as a user runs it (``--scale ci``): its tables, the
tuning/scoring split, the calibrated reset threshold, the factorial's effect algebra, the verdict
reader on its runs, resumption."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from fresh_rl.eval.verdicts import READERS

FACTORIAL = ("snapshot", "mask_snapshot_clip_current", "mask_current_clip_snapshot", "recompute_current")


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, run_study):
    out = tmp_path_factory.mktemp("old_logits_factorial")
    return out, run_study("old_logits_factorial", "ci", out)


def test_ci_scale_writes_its_tables_and_figures(ci_run, csv_rows):
    out, _ = ci_run
    for name in ("runs.csv", "tuning.csv", "calibration.csv", "effects.csv", "effects.png", "mechanism.png",
                 "config.json", "README.md"):
        assert (out / name).stat().st_size > 0, name
    runs = csv_rows(out / "runs.csv")
    # ci: one cell, the four factorial arms + ewma + ewma_no_reset, scored on 2 seeds
    assert sorted((r["arm"], int(r["seed"])) for r in runs) == sorted(
        (a, s) for a in FACTORIAL + ("ewma", "ewma_no_reset") for s in (1, 2))


def test_tuning_and_calibration_use_other_seeds_and_their_picks_are_applied(ci_run, csv_rows):
    out, _ = ci_run
    runs, tuning, calibration = (csv_rows(out / f"{n}.csv") for n in ("runs", "tuning", "calibration"))
    assert {int(r["seed"]) for r in tuning} == {int(r["seed"]) for r in calibration} == {0}
    for arm in FACTORIAL + ("ewma_no_reset",):  # each arm runs the best tuning-seed rate of its grid
        best = max((r for r in tuning if r["arm"] == arm), key=lambda r: float(r["mean_return"]))
        assert {r["learning_rate"] for r in runs if r["arm"] == arm} == {best["learning_rate"]}
    no_reset_lr = {r["learning_rate"] for r in runs if r["arm"] == "ewma_no_reset"}
    assert {r["learning_rate"] for r in runs if r["arm"] == "ewma"} == no_reset_lr
    assert {r["learning_rate"] for r in calibration} == no_reset_lr
    # the scored threshold is the calibration's nearest to a 20% reset rate
    nearest = min(calibration, key=lambda r: abs(float(r["reset_rate"]) - 0.2))["threshold"]
    assert {r["threshold"] for r in runs if r["arm"] == "ewma"} == {nearest}
    assert all(float(r["reset_rate"]) == 0.0 for r in runs if r["arm"] == "ewma_no_reset")


def test_the_total_gap_is_the_sum_of_the_two_main_effects(ci_run, csv_rows):
    """SS − CC = [mean(SS, SC) − mean(CS, CC)] + [mean(SS, CS) − mean(SC, CC)] per seed, so the
    seed means add exactly up to float64 rounding (~1e-13 of returns ≤ 500)."""
    out, _ = ci_run
    runs = csv_rows(out / "runs.csv")
    effect = {(r["contrast"], r["metric"]): float(r["difference"]) for r in csv_rows(out / "effects.csv")}
    for metric in ("mean_return", "active_fraction"):
        total = effect["total gap (snapshot − recompute_current)", metric]
        assert total == pytest.approx(effect["mask main effect", metric] + effect["clip main effect", metric],
                                      abs=1e-9)
        per_seed = {a: np.array([float(r[metric]) for r in sorted(runs, key=lambda r: int(r["seed"]))
                                 if r["arm"] == a]) for a in FACTORIAL}
        assert total == pytest.approx(float(np.mean(per_seed["snapshot"] - per_seed["recompute_current"])), abs=1e-9)
    # the mask read from the current weights keeps fewer samples than snapshot's (lag 4: r_d far from 1)
    active = {a: np.mean([float(r["active_fraction"]) for r in runs if r["arm"] == a]) for a in FACTORIAL}
    assert active["mask_current_clip_snapshot"] < active["snapshot"]


def test_the_verdict_reader_decides_the_declared_claims_on_the_ci_runs(ci_run, tmp_path):
    out, _ = ci_run
    study = tmp_path / "results" / "old_logits_factorial"
    study.mkdir(parents=True)
    shutil.copy(out / "runs.csv", study / "runs.csv")
    series, measure = READERS["old_logits_factorial"](tmp_path)
    cell = {"task": "CartPole-v1", "setting": "fixed4"}
    assert sorted(series("snapshot", {"metric": "return"}, cell)) == [1, 2]
    assert 0.0 <= measure({"measure": "reset_rate"}, cell) <= 1.0
    assert 0.0 <= measure({"measure": "recompute_current_masked_fraction"}, cell) <= 1.0


def test_rerun_restores_every_chunk(ci_run, run_study):
    out, first = ci_run
    runs = (out / "runs.csv").read_text()
    again = run_study("old_logits_factorial", "ci", out)
    assert "scoring 4/" not in again.stderr and "tuning 4/" not in again.stderr  # nothing recomputed
    assert (out / "runs.csv").read_text() == runs
    assert again.stdout.splitlines()[4:] == first.stdout.splitlines()[4:]
