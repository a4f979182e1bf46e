"""VACO in the regime its paper describes: backward lag small against the run, forward lag swept, equal tuning.

Control trainer (:func:`fresh_rl.control.train.train`). A cell is a backward lag (fixed 0, 4 or 16
versions, one traced ``HyperParams.lag`` program; or a geometric mixture of mean 4 per actor group
and iteration) × a forward lag M ∈ {4, 16, 64} updates per batch (epochs × 4 minibatches, the batch
fixed). Actors act on-policy for the first :attr:`Scale.warmup` versions
(``TrainConfig.lag_warmup_versions``), so the ring never serves θ0 to a lagged actor beyond that;
every run has :attr:`Scale.iterations` versions, so the largest fixed lag is ≤ 10% of them.

Equal tuning: each method gets the same 3 × 3 grid, learning rate × its own knob (PPO-clip's ε,
PPO-KL's fixed β, SPO's ε, IMPALA's ρ̄, VACO's δ), on tuning seeds at the middle cell (lag 4,
M = 16), picked by mean learner return over the run's evaluations; every cell is then scored on
other seeds at the pick. Ablations at M = 16 over every backward lag, at VACO's pick: align-only,
filter-only and VACO's δ curve. Each stage is a resumable :func:`fresh_rl.sweep.run_stage`.

Outputs (``results/vaco_forward_lag/``): ``runs.csv`` (per scoring run: task, method, knob, lr, backward lag, M,
seed, mean and final learner return, measured backward TV, forward TV after the batch's last update (a run's median:
unbounded under backward lag), masked and clip fractions, versions), ``tuning.csv``, ``score_vs_{forward_lag,
backward_lag,tv}.png``, ``config.json``, ``README.md``.

    python experiments/vaco_forward_lag.py --scale ci    # the tests
    python experiments/vaco_forward_lag.py --scale cpu      # CartPole-v1, Acrobot-v1, brax/inverted_pendulum
    python experiments/vaco_forward_lag.py --scale minatar --out results/vaco_forward_lag_minatar
                                # Breakout-MinAtar, same design: ~17-34 CPU-hours on 2 cores (measured), not run
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from fresh_rl.control.config import TrainConfig
from fresh_rl.control.forward_lag_study import KNOBS, MEASURED, MIXTURE, Scale, diverged_text, score, task_folder, tune
from fresh_rl.presets import named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, write_atomic, write_csv
from fresh_rl.report import (grouped, interval, interval_text, markdown_table, plot_interval_curves, save_panel_grid,
                             save_panels, write_readme)
from fresh_rl.sweep import output_lock
from fresh_rl.sweep.study_cli import study_main

RESULTS = REPOSITORY_ROOT / "results" / "vaco_forward_lag"


def _task(env, envs, steps, iterations, every, episodes, **overrides) -> TrainConfig:
    return TrainConfig(env_name=env, num_envs=envs, rollout_length=steps, total_env_steps=envs * steps * iterations,
                       num_minibatches=4, eval_every=every, eval_episodes=episodes, num_actor_groups=4,
                       **overrides)


SCALES = named({
    "ci": Scale((_task("CartPole-v1", 8, 16, 12, 6, 2, normalize_obs=True),), (0, 2), 2.0, (4,), 2,
                (1e-3,), 1, 2, 6, knobs=(("ppo_clip", (0.2,)), ("vaco", (0.1, 0.2)))),
    "cpu": Scale((_task("CartPole-v1", 8, 64, 200, 20, 8, normalize_obs=True),
                  _task("Acrobot-v1", 8, 64, 200, 20, 8, normalize_obs=True),
                  _task("brax/inverted_pendulum", 8, 64, 200, 20, 8, brax_backend="spring", normalize_obs=True,
                        entropy_coef=0.0, advantage_normalization="standardize")),
                 (0, 4, 16), 4.0, (4, 16, 64), 16, (3e-4, 1e-3, 3e-3), 5, 10, 15),
    # the same design on Breakout-MinAtar: 121 s per run measured here (~34 h), over the cpu preset's 12 h
    "minatar": Scale((_task("Breakout-MinAtar", 8, 64, 200, 20, 8, normalize_obs=False, hidden_sizes=(64,),
                            entropy_coef=0.01),), (0, 4, 16), 4.0, (4, 16, 64), 16, (3e-4, 1e-3, 3e-3), 5, 10, 15),
})


def figures(runs: list[dict], scale: Scale, out_dir: Path) -> None:
    """Score against M (at the middle backward lag) and against the backward lag (at the middle M)
    per task with 95% t intervals, and score against the measured forward and backward TV."""
    main = [r for r in runs if r["method"] in KNOBS and r["tuned_knob"]]
    tasks, cells = list(dict.fromkeys(r["task"] for r in main)), grouped(main, ("task", "method", "backward", "updates"))
    lag, updates = str(scale.middle[0]), scale.middle[1]
    views = {"score_vs_forward_lag": (list(scale.updates), lambda x: (lag, x), "M updates per batch (forward lag)"),
             "score_vs_backward_lag": ([str(v) for v in scale.lags] + [MIXTURE], lambda x: (x, updates),
                                       "backward lag (versions)")}
    for name, (xs, cell, label) in views.items():
        save_panels(out_dir / f"{name}.png", tasks, lambda ax, task: plot_interval_curves(
            ax, xs, {m: [[r["mean_return"] for r in cells.get((task, m, *cell(x)), [])] for x in xs]
                     for m, _ in scale.knobs}, label, "learner return, mean over evaluations (95% t)"))

    def scatter(ax, tv, task):  # forward TV (after the last update): biased, unbounded under backward lag
        for method, _ in scale.knobs:
            rows = [r for r in main if r["task"] == task and r["method"] == method]
            ax.scatter([r[tv] for r in rows], [r["mean_return"] for r in rows], s=8, label=method)
        ax.set(title=task, xscale="log" if tv == "forward_tv" else "linear", xlabel=f"{tv[:-3]} TV", ylabel="return")
    save_panel_grid(out_dir / "score_vs_tv.png", ["forward_tv", "backward_tv"], tasks, scatter)


def readme_lines(scale: Scale, t: dict, picks: dict, seconds: dict, seed: int) -> list[str]:
    c0, s0, runs = scale.tasks[0], seed + scale.tuning_seeds, t["runs"]
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
            for n in [sum(r["task"] == task.env_name for r in t["runs"] + t["tuning"])])),
        f"| all | {sum(p for p, _ in seconds.values())} | {len(t['runs']) + len(t['tuning'])} | | "
        f"{sum(s for _, s in seconds.values()):.0f} |", "",
        f"Setup: {c0.num_envs} envs × T = {c0.rollout_length} per iteration, {c0.num_iterations} versions per run, "
        f"4 minibatches; backward lags {list(scale.lags)} fixed and a geometric mixture of mean {scale.mixture_mean:g} "
        f"per actor group, actors on-policy for the first {scale.warmup} versions; forward lag M ∈ "
        f"{list(scale.updates)} updates per batch. Each method's grid: lr {list(scale.learning_rates)} × its knob "
        f"({', '.join(f'{m} {KNOBS[m][0]} {list(v)}' for m, v in scale.knobs)}), tuned at lag {scale.middle[0]}, "
        f"M = {scale.middle[1]} on seeds {seed}–{s0 - 1}; scored on seeds {s0}–{s0 + scale.scoring_seeds - 1}.", "",
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


def run(scale: Scale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started, out_dir = time.perf_counter(), Path(out_dir)
    with output_lock(out_dir):
        t, picks = {"tuning": [], "runs": []}, {}
        for task in scale.tasks:
            picks[task.env_name], tuning = tune(task, scale, out_dir, seed)
            t["tuning"] += tuning
            t["runs"] += score(task, scale, picks[task.env_name], out_dir, seed)
        for name, rows in t.items():
            write_csv(out_dir / f"{name}.csv", rows)
        figures(t["runs"], scale, out_dir)
        seconds = {task.env_name: [float(p.read_text()) for p in (out_dir / "runs").glob(
            f"{task_folder(task.env_name)}-*.seconds")] for task in scale.tasks}
        seconds = {task: (len(s), sum(s)) for task, s in seconds.items()}  # programs, wall seconds
        header = {**provenance(started=started), "seed": seed}
        write_atomic(out_dir / "config.json", json.dumps(
            {"scale": scale.label, "scale_config": repr(scale), "picks": {k: {m: list(v) for m, v in p.items()}
                                                                         for k, p in picks.items()}, **header},
            indent=1, default=str) + "\n")
        return write_readme(out_dir, "VACO with backward lag small against the run, forward lag swept and equal tuning",
                            header, readme_lines(scale, t, picks, seconds, seed))


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
