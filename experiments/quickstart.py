"""The main job: the three papers' mechanisms at small scale on a CPU, each with its interval.

Three seeds cannot rank methods by return, so the quickstart shows what its scale can show —
the mechanisms each paper relies on, measured per seed with a 95% Student-t interval over
seeds (``fresh_rl.eval.seed_interval``):

1. FreshPER (arXiv 2604.16918): the age of what standard PER samples against uniform replay
   and the age-decayed buffer, on one aging buffer (``experiments/priority_staleness.py``).
2. VACO (arXiv 2603.01365): the measured backward policy drift (TV between the acting and the
   learning policy) at lag 0 and 4 on CartPole and Acrobot, and beside it the fraction of
   samples the TV filter keeps (a measurement: at this scale the filter rarely fires, so its
   kept fraction is shown, not compared) (``experiments/vaco_lag_sweep.py --scale quick``).
3. Missing old logits (arXiv 2605.12070): the old-logit mask's active-token fraction against
   the staleness window W for every route, in the control analogue at W = 1 and 16
   (``experiments/old_logits_control.py --scale quick``).

A *statement* compares two arms seed by seed (paired): "higher" or "lower" when the 95%
interval of the mean difference excludes 0, else "not separated". Returns are printed with
their intervals and "n = 3 seeds: no ranking". Outputs (default ``runs/quickstart/``,
git-ignored): each part's folder, ``statements.{md,csv}``, ``mechanisms.png``, ``timings.csv``
and ``README.md`` (wall and compile time per part). The committed reference run lives in
``results/quickstart/`` (made with ``--out results/quickstart`` at a clean commit); compare
with ``diff runs/quickstart/statements.md results/quickstart/statements.md``.

    python experiments/quickstart.py                 # ~1.5 min on 2 cores (empty compilation cache)
    python experiments/quickstart.py --seed 3        # seeds 3, 4, 5 instead of 0, 1, 2
    python experiments/quickstart.py --scale ci      # the test suite's version (~2 min)
"""
from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from fresh_rl.compilation_cache import host_cache_directory
from fresh_rl.provenance import REPOSITORY_ROOT, git_commit, read_csv, require_clean, write_csv
from fresh_rl.quickstart import PARTS, SCALES, part_command, part_xla_flags, render_readme, run_part, write_report
from fresh_rl.sweep.study_cli import add_preset_arguments, chosen_preset, start_study
from fresh_rl.validation import CHECKED_HELP

OUT = REPOSITORY_ROOT / "runs" / "quickstart"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (default: %(default)s)")
    add_preset_arguments(parser, SCALES, default="quick")
    parser.add_argument("--seed", type=int, default=0, help="first seed of each part")
    parser.add_argument("--only", choices=tuple(PARTS), action="append",
                        help="run only these parts (repeatable); the report needs all three")
    parser.add_argument("--fresh", action="store_true",
                        help="delete each part's outputs first (and take over an --out made with another "
                             "--scale or --seed)")
    parser.add_argument("--report-only", action="store_true",
                        help="only rebuild statements and the figure from the parts' outputs")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write into results/ although the code has uncommitted edits")
    parser.add_argument("--checked", action="store_true",
                        help="passed to the VACO and old-logit parts (not the FreshPER part: its batched while "
                             f"loop cannot be checkified): {CHECKED_HELP}")
    args = parser.parse_args(argv)
    scale = chosen_preset(parser, args, SCALES)
    args.out = args.out.resolve()
    # --only runs some parts of the same job and --report-only none: not part of its identity
    start_study(parser, args, {"study": "quickstart", "scale": scale.label, "seed": args.seed}, args.out, argv,
                fresh=args.fresh, in_process=False)
    # A scratch folder (the default runs/quickstart) takes runs of edited code; a committed
    # reference under results/ must name the commit that made it.
    committed = args.out.is_relative_to(REPOSITORY_ROOT / "results")
    allow_dirty = args.allow_dirty or not committed
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        cache = host_cache_directory()
        cache_state = "off" if cache is None else ("warm" if cache.exists() and any(cache.iterdir()) else "empty")
        run_id, commit = time.strftime("%Y-%m-%dT%H:%M:%S"), require_clean(git_commit(), allow_dirty)
        rows = []
        for part, (title, _) in PARTS.items():
            if args.only and part not in args.only:
                continue
            print(f"\n=== {title}", flush=True)
            if args.fresh and (args.out / part).exists():
                shutil.rmtree(args.out / part)
            times = run_part(part_command(part, scale, args.seed, args.out / part, args.checked), allow_dirty)
            shown = part_command(part, scale, args.seed, Path(part), args.checked)  # the folder relative to --out
            rows.append({"run_id": run_id, "commit": commit, "scale": scale.label, "seed": args.seed,
                         "cache": cache_state, "xla_flags": part_xla_flags(), "part": part,
                         "command": "python " + " ".join(shown), **times})
        timings = args.out / "timings.csv"
        write_csv(timings, read_csv(timings, missing_ok=True) + rows)
        render_readme(args.out)
    if all((args.out / part).exists() for part in PARTS):
        print("\n" + write_report(args.out, scale.label, args.seed))
    else:
        print(f"\n(statements need all three parts under {args.out})")


if __name__ == "__main__":
    main()
