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

Outputs (``results/vaco_forward_lag/``): ``runs.csv`` (one row per scoring run: task, method,
knob, lr, backward lag, M, seed, mean and final learner return, measured backward TV, forward TV
after the batch's last update, the filter's masked fraction, the clip fraction, versions per run),
``tuning.csv``, ``score_vs_forward_lag.png``, ``score_vs_backward_lag.png``, ``score_vs_tv.png``,
``config.json``, ``README.md``.

    python experiments/vaco_forward_lag.py --scale ci    # the tests
    python experiments/vaco_forward_lag.py --scale cpu   # CartPole-v1, Acrobot-v1, Breakout-MinAtar
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from pathlib import Path

import numpy as np

from fresh_rl.control.config import TrainConfig
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.train import train
from fresh_rl.corrections import PPOClipConfig, SPOConfig
from fresh_rl.eval import eval_mean_score
from fresh_rl.lag import DelayConfig
from fresh_rl.presets import Preset, named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_csv
from fresh_rl.report import interval, interval_text
from fresh_rl.sweep import output_lock, run_stage
from fresh_rl.sweep.keys import seed_keys
from fresh_rl.sweep.study_cli import study_main

RESULTS = REPOSITORY_ROOT / "results" / "vaco_forward_lag"
MIXTURE = "mixture"
KNOBS = {  # method → (knob name, its 3 values, traced HyperParams leaf or None: a static config field)
    "ppo_clip": ("ε", (0.1, 0.2, 0.3), None),
    "ppo_kl": ("β", (0.03, 0.1, 0.3), "kl_coef"),
    "spo": ("ε", (0.1, 0.2, 0.3), None),
    "impala": ("ρ̄", (0.5, 1.0, 2.0), None),
    "vaco": ("δ", (0.1, 0.2, 0.4), "vaco_delta"),
}
ABLATIONS = ("vaco_align_only", "vaco_filter_only")
DELTA_CURVE = (0.05, 0.1, 0.2, 0.4)
KEEP = ("eval/return_deterministic", "eval/valid", "lag/tv", "lag/forward_tv", "lag/version_gap_mean",
        "loss/clip_fraction", "loss/mask_fraction")


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    tasks: tuple[TrainConfig, ...]  # per task: everything but the method, its knob, M and the delay
    lags: tuple[int, ...]  # fixed backward lags (the middle one is the tuning cell's)
    mixture_mean: float
    updates: tuple[int, ...]  # forward lag M = epochs × minibatches (minibatches fixed)
    warmup: int
    learning_rates: tuple[float, ...]
    tuning_seeds: int
    scoring_seeds: int
    chunk: int
    knobs: tuple[tuple[str, tuple[float, ...]], ...] = tuple((m, v) for m, (_, v, _) in KNOBS.items())
    """(method, its knob values): the compared methods and their tuning grids (the same size for each)."""

    @property
    def middle(self) -> tuple[int, int]:
        return self.lags[len(self.lags) // 2], self.updates[len(self.updates) // 2]


def _task(env, envs, steps, iterations, every, episodes, **overrides) -> TrainConfig:
    return TrainConfig(env_name=env, num_envs=envs, rollout_length=steps, total_env_steps=envs * steps * iterations,
                       num_minibatches=4, eval_every=every, eval_episodes=episodes, num_actor_groups=4,
                       **overrides)


SCALES = named({
    "ci": Scale((_task("CartPole-v1", 8, 16, 12, 6, 2, normalize_obs=True),), (0, 2), 2.0, (4,), 2,
                (1e-3,), 1, 2, 6, knobs=(("ppo_clip", (0.2,)), ("vaco", (0.1, 0.2)))),
    "cpu": Scale((_task("CartPole-v1", 8, 64, 200, 20, 8, normalize_obs=True),
                  _task("Acrobot-v1", 8, 64, 200, 20, 8, normalize_obs=True),
                  _task("Breakout-MinAtar", 8, 64, 200, 20, 8, normalize_obs=False, hidden_sizes=(64,),
                        entropy_coef=0.01)),
                 (0, 4, 16), 4.0, (4, 16, 64), 16, (3e-4, 1e-3, 3e-3), 5, 10, 15),
})


def config_for(task: TrainConfig, scale: Scale, method: str, knob: float, updates: int, delay: str) -> TrainConfig:
    """The static config of a program: the method, its knob where static, M and the delay kind."""
    static = {"ppo_clip": lambda: {"ppo_clip": PPOClipConfig(knob, knob)}, "spo": lambda: {"spo": SPOConfig(knob)},
              "impala": lambda: {"vtrace_rho_bar": knob},
              "vaco_filter_only": lambda: {"vaco": dataclasses.replace(task.vaco, delta=knob)}}.get(method, dict)()
    ring = max(scale.lags) + 1
    d = DelayConfig.fixed(0, ring) if delay == "fixed" else DelayConfig.geometric(scale.mixture_mean, ring)
    return dataclasses.replace(task, method=method, num_epochs=updates // task.num_minibatches, delay=d,
                               lag_warmup_versions=scale.warmup, **static)


def _train_kept(config, key, hp):
    metrics = train(config, key, hp).metrics
    return {k: metrics[k] for k in KEEP if k in metrics}


def stage(config, scale, rows, out_dir, name):
    """``rows`` (dicts with ``seed``, ``learning_rate``, ``lag`` and the traced knob if any) of one program."""
    traced = KNOBS.get(config.method, (None, None, None))[2]
    grid = {"learning_rate": [r["learning_rate"] for r in rows], "lag": [r["lag"] for r in rows]}
    if traced:
        grid[traced] = [r["knob"] for r in rows]
    label = f"{config.env_name} {config.method} M={config.num_epochs * config.num_minibatches} {name}"
    out, _ = run_stage(functools.partial(_train_kept, config), seed_keys([r["seed"] for r in rows]),
                       HyperParams.from_grid(config, grid), directory=out_dir / "runs" / label.replace(" ", "-"),
                       fingerprint=f"{name} {config!r} rows={rows}", chunk_size=scale.chunk, label=label)
    mean = eval_mean_score(out["eval/return_deterministic"], out["eval/valid"])
    return [{**r, "mean_return": float(m), "final_return": float(f),
             **{col: float(np.mean(out[key][i])) if key in out else math.nan for col, key in
                (("backward_tv", "lag/tv"), ("forward_tv", "lag/forward_tv"), ("version_gap", "lag/version_gap_mean"),
                 ("clip_fraction", "loss/clip_fraction"), ("masked_fraction", "loss/mask_fraction"))}}
            for i, (r, m, f) in enumerate(zip(rows, mean, out["eval/return_deterministic"][:, -1]))]


def tune(task, scale, out_dir, seed) -> tuple[dict, list[dict]]:
    """Every method's (lr, knob) pick at the middle cell on the tuning seeds."""
    lag, updates = scale.middle
    picks, rows_out = {}, []
    for method, values in scale.knobs:
        traced = KNOBS[method][2]
        groups = [values] if traced else [(v,) for v in values]  # one program per static knob value
        for group in groups:
            rows = [{"method": method, "knob": k, "learning_rate": lr, "lag": lag, "seed": s}
                    for k in group for lr in scale.learning_rates for s in range(seed, seed + scale.tuning_seeds)]
            rows_out += stage(config_for(task, scale, method, group[0], updates, "fixed"), scale, rows, out_dir,
                              "tuning")
        score = {}
        for r in rows_out:
            if r["method"] == method:
                score.setdefault((r["learning_rate"], r["knob"]), []).append(r["mean_return"])
        picks[method] = max(score, key=lambda k: np.mean(score[k]))
    return picks, [{"task": task.env_name, **r} for r in rows_out]


def score(task, scale, picks, out_dir, seed) -> list[dict]:
    """Every method at its pick in every cell, then the ablations at the middle M."""
    seeds = range(seed + scale.tuning_seeds, seed + scale.tuning_seeds + scale.scoring_seeds)
    jobs = [(m, *picks[m], updates) for m, _ in scale.knobs for updates in scale.updates]
    if "vaco" in picks:
        jobs += [(m, *picks["vaco"], scale.middle[1]) for m in ABLATIONS]
    out = []
    for method, lr, knob, updates in jobs:
        for delay, lags in (("fixed", scale.lags), (MIXTURE, (0,))):
            knobs = DELTA_CURVE if (method, updates) == ("vaco", scale.middle[1]) else (knob,)
            rows = [{"method": method, "knob": k, "learning_rate": lr, "lag": lag, "seed": s}
                    for k in knobs for lag in lags for s in seeds]
            config = config_for(task, scale, method, knob, updates, delay)
            for r in stage(config, scale, rows, out_dir, "scoring"):
                out.append({"task": task.env_name, **r, "backward": MIXTURE if delay == MIXTURE else str(r["lag"]),
                            "updates": updates, "tuned_knob": r["knob"] == knob, "versions": config.num_iterations})
    return out


def figures(t: dict, scale: Scale, out_dir: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in t["runs"]))
    main = [r for r in t["runs"] if r["method"] in KNOBS and r["tuned_knob"]]
    backwards = [str(lag) for lag in scale.lags] + [MIXTURE]
    views = {"score_vs_forward_lag": ("updates", list(scale.updates), "M updates per batch (forward lag)"),
             "score_vs_backward_lag": ("backward", backwards, "backward lag (versions)")}
    for name, (axis, xs, label) in views.items():
        fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
        for ax, task in zip(axes[0], tasks):
            for method, _ in scale.knobs:
                cells = [[r["mean_return"] for r in main if r["task"] == task and r["method"] == method
                          and r[axis] == x and (axis == "updates" or r["updates"] == scale.middle[1])
                          and (axis == "backward" or r["backward"] == str(scale.middle[0]))] for x in xs]
                m = [interval(c) if c else (np.nan,) * 3 for c in cells]
                ax.errorbar(range(len(xs)), [v[0] for v in m], yerr=[[v[0] - v[1] for v in m], [v[2] - v[0] for v in m]],
                            marker="o", capsize=3, label=method)
            ax.set_xticks(range(len(xs)), [str(x) for x in xs])
            ax.set(title=task, xlabel=label, ylabel="learner return, mean over evaluations (95% t)")
        axes[0, 0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / f"{name}.png", dpi=110)
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        for method, _ in scale.knobs:
            rows = [r for r in main if r["task"] == task and r["method"] == method]
            ax.scatter([r["forward_tv"] for r in rows], [r["mean_return"] for r in rows], s=8, label=method)
        ax.set(title=task, xscale="log", xlabel="measured forward TV after the batch's last update",
               ylabel="learner return, mean over evaluations")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "score_vs_tv.png", dpi=110)
    plt.close("all")


