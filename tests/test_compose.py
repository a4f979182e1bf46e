"""experiments/compose.py run as a user runs it (``--scale ci``): every arm on the same seeds, the
composed arm's seams measured, and a rerun that loads the saved arms. Slow lane: five control
programs compile (≈ 1–2 min on 2 cores)."""
from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, run_study):
    out = tmp_path_factory.mktemp("compose")
    return out, run_study("compose", "ci", out)


def test_every_arm_runs_on_the_same_seeds(ci_run):
    out, _ = ci_run
    arms = json.loads((out / "runs.json").read_text())["arms"]
    assert len(arms) >= 2 and len({tuple(a["seeds"]) for a in arms.values()}) == 1
    for arm in arms.values():
        assert len(arm["final_eval_return"]) == len(arm["seeds"])
    assert (out / "learning_curves.png").stat().st_size > 0


def test_rerun_loads_the_saved_arms(ci_run, run_study):
    out, _ = ci_run
    saved = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.npz")}
    again = run_study("compose", "ci", out)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.npz")} == saved
    assert "final return" in again.stdout
