"""Quick reproduction of the three papers' headline comparisons on a CPU (≤ 20 min, 2 cores).

1. FreshPER — priority staleness: what standard PER, FreshPER and uniform replay sample from
   the same aging buffer (``experiments/priority_staleness.py --scale cpu``).
2. VACO — PPO-clip, PPO-KL and VACO on CartPole and Acrobot at lag 0 and 4, 3 seeds
   (``experiments/vaco_lag_sweep.py --scale quick``).
3. Missing old logits — the async LLM pipeline at CI scale: recompute-with-current vs
   snapshot vs the approximations, the mask-collapse mechanism
   (``experiments/old_logits.py --scale ci``).

Each part writes into ``results/quickstart/<part>/`` (figures, CSVs, a summary) and this
script writes ``results/quickstart/README.md`` with the wall time of every part. Parts that
already finished are resumed from their saved runs where the script supports it.

    python experiments/quickstart.py
"""
from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "quickstart"

PARTS = (
    ("freshper_priority_staleness", "FreshPER: priority staleness (PER vs FreshPER vs uniform)",
     ["experiments/priority_staleness.py", "--scale", "cpu"]),
    ("vaco_lag", "VACO vs PPO-clip / PPO-KL under lag 0 and 4",
     ["experiments/vaco_lag_sweep.py", "--scale", "quick"]),
    ("old_logits", "Missing old logits: routes and the mask collapse (CI scale)",
     ["experiments/old_logits.py", "--scale", "ci"]),
)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", choices=[p[0] for p in PARTS], action="append",
                        help="run only these parts (repeatable)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, title, command in PARTS:
        if args.only and name not in args.only:
            continue
        out = args.out / name
        full = [sys.executable, *command, "--out", str(out)]
        print(f"\n=== {title}\n$ {' '.join(full[1:])}", flush=True)
        start = time.perf_counter()
        subprocess.run(full, cwd=ROOT, check=True)
        rows.append((name, title, " ".join(["python", *command, "--out", f"results/quickstart/{name}"]),
                     time.perf_counter() - start))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}"
    lines = ["# Quickstart: the three papers' headline comparisons at small scale", "",
             f"Made by `python experiments/quickstart.py` at commit {commit} on {machine}; "
             f"total wall time {sum(r[3] for r in rows):.0f} s. Each part's folder holds its figures, CSVs and "
             "summary; the committed full-scale results are in results/freshper, results/vaco and "
             "results/old_logits.", "",
             "| part | what | command | wall time |", "|---|---|---|---|"]
    lines += [f"| `{n}/` | {t} | `{c}` | {s:.0f} s |" for n, t, c, s in rows]
    (args.out / "README.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
