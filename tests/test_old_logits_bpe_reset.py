"""experiments/old_logits_bpe_reset.py run as a user runs it (``--scale ci``, the random-weight BPE
stand-in): calibration on other seeds, the kept threshold is the calibration's nearest to the
target rate, both routes scored on the same seeds, resumption (slow lane: three vmapped LLM
programs compile, ≈ 2 min on 2 cores); and, without training, the committed no-reset rows read
back from the bpe grid's run files."""
from __future__ import annotations

import pytest

from fresh_rl.llm.old_logits_reset_study import Scale, read_no_reset_rows, table
from fresh_rl.llm.presets import OLD_LOGITS_SCALES, RESULTS


def test_the_committed_no_reset_rows_are_read_from_the_bpe_grid(csv_rows):
    """``read_no_reset_rows`` reads the bpe grid's committed W = 16 ``ewma_no_reset`` run files
    (fresh_rl.llm.old_logits_study.read_run_csv) into the rows results/old_logits_bpe_reset/runs.csv holds."""
    runs = RESULTS / "old_logits_bpe" / "runs"
    committed = RESULTS / "old_logits_bpe_reset" / "runs.csv"
    if not (runs.is_dir() and committed.exists()):
        pytest.skip("no committed results/old_logits_bpe runs in this checkout")
    scale = Scale(OLD_LOGITS_SCALES["bpe"], 16, (0.985,), (5,), (0, 1, 2, 3, 4), no_reset_runs=runs)
    rows = table("ewma_no_reset", read_no_reset_rows(scale, scale.bed))
    assert [{k: str(v) for k, v in r.items()} for r in rows] == [
        r for r in csv_rows(committed) if r["route"] == "ewma_no_reset"]


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, run_study):
    out = tmp_path_factory.mktemp("old_logits_bpe_reset")
    return out, run_study("old_logits_bpe_reset", "ci", out)


@pytest.mark.slow
def test_calibration_picks_the_threshold_and_scoring_pairs_the_routes(ci_run, csv_rows):
    out, _ = ci_run
    calibration, runs = csv_rows(out / "calibration.csv"), csv_rows(out / "runs.csv")
    assert {int(r["seed"]) for r in calibration} == {1} and {r["threshold"] for r in calibration} == {"0.5", "0.999"}
    nearest = min(calibration, key=lambda r: (abs(float(r["reset_rate"]) - 0.2), float(r["threshold"])))
    assert {r["threshold"] for r in runs if r["route"] == "ewma"} == {nearest["threshold"]}
    assert sorted((r["route"], int(r["seed"])) for r in runs) == [("ewma", 0), ("ewma_no_reset", 0)]
    for r in calibration + runs:
        assert 0.0 <= float(r["reset_rate"]) <= 1.0 and 0.0 <= float(r["success_held_out"]) <= 1.0
    assert all(float(r["reset_rate"]) == 0.0 for r in runs if r["route"] == "ewma_no_reset")


@pytest.mark.slow
def test_rerun_loads_the_saved_stages(ci_run, run_study):
    out, _ = ci_run
    runs = (out / "runs.csv").read_text()
    again = run_study("old_logits_bpe_reset", "ci", out)
    assert "iteration" not in again.stdout.split("# EWMA")[0]  # nothing trained again
    assert (out / "runs.csv").read_text() == runs
