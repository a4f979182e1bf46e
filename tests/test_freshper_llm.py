"""experiments/freshper_llm.py run as a user runs it (``--scale bpe-slice-ci``, the random-weight
BPE stand-in): its tables, arms and seeds, the authors' pipeline's update count, resumption."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, run_study):
    out = tmp_path_factory.mktemp("freshper_llm")
    return out, run_study("freshper_llm", "bpe-slice-ci", out)


def test_every_arm_and_seed_is_scored_on_held_out_prompts(ci_run, csv_rows):
    out, first = ci_run
    for name in ("runs.csv", "curves.csv", "ess_vs_age.csv", "ess_fit.csv", "learning_curves.png",
                 "config.json", "README.md"):
        assert (out / name).stat().st_size > 0, name
    runs = csv_rows(out / "runs.csv")
    arms = {r["arm"] for r in runs}
    assert arms == {"on_policy", "per_authors", "freshper_authors_tau1", "freshper_authors_tau4"}
    for arm in arms:  # 2 seeds per arm, common across the τ rows
        assert sorted(int(r["seed"]) for r in runs if r["arm"] == arm) == [0, 1]
    assert all(0.0 <= float(r["held_out_success"]) <= 1.0 for r in runs)
    assert all(float(r["mean_sampled_age"]) == 0.0 for r in runs if r["arm"] == "on_policy")  # never replays
    assert {r["weights"] for r in csv_rows(out / "ess_fit.csv")} == {"token", "sequence"}
    assert "[per_authors] iteration 4/4" in first.stdout


def test_rerun_loads_finished_arms(ci_run, run_study):
    out, first = ci_run
    runs = (out / "runs.csv").read_text()
    again = run_study("freshper_llm", "bpe-slice-ci", out)
    assert "iteration" not in again.stdout.split("# FreshPER")[0]  # no arm trained again
    assert (out / "runs.csv").read_text() == runs


def test_paper_slice_spans_five_tau_and_refuses_a_missing_model_folder(tmp_path):
    """The accelerator preset: a run (and a buffer) of ≥ 5 τ at its largest τ; without the
    Qwen2.5-0.5B folder the script exits before building anything, naming the folder."""
    import subprocess
    import sys
    from pathlib import Path

    from fresh_rl.llm.presets import FRESHPER_SCALES, QWEN2_5_0_5B_FOLDER

    scale = FRESHPER_SCALES["paper-slice"]
    assert scale.iterations >= 5 * max(scale.taus) and scale.seeds >= 5
    for name, config in scale.methods:
        if config.replay_updates:
            assert config.capacity >= scale.iterations * scale.rl.batch_size, name
    assert scale.model == QWEN2_5_0_5B_FOLDER and QWEN2_5_0_5B_FOLDER.endswith("Qwen2.5-0.5B")
    if Path(QWEN2_5_0_5B_FOLDER, "config.json").exists():
        pytest.skip(f"{QWEN2_5_0_5B_FOLDER} holds the model: the paper slice would run")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "experiments" / "freshper_llm.py"), "--scale", "paper-slice",
                           "--out", str(tmp_path / "out"), "--allow-dirty"],
                          capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode != 0 and QWEN2_5_0_5B_FOLDER in done.stderr and "config.json" in done.stderr
