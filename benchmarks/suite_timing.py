"""Wall time of the CI command from fresh clones, the slowest tests, and the slow lane.

Clones the repository at HEAD into a scratch folder ``--runs`` times in a row and runs
``bash .ci/run`` in each (a new venv, the README's test command), as CI does: a new venv (pip
uses the machine's wheel cache, as CI on the same machine does) and a cold XLA compilation
cache. ``PYTEST_ADDOPTS`` adds a JUnit report to each run (the command itself is
unchanged), from which the slowest tests are read. ``--slow`` then runs the slow lane
(``pytest -m slow``) in the last clone's venv. Writes ``results/bench/tests.{md,json}``.

The slow lane can also be timed on its own (``--runs 0 --slow``: one clone, its install
untimed, then ``pytest -m slow``), into ``tests_slow.json``; a later run without ``--slow``
shows that record in ``tests.md`` under its own commit and load note.

    python benchmarks/suite_timing.py --runs 3 --slow
    python benchmarks/suite_timing.py --runs 0 --slow --note "…"   # the slow lane alone
    python benchmarks/suite_timing.py --runs 3                      # + the saved slow record
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from fresh_rl.provenance import REPOSITORY_ROOT, machine_description, short_commit

OUT = REPOSITORY_ROOT / "results" / "bench"
SUMMARY = re.compile(r"^=+ (.*(?:passed|failed).*) in [\d.]+s.*=+$", re.M)


def junit_cases(path: Path) -> list[tuple[float, str]]:
    """``(seconds, file::test)`` of every test case in a JUnit report."""
    cases = []
    for case in ET.parse(path).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        cases.append((float(case.get("time", 0.0)), f"{module}.py::{case.get('name')}"))
    return sorted(cases, reverse=True)


def timed(command: list[str], cwd: Path, env: dict) -> tuple[float, int, str]:
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, done.returncode, done.stdout + done.stderr


def summary_line(output: str) -> str:
    found = SUMMARY.findall(output)
    return found[-1] if found else "no pytest summary"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--slow", action="store_true", help="also time the slow lane")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--note", default="otherwise idle machine",
                        help="what else the machine was doing (written beside the times)")
    args = parser.parse_args(argv)
    if args.runs < 0 or (args.runs == 0 and not args.slow):
        parser.error("--runs must be ≥ 1 (or 0 with --slow: time the slow lane alone)")
    # what is timed is a clone, which holds only committed code: HEAD is its exact provenance
    # (uncommitted edits in this checkout never reach it)
    commit = short_commit()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "FRESH_RL_"))}
    env["CI"] = "true"
    record = {"commit": commit, "machine": machine_description(), "note": args.note, "runs": [],
              "slow": None, "slow_lane": []}
    with tempfile.TemporaryDirectory(prefix="fresh_rl_suite_") as scratch:
        if args.runs == 0:  # the slow lane alone: a clone and its venv, install not timed
            clone = Path(scratch) / "clone0"
            subprocess.run(["git", "clone", "-q", str(REPOSITORY_ROOT), str(clone)], check=True)
            subprocess.run(["bash", "-c", "python3.11 -m venv .venv && .venv/bin/pip install -q "
                            "-e '.[test]'"], cwd=clone, env=env, check=True, capture_output=True)
        for run in range(args.runs):
            clone = Path(scratch) / f"clone{run}"
            subprocess.run(["git", "clone", "-q", str(REPOSITORY_ROOT), str(clone)], check=True)
            report = Path(scratch) / f"junit{run}.xml"
            wall, code, output = timed(["bash", ".ci/run"], clone,
                                       {**env, "PYTEST_ADDOPTS": f"--junitxml={report}"})
            cases = junit_cases(report) if report.exists() else []
            record["runs"].append({"wall_seconds": round(wall, 1), "exit_code": code,
                                   "summary": summary_line(output),
                                   "slowest": [[round(s, 1), n] for s, n in cases[:15]]})
            print(f"run {run + 1}: {wall:.0f} s, exit {code}, {summary_line(output)}", flush=True)
            if code != 0:
                print(output[-5000:])
        collected = subprocess.run([".venv/bin/python", "-m", "pytest", "-m", "slow", "--collect-only",
                                    "-q", "-p", "no:cacheprovider"], cwd=clone, env=env,
                                   capture_output=True, text=True).stdout
        record["slow_lane"] = [line for line in collected.splitlines() if "::" in line]
        if args.slow:
            report = Path(scratch) / "junit_slow.xml"
            wall, code, output = timed([".venv/bin/python", "-m", "pytest", "-m", "slow",
                                        f"--junitxml={report}"], clone, env)
            cases = junit_cases(report) if report.exists() else []
            record["slow"] = {"wall_seconds": round(wall, 1), "exit_code": code,
                              "summary": summary_line(output),
                              "tests": [[round(s, 1), n] for s, n in cases]}
            print(f"slow lane: {wall:.0f} s, exit {code}, {summary_line(output)}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.runs == 0:
        (args.out / "tests_slow.json").write_text(json.dumps(record, indent=1) + "\n")
        return
    saved_slow = args.out / "tests_slow.json"
    if record["slow"] is None and saved_slow.exists():
        record["slow_record"] = json.loads(saved_slow.read_text())
    (args.out / "tests.json").write_text(json.dumps(record, indent=1) + "\n")
    (args.out / "tests.md").write_text(render(record))
    print(render(record))


def render(record: dict) -> str:
    runs = record["runs"]
    lines = ["# Test suite wall time", "",
             f"Made by `python benchmarks/suite_timing.py --runs {len(runs)}"
             f"{' --slow' if record['slow'] else ''}` at commit {record['commit']} on "
             f"{record['machine']}. Each run is `bash .ci/run` in a fresh clone (new venv and pip "
             "install from the machine's wheel cache, cold XLA compilation cache), one after the "
             f"other ({record.get('note', 'otherwise idle machine')}); the wall time includes the "
             "install.", "",
             "| run | wall time | exit | pytest |", "|---|---|---|---|"]
    lines += [f"| {i + 1} | {r['wall_seconds']:.0f} s ({r['wall_seconds'] / 60:.1f} min) | "
              f"{r['exit_code']} | {r['summary']} |" for i, r in enumerate(runs)]
    lines += ["", f"## The 15 slowest tests (run {len(runs)}; setup of module fixtures is "
              "counted in the first test that uses them)", "", "| seconds | test |", "|---|---|"]
    lines += [f"| {s:.1f} | `{n}` |" for s, n in runs[-1]["slowest"]]
    slow, where = record["slow"], "with the clone's venv"
    saved = record.get("slow_record")
    if not slow and saved:
        slow, record = saved["slow"], {**record, "slow_lane": saved["slow_lane"]}
        where = (f"timed on its own by `python benchmarks/suite_timing.py --runs 0 --slow` at "
                 f"commit {saved['commit']} ({saved['note']}), in a fresh clone's venv")
    if not slow:
        lines += ["", f"## The slow lane (`pytest -m slow`): {len(record['slow_lane'])} tests, not timed "
                  "in this run (`--slow` times it)", ""]
        lines += [f"- `{name}`" for name in record["slow_lane"]]
    if slow:
        lines += ["", "## The slow lane (`pytest -m slow`)", "",
                  f"{slow['summary']}; {slow['wall_seconds']:.0f} s wall "
                  f"({slow['wall_seconds'] / 60:.1f} min), {where}, cold compilation cache.", "",
                  "| seconds | test |", "|---|---|"]
        lines += [f"| {s:.1f} | `{n}` |" for s, n in slow["tests"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
