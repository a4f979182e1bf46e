"""Priority staleness: what standard PER and FreshPER sample as the buffer ages.

A controlled simulation of the failure FreshPER (arXiv 2604.16918) fixes. Each policy version
inserts a batch of trajectories whose base priority is ``|reward| + ε``; early in training the
rewards are large and noisy (the policy is bad and explores), later they shrink as it
improves, so old trajectories carry the largest priorities. Each version also replays one
batch and writes its (static, reward-based) priority back, as the authors' code does. The
policy drifts by a constant KL ``κ`` per version, so a trajectory of age ``a`` has expected
importance-sampling ESS fraction ``exp(−κ·a)`` under the current policy (the ESS argument of
the paper; its exact constants are not known, so κ is a knob).

Standard PER keeps drawing the stale, high-priority early trajectories; FreshPER's
``exp(−age/τ)`` decay moves the sampled mass to recent data; uniform replay sits between.
The script runs every sampler on the same stream, all seeds vmapped in one jitted scan
(:mod:`fresh_rl.studies.priority_staleness`), and writes
``results/freshper/priority_staleness.{csv,png,md}``.

    python experiments/priority_staleness.py --scale ci     # seconds
    python experiments/priority_staleness.py --scale cpu    # the committed figure
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.studies.priority_staleness import SCALES, plot_streams, run_samplers, summary_lines, version_rows
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, write_csv
from fresh_rl.report import write_readme
from fresh_rl.sweep.study_cli import NO_CHECKED, add_preset_arguments, chosen_preset, start_study

RESULTS = REPOSITORY_ROOT / "results" / "freshper"
SAMPLERS = {
    "uniform": dict(sampling="uniform"),
    "PER": dict(sampling="per"),
    "FreshPER τ=500": dict(sampling="freshper", age_decay_tau=500.0),
    "FreshPER τ=100": dict(sampling="freshper", age_decay_tau=100.0),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=NO_CHECKED)
    add_preset_arguments(parser, SCALES, default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--fresh", action="store_true", help="take over an --out folder made by another scale or seed")
    add_compilation_cache_flag(parser)
    args = parser.parse_args(argv)
    config = chosen_preset(parser, args, SCALES)
    identity = {"study": "priority_staleness", "scale": config.label, "seed": args.seed}
    # its own record: the default folder is results/freshper, shared with experiments/freshper.py
    start_study(parser, args, identity, args.out, argv, fresh=args.fresh, record="priority_staleness.run.json")
    start = time.perf_counter()
    results = run_samplers(config, SAMPLERS, args.seed)
    header = provenance(started=start)
    write_csv(args.out / "priority_staleness.csv", version_rows(results, args.seed))
    plot_streams(args.out / "priority_staleness.png", results, config)
    print(write_readme(args.out, "Priority staleness (FreshPER motivation)", header,
                       summary_lines(results, config), name="priority_staleness.md"), end="")


if __name__ == "__main__":
    main()
