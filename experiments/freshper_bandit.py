"""FreshPER as its authors run it, on an exact stale-buffer test bed, with τ in absolute versions.

The bed (:mod:`fresh_rl.tabular_bandit`) is a tabular softmax policy over 4-token sequences of 8 actions with a
graded sparse reward, so expected reward J, KL(β‖π) and ESS/n of every stored behaviour policy are exact. Three
stages (:mod:`fresh_rl.tabular_bandit.freshper_study`), each resumable from its saved chunks (``--fresh`` recomputes):

1. *drift pilot* (tuning seeds): on-policy runs at every learning rate; the exact ESS/n of the
   behaviour policy of age a against the learner, of whole-sequence (trajectory) weights and of
   per-step weights, averaged over seeds and learning-phase snapshots, each fitted by
   ``exp(−a/τ)``: two τ_ESS per learning rate, reported beside the τ grid;
2. *tuning* (seeds 0 … n_tune − 1): every arm × the same learning-rate grid; each arm keeps the
   rate with the best mean J over the run (every arm gets a grid of the same size);
3. *scoring* (the next n_score seeds): every arm at its tuned rate.

Arms (:mod:`fresh_rl.studies.freshper_tau_sweep`): on-policy, 1 + K epochs (matched updates), uniform replay, the
authors' PER (``per_authors``: new items at max priority, sampled items refreshed; τ = ∞) and ``freshper_authors``
(that pipeline plus p·exp(−age/τ)) at every τ of the grid, in versions. Replay updates use an Adam state of their
own, so replayed data is not confounded with the fresh updates' momentum. The buffer spans ≥ 10 × the largest τ.

Outputs (``results/freshper_bandit/``): ``runs.csv``, ``tuning.csv``, ``ess_vs_age.{csv,png}``, ``sampled_age.csv``,
``score_vs_tau.{csv,png}``, ``config.json``, ``README.md``; experiments/verdicts.py decides the claims.

    python experiments/freshper_bandit.py --scale ci    # seconds of running, the tests
    python experiments/freshper_bandit.py --scale cpu   # the committed results
    python experiments/freshper_bandit.py --scale paper # 10 + 30 seeds, longer runs (accelerator)
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

from fresh_rl.presets import named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, write_atomic, write_csv
from fresh_rl.studies import freshper_tau_sweep
from fresh_rl.report import markdown_table, plot_score_vs_tau, position_on_grid, save_panels, write_readme
from fresh_rl.sweep import output_lock
from fresh_rl.sweep.study_cli import study_main
from fresh_rl.tabular_bandit import BedConfig
from fresh_rl.tabular_bandit.freshper_study import (LEARNING_PHASE_REWARD, Scale, drift_pilot, reading_lines, score,
                                                    tables, tune)

RESULTS = REPOSITORY_ROOT / "results" / "freshper_bandit"
TAUS = (1.0, 3.0, 10.0, 30.0, 100.0)
SCALES = named({
    "ci": Scale(BedConfig(batch_size=16, num_iterations=40, extra_updates=2, buffer_iterations=32, log_every=10),
                (0.03, 0.1), 1, 2, (1.0, 3.0)),
    "cpu": Scale(BedConfig(batch_size=32, num_iterations=1200, extra_updates=2, buffer_iterations=1000, log_every=20),
                 (0.001, 0.003, 0.01), 5, 10, TAUS),
    "paper": Scale(BedConfig(batch_size=64, num_iterations=3000, extra_updates=2, buffer_iterations=2000,
                             log_every=50), (0.001, 0.003, 0.01), 10, 30, TAUS),
})


def figures(scale: Scale, drift: dict, table: dict, out_dir: Path) -> None:
    """Exact ESS/n and KL against age (the pilot), and score against τ with the controls."""
    def drift_panel(ax, name):
        if name == "ESS/n":
            return freshper_tau_sweep.plot_ess_by_age(ax, drift, scale.taus, "exact ESS/n (on-policy pilot)")
        for lr, d in drift.items():
            ax.plot(d["kl"], label=f"lr {lr}")
        ax.set(xlabel="age (versions)", ylabel="exact KL(β‖π)", yscale="log", xscale="symlog")
    save_panels(out_dir / "ess_vs_age.png", ("ESS/n", "KL"), drift_panel)
    save_panels(out_dir / "score_vs_tau.png", ("exact bed",), lambda ax, _: plot_score_vs_tau(
        ax, scale.taus, [table[a] for a in freshper_tau_sweep.tau_arms(freshper_tau_sweep.arms(scale.taus))],
        {a: table[a]["mean"] for a in freshper_tau_sweep.CONTROLS[:3]},
        f"mean exact J over the run ({scale.scoring_seeds} scoring seeds, 95% t)"), width=6.5)


def readme_lines(scale: Scale, pilot: dict, tuning: dict, table: dict, seconds: float, seed: int) -> list[str]:
    bed, drift, picked, s0 = scale.bed, pilot["by_lr"], tuning["picked"], seed + scale.tuning_seeds
    named, last, half = freshper_tau_sweep.arms(scale.taus), bed.buffer_iterations - 1, bed.buffer_iterations / 2
    fresh_lr = freshper_tau_sweep.usual_rate(picked, named)
    return [
        f"The runs were computed by the invocation that finished each stage (pilot {pilot['seconds']:.0f} s, tuning "
        f"{tuning['seconds']:.0f} s, scoring {seconds:.0f} s wall time, compilation included); a rerun restores "
        "its saved chunks.", "",
        f"Bed: tabular softmax policy, T = {bed.num_steps} tokens × A = {bed.num_actions} actions, reward = matched "
        f"target prefix / T; B = {bed.batch_size} sequences per iteration (one policy version each), 1 + K = "
        f"{1 + bed.extra_updates} updates per iteration for replay and epoch arms, {bed.num_iterations} iterations; "
        f"buffer of {bed.batch_size * bed.buffer_iterations} items = {bed.buffer_iterations} versions (full from "
        f"iteration {bed.buffer_iterations} on), PPO-clip ε = {bed.clip_epsilon}, Adam, replay updates with their "
        f"own Adam state, priority source `{bed.priority}`, α = {bed.priority_exponent}, IS β = "
        f"{bed.importance_exponent_default}, floor {bed.min_decayed_priority}. Learning-rate grid "
        f"{list(scale.learning_rates)} for every arm, picked on tuning seeds {seed}–{s0 - 1} by mean J over the "
        f"run and scored on seeds {s0}–{s0 + scale.scoring_seeds - 1}. Every J, ESS/n and KL is exact (closed "
        "form), not estimated.", "",
        "## Drift: how fast stored data goes stale (on-policy pilot, tuning seeds)", "",
        *markdown_table(("lr", "learning-phase snapshots", "τ from trajectory ESS", "τ from per-step ESS",
                         "trajectory ESS/n at age 10", "at 100", "per-step ESS/n at 100", "KL at 100"), (
            (lr, f"{d['learning_snapshots']}/{d['snapshots']}", f"{d['tau_trajectory']:.1f}", f"{d['tau_step']:.1f}",
             f"{d['ess_trajectory'][min(10, last)]:.3f}", f"{d['ess_trajectory'][min(100, last)]:.3f}",
             f"{d['ess_step'][min(100, last)]:.3f}", f"{d['kl'][min(100, last)]:.4f}") for lr, d in drift.items())),
        "",
        "τ: least squares of log ESS/n on age through the origin over ages with ESS/n ≥ 0.05 (ESS/n averaged over "
        f"seeds and the learning-phase snapshots, on-policy J < {LEARNING_PHASE_REWARD}; `ess_vs_age.csv`, "
        "`ess_vs_age.png`). The sequence weight is the product of the T per-step weights, so its ESS falls faster. "
        f"Where the rules for τ fall on the grid {list(scale.taus)} + ∞: the authors' README default, 500 versions "
        f"{position_on_grid(500.0, scale.taus)}, and their older heuristic capacity / (2 · batch) = {half:g} "
        f"versions {position_on_grid(half, scale.taus)}; the ESS rule (τ = τ_ESS of the data) at the learning rate "
        f"`freshper_authors` was tuned to most often, {fresh_lr}: {drift[fresh_lr]['tau_trajectory']:.1f} from "
        f"trajectory weights {position_on_grid(drift[fresh_lr]['tau_trajectory'], scale.taus)}, "
        f"{drift[fresh_lr]['tau_step']:.1f} from per-step weights "
        f"{position_on_grid(drift[fresh_lr]['tau_step'], scale.taus)}.", "",
        "## Scores (scoring seeds, each arm at its tuned learning rate; 95% Student-t intervals)", "",
        *markdown_table(("arm", "tuned lr", "mean J over the run", "final J", "mean sampled age", "buffer span / τ",
                         "sampled-age gap to per_authors"), []),
        *freshper_tau_sweep.score_lines(table, freshper_tau_sweep.tau_arms(named), 4), "",
        "Tuning means per learning rate: `tuning.csv`. Score against τ: `score_vs_tau.png`. The sampled-age gap is "
        "the gate of every FreshPER-vs-PER cell (≥ 20%, experiments/claims/freshper_bandit.toml).", "",
        "## Reading", "", *reading_lines(scale, table, picked), "", "## Verdicts", "",
        "Decided in [results/VERDICTS.md](../VERDICTS.md#freshper_bandit) by `python experiments/verdicts.py` from "
        "these tables and experiments/claims/freshper_bandit.toml: one pooled Student-t test per claim over its τ "
        "cells on the seed-paired mean J, the cells Holm-corrected."]


def run(scale: Scale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started, out_dir = time.perf_counter(), Path(out_dir)
    with output_lock(out_dir):
        pilot = drift_pilot(scale, out_dir, seed)
        log("tau per lr (trajectory / per-step ESS): " + ", ".join(
            f"{lr}: {d['tau_trajectory']:.1f} / {d['tau_step']:.1f}" for lr, d in pilot["by_lr"].items()))
        tuning = tune(scale, out_dir, seed, log)
        grid, out, scoring_seconds = score(scale, tuning["picked"], out_dir, seed, log)
        header = provenance(started=started)
        write_atomic(out_dir / "config.json", json.dumps(
            {"scale": scale.label, "seed": seed, "bed": dataclasses.asdict(scale.bed),
             "learning_rates": list(scale.learning_rates), "tuning_seeds": scale.tuning_seeds,
             "scoring_seeds": scale.scoring_seeds, "taus": list(scale.taus),
             "arms": {a: [m, t if math.isfinite(t) else "inf"]
                      for a, (m, t) in freshper_tau_sweep.arms(scale.taus).items()},
             "picked_learning_rates": tuning["picked"],
             "tau_ess": {str(lr): {"trajectory": d["tau_trajectory"], "step": d["tau_step"]}
                         for lr, d in pilot["by_lr"].items()}, **header}, indent=1))
        t, table = tables(scale, pilot, tuning, grid, out)
        for name, rows in t.items():
            write_csv(out_dir / f"{name}.csv", rows)
        figures(scale, pilot["by_lr"], table, out_dir)
        return write_readme(out_dir, "FreshPER as its authors run it, on the exact stale-buffer bed", header,
                            readme_lines(scale, pilot, tuning, table, scoring_seconds, seed))


def main(argv=None):
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
