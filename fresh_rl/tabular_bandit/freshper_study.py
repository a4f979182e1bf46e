"""The stages and tables of FreshPER's τ sweep on the exact bed (``experiments/freshper_bandit.py``).

Three stages, each one vmapped program of :func:`fresh_rl.tabular_bandit.train` over a
``fresh_rl.sweep.product_grid`` run by :func:`fresh_rl.sweep.run_stage` in saved chunks: the
on-policy *drift pilot* (exact ESS/n and KL of every stored behaviour policy by age), *tuning*
(every arm of :mod:`fresh_rl.studies.freshper_tau_sweep` × the learning-rate grid) and *scoring* (every arm
at its pick on the next seeds). Replay updates use an Adam state of their own.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import numpy as np

from fresh_rl.lag import fit_ess_time_constant
from fresh_rl.presets import Preset
from fresh_rl.studies import freshper_tau_sweep
from fresh_rl.report import histogram_mean
from fresh_rl.results import NamedArrays
from fresh_rl.sweep import product_grid, run_stage
from fresh_rl.tabular_bandit.bed import BedConfig, method_hparams, stack_hparams, train

LEARNING_PHASE_REWARD = 0.9  # τ_ESS uses the snapshots where on-policy J < 0.9 (our choice)
PILOT_KEEP = ("expected_reward", "ess_by_age", "ess_step_by_age", "kl_by_age")
RUN_KEEP = ("expected_reward", "extra_update_cosine", "sampled_age_counts", "num_updates", "adam_count")


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    """One scale: the bed, the learning-rate grid, tuning and scoring seeds, the τ grid."""

    bed: BedConfig
    learning_rates: tuple[float, ...]
    tuning_seeds: int
    scoring_seeds: int
    taus: tuple[float, ...]


def _hparams(method: str, tau: float, learning_rate: float) -> dict:
    # freshper_authors' τ factor is 1: its tau_fit argument is τ itself (fresh_rl.replay.methods)
    return method_hparams(method, learning_rate, tau, replay_optimizer="separate")


def _train_kept(bed, keep, key, hp):
    out = train(bed, key, hp)
    return {k: out[k] for k in keep}


def _run_grid(bed, keep, grid, rows, directory: Path, fingerprint: str, chunk: int):
    """``train`` over the grid rows as one resumable stage (:func:`fresh_rl.sweep.run_stage`)."""
    return run_stage(functools.partial(_train_kept, bed, keep), grid.keys, stack_hparams(rows),
                     directory=directory, fingerprint=fingerprint, chunk_size=chunk)


def drift_pilot(scale: Scale, out_dir: Path, seed: int) -> dict:
    """On-policy runs per learning rate on the tuning seeds → exact trajectory and per-step
    ESS/n and KL by age, averaged over seeds and the learning-phase snapshots (seed-mean
    on-policy J below ``LEARNING_PHASE_REWARD``; all snapshots if none is), and their τ fits."""
    bed, lrs, n = scale.bed, scale.learning_rates, scale.tuning_seeds
    grid = product_grid(n, seed, learning_rate=lrs)
    rows = [_hparams("onpolicy", math.inf, r["learning_rate"]) for r in grid.rows]
    out, seconds = _run_grid(bed, PILOT_KEEP, grid, rows, out_dir / "runs" / "pilot",
                             f"pilot {bed!r} seeds={n}@{seed} lrs={lrs}", n * len(lrs))
    runs = NamedArrays.from_grid(out, {"learning_rate": lrs, "seed": range(seed, seed + n)})
    ages = np.arange(bed.buffer_iterations)
    drift = {}
    for lr in lrs:
        at_lr = runs.sel(learning_rate=lr)  # [seed, iteration] and [seed, snapshot, age]
        snapshot_j = at_lr["expected_reward"][..., bed.log_every - 1::bed.log_every].mean(at_lr.axis("seed"))
        learning = snapshot_j < LEARNING_PHASE_REWARD
        learning = learning if learning.any() else np.ones_like(learning)
        curves = {name: freshper_tau_sweep.mean_by_age(at_lr[f"{key}_by_age"][:, learning])
                  for name, key in (("ess_trajectory", "ess"), ("ess_step", "ess_step"), ("kl", "kl"))}
        drift[lr] = {**curves, "tau_trajectory": fit_ess_time_constant(ages, curves["ess_trajectory"]),
                     "tau_step": fit_ess_time_constant(ages, curves["ess_step"]),
                     "learning_snapshots": int(learning.sum()), "snapshots": int(learning.size)}
    return {"by_lr": drift, "seconds": seconds}


def tune(scale: Scale, out_dir: Path, seed: int, log=print) -> dict:
    """Every arm × learning rate on the tuning seeds: ``tuned``, the seed-mean J over the run
    (``mean_expected_reward``, dims ``arm``, ``learning_rate``), the picked rate per arm and the
    stage's wall time."""
    bed, lrs, n, named = scale.bed, scale.learning_rates, scale.tuning_seeds, freshper_tau_sweep.arms(scale.taus)
    grid = product_grid(n, seed, arm=list(named), learning_rate=lrs)
    rows = [_hparams(*named[r["arm"]], r["learning_rate"]) for r in grid.rows]
    log(f"tuning: {grid.size} runs ({len(named)} arms x {len(lrs)} lrs x {n} seeds)")
    out, seconds = _run_grid(bed, RUN_KEEP, grid, rows, out_dir / "runs" / "tuning",
                             f"tuning {bed!r} seeds={n}@{seed} lrs={lrs} arms={named}", n * len(lrs))
    tuned = NamedArrays.from_grid({"mean_expected_reward": out["expected_reward"].mean(-1)},
                                  {"arm": list(named), "learning_rate": lrs, "seed": range(seed, seed + n)}).mean("seed")
    return {"tuned": tuned, "picked": freshper_tau_sweep.picked_rates(tuned, "mean_expected_reward"), "seconds": seconds}


