"""Profile: what the replay step costs per priority-tree column, and with floored items.

The default FreshPER tree has two columns (sum; min of log-keys, the buffer-wide importance
normaliser and the floor's trigger) plus the set of floored items (``fresh_rl.replay.slot_set``);
a sample's descent reads the sum column only. This script times ``sample``, ``set_priorities``
and their training step inside a jitted scan for the default with no item floored, the default
with half the buffer floored (inserted 20τ before the rest), the floor off
(``min_decayed_priority=0``: sum and min, no set) and the floor off with batch-normalised
weights (sum only, 1 column), beside flashbax, with the timing loop of
``benchmarks/replay_bench.py`` (implementations of a cell take turns in every repeat). Writes
``results/bench/replay_columns.{csv,md}``:

    taskset -c 1 python benchmarks/replay_columns.py
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from replay_bench import RESULTS, _uptime, flashbax, ours, time_cell

from fresh_rl.provenance import command_line, git_commit, machine_description, write_csv

VARIANTS = {
    "flashbax_per": lambda c, b: flashbax(c, b),
    "default (2 columns + floored set)": lambda c, b: ours(c, b, "freshper"),
    "default, half floored": lambda c, b: ours(c, b, "freshper", floored_fraction=0.5),
    "2 columns (no floor)": lambda c, b: ours(c, b, "freshper", "buffer",
                                              min_decayed_priority=0.0),
    "1 column (no floor, batch weights)": lambda c, b: ours(c, b, "freshper", "batch",
                                                            min_decayed_priority=0.0),
}
OPS = ("sample", "set_priorities", "sample+set_priorities")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", nargs="+", default=["16x256", "20x256", "20x4096"],
                        help="log2(capacity)xbatch cells")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started, load_start = time.perf_counter(), _uptime()
    rows = []
    for cell in args.cells:
        log_c, batch = map(int, cell.split("x"))
        capacity = 1 << log_c
        impls = {name: make(capacity, batch) for name, make in VARIANTS.items()}
        for op in OPS:
            timings = time_cell(impls, {name: (op,) for name in impls}, capacity, batch, 30,
                                args.repeats, 0)
            for (name, _), t in timings.items():
                rows.append(dict(capacity=f"2^{log_c}", batch=batch, op=op, impl=name,
                                 scan_us=round(t["scan_us"], 1)))
            print(cell, op, {n: round(t["scan_us"], 1) for (n, _), t in timings.items()},
                  flush=True)
    write_csv(args.out / "replay_columns.csv", rows)
    wall = time.perf_counter() - started
    names = list(VARIANTS)
    lines = ["# Replay step cost per priority-tree column", "",
             f"Command: `{command_line()}`; commit {git_commit()}; {machine_description()}; "
             f"wall time {wall / 60:.1f} min.",
             f"Load: `{load_start}` at start, `{_uptime()}` at the end.", "",
             "Microseconds per call inside a jitted scan (median of repeats; the variants take "
             "turns), tree fan-out K = 8.", "",
             "| capacity | batch | op | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    for cell in args.cells:
        log_c, batch = map(int, cell.split("x"))
        for op in OPS:
            got = {r["impl"]: r["scan_us"] for r in rows
                   if r["capacity"] == f"2^{log_c}" and r["batch"] == batch and r["op"] == op}
            lines.append(f"| 2^{log_c} | {batch} | {op} | "
                         + " | ".join(f"{got[n]:.1f}" for n in names) + " |")
    (args.out / "replay_columns.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
