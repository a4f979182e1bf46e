"""experiments/freshper_control_tau.py run as a user runs it (``--scale ci``): its tables, the
tuning/scoring split, matched update counts, the decay's effect on what is replayed, resumption."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, run_study):
    out = tmp_path_factory.mktemp("freshper_control_tau")
    return out, run_study("freshper_control_tau", "ci", out)


def test_ci_scale_writes_its_tables_and_figures(ci_run, csv_rows):
    out, _ = ci_run
    for name in ("runs.csv", "tuning.csv", "ess_vs_age.csv", "sampled_age.csv", "score_vs_tau.csv",
                 "score_vs_tau.png", "ess_vs_age.png", "config.json", "README.md"):
        assert (out / name).stat().st_size > 0, name
    runs = csv_rows(out / "runs.csv")
    # ci: 4 controls + τ ∈ {1, 3}, scored on 2 seeds
    assert len(runs) == 6 * 2 and len({r["arm"] for r in runs}) == 6
    ess = csv_rows(out / "ess_vs_age.csv")
    assert all(0 < float(r["ess_fraction"]) <= 1 and 0 < float(r["ess_step_fraction"]) <= 1 for r in ess
               if float(r["ess_fraction"]) > 0)


def test_tuning_seeds_are_not_scoring_seeds_and_each_arm_runs_its_pick(ci_run, csv_rows):
    out, _ = ci_run
    runs, tuning = csv_rows(out / "runs.csv"), csv_rows(out / "tuning.csv")
    assert {int(r["seed"]) for r in runs} == {1, 2}  # the tuning seed is 0
    picked = {r["arm"]: r["learning_rate"] for r in tuning if r["picked"] == "True"}
    assert len(picked) == 6 and sum(r["picked"] == "True" for r in tuning) == 6
    for arm in picked:  # the pick is the best tuning-seed score of the arm's grid
        grid = [r for r in tuning if r["arm"] == arm]
        assert picked[arm] == max(grid, key=lambda r: float(r["mean_eval_return"]))["learning_rate"]
    assert all(r["learning_rate"] == picked[r["arm"]] for r in runs)


def test_matched_updates_and_the_decay_replays_younger_rows(ci_run, csv_rows):
    out, _ = ci_run
    runs = csv_rows(out / "runs.csv")
    iterations = 20
    for r in runs:  # one fresh step per iteration, + K = 2 for the epoch and replay arms
        assert int(r["num_updates"]) == iterations * (1 if r["arm"] == "onpolicy" else 3), r["arm"]
    age = {a: sum(float(r["mean_sampled_age"]) for r in runs if r["arm"] == a) / 2 for a in
           ("per_authors", "freshper_authors_tau1")}
    # at τ = 1 version a row's priority falls by e per version against PER's flat one, in a buffer of 8
    # versions: the mean replayed age must drop well below PER's (it cannot by chance across 2 seeds)
    assert age["freshper_authors_tau1"] < 0.7 * age["per_authors"]


def test_rerun_restores_every_chunk(ci_run, run_study):
    out, first = ci_run
    runs = (out / "runs.csv").read_text()
    again = run_study("freshper_control_tau", "ci", out)
    assert "tuning 2/" not in again.stderr and "scoring 2/" not in again.stderr  # nothing recomputed
    assert (out / "runs.csv").read_text() == runs
    assert again.stdout.splitlines()[4:] == first.stdout.splitlines()[4:]  # the tables below the stamp
