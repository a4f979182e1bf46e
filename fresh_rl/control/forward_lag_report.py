"""The tables, figures and README of the VACO forward-lag study (``experiments/vaco_forward_lag.py``),
written from the rows of :mod:`fresh_rl.control.forward_lag_study`: per-cell intervals and measured
lags, the sizing, the picks, the score-vs-lag and score-vs-TV figures and the forward-TV
measurement (both estimators side by side).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fresh_rl.control.forward_lag_study import KNOBS, MEASURED, MIXTURE, Scale, diverged_text
from fresh_rl.report import (grouped, interval, interval_text, markdown_table, plot_interval_curves, save_panel_grid,
                             save_panels)

TV_LABELS = {"forward_tv_weighted": "forward TV (importance-sampled; first scoring seeds)",
             "backward_tv": "backward TV(π_T, β)"}
CELL = ("task", "method", "backward", "updates")


def figures(runs: list[dict], forward_tv: list[dict], scale: Scale, out_dir: Path) -> None:
    """Score against M (at the middle backward lag) and against the backward lag (at the middle M)
    per task with 95% t intervals, and score against the measured forward TV (importance-sampled, the
    ``forward_tv`` runs) and backward TV (the scoring runs)."""
    main = [r for r in runs if r["method"] in KNOBS and r["tuned_knob"]]
    tasks, cells = list(dict.fromkeys(r["task"] for r in main)), grouped(main, CELL)
    lag, updates = str(scale.middle[0]), scale.middle[1]
    views = {"score_vs_forward_lag": (list(scale.updates), lambda x: (lag, x), "M updates per batch (forward lag)"),
             "score_vs_backward_lag": ([str(v) for v in scale.lags] + [MIXTURE], lambda x: (x, updates),
                                       "backward lag (versions)")}
    for name, (xs, cell, label) in views.items():
        save_panels(out_dir / f"{name}.png", tasks, lambda ax, task: plot_interval_curves(
            ax, xs, {m: [[r["mean_return"] for r in cells.get((task, m, *cell(x)), [])] for x in xs]
                     for m, _ in scale.knobs}, label, "learner return, mean over evaluations (95% t)"))

    def scatter(ax, tv, task):  # the forward TV after a batch's last update, importance-sampled from β's actions
        for method, _ in scale.knobs:
            rows = [r for r in (forward_tv if tv == "forward_tv_weighted" else main)
                    if r["task"] == task and r["method"] == method]
            ax.scatter([r[tv] for r in rows], [r["mean_return"] for r in rows], s=8, label=method)
        ax.set(title=task, xscale="log" if tv == "forward_tv_weighted" else "linear",
               xlabel=TV_LABELS[tv], ylabel="return")
    save_panel_grid(out_dir / "score_vs_tv.png", list(TV_LABELS), tasks, scatter)


def readme_lines(scale: Scale, t: dict, picks: dict, seconds: dict, seed: int) -> list[str]:
    c0, scoring, runs = scale.tasks[0], scale.scoring_range(seed, scale.scoring_seeds), t["runs"]
    every = t["runs"] + t["tuning"] + t["forward_tv"]
    cells = []
    for key, rows in grouped(runs, ("task", "method", "knob", "backward", "updates")).items():
        mean = {c: f"{np.mean(v):.3f}" if (v := [r[c] for r in rows if not np.isnan(r[c])]) else "–" for c in MEASURED}
        cells.append([*key[:2], f"{key[2]:g}", f"{rows[0]['learning_rate']:g}", *key[3:], rows[0]["versions"],
                      interval_text(*interval([r["mean_return"] for r in rows])) + diverged_text(rows), *mean.values()])
    return [
        "", "## Sizing (wall seconds of the invocations that finished each stage, 2-core CPU)", "",
        *markdown_table(("task", "programs", "runs", "env steps", "wall (s)"), (
            (task.env_name, programs, n, f"{n * task.total_env_steps:,}", f"{s:.0f}")
            for task in scale.tasks for programs, s in [seconds[task.env_name]]
            for n in [sum(r["task"] == task.env_name for r in every)])),
        f"| all | {sum(p for p, _ in seconds.values())} | {len(every)} | | "
        f"{sum(s for _, s in seconds.values()):.0f} |", "",
        f"Setup: {c0.num_envs} envs × T = {c0.rollout_length} per iteration, {c0.num_iterations} versions per run, "
        f"4 minibatches; backward lags {list(scale.lags)} fixed and a geometric mixture of mean {scale.mixture_mean:g} "
        f"per actor group, actors on-policy for the first {scale.warmup} versions; forward lag M ∈ "
        f"{list(scale.updates)} updates per batch. Each method's grid: lr {list(scale.learning_rates)} × its knob "
        f"({', '.join(f'{m} {KNOBS[m][0]} {list(v)}' for m, v in scale.knobs)}), tuned at lag {scale.middle[0]}, "
        f"M = {scale.middle[1]} on seeds {seed}–{scoring.start - 1}; scored on seeds {scoring.start}–{scoring.stop - 1}.", "",
        "## Picks (`tuning.csv`)", "", *markdown_table(("task", "method", "knob", "lr"), (
            (task, m, f"{KNOBS[m][0]} = {k:g}", f"{lr:g}") for task, p in picks.items() for m, (lr, k) in p.items())),
        "", "## Cells (scoring seeds; 95% Student-t intervals; measured lags are run means, the forward TV a run's "
        "median over iterations: ½·mean|π_θ/π_T − 1| on β's actions, exact at lag 0, biased under backward lag)", "",
        *markdown_table(("task", "method", "knob", "lr", "backward lag", "M", "versions", "mean learner return",
                         "version gap", "backward TV", "forward TV", "filter masked", "clip fraction"), cells),
        "", "Figures: `score_vs_forward_lag.png`, `score_vs_backward_lag.png`, `score_vs_tv.png`.", "", "## Verdicts",
        "", "Decided in [results/VERDICTS.md](../VERDICTS.md#vaco_forward_lag) by `python experiments/verdicts.py` from "
        "`runs.csv` and experiments/claims/vaco_forward_lag.toml (each cell's gates there). Breakout-MinAtar is the "
        "`minatar` preset, not run here: 121 s per run measured on 2 cores, ~34 CPU-hours for its runs; it was "
        "amended out of the claims' cells before any of its scoring runs."]


def forward_tv_lines(t: dict, seconds: float) -> list[str]:
    """Per cell both forward-TV estimators on the ``forward_tv`` runs (``t["forward_tv"]``, ``seconds`` of
    wall in all), and how far those reruns' returns are from their scoring runs' (``t["runs"]``, same
    config, seed and row)."""
    def run(r):
        return *(r[k] for k in CELL), r["seed"]
    scoring = {run(r): r["mean_return"] for r in t["runs"] if r["tuned_knob"]}
    gaps = np.array([abs(r["mean_return"] - scoring[run(r)]) for r in t["forward_tv"]])
    cells = [[*key, len(rows), f"{np.nanmedian([r['forward_tv'] for r in rows]):.3g}",
              f"{np.nanmean([r['forward_tv_weighted'] for r in rows]):.3f}"]
             for key, rows in grouped(t["forward_tv"], CELL).items()]
    seeds = sorted({r["seed"] for r in t["forward_tv"]})
    return [
        "", "## Forward TV at each batch's last update, both estimators (`forward_tv.csv`)", "",
        f"Every method at its pick in every cell, rerun on scoring seeds {seeds} ({len(t['forward_tv'])} runs, "
        f"{seconds:.0f} s of the sizing table's wall) keeping also the trainer's "
        "`lag/forward_tv_weighted` = ½·mean|π_θ/β − π_T/β| over the batch (TV(π_θ, π_T) importance-sampled from the "
        "behaviour policy's actions: unbiased at every backward lag), beside `lag/forward_tv` = ½·mean|π_θ/π_T − 1| "
        "(exact in expectation only at lag 0). Columns: the runs' median over iterations of the plain estimate "
        "(as in the cells table), the runs' mean of the importance-sampled one (the mean of unbiased per-iteration "
        "estimates). A rerun has its scoring run's config, key and row but runs in another compiled program, whose "
        "float rounding can steer it elsewhere over 200 versions: "
        f"{int((gaps == 0).sum())} of {len(gaps)} reproduce their scoring run's mean return exactly, the largest "
        f"difference is {gaps.max():.3g}.",
        "", *markdown_table(("task", "method", "backward lag", "M", "runs", "forward TV, plain (median)",
                             "forward TV, importance-sampled (mean)"), cells)]
