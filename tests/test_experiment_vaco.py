"""The ``ci`` scale of experiments/vaco_lag_sweep.py runs inside the test suite: PPO-clip and
VACO both learn CartPole, the outputs are written, and a second invocation resumes from the
saved runs instead of recomputing them (and rejects runs of the old key schedule); its grid
derives the same key per cell as ``fresh-rl sweep``."""
import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fresh_rl.control.presets import KEY_SCHEDULE, VACO_SCALES, saved_run_matches, variant_config, variant_grid
from fresh_rl.eval import final_score, initial_score

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "vaco_lag_sweep.py"
VARIANTS = ("ppo_clip", "vaco")


def _run_script(out: Path) -> str:
    """The ci scale as a user runs it (a separate process; the session's compilation cache)."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--scale", "ci", "--out", str(out), "--bootstrap-reps", "200"],
                          capture_output=True, text=True, timeout=1500, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _saved_runs(out: Path) -> dict:
    return {v: dict(np.load(out / "runs" / f"CartPole-v1__{v}.npz")) for v in VARIANTS}


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vaco_ci")
    _run_script(out)
    return out, _saved_runs(out)


def test_ci_scale_learns_cartpole_for_ppo_clip_and_vaco(ci_run):
    _, results = ci_run
    for variant in VARIANTS:
        returns = results[variant]["episode_return"]  # [lags, deltas, seeds, iters]
        initial = initial_score(returns, results[variant]["episodes_completed"]).mean()
        final = final_score(returns)[0, 0].mean()  # lag 0, seed mean
        print(variant, "initial", initial, "final (lag 0)", final)
        assert initial < 40.0  # random CartPole policy: ~20
        assert final > 100.0 and final > 4 * initial, (variant, initial, final)


def test_ci_scale_writes_outputs_and_acts_with_the_swept_lag(ci_run):
    out, results = ci_run
    for name in ("runs.csv", "curves.csv", "aggregates.csv", "aggregates.png", "summary.md",
                 "curves_CartPole-v1.png"):
        assert (out / name).stat().st_size > 0, name
    rows = list(csv.DictReader(open(out / "runs.csv")))
    assert len(rows) == 2 * 2 * 2  # variants × lags × seeds
    gaps = {(r["variant"], int(r["lag"])): float(r["mean_version_gap"]) for r in rows}
    # fixed lag k: gaps 0, 1, …, k−1, then k for the rest of the run
    iters = results["vaco"]["episode_return"].shape[-1]
    k = 4
    assert gaps[("vaco", 0)] == 0.0
    np.testing.assert_allclose(gaps[("vaco", k)], (sum(range(k)) + k * (iters - k)) / iters)
    assert "Verdicts" in (out / "summary.md").read_text()


def test_second_invocation_resumes_from_saved_runs(ci_run):
    out, results = ci_run
    stamps = {v: (out / "runs" / f"CartPole-v1__{v}.npz").stat().st_mtime_ns for v in VARIANTS}
    log = _run_script(out)
    assert log.count("[resume]") == len(VARIANTS), log
    for variant, data in _saved_runs(out).items():
        assert (out / "runs" / f"CartPole-v1__{variant}.npz").stat().st_mtime_ns == stamps[variant]
        np.testing.assert_array_equal(data["episode_return"], results[variant]["episode_return"])


def test_study_and_cli_sweep_derive_the_same_key_per_grid_cell():
    from fresh_rl import cli
    from fresh_rl.sweep import seed_key

    config = variant_config(VACO_SCALES["ci"].tasks[0], "vaco", {}, ring_size=9)
    study = variant_grid(config, (0, 4, 8), (0.1, 0.2), num_seeds=4, seed=0)
    sweep_cli = cli.sweep_grid(config, 4, 0, cli._parse_grid(["lag=0,4,8", "vaco_delta=0.1,0.2"]))
    cells = []
    for grid, hparams in (study, sweep_cli):
        (i,) = [i for i, r in enumerate(grid.rows) if (r["seed"], r["lag"], r["vaco_delta"]) == (2, 4, 0.2)]
        cells.append((np.asarray(grid.keys[i]), int(hparams.lag[i]), float(hparams.vaco_delta[i])))
    np.testing.assert_array_equal(cells[0][0], cells[1][0])
    np.testing.assert_array_equal(cells[0][0], seed_key(2))
    assert cells[0][1:] == cells[1][1:] == (4, pytest.approx(0.2))
    # the study's [L, D, S] reshape relies on product_grid's order: seed fastest, then δ, then lag
    rows = study[0].rows
    assert [(r["lag"], r["vaco_delta"], r["seed"]) for r in rows[:5]] == [
        (0, 0.1, 0), (0, 0.1, 1), (0, 0.1, 2), (0, 0.1, 3), (0, 0.2, 0)]


def test_saved_runs_of_the_old_key_schedule_are_rejected():
    config = variant_config(VACO_SCALES["ci"].tasks[0], "vaco", {}, ring_size=5)
    data = {"config": np.array(repr(config)), "seed": np.array(0), "lags": np.array([0, 4]),
            "deltas": np.array([0.2]), "episode_return": np.zeros((2, 1, 2, 3))}
    assert not saved_run_matches(data, config, 0, (0, 4), (0.2,), 2)  # no key_schedule: old
    data["key_schedule"] = np.array(KEY_SCHEDULE)
    assert saved_run_matches(data, config, 0, (0, 4), (0.2,), 2)
    assert not saved_run_matches(data, config, 1, (0, 4), (0.2,), 2)


def test_notebook_02_vaco_under_lag(run_notebook, ci_run):
    """The notebook runs the ci scale through the study's ``run_variant`` (after the script: the
    same programs, loaded from the session's compilation cache)."""
    notebook = run_notebook("02_vaco_under_lag")
    printed = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code"
                      for o in c.get("outputs", []))
    assert "ppo_clip" in printed and "vaco" in printed