def score(scale: Scale, picked: dict, out_dir: Path, seed: int, log=print):
    """Every arm at its tuned learning rate on the scoring seeds (disjoint from the tuning ones):
    the grid, the runs' outputs (dims ``arm``, ``seed``) and the stage's wall time."""
    bed, n, named, first_seed = scale.bed, scale.scoring_seeds, freshper_tau_sweep.arms(scale.taus), seed + scale.tuning_seeds
    grid = product_grid(n, first_seed, arm=list(named))
    rows = [_hparams(*named[r["arm"]], picked[r["arm"]]) for r in grid.rows]
    log(f"scoring: {grid.size} runs ({len(named)} arms x {n} seeds) at the tuned rates {picked}")
    out, seconds = _run_grid(bed, RUN_KEEP, grid, rows, out_dir / "runs" / "scoring",
                             f"scoring {bed!r} seeds={n}@{first_seed} picked={picked}", n)
    return grid, NamedArrays.from_grid(out, {"arm": list(named), "seed": range(first_seed, first_seed + n)}), seconds


def tables(scale: Scale, pilot: dict, tuning: dict, grid, out: NamedArrays) -> tuple[dict[str, list[dict]], dict]:
    """The study's CSV tables (name → rows) and the score table of every arm (arm → row; the
    ``score_vs_tau.csv`` rows are the arms on the τ axis) from the scoring ``grid`` and its
    outputs ``out`` (:func:`score`)."""
    named, picked = freshper_tau_sweep.arms(scale.taus), tuning["picked"]
    runs = []
    for r in grid.rows:
        run = out.sel(arm=r["arm"], seed=r["seed"])
        runs.append({"arm": r["arm"], "method": named[r["arm"]][0], "tau": named[r["arm"]][1],
                     "learning_rate": picked[r["arm"]], "seed": r["seed"],
                     "final_expected_reward": float(run["expected_reward"][-1]),
                     "mean_expected_reward": float(run["expected_reward"].mean()),
                     "mean_sampled_age": histogram_mean(run["sampled_age_counts"]),
                     "extra_update_cosine": float(run["extra_update_cosine"].mean()),
                     "num_updates": int(run["num_updates"]), "adam_count": int(run["adam_count"])})
    table = freshper_tau_sweep.score_rows(
        named, picked, runs, ("mean_expected_reward", "final_expected_reward"),
        {arm: float(np.mean([r["mean_sampled_age"] for r in runs if r["arm"] == arm])) for arm in named},
        scale.bed.buffer_iterations)
    return {"runs": runs,
            "tuning": freshper_tau_sweep.tuning_rows(named, tuning["tuned"], picked, scale.tuning_seeds,
                                                     "mean_expected_reward"),
            "ess_vs_age": freshper_tau_sweep.ess_rows(pilot["by_lr"]),
            "sampled_age": freshper_tau_sweep.sampled_age_rows(named, picked, out.sum("seed")),
            "score_vs_tau": [table[a] for a in freshper_tau_sweep.tau_arms(named)]}, table


def reading_lines(scale: Scale, table: dict, picked: dict) -> list[str]:
    """The shape of score against τ, the matched-updates control and the tuning edge, as bullet
    lines computed from the scoring table (seed means; the verdicts test them)."""
    on_axis = freshper_tau_sweep.tau_arms(freshper_tau_sweep.arms(scale.taus))
    means = [table[a]["mean"] for a in on_axis]  # τ ascending, then ∞
    shape = (f"falls monotonically with τ, from {means[0]:.4f} at τ = {scale.taus[0]:g} to {means[-1]:.4f} at "
             "τ = ∞ (PER)" if all(x >= y for x, y in zip(means, means[1:])) else
             f"is highest at `{on_axis[int(np.argmax(means))]}` ({max(means):.4f}); PER (τ = ∞) {means[-1]:.4f}")
    epochs = table["onpolicy_epochs"]["mean"]
    above = [a for a in on_axis if table[a]["mean"] >= epochs]
    lines = [f"- Seed-mean J over the run {shape}; mean sampled age {table[on_axis[0]]['sampled_age']:.1f} versions "
             f"at the smallest τ against {table['per_authors']['sampled_age']:.1f} for PER.",
             f"- The matched-updates control (1 + K epochs on the fresh batch) scores {epochs:.4f}: " + (
                 f"at or below {', '.join(above)}." if above else "above every replay arm" + (
                     ", so on this bed the decay helps by bringing the replayed data closer to the fresh batch, and "
                     "fresh data does better still." if max(means[:-1]) > means[-1] else "."))]
    edge = sorted({lr for lr in picked.values() if lr == max(scale.learning_rates)})
    if edge:
        lines.append(f"- {sum(lr == edge[0] for lr in picked.values())} of {len(picked)} arms picked the grid's "
                     f"largest learning rate, {edge[0]}; the grid was declared before the runs, so no larger rate "
                     "was tried.")
    return lines


__all__ = ["LEARNING_PHASE_REWARD", "PILOT_KEEP", "RUN_KEEP", "Scale", "drift_pilot", "reading_lines", "score", "tables", "tune"]
