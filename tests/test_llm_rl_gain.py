"""experiments/llm_rl_gain.py: the held-out RL gain per task × seed (the LLM test bed).

The ci scale runs end to end on the random-weight BPE stand-in (2 seeds × 2 iterations), as a
user runs it: every run records before / after / gain on the same held-out episodes, the table
aggregates them, the resume state is removed once a run is saved, and a second invocation loads
the saved runs. ``summarize`` (fresh_rl.llm.rl_gain) is checked against NumPy on synthetic records."""
import csv
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fresh_rl.eval import seed_interval
from fresh_rl.llm.presets import RL_GAIN_SCALES
from fresh_rl.llm.rl_gain import load_record, run_name, summarize

ROOT = Path(__file__).resolve().parents[1]


def _run_ci(out: Path, *flags: str) -> str:
    """``python experiments/llm_rl_gain.py --scale ci --out out *flags``; its stdout."""
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "llm_rl_gain.py"), "--scale", "ci",
                           "--out", str(out), *flags], capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _records(out: Path, prompt_pool: int = 0) -> list[dict]:
    """The saved runs of ``out`` at ``prompt_pool``, by seed."""
    records = [load_record(str(p)) for p in sorted((out / "runs").glob("*.json"))]
    return sorted((r for r in records if r["prompt_pool"] == prompt_pool), key=lambda r: r["seed"])


def _table(stdout: str) -> list[str]:
    """The per-setting gain lines the script prints last."""
    return [line for line in stdout.splitlines() if line.startswith("arithmetic lr")]


@pytest.fixture(scope="module")
def ci_study(tmp_path_factory):
    out = tmp_path_factory.mktemp("rl_gain")
    stdout = _run_ci(out)
    return out, stdout, _records(out)


# the LLM RL-gain study at ci scale (a finished study); its summary statistics are checked
# against NumPy in the default run
@pytest.mark.slow
def test_ci_scale_records_paired_held_out_gains(ci_study):
    out, stdout, records = ci_study
    assert [(r["task"], r["seed"]) for r in records] == [("arithmetic", 0), ("arithmetic", 1)]
    for r in records:
        assert r["gain"] == r["after"] - r["before"] and 0.0 <= r["after"] <= 1.0
        assert r["episodes"] == 2 * 8 and len(r["train_success"]) == 2
        assert r["steady_seconds_per_iteration"] > 0
        assert r["seeds_in_program"] == 2  # the ci scale vmaps its two seeds in one program
    assert records[0]["before"] == records[1]["before"]  # one warm start, the same episodes
    assert len(_table(stdout)) == 1
    table = list(csv.DictReader(open(out / "gain.csv")))
    assert len(table) == 1 and int(table[0]["seeds"]) == 2
    # float64 host values (CSV repr is exact): one mean of 2 numbers, ≤ 1 ulp < default rtol 1e-7
    np.testing.assert_allclose(float(table[0]["gain"]), np.mean([r["gain"] for r in records]))
    assert len(list(csv.DictReader(open(out / "curves.csv")))) == 2 * 2
    throughput = list(csv.DictReader(open(out / "throughput.csv")))
    assert len(throughput) == 2 and {r["episodes_per_iteration"] for r in throughput} == {str(2 * 8)}
    assert not (out / "checkpoints").exists()  # saved runs drop their resume state


@pytest.mark.slow  # needs the ci study above
def test_second_invocation_loads_the_saved_runs(ci_study):
    out, stdout, records = ci_study
    stamps = {p.name: p.stat().st_mtime_ns for p in (out / "runs").iterdir()}
    again = _run_ci(out)
    assert again.count("[resume]") == 2 and "held-out success" not in again  # loaded, not rerun
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").iterdir()} == stamps
    assert _table(again) == _table(stdout) and _records(out) == records
    name = run_name(RL_GAIN_SCALES["ci"], "arithmetic", 0)  # the name the script saved seed 0 under
    assert name == "arithmetic_lr0.0001_ep1_g2_W0_it2_seed0"
    saved = json.load(open(out / "runs" / f"{name}.json"))
    assert (saved["task"], saved["seed"], saved["fingerprint"]) == ("arithmetic", 0, records[0]["fingerprint"])
    (out / "gain.csv").unlink()
    tables_only = _run_ci(out, "--tables-only")
    assert "[resume]" not in tables_only and "held-out success" not in tables_only  # ran nothing
    assert [r["seeds"] for r in csv.DictReader(open(out / "gain.csv"))] == ["2"]
    assert _table(tables_only) == _table(stdout)


