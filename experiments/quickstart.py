"""Quick reproduction of the three papers' headline comparisons on a CPU (≤ 20 min, 2 cores).

1. FreshPER — priority staleness: what standard PER, FreshPER and uniform replay sample from
   the same aging buffer (``experiments/priority_staleness.py --scale cpu``).
2. VACO — PPO-clip, PPO-KL and VACO on CartPole and Acrobot at lag 0 and 4, 3 seeds
   (``experiments/vaco_lag_sweep.py --scale quick``).
3. Missing old logits — the control analogue at W = 1 and 16 (random staleness): every
   old-logit route (recompute-with-current, snapshot, old-logit model, proxies, EWMA), the
   active-token fraction, the route's |log r̂_d| and the learner's return side by side
   (``experiments/old_logits_control.py --scale quick``).

Each part writes into ``results/quickstart/<part>/`` (figures, CSVs, a summary) and this
script writes ``results/quickstart/README.md`` with every part's wall time and the part of it
spent tracing and compiling XLA programs (or loading them from the persistent compilation
cache, ``fresh_rl.compilation_cache``). Each run is also appended to
``results/quickstart/timings.csv``, so the README can show a first run (empty cache) next to
a rerun (warm cache). Parts that already finished are resumed from their saved runs where the
script supports it; ``--fresh`` deletes the outputs first, so everything is recomputed.

    python experiments/quickstart.py
    python experiments/quickstart.py --fresh    # recompute every part (the cache still applies)
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fresh_rl.compilation_cache import REPORT_VARIABLE, host_cache_directory
from fresh_rl.provenance import REPOSITORY_ROOT, git_commit, machine_description, write_csv

OUT = REPOSITORY_ROOT / "results" / "quickstart"

PARTS = (
    ("freshper_priority_staleness", "FreshPER: priority staleness (PER vs FreshPER vs uniform)",
     ["experiments/priority_staleness.py", "--scale", "cpu"]),
    ("vaco_lag", "VACO vs PPO-clip / PPO-KL under lag 0 and 4",
     ["experiments/vaco_lag_sweep.py", "--scale", "quick"]),
    ("old_logits_control", "Missing old logits: every route's mask collapse and reward at W = 1 and 16 (control)",
     ["experiments/old_logits_control.py", "--scale", "quick"]),
)
TIMING_FIELDS = ("run_id", "commit", "cache", "part", "wall_seconds", "compile_seconds", "run_seconds")


def run_part(name: str, command: list[str], out: Path, fresh: bool) -> dict:
    """Run one part in its own process; returns its wall and compile seconds."""
    if fresh and out.exists():
        shutil.rmtree(out)
    full = [sys.executable, *command, "--out", str(out)]
    print(f"$ {' '.join(full[1:])}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "compile.json"
        start = time.perf_counter()
        subprocess.run(full, cwd=REPOSITORY_ROOT, check=True, env={**os.environ, REPORT_VARIABLE: str(report)})
        wall = time.perf_counter() - start
        compile_s = json.loads(report.read_text())["total"] if report.exists() else float("nan")
    return {"part": name, "wall_seconds": round(wall, 1), "compile_seconds": round(compile_s, 1),
            "run_seconds": round(wall - compile_s, 1)}


def read_timings(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", choices=[p[0] for p in PARTS], action="append",
                        help="run only these parts (repeatable)")
    parser.add_argument("--fresh", action="store_true", help="delete each part's outputs first (recompute)")
    parser.add_argument("--readme-only", action="store_true", help="only rewrite README.md from timings.csv")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.readme_only:
        print(render_readme(args.out))
        return
    cache = host_cache_directory()
    cache_state = "off" if cache is None else ("warm" if cache.exists() and any(cache.iterdir()) else "empty")
    commit = git_commit()
    run_id = time.strftime("%Y-%m-%dT%H:%M:%S")
    rows = []
    for name, title, command in PARTS:
        if args.only and name not in args.only:
            continue
        print(f"\n=== {title}", flush=True)
        row = run_part(name, command, args.out / name, args.fresh)
        rows.append({"run_id": run_id, "commit": commit, "cache": cache_state, **row})
    timings_path = args.out / "timings.csv"
    write_csv(timings_path, read_timings(timings_path) + [{k: r[k] for k in TIMING_FIELDS} for r in rows])
    print(render_readme(args.out))


def render_readme(out: Path) -> str:
    """``out/README.md`` from ``out/timings.csv``: the latest run's parts, then every run recorded
    at the same commit (a ``+dirty`` mark ignored: the run itself rewrites tracked outputs)."""
    history = read_timings(out / "timings.csv")
    latest = [h for h in history if h["run_id"] == history[-1]["run_id"]]
    commit = latest[0]["commit"].removesuffix("+dirty")
    parts = {name: (title, " ".join(["python", *command, "--out", f"results/quickstart/{name}"]))
             for name, title, command in PARTS}
    total = sum(float(r["wall_seconds"]) for r in latest)
    lines = ["# Quickstart: the three papers' headline comparisons at small scale", "",
             f"Made by `python experiments/quickstart.py` at commit {commit} on {machine_description()}; "
             f"total wall time {total:.0f} s (compilation cache: {latest[0]['cache']}). Each part's folder "
             "holds its figures, CSVs and summary; the committed full-scale results are in results/freshper, "
             "results/vaco and results/old_logits_control. Compiling = tracing, lowering, XLA compilation and "
             "loading programs from the persistent cache (`fresh_rl.compilation_cache.CompileMeter`).", "",
             "| part | what | command | wall time | compiling | running |", "|---|---|---|---|---|---|"]
    lines += [f"| `{r['part']}/` | {parts[r['part']][0]} | `{parts[r['part']][1]}` | "
              f"{float(r['wall_seconds']):.0f} s | {float(r['compile_seconds']):.0f} s | "
              f"{float(r['run_seconds']):.0f} s |" for r in latest]
    same_commit = [h for h in history if h["commit"].removesuffix("+dirty") == commit]
    if len({h["run_id"] for h in same_commit}) > 1:
        lines += ["", "Every run recorded at this commit (`timings.csv`; seconds: wall / compiling / running):", "",
                  "| run | cache | " + " | ".join(p[0] for p in PARTS) + " |",
                  "|---|---|" + "---|" * len(PARTS)]
        for run in dict.fromkeys(h["run_id"] for h in same_commit):
            cells = {h["part"]: h for h in same_commit if h["run_id"] == run}
            cache_cell = next(iter(cells.values()))["cache"]
            lines.append(f"| {run} | {cache_cell} | " + " | ".join(
                f"{float(cells[p[0]]['wall_seconds']):.0f} / {float(cells[p[0]]['compile_seconds']):.0f} / "
                f"{float(cells[p[0]]['run_seconds']):.0f}" if p[0] in cells else "—" for p in PARTS) + " |")
    text = "\n".join(lines) + "\n"
    (out / "README.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
