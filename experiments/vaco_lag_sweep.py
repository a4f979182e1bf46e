"""VACO under simulated policy lag: methods × lag levels × tasks × seeds, δ sweep, ablation.

Reproduces the claim of VACO (arXiv 2603.01365; docs/vaco.md): advantage
realignment + the TV filter stay robust as policy lag grows, where PPO-KL, SPO and IMPALA
degrade. Beyond the paper (the reviewers' complaints): ≥ 5 seeds, learning curves, PPO-clip as
an extra baseline, a δ sweep and a component ablation.

Each (task, variant) is one compiled program over its seeds × lags (× δ, × β) grid, with the
delay mixture (``cpu``, ``paper``) as the last lag column ("mixture"); finished ones are saved to
``results/vaco/runs/*.npz``, so an interrupted sweep resumes (``--fresh`` recomputes everything).

Outputs (``results/vaco/``): ``runs.csv`` (one row per run: final score, initial score, training
return, evaluation AUC, lag metrics), ``curves.csv`` (seed-mean return per iteration with 95%
Student-t bands), ``curves_<task>.png``, ``per_task.csv`` (seed-mean normalised score per task,
variant, swept value and lag, 95% Student-t interval); over at least ``MIN_AGGREGATE_TASKS``
learning tasks also ``aggregates.{csv,png}`` (rliable median / IQM / mean / optimality gap with
95% stratified-bootstrap intervals per method and lag), ``probability_of_improvement.csv`` (P(VACO variant > baseline) per lag, with intervals),
``score_vs_tv.{csv,png}`` (seed-mean normalised score against the measured backward TV per
method, task and lag), ``lag_metrics.csv`` (measured version gap, backward and forward TV, ESS,
filter on-fraction and masked / clipped fractions per task, method and lag),
``equal_tuning.csv`` (aggregates with every variant at its best swept value at lag 0, VACO's δ
as PPO-KL's β, on the δ-sweep tasks), ``delta_sweep.{csv,png}`` (per VACO variant),
``ablation.csv`` (those three also only over ≥ ``MIN_AGGREGATE_TASKS`` tasks), and ``summary.md``.
The claims are decided by experiments/verdicts.py (results/VERDICTS.md).
``--tasks`` restricts a scale to some of its tasks (same configs, so their saved runs load).

    python experiments/vaco_lag_sweep.py --scale ci     # ~2 min, CartPole, run by the tests
    python experiments/vaco_lag_sweep.py --scale quick  # ~5 min, part of experiments/quickstart.py
    python experiments/vaco_lag_sweep.py --scale cpu    # the study: 5 tasks, 10 seeds (many hours, resumable)
    python experiments/vaco_lag_sweep.py --scale cpu --tasks CartPole-v1,Acrobot-v1  # a subset of its tasks
    python experiments/vaco_lag_sweep.py --scale gpu10  # ~10 min on one GPU (estimated, not yet run)
    python experiments/vaco_lag_sweep.py --scale paper  # Brax MuJoCo tasks at 100M steps (GPU/TPU)

Runs and scores: :mod:`fresh_rl.control.vaco_sweep_study`; tables: :mod:`fresh_rl.control.vaco_sweep_report`;
scales: ``fresh_rl.control.presets.VACO_SCALES``; this script picks the figures.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.control.presets import ABLATIONS, VACO_SCALES as SCALES, lag_name
from fresh_rl.control.vaco_sweep_report import write_tables
from fresh_rl.control.vaco_sweep_study import run_all
from fresh_rl.eval import AGGREGATE_METRICS
from fresh_rl.provenance import REPOSITORY_ROOT, provenance
from fresh_rl.report import save_panels
from fresh_rl.sweep.study_cli import add_preset_arguments, chosen_preset, start_study
from fresh_rl.validation import CHECKED_HELP

RESULTS = REPOSITORY_ROOT / "results" / "vaco"


def figures(scale, t: dict, out_dir: Path) -> None:
    """``score_vs_tv.png`` and ``curves_<task>.png``; with aggregates ``aggregates.png``, with the
    δ sweep ``delta_sweep.png`` (``t``: :func:`write_tables`'s tables)."""
    def score_vs_tv(ax, task):
        for i, variant in enumerate(scale.methods):
            rows = [r for r in t["score_vs_tv"] if (r["task"], r["variant"]) == (task, variant)]
            points = [(r["mean_backward_tv"], r["normalized_score_seed_mean"]) for r in rows]
            if rows:
                ax.plot(*zip(*points), "o-", color=f"C{i}", label=variant, lw=0.8)
                for r, point in zip(rows, points):
                    ax.annotate(r["lag"], point, fontsize=6)
        ax.set(xlabel="measured backward TV(π_T, β), run mean", ylabel="normalised final score (seed mean)")
    save_panels(out_dir / "score_vs_tv.png", t["tasks"], score_vs_tv, 4.2, 3.4)

    for task in t["tasks"]:  # learning curves, one panel per lag
        panels = {f"{task}, lag {lag_name(lag)}": lag for lag in scale.study_lags}

        def curves(ax, title, task=task, panels=panels):
            for (name, variant), (steps, bands) in t["curves"].items():
                if name == task:
                    mean, low, high = bands[panels[title]]
                    ax.plot(steps, mean, "--" if variant in ABLATIONS else "-", label=variant, lw=1.2)
                    ax.fill_between(steps, low, high, alpha=0.15)
            ax.set(xlabel="env steps", ylabel="episode return")
        save_panels(out_dir / f"curves_{task.replace('/', '_')}.png", list(panels), curves, 4.2, 3.4)

    if t["aggregates"]:  # one panel per metric, a row per lag and method
        rows = [(lag, i, variant) for lag in scale.study_lags for i, variant in enumerate(scale.methods)]

        def aggregates(ax, metric):
            for y, (lag, i, variant) in enumerate(rows):
                if variant in t["aggregates"][lag]:
                    point, low, high = t["aggregates"][lag][variant][metric]
                    ax.plot([low, high], [y, y], lw=6, alpha=0.5, color=f"C{i}",
                            label=variant if lag == scale.study_lags[0] else None)
                    ax.plot([point], [y], "k|", ms=12)
            ax.set_yticks(range(len(rows)), [f"lag {lag_name(lag)}: {v}" for lag, _, v in rows]
                          if metric == AGGREGATE_METRICS[0] else [])
            ax.invert_yaxis()
            ax.set_xlabel("normalised score, 95% bootstrap CI")
        save_panels(out_dir / "aggregates.png", AGGREGATE_METRICS, aggregates, 4.0, 1.2 + 0.45 * len(rows))

    def delta_sweep(ax, variant):
        for i, lag in enumerate(scale.study_lags):
            sweep = t["delta_sweep"][variant, lag]
            iqm = np.array([m["iqm"] for m in sweep.values()])  # [δ, (point, low, high)]
            ax.errorbar(np.array([float(d) for d in sweep]) * (1 + 0.03 * i), iqm[:, 0], marker="o", capsize=3,
                        yerr=[iqm[:, 0] - iqm[:, 1], iqm[:, 2] - iqm[:, 0]], label=f"lag {lag_name(lag)}")
        bound = "mean |r − 1|" if variant == "vaco_l1" else "TV = ½·mean |r − 1|"
        ax.set(xscale="log", xlabel=f"δ ({bound}) over {', '.join(t['ablation_tasks'])}", ylabel="IQM normalised score")
    if t["delta_sweep"]:
        save_panels(out_dir / "delta_sweep.png", list(dict.fromkeys(v for v, _ in t["delta_sweep"])), delta_sweep,
                    5.0, 3.4)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_preset_arguments(parser, SCALES)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bootstrap-reps", type=int, default=2000,
                        help="resamples of rliable's stratified bootstrap (aggregates over ≥ 3 tasks)")
    parser.add_argument("--fresh", action="store_true", help="ignore saved runs and recompute all")
    parser.add_argument("--tasks", default=None,
                        help="comma-separated subset of the scale's tasks to run and tabulate (default: all)")
    add_compilation_cache_flag(parser)
    parser.add_argument("--checked", action="store_true", help=CHECKED_HELP)
    args = parser.parse_args(argv)
    scale = chosen_preset(parser, args, SCALES)
    if args.tasks is not None:
        scale = scale.with_tasks(args.tasks.split(","))
    # --tasks runs a subset of the same study (chunks) and --bootstrap-reps only redraws the tables
    identity = {"study": "vaco_lag_sweep", "scale": scale.label, "seed": args.seed}
    with start_study(parser, args, identity, args.out, argv, fresh=args.fresh):
        start = time.perf_counter()
        results = run_all(scale, args.out, args.seed, args.fresh)
    header = {
        **provenance(command=f"python experiments/vaco_lag_sweep.py --scale {args.scale} --seed {args.seed}"
                             + (f" --tasks {args.tasks}" if args.tasks else "")
                             + (f" --out {args.out}" if args.out != RESULTS else "")),
        "wall_time_s_this_invocation": round(time.perf_counter() - start, 1),
        "compile_s_total": round(float(sum(float(d.attrs["compile_s"]) for d in results.values())), 1),
        "run_s_total": round(float(sum(float(d.attrs["run_s"]) for d in results.values())), 1),
        "seeds": scale.num_seeds, "lags": list(scale.lags), "mixture": repr(scale.mixture),
    }
    tables = write_tables(scale, results, args.out, header, args.bootstrap_reps)
    figures(scale, tables, args.out)
    print(tables["summary"])
    return results


if __name__ == "__main__":
    main()