def test_summarize_matches_numpy():
    rng = np.random.default_rng(0)
    records = [{"task": t, "learning_rate": lr, "epochs": 1, "minibatches": 1, "num_groups": 8, "prompt_pool": 0,
                "staleness_window": 0, "iterations": 40, "seed": s, "before": b,
                "after": b + g, "gain": g, "episodes": 64, "train_seconds": 60.0 * (s + 1)}
               for t in ("countdown", "sokoban") for lr in (1e-4, 3e-4)
               for s, (b, g) in enumerate(rng.uniform(0, 0.3, (5, 2)))]
    rows = summarize(records)
    assert [(r["task"], r["learning_rate"]) for r in rows] == [
        ("countdown", 1e-4), ("countdown", 3e-4), ("sokoban", 1e-4), ("sokoban", 3e-4)]
    for row in rows:
        gains = np.array([r["gain"] for r in records
                          if (r["task"], r["learning_rate"]) == (row["task"], row["learning_rate"])])
        mean, low, high = seed_interval(gains)
        # float64 host arithmetic on the same 5 values: a few ulps ≪ default rtol 1e-7 / rel 1e-6
        np.testing.assert_allclose([row["gain"], row["gain_ci_low"], row["gain_ci_high"]], [mean, low, high])
        assert row["seeds"] == 5 and row["train_minutes_per_run"] == pytest.approx(3.0)


def test_run_names_and_old_records_carry_every_probed_setting(tmp_path):
    """Settings off the default (minibatches, prompts per iteration) appear in the run's name;
    records saved before a setting was recorded load with the value they ran at."""
    scale = RL_GAIN_SCALES["cpu"]
    assert run_name(scale, "countdown", 3) == "countdown_lr0.0001_ep1_W0_it60_seed3"
    probed = dataclasses.replace(scale, rl=dataclasses.replace(scale.rl, minibatches=4, num_groups=32,
                                                               prompt_pool=64))
    assert run_name(probed, "countdown", 3) == "countdown_lr0.0001_ep1_mb4_g32_pool64_W0_it60_seed3"
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"task": "arithmetic", "seed": 0}))
    old = load_record(str(path))
    assert (old["minibatches"], old["num_groups"], old["prompt_pool"], old["staleness_window"]) == (1, 8, 0, 1)


@pytest.mark.slow  # needs the ci study above
def test_prompt_pool_runs_score_the_training_prompts_too(ci_study):
    """With ``--prompt-pool`` the runs also score the fixed training prompts (before and after);
    held-out scoring is the same episodes as the fresh-prompt runs, and both settings share the
    folder's tables."""
    out, _, records = ci_study
    _run_ci(out, "--prompt-pool", "4")
    pooled = _records(out, prompt_pool=4)
    assert [r["seed"] for r in pooled] == [0, 1]
    for r in pooled:
        assert 0.0 <= r["pool_before"] <= 1.0 and 0.0 <= r["pool_after"] <= 1.0
        assert r["before"] == records[0]["before"]  # the same held-out episodes and warm start
        assert (out / "runs" / f"arithmetic_lr0.0001_ep1_g2_pool4_W0_it2_seed{r['seed']}.json").exists()
    rows = list(csv.DictReader(open(out / "gain.csv")))
    assert sorted(int(r["prompt_pool"]) for r in rows) == [0, 4]
    (pool_row,) = [r for r in rows if r["prompt_pool"] == "4"]
    assert float(pool_row["pool_before"]) == np.mean([r["pool_before"] for r in pooled])  # repr: exact
