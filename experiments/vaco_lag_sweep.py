"""VACO under simulated policy lag: methods × lag levels × tasks × seeds, δ sweep, ablation.

Reproduces the claim of VACO (arXiv 2603.01365; docs/vaco.md): advantage
realignment + the TV filter stay robust as policy lag grows, where PPO-KL, SPO and IMPALA
degrade. Beyond the paper (the reviewers' complaints): ≥ 5 seeds, learning curves, PPO-clip as
an extra baseline, a δ sweep and a component ablation.

Every (task, variant) pair is one compiled program: ``train`` vmapped over the
``fresh_rl.sweep.product_grid`` of seeds × lag levels (× δ values for VACO, × β for ppo_kl_fixed) with
:class:`fresh_rl.control.HyperParams`, sharded over all devices by
``fresh_rl.control.presets.run_variant`` (the same grid, keys and program as ``fresh-rl sweep``).
A scale with a delay mixture (``cpu``, ``paper``: lags 0, 8, 32, 64 and geometric actor delays
of mean 8, docs/vaco.md) runs it as a second program per pair, the last column of the lag axis
(``-1``, "mixture" in the tables). Finished pairs are saved to ``results/vaco/runs/*.npz`` (axes
named, :data:`RUN_DIMS`) as they complete, so an interrupted sweep resumes where it stopped
(``--fresh`` recomputes everything); saved runs of an older key schedule, config or mixture are recomputed.

Outputs (``results/vaco/``): ``runs.csv`` (one row per run: final score, initial score, training
return, evaluation AUC, lag metrics), ``curves.csv`` (seed-mean return per iteration with 95%
Student-t bands), ``curves_<task>.png``, ``per_task.csv`` (seed-mean normalised score per task,
variant, swept value and lag, 95% Student-t interval); over at least ``MIN_AGGREGATE_TASKS``
learning tasks also ``aggregates.{csv,png}`` (rliable median / IQM / mean / optimality gap with
95% stratified-bootstrap intervals per method and lag),
``probability_of_improvement.csv`` (P(VACO variant > baseline) per lag, with intervals),
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

**Scores.** A run's final score is the learner's deterministic evaluation averaged over the
last 10% of its evaluations when the scale evaluates the learner (``eval_every`` > 0: ``cpu``,
``gpu10``, ``paper``), else the mean episode return of the actors over the last 10% of
iterations (``ci``, ``quick``); normalised per task as ``(R − R_init)/(R_best − R_init)`` with
R_init in the final score's mode: the mean first learner evaluation over all the task's runs
(no evaluation of the untrained learner is saved), else the mean return of the actors' first
completed episodes (the untrained policy); R_best the best final score of any run on the task
(our choice: the paper's normalisation is unknown). A run whose parameters diverged (NaN returns) scores R_init, i.e.
0, and is counted in the summary.
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import time
from pathlib import Path
from typing import Optional

import numpy as np

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.control.presets import (ABLATIONS, KEY_SCHEDULE, VACO_SCALES as SCALES, SWEPT_BASELINES, Scale, best_at_first_lag,
                                      headline_index, VACO_VARIANTS, lag_name, run_study_variant, saved_run_matches, study_variants,
                                      variant_config)
from fresh_rl.eval import (AGGREGATE_METRICS, aggregate_intervals, eval_area_under_curve, eval_final_score,
                           eval_first_score, eval_initial_score, final_score, improvement_intervals, initial_score,
                           seed_interval)
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, write_csv
from fresh_rl.results import DIMS_KEY, NamedArrays
from fresh_rl.sweep.study_cli import add_preset_arguments, chosen_preset, start_study
from fresh_rl.validation import CHECKED_HELP

RESULTS = REPOSITORY_ROOT / "results" / "vaco"
MIN_AGGREGATE_TASKS = 3
"""rliable aggregates (median, IQM, optimality gap, P(X > Y)) only over at least this many tasks:
over one or two they say nothing the per-task intervals do not (``per_task.csv``)."""
RUN_DIMS = ("lag", "delta", "seed")
"""A run's leading axes (``variant_grid``'s; "delta" is β for ``ppo_kl_fixed``); then iterations."""

def run_all(scale: Scale, out_dir: Path, seed: int, fresh: bool, log=print) -> dict:
    """Run (or load) every (task, variant); returns {(task, variant): run} (:func:`named_run`, ``final`` added)."""
    runs_dir = out_dir / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for task in scale.tasks:
        for variant, method, overrides, deltas in study_variants(scale, task):
            path = runs_dir / f"{task.name.replace('/', '_')}__{variant}.npz"
            config = variant_config(task, method, overrides, scale.ring_size)
            if path.exists() and not fresh:
                data = dict(np.load(path, allow_pickle=False))
                if saved_run_matches(data, config, seed, scale.study_lags, deltas, scale.num_seeds, scale.mixture):
                    log(f"[resume] {task.name} {variant}: loaded {path.name}")
                    results[(task.name, variant)] = with_final_score(named_run(data))
                    continue
            res = run_study_variant(scale, config, deltas, seed)
            data = {k.replace("/", "__"): v for k, v in res["metrics"].items()}
            data.update(config=np.array(repr(config)), seed=np.array(seed), key_schedule=np.array(KEY_SCHEDULE),
                        lags=np.array(scale.study_lags), mixture=np.array(repr(scale.mixture)),
                        deltas=np.array(deltas), compile_s=np.array(res["compile_s"]),
                        run_s=np.array(res["run_s"]), env_steps=np.array(res["env_steps"]),
                        batch_size=np.array(config.batch_size),
                        nonfinite_from_iteration=res["nonfinite_from_iteration"])
            run = named_run(data)
            bad = [tuple(run.coords[dim][i] for dim, i in zip(RUN_DIMS, cell))
                   for cell in np.argwhere(run["nonfinite_from_iteration"] >= 0)]
            if bad:
                log(f"WARNING {task.name} {variant}: {len(bad)} runs went non-finite "
                    f"((lag, delta, seed) {bad}; marked in nonfinite_from_iteration)")
            run.to_npz(path)
            run = results[(task.name, variant)] = with_final_score(run)
            log(f"{task.name} {variant}: compile {res['compile_s']:.0f}s run {res['run_s']:.0f}s "
                f"({res['env_steps'] / res['run_s']:.0f} env steps/s over all runs); final return by lag "
                f"{np.round(run.sel(delta=headline_delta(variant, run)).mean('seed')['final'], 1).tolist()}")
    return results


def named_run(arrays: dict) -> NamedArrays:
    """A run's arrays over :data:`RUN_DIMS`, saved with the axis names or positional (a fresh run's;
    runs saved before the names): the arrays with the three leading axes are its variables, the
    rest its attrs (``lags``, ``deltas`` too: ``saved_run_matches`` and vaco_regime.py read them)."""
    if DIMS_KEY in arrays:
        return NamedArrays.from_mapping(arrays)
    first_seed, grid = int(arrays["seed"]), {k: v for k, v in arrays.items() if np.ndim(v) >= len(RUN_DIMS)}
    coords = {"lag": arrays["lags"].tolist(), "delta": arrays["deltas"].tolist(),
              "seed": range(first_seed, first_seed + arrays["episode_return"].shape[2])}
    return NamedArrays(RUN_DIMS, coords, grid, {k: v for k, v in arrays.items() if k not in grid})


def with_final_score(run: NamedArrays) -> NamedArrays:
    """``run`` with ``final``, its final score per run: the learner's deterministic evaluation
    (mean of the last 10% of evaluations) when the runs evaluated it (``eval_every`` > 0), else
    the training return of the (stale) behaviour policy over the last 10% of iterations."""
    if "eval__return_deterministic" in run:
        return run.assign(final=eval_final_score(run["eval__return_deterministic"], run["eval__valid"] > 0))
    return run.assign(final=final_score(run["episode_return"]))


def headline_delta(variant: str, run: NamedArrays) -> float:
    """The swept value ``variant`` is reported with (``fresh_rl.control.presets.headline_index``)."""
    return run.coords["delta"][headline_index(variant, run.coords["delta"], run["final"])]


def learning_check(scale: Scale, results: dict) -> dict:
    """Whether each task shows learning within its budget (a test bed that cannot learn cannot
    rank methods): the main variant with the best seed-mean final score at the first lag, and
    the 95% Student-t interval over seeds of its per-seed gain, final − initial (learner evaluations: the last
    vs the first 10% of them; else the actors' training return). A task *learns* when that
    interval is above 0; only such tasks enter the aggregates (our rule).
    Returns {task: {"variant", "initial", "final", "gain", "low", "high", "learns"}}."""
    check = {}
    for task in scale.tasks:
        best = None
        for variant in scale.methods:
            d = results.get((task.name, variant))
            if d is None:
                continue
            first = d.sel(lag=d.coords["lag"][0], delta=headline_delta(variant, d))  # [seed]
            final = first["final"]
            initial = (eval_initial_score(first["eval__return_deterministic"], first["eval__valid"] > 0)
                       if "eval__return_deterministic" in first else
                       initial_score(first["episode_return"], first["episodes_completed"]))
            if np.isfinite(final).all() and (best is None or final.mean() > best[1].mean()):
                best = (variant, final, initial)
        if best is None:
            continue
        variant, final, initial = best
        gain, low, high = (float(x) for x in seed_interval(final - initial))
        check[task.name] = {"variant": variant, "initial": float(initial.mean()), "final": float(final.mean()),
                            "gain": gain, "low": low, "high": high, "learns": low > 0}
    return check


def score_tables(scale: Scale, results: dict):
    """Normalised final scores: {(variant, lag, delta): {task: [seeds]}}, and ``results`` with
    them as ``normalized``, ``(final − R_init)/(R_best − R_init)`` per task (a diverged run scores
    R_init), both in the final score's mode: with learner evaluations R_init is the mean first
    evaluation (:func:`fresh_rl.eval.eval_first_score`) of all the task's runs, else the actors'
    first completed episodes (``initial_score``); R_best the best final score;
    delta ``"headline"`` holds the value each variant is reported with (:func:`headline_delta`),
    ``"tuned"`` the value with the best seed mean at the first lag (``best_at_first_lag``: the
    rule ``ppo_kl_fixed``'s β gets, applied to every variant's swept axis)."""
    scores, normalized_results = {}, {}
    for task in scale.tasks:
        runs = {v: d for (t, v), d in results.items() if t == task.name}
        low = float(np.nanmean([np.nanmean(eval_first_score(d["eval__return_deterministic"], d["eval__valid"] > 0)
                                           if "eval__return_deterministic" in d else
                                           initial_score(d["episode_return"], d["episodes_completed"]))
                                for d in runs.values()]))
        high = float(max(np.nanmax(d["final"]) for d in runs.values()))
        for variant, d in runs.items():
            final = np.nan_to_num(d["final"], nan=low)  # diverged → untrained
            d = normalized_results[task.name, variant] = d.assign(normalized=(final - low) / max(high - low, 1e-8))
            read_at = {**{delta: delta for delta in d.coords["delta"]}, "headline": headline_delta(variant, d),
                       "tuned": d.coords["delta"][best_at_first_lag(final)]}  # value → the δ it reads
            for lag in d.coords["lag"]:
                for value, delta in read_at.items():
                    scores.setdefault((variant, lag, value), {})[task.name] = d.sel(lag=lag, delta=delta)["normalized"]
    return scores, normalized_results


def _matrix(per_task: dict, tasks) -> Optional[np.ndarray]:
    if not all(t in per_task for t in tasks):
        return None
    return np.stack([per_task[t] for t in tasks], axis=1)  # [seeds, tasks]


def _lag_comparison(scale: Scale, scores: dict, value: str, tasks, reps: int) -> tuple[dict, dict]:
    """Per lag: rliable aggregates of the main methods read at ``value`` (``"headline"`` or
    ``"tuned"``, :func:`score_tables`) over ``tasks``, and P(VACO variant > baseline) for every
    pair of them; methods missing on one of the tasks are left out."""
    agg, improvement = {}, {}
    for lag in scale.study_lags:
        mats = {v: _matrix(scores.get((v, lag, value), {}), tasks) for v in scale.methods}
        mats = {v: m for v, m in mats.items() if m is not None}
        agg[lag] = aggregate_intervals(mats, reps=reps)
        improvement[lag] = improvement_intervals(
            {(v, b): (mats[v], mats[b]) for v in mats if v in VACO_VARIANTS for b in mats if b not in VACO_VARIANTS},
            reps=reps)
    return agg, improvement


def _aggregate_rows(agg: dict) -> list[list[str]]:
    """CSV rows ``[lag, method, metric, point, ci_low, ci_high]`` of :func:`_lag_comparison`'s aggregates."""
    return [[lag_name(lag), variant, metric, f"{p:.4f}", f"{lo:.4f}", f"{hi:.4f}"]
            for lag, table in agg.items() for variant, metrics in table.items()
            for metric, (p, lo, hi) in metrics.items()]


def write_outputs(scale: Scale, results: dict, out_dir: Path, header: dict, reps: int) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    all_tasks = [t.name for t in scale.tasks]
    lags = scale.study_lags
    scores, results = score_tables(scale, results)
    learning = learning_check(scale, results)
    with open(out_dir / "learning_check.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "best_variant_at_first_lag", "initial", "final", "gain", "gain_ci_low", "gain_ci_high",
                    "learns"])
        for t, c in learning.items():
            w.writerow([t, c["variant"], f"{c['initial']:.3f}", f"{c['final']:.3f}", f"{c['gain']:.3f}",
                        f"{c['low']:.3f}", f"{c['high']:.3f}", c["learns"]])
    # aggregates, improvement probabilities, δ sweep and ablations over the tasks that learn
    # (all tasks, flagged in the summary, when none does), and only over MIN_AGGREGATE_TASKS or more
    tasks = [t for t in all_tasks if learning.get(t, {}).get("learns")] or all_tasks
    ablation_tasks = [t.name for t in scale.tasks if t.ablations and t.name in tasks]
    ablation_aggregates = len(ablation_tasks) >= MIN_AGGREGATE_TASKS
    per_task = per_task_rows(scores, all_tasks)
    write_csv(out_dir / "per_task.csv", per_task)

    # runs.csv
    with open(out_dir / "runs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "variant", "lag", "delta", "seed", "final_return", "initial_return",
                    "normalized_score", "final_training_return", "eval_auc", "mean_version_gap",
                    "mean_tv_behaviour", "mean_forward_tv", "mean_ess", "mean_filter_on",
                    "mean_mask_fraction", "mean_clip_fraction"])
        means = ("lag__version_gap_mean", "lag__tv", "lag__forward_tv", "lag__ess", "loss__filter_on",
                 "loss__mask_fraction", "loss__clip_fraction")  # the mean_* columns: means over iterations
        for (task_name, variant), d in sorted(results.items()):
            d = d.assign(initial=initial_score(d["episode_return"], d["episodes_completed"]),
                         training=final_score(d["episode_return"]),
                         **({"auc": eval_area_under_curve(d["eval__return_deterministic"], d["eval__valid"] > 0)}
                            if "eval__return_deterministic" in d else {}))
            for lag, delta, seed in itertools.product(*(d.coords[dim] for dim in RUN_DIMS)):
                cell = d.sel(lag=lag, delta=delta, seed=seed)
                w.writerow([task_name, variant, lag_name(lag), delta, seed, f"{cell['final']:.3f}",
                            f"{cell['initial']:.3f}", f"{cell['normalized']:.4f}", f"{cell['training']:.3f}",
                            f"{cell['auc']:.3f}" if "auc" in cell else ""]
                           + [float(cell[k].mean()) if k in cell else "" for k in means])

    # score against the *measured* backward TV(π_T, β): a fixed lag moves methods by different
    # amounts (PPO's trust region keeps π_T near β), so this is the comparison at equal drift
    tv_rows = []
    for (task_name, variant), d in sorted(results.items()):
        if variant not in scale.methods or "lag__tv" not in d:
            continue
        at = d.sel(delta=headline_delta(variant, d))
        tv_rows += [(task_name, variant, lag_name(lag), float(np.nanmean(at.sel(lag=lag)["lag__tv"])),
                     float(at.sel(lag=lag)["normalized"].mean())) for lag in at.coords["lag"]]
    with open(out_dir / "score_vs_tv.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "variant", "lag", "mean_backward_tv", "normalized_score_seed_mean"])
        w.writerows([r[:3] + (f"{r[3]:.4f}", f"{r[4]:.4f}") for r in tv_rows])
    fig, axes = plt.subplots(1, len(all_tasks), figsize=(4.2 * len(all_tasks), 3.4), squeeze=False)
    for ti, task_name in enumerate(all_tasks):
        ax = axes[0, ti]
        for vi, variant in enumerate(scale.methods):
            pts = [r for r in tv_rows if r[0] == task_name and r[1] == variant]
            if pts:
                ax.plot([r[3] for r in pts], [r[4] for r in pts], "o-", color=f"C{vi}", label=variant, lw=0.8)
                for r in pts:
                    ax.annotate(r[2], (r[3], r[4]), fontsize=6)
        ax.set_title(task_name, fontsize=9)
        ax.set_xlabel("measured backward TV(π_T, β), run mean")
    axes[0, 0].set_ylabel("normalised final score (seed mean)")
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "score_vs_tv.png", dpi=110)
    plt.close(fig)

    # learning curves
    with open(out_dir / "curves.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["task", "variant", "lag", "iteration", "env_steps", "mean_return", "ci_low", "ci_high"])
        for task_name in all_tasks:
            fig, axes = plt.subplots(1, len(lags), figsize=(4.2 * len(lags), 3.4), squeeze=False)
            for variant in list(scale.methods) + list(scale.ablations):
                d = results.get((task_name, variant))
                if d is None:
                    continue
                at = d.sel(delta=headline_delta(variant, d))
                steps = (np.arange(d["episode_return"].shape[-1]) + 1) * int(d.attrs["batch_size"])
                for ax, lag in zip(axes[0], at.coords["lag"]):
                    curve = at.sel(lag=lag)
                    mean, low, high = seed_interval(curve["episode_return"], axis=curve.axis("seed"))
                    for i in range(len(mean)):
                        w.writerow([task_name, variant, lag, i, int(steps[i]), f"{mean[i]:.3f}",
                                    f"{low[i]:.3f}", f"{high[i]:.3f}"])
                    style = "--" if variant in ABLATIONS else "-"
                    ax.plot(steps, mean, style, label=variant, lw=1.2)
                    ax.fill_between(steps, low, high, alpha=0.15)
                    ax.set_title(f"{task_name}, lag {lag_name(lag)}")
                    ax.set_xlabel("env steps")
            axes[0, 0].set_ylabel("episode return")
            axes[0, -1].legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(out_dir / f"curves_{task_name.replace('/', '_')}.png", dpi=110)
            plt.close(fig)

    # rliable aggregates and P(VACO variant > baseline) of the main methods, per lag
    agg, improvement = {}, {}
    if len(tasks) >= MIN_AGGREGATE_TASKS:
        agg, improvement = _lag_comparison(scale, scores, "headline", tasks, reps)
        agg_rows = _aggregate_rows(agg)
        with open(out_dir / "aggregates.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["lag", "method", "metric", "point", "ci_low", "ci_high"])
            w.writerows(agg_rows)

        with open(out_dir / "probability_of_improvement.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["lag", "vaco_variant", "baseline", "probability", "ci_low", "ci_high"])
            for lag, table in improvement.items():
                for (vaco, base), (p, lo, hi) in table.items():
                    w.writerow([lag_name(lag), vaco, base, f"{p:.4f}", f"{lo:.4f}", f"{hi:.4f}"])
        fig, axes = plt.subplots(len(lags), 4, figsize=(13, 1.2 + 0.45 * len(scale.methods) * len(lags)),
                                 squeeze=False)
        for li, lag in enumerate(scale.study_lags):
            for mi, metric in enumerate(AGGREGATE_METRICS):
                ax = axes[li, mi]
                for yi, variant in enumerate(scale.methods):
                    if variant not in agg[lag]:
                        continue
                    p, lo, hi = agg[lag][variant][metric]
                    ax.plot([lo, hi], [yi, yi], lw=6, alpha=0.5, color=f"C{yi}")
                    ax.plot([p], [yi], "k|", ms=12)
                ax.set_yticks(range(len(scale.methods)))
                ax.set_yticklabels(scale.methods if mi == 0 else [])
                ax.set_title(f"{metric} (lag {lag_name(lag)})", fontsize=9)
        fig.suptitle("normalised final score, 95% stratified-bootstrap CIs over seeds")
        fig.tight_layout()
        fig.savefig(out_dir / "aggregates.png", dpi=110)
        plt.close(fig)

    # δ sweep and ablation (tasks with ablations)
    delta_rows, ablation_rows = [], []
    delta_agg, ablation_agg = {}, {}
    if ablation_aggregates and len(scale.deltas) > 1:
        vaco_variants = [v for v in VACO_VARIANTS if v in scale.methods]
        for variant in vaco_variants:
            for lag in scale.study_lags:
                sd = {}
                for delta in scale.deltas:
                    mat = _matrix(scores.get((variant, lag, float(delta)), {}), ablation_tasks)
                    if mat is not None:
                        sd[str(delta)] = mat
                delta_agg[variant, lag] = aggregate_intervals(sd, reps=reps)
                for delta, mets in delta_agg[variant, lag].items():
                    p, lo, hi = mets["iqm"]
                    delta_rows.append([variant, lag_name(lag), delta, f"{p:.4f}", f"{lo:.4f}", f"{hi:.4f}",
                                       f"{mets['mean'][0]:.4f}"])
        with open(out_dir / "delta_sweep.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["variant", "lag", "delta", "iqm", "iqm_ci_low", "iqm_ci_high", "mean"])
            w.writerows(delta_rows)
        fig, axes = plt.subplots(1, len(vaco_variants), figsize=(5 * len(vaco_variants), 3.4), squeeze=False)
        for ax, variant in zip(axes[0], vaco_variants):
            for li, lag in enumerate(scale.study_lags):
                sweep = delta_agg[variant, lag]
                xs = [float(k) for k in sweep]
                ys = [v["iqm"][0] for v in sweep.values()]
                lo = [v["iqm"][1] for v in sweep.values()]
                hi = [v["iqm"][2] for v in sweep.values()]
                ax.errorbar(np.array(xs) * (1 + 0.03 * li), ys, yerr=[np.subtract(ys, lo), np.subtract(hi, ys)],
                            marker="o", capsize=3, label=f"lag {lag_name(lag)}")
            ax.set_xscale("log")
            ax.set_xlabel(f"δ ({'mean |r − 1|' if variant == 'vaco_l1' else 'TV = ½·mean |r − 1|'})")
            ax.set_ylabel("IQM normalised score")
            ax.set_title(f"{variant} δ sweep ({', '.join(ablation_tasks)})", fontsize=8)
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "delta_sweep.png", dpi=110)
        plt.close(fig)
    if ablation_aggregates and scale.ablations:
        for lag in scale.study_lags:
            sd = {}
            for variant in ("vaco",) + tuple(scale.ablations) + tuple(m for m in scale.methods if m != "vaco"):
                mat = _matrix(scores.get((variant, lag, "headline"), {}), ablation_tasks)
                if mat is not None:
                    sd[variant] = mat
            ablation_agg[lag] = aggregate_intervals(sd, reps=reps)
            for variant, mets in ablation_agg[lag].items():
                p, lo, hi = mets["iqm"]
                ablation_rows.append([lag_name(lag), variant, f"{p:.4f}", f"{lo:.4f}", f"{hi:.4f}", f"{mets['mean'][0]:.4f}"])
        with open(out_dir / "ablation.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["lag", "variant", "iqm", "iqm_ci_low", "iqm_ci_high", "mean"])
            w.writerows(ablation_rows)

    # measured lag metrics per task × main variant × lag (the drift each verdict rests on)
    metric_keys = (("version_gap", "lag__version_gap_mean"), ("backward_tv", "lag__tv"),
                   ("forward_tv_median", "lag__forward_tv"), ("ess", "lag__ess"),
                   ("filter_on", "loss__filter_on"), ("mask_fraction", "loss__mask_fraction"),
                   ("clip_fraction", "loss__clip_fraction"))
    lag_rows = []
    for (task_name, variant), d in sorted(results.items()):
        if variant not in scale.methods:
            continue
        at = d.sel(delta=headline_delta(variant, d))
        for lag in at.coords["lag"]:
            row = {"task": task_name, "variant": variant, "lag": lag_name(lag)}
            for name, key in metric_keys:
                if key not in d:
                    row[name] = ""
                    continue
                cell = np.asarray(at.sel(lag=lag)[key], np.float64)
                # ½·mean|r − 1| is unbounded when a ratio explodes: its median over iterations
                value = np.nanmedian(cell) if name == "forward_tv_median" else np.nanmean(cell)
                row[name] = f"{value:.4f}"
            lag_rows.append(row)
    write_csv(out_dir / "lag_metrics.csv", lag_rows)

    # equal tuning: on the tasks with the δ sweep every variant is read at its best swept value
    # at the first lag (VACO's δ, as ppo_kl_fixed's β), then run under lag; the pick is made on
    # the seeds it is scored on (biased towards the tuned arm: experiments/verdicts.py picks on
    # half the seeds and scores on the other half)
    tuned_agg, tuned_improvement = {}, {}
    if ablation_aggregates and len(scale.deltas) > 1:
        tuned_agg, tuned_improvement = _lag_comparison(scale, scores, "tuned", ablation_tasks, reps)
        tuned_rows = _aggregate_rows(tuned_agg)
        with open(out_dir / "equal_tuning.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["lag", "method", "metric", "point", "ci_low", "ci_high"])
            w.writerows(tuned_rows)
            for lag, table in tuned_improvement.items():
                for (vaco, base), (p, lo, hi) in table.items():
                    w.writerow([lag_name(lag), f"P({vaco} > {base})", "probability_of_improvement",
                                f"{p:.4f}", f"{lo:.4f}", f"{hi:.4f}"])

    summary = summarize(scale, results, scores, agg, delta_agg, ablation_agg, improvement, header,
                        lag_rows=lag_rows, equal_tuning=(ablation_tasks, tuned_agg, tuned_improvement),
                        learning=(learning, tasks), per_task=per_task)
    (out_dir / "summary.md").write_text(summary)
    return summary


def per_task_rows(scores: dict, tasks) -> list[dict]:
    """Per (variant, swept value or ``"headline"``, lag, task): the seed mean of the normalised
    score with its 95% Student-t interval. The ``"tuned"`` reading is left out: its value was
    picked on the seeds it would be scored on."""
    rows = []
    for (variant, lag, value), per in scores.items():
        if value == "tuned":
            continue
        for task in tasks:
            if task in per:
                mean, low, high = (float(x) for x in seed_interval(per[task]))
                rows.append({"task": task, "variant": variant, "value": value, "lag": lag_name(lag),
                             "seeds": len(per[task]), "mean": f"{mean:.4f}", "ci_low": f"{low:.4f}",
                             "ci_high": f"{high:.4f}"})
    return rows


def _fmt(t):
    return f"{t[0]:.3f} [{t[1]:.3f}, {t[2]:.3f}]"


def summarize(scale, results, scores, agg, delta_agg, ablation_agg, improvement, header,
              lag_rows=(), equal_tuning=((), {}, {}), learning=({}, ()), per_task=()) -> str:
    lines = ["# VACO lag sweep — summary", "",
             "```", json.dumps(header, indent=1), "```", "",
             "Normalised final score (0 = R_init, the first learner evaluation, 1 = the best run on the "
             f"task). rliable aggregates (stratified-bootstrap CIs over seeds) only over ≥ {MIN_AGGREGATE_TASKS} "
             "tasks; otherwise per-task seed means with 95% Student-t intervals. The claims are decided "
             "in results/VERDICTS.md (experiments/verdicts.py).", ""]
    lines += ["## Per-task final return (seed mean ± half-width of 95% CI)", "",
              "| task | variant | " + " | ".join(f"lag {lag_name(lag)}" for lag in scale.study_lags) + " |",
              "|---|---|" + "---|" * len(scale.study_lags)]
    for (task_name, variant), d in sorted(results.items()):
        at = d.sel(delta=headline_delta(variant, d))
        cells = []
        for fin in (at.sel(lag=lag)["final"] for lag in at.coords["lag"]):  # [seed] per lag
            ok = np.isfinite(fin)
            m, lo, hi = seed_interval(fin[ok]) if ok.any() else (np.nan,) * 3
            diverged = f" ({int((~ok).sum())} diverged)" if not ok.all() else ""
            cells.append(f"{float(m):.1f} ± {float(hi - lo) / 2:.1f}{diverged}")
        lines.append(f"| {task_name} | {variant} | " + " | ".join(cells) + " |")
    tuned = [f"{v} on {t}: {headline_delta(v, d):g}"
             for (t, v), d in sorted(results.items()) if v in SWEPT_BASELINES]
    if tuned:
        lines += ["", f"Baselines with their own grid are reported at their best value at lag {scale.lags[0]}: "
                  + ", ".join(tuned) + "."]
    checks, agg_tasks = learning
    lines += ["", "## Does each task learn within its budget?", "",
              "Best main variant at the first lag; gain = final − initial learner score (last vs first 10% of "
              "evaluations), seed mean and 95% interval. Only tasks that learn enter the aggregates.", "",
              "| task | best variant | initial | final | gain | learns |", "|---|---|---|---|---|---|"]
    for t, c in checks.items():
        lines.append(f"| {t} | {c['variant']} | {c['initial']:.1f} | {c['final']:.1f} | "
                     f"{c['gain']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}] | {'yes' if c['learns'] else 'no'} |")
    if checks and not any(c["learns"] for c in checks.values()):
        lines += ["", "**No task shows learning: the tables below are over all tasks and uninformative.**"]
    if agg:
        lines += ["", f"## Aggregates over {', '.join(agg_tasks) or 'all tasks'} (main methods)", "",
                  "| lag | method | " + " | ".join(AGGREGATE_METRICS) + " |", "|---|---|" + "---|" * 4]
        for lag in scale.study_lags:
            for variant, mets in agg[lag].items():
                lines.append(f"| {lag_name(lag)} | {variant} | "
                             + " | ".join(_fmt(mets[m]) for m in AGGREGATE_METRICS) + " |")
        lines += ["", "## Probability of improvement (VACO variant over each baseline)", "",
                  "P(X > Y): the chance a run of X beats a run of Y on a task drawn at random (ties count ½), "
                  "with its 95% stratified-bootstrap CI; a CI entirely above 0.5 says X is better.", "",
                  "| lag | pair | P(X > Y) |", "|---|---|---|"]
        for lag, table in improvement.items():
            for (vaco, base), interval in table.items():
                lines.append(f"| {lag_name(lag)} | {vaco} > {base} | {_fmt(interval)} |")
    else:
        headline = {(r["task"], r["variant"], r["lag"]): r for r in per_task if r["value"] == "headline"}
        lines += ["", f"## Per-task normalised scores ({len(agg_tasks)} learning task(s): fewer than "
                  f"{MIN_AGGREGATE_TASKS}, so no aggregates; `per_task.csv` has every swept value)", "",
                  "Seed mean and 95% Student-t interval, main methods at their reported value.", "",
                  "| task | method | " + " | ".join(f"lag {lag_name(lag)}" for lag in scale.study_lags) + " |",
                  "|---|---|" + "---|" * len(scale.study_lags)]
        for task in agg_tasks:
            for variant in scale.methods:
                cells = [headline.get((task, variant, lag_name(lag))) for lag in scale.study_lags]
                if any(cells):
                    lines.append(f"| {task} | {variant} | " + " | ".join(
                        f"{c['mean']} [{c['ci_low']}, {c['ci_high']}]" if c else "–" for c in cells) + " |")

    lines += ["", "## Measured lag metrics (main variants at their reported value)", "",
              "Run means over iterations, seed means; forward TV is the median over iterations "
              "(½·mean|r − 1| is unbounded when a ratio explodes).", "",
              "| task | variant | lag | version gap | backward TV | forward TV | ESS | filter on | masked | clipped |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in lag_rows:
        lines.append(f"| {r['task']} | {r['variant']} | {r['lag']} | " + " | ".join(
            r[k] or "–" for k in ("version_gap", "backward_tv", "forward_tv_median", "ess", "filter_on",
                                  "mask_fraction", "clip_fraction")) + " |")

    tuned_tasks, tuned_agg, tuned_improvement = equal_tuning
    if tuned_agg:
        lines += ["", f"## Equal tuning ({', '.join(tuned_tasks)}): every swept value picked at lag "
                  f"{scale.lags[0]}", "",
                  "VACO variants at their best δ at the first lag, as ppo_kl_fixed at its best β; the "
                  "others have no swept value.", "",
                  "| lag | method | IQM | P(VACO variant > method) |", "|---|---|---|---|"]
        for lag in scale.study_lags:
            for variant, mets in tuned_agg[lag].items():
                poi = "; ".join(f"{v}: {_fmt(tuned_improvement[lag][(v, b)])}"
                                for (v, b) in tuned_improvement[lag] if b == variant)
                lines.append(f"| {lag_name(lag)} | {variant} | {_fmt(mets['iqm'])} | {poi or '–'} |")

    lines += ["", "## Verdicts", "", "Decided in results/VERDICTS.md by experiments/verdicts.py from the "
              "declared claims (experiments/claims/vaco.toml) and these runs."]
    if delta_agg or ablation_agg:
        lines += ["", "## δ sweep and ablations (IQM)", ""]
    for (variant, lag), sd in delta_agg.items():
        vals = {k: v["iqm"][0] for k, v in sd.items()}
        lines.append(f"- {variant} δ sweep at lag {lag_name(lag)}: IQM " + ", ".join(f"δ={k}: {v:.3f}" for k, v in vals.items())
                     + f" (spread {max(vals.values()) - min(vals.values()):.3f}).")
    for lag, sd in ablation_agg.items():
        lines.append(f"- ablation at lag {lag_name(lag)} (IQM): " + ", ".join(f"{k} {_fmt(v['iqm'])}" for k, v in sd.items()))
    lines.append("")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_preset_arguments(parser, SCALES, default="ci")
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
    summary = write_outputs(scale, results, args.out, header, args.bootstrap_reps)
    print(summary)
    return results


if __name__ == "__main__":
    main()
