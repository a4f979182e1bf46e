"""The stages and tables of FreshPER's τ sweep in control (``experiments/freshper_control_tau.py``).

Per task two resumable stages (:func:`fresh_rl.sweep.run_stage`) of
:func:`fresh_rl.control.freshper_study.train_kept` over the arms of :mod:`fresh_rl.studies.freshper_tau_sweep`,
replay updates on an Adam state of their own: *tuning* (every arm × the learning-rate grid on the
tuning seeds; its on-policy rows are the drift pilot) and *scoring* (every arm at its pick on the
next seeds).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from fresh_rl.control.config import TrainConfig
from fresh_rl.control.freshper_study import run_kept
from fresh_rl.control.hyperparams import replay_grid
from fresh_rl.eval import eval_mean_score
from fresh_rl.lag import fit_ess_time_constant
from fresh_rl.presets import Preset
from fresh_rl.studies import freshper_tau_sweep
from fresh_rl.replay.methods import replay_hparams
from fresh_rl.report import histogram_mean
from fresh_rl.results import NamedArrays
from fresh_rl.sweep import product_grid

KEEP = ("eval/return_deterministic", "eval/valid", "drift/ess", "drift/ess_row", "drift/kl", "sampled_age_counts",
        "num_updates")


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    """One scale: a config per task, the learning-rate grid, tuning and scoring seeds, the τ grid."""

    configs: tuple[TrainConfig, ...]
    learning_rates: tuple[float, ...]
    tuning_seeds: int
    scoring_seeds: int
    taus: tuple[float, ...]


def run_arms(config: TrainConfig, scale: Scale, grid, lrs, out_dir: Path, stage: str, chunk: int):
    """:data:`KEEP` of every run of ``grid`` (rows with an ``arm``) at learning rates ``lrs[i]``."""
    named = freshper_tau_sweep.arms(scale.taus)
    rows = [replay_hparams(named[r["arm"]][0], named[r["arm"]][1], "separate") for r in grid.rows]
    return run_kept(config, KEEP, grid, replay_grid(config, rows, {"learning_rate": list(lrs)}),
                    out_dir / "runs" / f"{config.env_name}-{stage}",
                    f"{stage} {config!r} seeds={[r['seed'] for r in grid.rows]} "
                    f"arms={[r['arm'] for r in grid.rows]} lrs={list(lrs)}", chunk, f"{config.env_name} {stage}")


def drift_curves(config: TrainConfig, tuning: NamedArrays) -> dict:
    """Per lr: seed- and snapshot-mean per-step / per-row (trajectory) ESS/n and KL by age of the
    on-policy runs of ``tuning`` (dims ``arm``, ``learning_rate``, ``seed``), and their τ fits. The
    row fit uses ages whose ESS/n ≥ 2/num_envs (our choice: one age holds num_envs rows, so
    1/num_envs is the floor of a fully degenerate weight set)."""
    onpolicy, curves = tuning.sel(arm="onpolicy"), {}
    for lr in onpolicy.coords["learning_rate"]:
        mean = {name: freshper_tau_sweep.mean_by_age(onpolicy.sel(learning_rate=lr)[f"drift/{k}"])
                for name, k in (("ess_step", "ess"), ("ess_trajectory", "ess_row"), ("kl", "kl"))}
        ages = np.arange(mean["ess_step"].size)
        curves[lr] = {**mean, "tau_step": fit_ess_time_constant(ages, mean["ess_step"]),
                      "tau_trajectory": fit_ess_time_constant(ages, mean["ess_trajectory"], 2 / config.num_envs)}
    return curves


def run_task(config: TrainConfig, scale: Scale, out_dir: Path, seed: int) -> dict:
    """Both stages of one task: the tuning means (``tuned``: ``mean_eval_return``, dims ``arm``,
    ``learning_rate``), the picks, the scoring grid and outputs (``out``: dims ``arm``, ``seed``),
    the drift curves and the two stages' wall times."""
    named, lrs, n = freshper_tau_sweep.arms(scale.taus), scale.learning_rates, scale.tuning_seeds
    grid = product_grid(n, seed, arm=list(named), learning_rate=lrs)
    tuning, tuning_seconds = run_arms(config, scale, grid, [r["learning_rate"] for r in grid.rows], out_dir,
                                      "tuning", n * len(lrs))
    coords = {"arm": list(named), "learning_rate": lrs, "seed": range(seed, seed + n)}
    tuned = NamedArrays.from_grid({"mean_eval_return": eval_mean_score(
        tuning["eval/return_deterministic"], tuning["eval/valid"])}, coords).mean("seed")
    picked = freshper_tau_sweep.picked_rates(tuned, "mean_eval_return")
    scoring_grid = product_grid(scale.scoring_seeds, seed + n, arm=list(named))
    scoring, scoring_seconds = run_arms(config, scale, scoring_grid, [picked[r["arm"]] for r in scoring_grid.rows],
                                        out_dir, "scoring", n * len(lrs))
    scoring_seeds = range(seed + n, seed + n + scale.scoring_seeds)
    return {"config": config, "tuned": tuned, "picked": picked, "grid": scoring_grid,
            "out": NamedArrays.from_grid(scoring, {"arm": list(named), "seed": scoring_seeds}),
            "drift": drift_curves(config, NamedArrays.from_grid(tuning, coords)),
            "seconds": (tuning_seconds, scoring_seconds)}


def tables(scale: Scale, results: dict) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """The study's CSV tables (name → rows) and each task's score table (arm → row) from
    :func:`run_task`'s results per task."""
    named, t, scores = freshper_tau_sweep.arms(scale.taus), {}, {}
    for env, res in results.items():
        scoring, picked, cell = res["out"], res["picked"], {"task": env}
        out = scoring.assign(final_return=scoring["eval/return_deterministic"][..., -1],
                             mean_eval_return=eval_mean_score(scoring["eval/return_deterministic"], scoring["eval/valid"]))
        runs = []
        for r in res["grid"].rows:
            run = out.sel(arm=r["arm"], seed=r["seed"])
            runs.append({"task": env, "arm": r["arm"], "method": named[r["arm"]][0], "tau": named[r["arm"]][1],
                         "learning_rate": picked[r["arm"]], "seed": r["seed"], "final_return": float(run["final_return"]),
                         "mean_eval_return": float(run["mean_eval_return"]),
                         "mean_sampled_age": histogram_mean(run["sampled_age_counts"]), "num_updates": int(run["num_updates"])})
        totals = out.sum("seed")
        scores[env] = freshper_tau_sweep.score_rows(
            named, picked, runs, ("mean_eval_return", "final_return"),
            {arm: histogram_mean(totals.sel(arm=arm)["sampled_age_counts"]) for arm in named},
            res["config"].replay.buffer_iterations, cell)
        for name, rows in (("runs", runs), ("tuning", freshper_tau_sweep.tuning_rows(
                named, res["tuned"], picked, scale.tuning_seeds, "mean_eval_return", cell)),
                           ("ess_vs_age", freshper_tau_sweep.ess_rows(res["drift"], cell)),
                           ("sampled_age", freshper_tau_sweep.sampled_age_rows(named, picked, totals, cell)),
                           ("score_vs_tau", list(scores[env].values()))):
            t.setdefault(name, []).extend(rows)
    return t, scores


__all__ = ["KEEP", "Scale", "drift_curves", "run_arms", "run_task", "tables"]
