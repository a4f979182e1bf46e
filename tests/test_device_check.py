"""benchmarks/device_check.py --dry-run-cpu, run as a user runs it: every stage runs with tiny
shapes on the CPU, every correctness check passes (device == CPU here, so any failure is a bug
in the check itself), and md and json are rewritten after each stage, in stage order.

The dry run compiles every stage's programs (Brax PPO, the vmapped study slice, a tiny LLM
iteration) at XLA's fastest settings (level 0, loop emitters): about a minute on 2 cores."""
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "device_check.py"
STAGES = ["correctness", "replay", "control", "llm", "study"]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("device_check")
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run-cpu", "--out", str(out),
                           "--cache-dir", str(out / "cache")],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, json.loads((out / "device_check.json").read_text()), \
        (out / "device_check.md").read_text(), done.stdout


def test_every_stage_ran_in_order_in_both_files(dry_run):
    _, report, md, _ = dry_run
    assert [stage["name"] for stage in report["stages"]] == STAGES
    assert {stage["name"]: stage["status"] for stage in report["stages"]} == dict.fromkeys(STAGES, "ran")
    assert re.findall(r"^## \d+\. (\w+): (\w+)$", md, re.M) == [(name, "ran") for name in STAGES]
    assert report["dry_run_cpu"] is True and report["commit"]


def test_the_files_are_rewritten_after_each_stage(dry_run):
    _, _, _, stdout = dry_run
    writes = re.findall(r"^\[(\w+)\] wrote device_check\.md and device_check\.json \((\d+) stage", stdout, re.M)
    assert writes == [(name, str(number)) for number, name in enumerate(STAGES, 1)]


def test_every_correctness_check_passes(dry_run):
    _, report, md, _ = dry_run
    rows = report["stages"][0]["rows"]
    checks = " ".join(row["check"] for row in rows)
    for part in ("replay per", "replay freshper", "V-trace", "VACO TV filter", "decoupled", "EWMA",
                 "control: one VACO iteration", "LLM tiny: decode", "LLM tiny: old log-probs",
                 "LLM tiny: loss", "LLM tiny: parameter step"):
        assert part in checks
    assert [row["status"] for row in rows] == ["pass"] * len(rows)
    assert all(row["argument"] for row in rows)
    assert md.count("| pass |") == len(rows)


def test_the_measuring_stages_report_their_figures(dry_run):
    _, report, _, _ = dry_run
    replay, control, llm, study = (stage["rows"] for stage in report["stages"][1:])
    assert replay and all(row["speed-up FreshPER"] > 0 and row["speed-up PER"] > 0 for row in replay)
    assert [row["implementation"] for row in control] == ["brax ppo", "ours vaco lag 0"]  # the dry run times VACO
    assert all(row["env steps/s"] > 0 for row in control)
    assert [row["stage"] for row in llm] == ["decode", "old_logprobs", "update"]
    assert all(row["tokens_per_s"] > 0 for row in llm)
    assert [row["backward lag"] for row in study] == [0, 4, 16]
    for row in study:
        assert row["seeds"] == 2 and math.isfinite(row["final return"])
        assert row["95% low"] <= row["final return"] <= row["95% high"]
        assert 0.0 <= row["mean loss/mask_fraction"] <= 1.0