def write_readme(scale: Scale, t: dict, picks: dict, seconds: float, out_dir: Path, header: dict) -> str:
    lines = []
    for key in dict.fromkeys((r["task"], r["method"], r["knob"], r["backward"], r["updates"]) for r in t["runs"]):
        rows = [r for r in t["runs"] if (r["task"], r["method"], r["knob"], r["backward"], r["updates"]) == key]
        mean = {c: np.nanmean([r[c] for r in rows]) for c in ("backward_tv", "forward_tv", "masked_fraction",
                                                             "clip_fraction", "version_gap")}
        lines.append(f"| {key[0]} | {key[1]} | {key[2]:g} | {rows[0]['learning_rate']:g} | {key[3]} | {key[4]} | "
                     f"{rows[0]['versions']} | {interval_text(*interval([r['mean_return'] for r in rows]))} | "
                     f"{mean['version_gap']:.1f} | {mean['backward_tv']:.3f} | {mean['forward_tv']:.3f} | "
                     f"{mean['masked_fraction']:.3f} | {mean['clip_fraction']:.3f} |")
    pick_lines = [f"| {task} | {m} | {KNOBS.get(m, ('δ',))[0]} = {k:g} | {lr:g} |"
                  for task, p in picks.items() for m, (lr, k) in p.items()]
    c0, seed = scale.tasks[0], header["seed"]
    text = [
        "# VACO with backward lag small against the run, forward lag swept and equal tuning", "",
        provenance_line(header), f"Compute of the stages (the invocations that ran them): {seconds:.0f} s.", "",
        f"Setup: {c0.num_envs} envs × T = {c0.rollout_length} per iteration, {c0.num_iterations} versions per run, "
        f"4 minibatches; backward lags {list(scale.lags)} fixed and a geometric mixture of mean {scale.mixture_mean:g} "
        f"per actor group, actors on-policy for the first {scale.warmup} versions; forward lag M ∈ "
        f"{list(scale.updates)} updates per batch. Each method's grid: lr {list(scale.learning_rates)} × its knob "
        f"({', '.join(f'{m} {KNOBS[m][0]} {list(v)}' for m, v in scale.knobs)}), tuned at lag {scale.middle[0]}, "
        f"M = {scale.middle[1]} on seeds {seed}–{seed + scale.tuning_seeds - 1}; scored on seeds "
        f"{seed + scale.tuning_seeds}–{seed + scale.tuning_seeds + scale.scoring_seeds - 1}.", "",
        "## Picks (`tuning.csv`)", "", "| task | method | knob | lr |", "|---|---|---|---|", *pick_lines, "",
        "## Cells (scoring seeds; 95% Student-t intervals; measured lags are run means)", "",
        "| task | method | knob | lr | backward lag | M | versions | mean learner return | version gap | "
        "backward TV | forward TV | filter masked | clip fraction |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *lines, "", "Figures: `score_vs_forward_lag.png`, `score_vs_backward_lag.png`, `score_vs_tv.png`.",
    ]
    (out_dir / "README.md").write_text("\n".join(text) + "\n")
    return "\n".join(text)


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
        figures(t, scale, out_dir)
        seconds = sum(float(p.read_text()) for p in (out_dir / "runs").glob("*.seconds"))
        header = {**provenance(started=started), "seed": seed}
        (out_dir / "config.json").write_text(json.dumps(
            {"scale": scale.label, "scale_config": repr(scale), "picks": {k: {m: list(v) for m, v in p.items()}
                                                                        for k, p in picks.items()}, **header},
            indent=1, default=str) + "\n")
        return write_readme(scale, t, picks, seconds, out_dir, header)


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
