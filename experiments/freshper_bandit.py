"""FreshPER as its authors run it, on an exact stale-buffer test bed, with τ in absolute versions.

The bed (:mod:`fresh_rl.tabular_bandit`) is a tabular softmax policy over 4-token sequences of
8 actions with a graded sparse reward, so expected reward J, KL(β‖π) and ESS/n of every stored
behaviour policy are exact. Three stages, each one vmapped program over a
``fresh_rl.sweep.product_grid`` run by ``fresh_rl.sweep.run_stage`` in chunks saved as they
finish (a rerun skips the saved chunks; ``--fresh`` recomputes):

1. *drift pilot* (tuning seeds): on-policy runs at every learning rate; the exact ESS/n of the
   behaviour policy of age a against the learner, of whole-sequence (trajectory) weights and of
   per-step weights, averaged over seeds and learning-phase snapshots, each fitted by
   ``exp(−a/τ)``: two τ_ESS per learning rate, reported beside the τ grid;
2. *tuning* (seeds 0 … n_tune − 1): every arm × the same learning-rate grid; each arm keeps the
   rate with the best mean J over the run (every arm gets a grid of the same size);
3. *scoring* (the next n_score seeds): every arm at its tuned rate.

Arms: on-policy (1 update per batch), on-policy with 1 + K epochs (matched updates), uniform
replay, the authors' PER (``per_authors``: new items at max priority, sampled items refreshed;
τ = ∞) and FreshPER as its authors run it (``freshper_authors``: that pipeline plus the decay
p·exp(−age/τ)) at every τ of the grid, in versions. Replay updates use an Adam state of their
own (``replay_optimizer="separate"``), so the data replayed is not confounded with the momentum
of the fresh updates. The buffer spans ≥ 10 × the largest finite τ and the runs fill it.

Outputs (``results/freshper_bandit/``): ``runs.csv`` (one row per scoring run), ``tuning.csv``
(mean over tuning seeds per arm and learning rate, the picked one marked), ``ess_vs_age.csv`` and
``ess_vs_age.png`` (exact trajectory and per-step ESS/n and KL against age, with the fits),
``sampled_age.csv``, ``score_vs_tau.{csv,png}``, ``config.json`` and ``README.md`` (the claims,
experiments/claims/freshper_bandit.toml, are decided by experiments/verdicts.py into
results/VERDICTS.md).

    python experiments/freshper_bandit.py --scale ci    # seconds of running, the tests
    python experiments/freshper_bandit.py --scale cpu   # the committed results
    python experiments/freshper_bandit.py --scale paper # 10 + 30 seeds, longer runs (accelerator)
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
import warnings
from pathlib import Path

import numpy as np

from fresh_rl.lag import fit_ess_time_constant
from fresh_rl.presets import Preset, named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_csv
from fresh_rl.report import histogram_mean, interval, plot_score_vs_tau, position_on_grid
from fresh_rl.sweep import output_lock, product_grid, run_stage
from fresh_rl.sweep.study_cli import study_main
from fresh_rl.tabular_bandit import BedConfig, method_hparams, stack_hparams, train

RESULTS = REPOSITORY_ROOT / "results" / "freshper_bandit"
LEARNING_PHASE_REWARD = 0.9  # τ_ESS uses the snapshots where on-policy J < 0.9 (our choice)
CONTROLS = ("onpolicy", "onpolicy_epochs", "uniform", "per_authors")


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    bed: BedConfig
    learning_rates: tuple[float, ...]
    tuning_seeds: int
    scoring_seeds: int
    taus: tuple[float, ...]


SCALES = named({
    "ci": Scale(BedConfig(batch_size=16, num_iterations=40, extra_updates=2, buffer_iterations=32,
                          log_every=10), (0.03, 0.1), 1, 2, (1.0, 3.0)),
    "cpu": Scale(BedConfig(batch_size=32, num_iterations=1200, extra_updates=2,
                           buffer_iterations=1000, log_every=20), (0.001, 0.003, 0.01), 5, 10,
                 (1.0, 3.0, 10.0, 30.0, 100.0)),
    "paper": Scale(BedConfig(batch_size=64, num_iterations=3000, extra_updates=2,
                             buffer_iterations=2000, log_every=50), (0.001, 0.003, 0.01), 10, 30,
                   (1.0, 3.0, 10.0, 30.0, 100.0)),
})
PILOT_KEEP = ("expected_reward", "ess_by_age", "ess_step_by_age", "kl_by_age")
RUN_KEEP = ("expected_reward", "extra_update_cosine", "sampled_age_counts", "num_updates",
            "adam_count")


def arms(scale: Scale) -> dict[str, tuple[str, float]]:
    """Arm name → (registry method, τ in versions; ∞ for the arms without decay)."""
    out = {name: (name, math.inf) for name in CONTROLS}
    out.update({f"freshper_authors_tau{tau:g}": ("freshper_authors", tau) for tau in scale.taus})
    return out


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
    ages = np.arange(bed.buffer_iterations)
    snapshot_j = out["expected_reward"].reshape(len(lrs), n, -1)[
        ..., bed.log_every - 1::bed.log_every].mean(1)  # [lrs, snapshots]
    drift = {}
    for i, lr in enumerate(lrs):
        learning = snapshot_j[i] < LEARNING_PHASE_REWARD
        learning = learning if learning.any() else np.ones_like(learning)
        curves = {}
        for name in ("ess", "ess_step", "kl"):
            x = out[f"{name}_by_age"].reshape(len(lrs), n, -1, bed.buffer_iterations)[i]
            with warnings.catch_warnings():  # an age no learning-phase snapshot reached: NaN
                warnings.simplefilter("ignore", RuntimeWarning)
                curves[name] = np.nanmean(np.where(x >= 0, x, np.nan)[:, learning], axis=(0, 1))
        drift[lr] = {**curves, "tau_trajectory": fit_ess_time_constant(ages, curves["ess"]),
                     "tau_step": fit_ess_time_constant(ages, curves["ess_step"]),
                     "learning_snapshots": int(learning.sum()), "snapshots": int(learning.size)}
    return {"by_lr": drift, "seconds": seconds}


def tune(scale: Scale, out_dir: Path, seed: int, log=print):
    """Every arm × learning rate on the tuning seeds; returns the per-run outputs, the grid and
    the picked rate per arm (best seed-mean J over the run)."""
    bed, lrs, n, named = scale.bed, scale.learning_rates, scale.tuning_seeds, arms(scale)
    grid = product_grid(n, seed, arm=list(named), learning_rate=lrs)
    rows = [_hparams(*named[r["arm"]], r["learning_rate"]) for r in grid.rows]
    log(f"tuning: {grid.size} runs ({len(named)} arms x {len(lrs)} lrs x {n} seeds)")
    out, seconds = _run_grid(bed, RUN_KEEP, grid, rows, out_dir / "runs" / "tuning",
                             f"tuning {bed!r} seeds={n}@{seed} lrs={lrs} arms={named}", n * len(lrs))
    mean_j = out["expected_reward"].mean(-1).reshape(len(named), len(lrs), n).mean(-1)
    picked = {arm: lrs[int(np.argmax(mean_j[a]))] for a, arm in enumerate(named)}
    return {"mean_j": mean_j, "picked": picked, "seconds": seconds}


def score(scale: Scale, picked: dict, out_dir: Path, seed: int, log=print):
    """Every arm at its tuned learning rate on the scoring seeds (disjoint from the tuning ones)."""
    bed, n, named = scale.bed, scale.scoring_seeds, arms(scale)
    grid = product_grid(n, seed + scale.tuning_seeds, arm=list(named))
    rows = [_hparams(*named[r["arm"]], picked[r["arm"]]) for r in grid.rows]
    log(f"scoring: {grid.size} runs ({len(named)} arms x {n} seeds) at the tuned rates {picked}")
    out, seconds = _run_grid(bed, RUN_KEEP, grid, rows, out_dir / "runs" / "scoring",
                             f"scoring {bed!r} seeds={n}@{seed + scale.tuning_seeds} picked={picked}", n)
    return grid, out, seconds


def _reading(scale: Scale, table: dict, tau_arms: list, picked: dict) -> list[str]:
    """The shape of score against τ, the matched-updates control and the tuning edge, as
    bullet lines computed from the scoring table (seed means; the verdicts test them)."""
    means = [table[a]["mean"] for a in tau_arms]  # τ ascending, then ∞
    best = tau_arms[int(np.argmax(means))]
    monotone = all(x >= y for x, y in zip(means, means[1:]))
    shape = (f"falls monotonically with τ, from {means[0]:.4f} at τ = {scale.taus[0]:g} to "
             f"{means[-1]:.4f} at τ = ∞ (PER)" if monotone else
             f"is highest at `{best}` ({max(means):.4f}); PER (τ = ∞) {means[-1]:.4f}")
    lines = [f"- Seed-mean J over the run {shape}; mean sampled age "
             f"{table[tau_arms[0]]['sampled_age']:.1f} versions at the smallest τ against "
             f"{table['per_authors']['sampled_age']:.1f} for PER."]
    epochs = table["onpolicy_epochs"]["mean"]
    above = [a for a in tau_arms if table[a]["mean"] >= epochs]
    decay_helps = max(means[:-1]) > means[-1]
    lines.append(f"- The matched-updates control (1 + K epochs on the fresh batch) scores {epochs:.4f}: "
                 + (f"at or below {', '.join(above)}." if above else "above every replay arm"
                    + (", so on this bed the decay helps by bringing the replayed data closer to the "
                       "fresh batch, and fresh data does better still." if decay_helps else ".")))
    edge = sorted({lr for lr in picked.values() if lr == max(scale.learning_rates)})
    if edge:
        lines.append(f"- {sum(lr == edge[0] for lr in picked.values())} of {len(picked)} arms picked "
                     f"the grid's largest learning rate, {edge[0]}; the grid was declared before the "
                     "runs, so no larger rate was tried.")
    return lines


def write_outputs(scale: Scale, pilot: dict, tuning: dict, grid, out, out_dir: Path, header: dict) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bed, lrs, named, drift = scale.bed, scale.learning_rates, arms(scale), pilot["by_lr"]
    picked, ages, n = tuning["picked"], np.arange(bed.buffer_iterations), scale.scoring_seeds
    runs = []
    for i, r in enumerate(grid.rows):
        method, tau = named[r["arm"]]
        runs.append({"arm": r["arm"], "method": method, "tau": tau, "learning_rate": picked[r["arm"]],
                     "seed": r["seed"], "final_expected_reward": float(out["expected_reward"][i, -1]),
                     "mean_expected_reward": float(out["expected_reward"][i].mean()),
                     "mean_sampled_age": histogram_mean(out["sampled_age_counts"][i]),
                     "extra_update_cosine": float(out["extra_update_cosine"][i].mean()),
                     "num_updates": int(out["num_updates"][i]), "adam_count": int(out["adam_count"][i])})
    write_csv(out_dir / "runs.csv", runs)
    write_csv(out_dir / "tuning.csv", [
        {"arm": arm, "method": named[arm][0], "tau": named[arm][1], "learning_rate": lr,
         "tuning_seeds": scale.tuning_seeds, "mean_expected_reward": float(tuning["mean_j"][a, li]),
         "picked": lr == picked[arm]} for a, arm in enumerate(named) for li, lr in enumerate(lrs)])
    write_csv(out_dir / "ess_vs_age.csv", [
        {"learning_rate": lr, "age": int(a), "ess_fraction": float(d["ess"][a]),
         "ess_step_fraction": float(d["ess_step"][a]), "kl": float(d["kl"][a]),
         "tau_trajectory": d["tau_trajectory"], "tau_step": d["tau_step"]}
        for lr, d in drift.items() for a in ages])
    counts = out["sampled_age_counts"].reshape(len(named), n, -1).sum(1)  # [arms, H]
    write_csv(out_dir / "sampled_age.csv", [
        {"arm": arm, "method": named[arm][0], "learning_rate": picked[arm], "age": int(a),
         "fraction": float(counts[i, a] / max(counts[i].sum(), 1))}
        for i, arm in enumerate(named) if named[arm][0] not in ("onpolicy", "onpolicy_epochs")
        for a in ages])

    by_arm = {arm: [r for r in runs if r["arm"] == arm] for arm in named}
    table = {}
    for arm, rows in by_arm.items():
        m, lo, hi = interval([r["mean_expected_reward"] for r in rows])
        f, flo, fhi = interval([r["final_expected_reward"] for r in rows])
        table[arm] = {"arm": arm, "tau": named[arm][1], "learning_rate": picked[arm], "mean": m,
                      "mean_low": lo, "mean_high": hi, "final": f, "final_low": flo, "final_high": fhi,
                      "sampled_age": float(np.mean([r["mean_sampled_age"] for r in rows]))}
    per_age = table["per_authors"]["sampled_age"]
    tau_arms = [a for a in named if named[a][0] == "freshper_authors"] + ["per_authors"]
    for arm in tau_arms:
        tau = named[arm][1]
        table[arm]["buffer_over_tau"] = bed.buffer_iterations / tau if math.isfinite(tau) else 0.0
        table[arm]["age_gap_vs_per"] = abs(table[arm]["sampled_age"] - per_age) / max(per_age, 1e-12)
    write_csv(out_dir / "score_vs_tau.csv", [table[a] for a in tau_arms])

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for lr, d in drift.items():
        line, = axes[0].plot(ages, d["ess"], label=f"lr {lr}: trajectory (τ {d['tau_trajectory']:.0f})")
        axes[0].plot(ages, d["ess_step"], ":", color=line.get_color(),
                     label=f"lr {lr}: per step (τ {d['tau_step']:.0f})")
        axes[1].plot(ages, d["kl"], color=line.get_color(), label=f"lr {lr}")
    for tau in scale.taus:
        axes[0].axvline(tau, color="grey", lw=0.5)
    axes[0].set(xlabel="age (versions); grey: the τ grid", ylabel="exact ESS/n (on-policy pilot)",
                xscale="symlog", xlim=(0, ages[-1]))
    axes[1].set(xlabel="age (versions)", ylabel="exact KL(β‖π)", yscale="log", xscale="symlog",
                xlim=(0, ages[-1]))
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "ess_vs_age.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6.5, 4))
    plot_score_vs_tau(ax, scale.taus, [table[a] for a in tau_arms],
                      {arm: table[arm]["mean"] for arm in ("onpolicy", "onpolicy_epochs", "uniform")},
                      f"mean exact J over the run ({n} scoring seeds, 95% t)")
    fig.tight_layout()
    fig.savefig(out_dir / "score_vs_tau.png", dpi=110)
    plt.close(fig)

    def row(arm):
        t = table[arm]
        extra = (f" | {t['buffer_over_tau']:.0f} | {100 * t['age_gap_vs_per']:.0f}%"
                 if "buffer_over_tau" in t else " | | ")
        return (f"| {arm} | {t['learning_rate']} | {t['mean']:.4f} [{t['mean_low']:.4f}, "
                f"{t['mean_high']:.4f}] | {t['final']:.4f} [{t['final_low']:.4f}, {t['final_high']:.4f}] "
                f"| {t['sampled_age']:.1f}{extra} |")

    cap, half = bed.batch_size * bed.buffer_iterations, bed.buffer_iterations / 2
    fresh_lrs = [picked[a] for a in named if named[a][0] == "freshper_authors"]
    fresh_lr = max(set(fresh_lrs), key=fresh_lrs.count)
    text = [
        "# FreshPER as its authors run it, on the exact stale-buffer bed",
        "",
        provenance_line(header),
        "The runs were computed by the invocation that finished each stage (pilot "
        f"{pilot['seconds']:.0f} s, tuning {tuning['seconds']:.0f} s, scoring "
        f"{header['scoring_seconds']:.0f} s wall time, compilation included); a rerun restores "
        "its saved chunks.",
        "",
        f"Bed: tabular softmax policy, T = {bed.num_steps} tokens × A = {bed.num_actions} actions, "
        f"reward = matched target prefix / T; B = {bed.batch_size} sequences per iteration (one "
        f"policy version each), 1 + K = {1 + bed.extra_updates} updates per iteration for replay "
        f"and epoch arms, {bed.num_iterations} iterations; buffer of {cap} items = "
        f"{bed.buffer_iterations} versions (full from iteration {bed.buffer_iterations} on), "
        f"PPO-clip ε = {bed.clip_epsilon}, Adam, replay updates with their own Adam state, "
        f"priority source `{bed.priority}`, α = {bed.priority_exponent}, IS β = "
        f"{bed.importance_exponent_default}, floor {bed.min_decayed_priority}. Learning-rate grid "
        f"{list(lrs)} for every arm, picked on tuning seeds {header['seed']}–"
        f"{header['seed'] + scale.tuning_seeds - 1} by mean J over the run and scored on seeds "
        f"{header['seed'] + scale.tuning_seeds}–{header['seed'] + scale.tuning_seeds + n - 1}. "
        "Every J, ESS/n and KL is exact (closed form), not estimated.",
        "",
        "## Drift: how fast stored data goes stale (on-policy pilot, tuning seeds)",
        "",
        "| lr | learning-phase snapshots | τ from trajectory ESS | τ from per-step ESS | "
        "trajectory ESS/n at age 10 | at 100 | per-step ESS/n at 100 | KL at 100 |",
        "|---|---|---|---|---|---|---|---|",
        *[f"| {lr} | {d['learning_snapshots']}/{d['snapshots']} | {d['tau_trajectory']:.1f} | "
          f"{d['tau_step']:.1f} | {d['ess'][min(10, ages[-1])]:.3f} | {d['ess'][min(100, ages[-1])]:.3f} | "
          f"{d['ess_step'][min(100, ages[-1])]:.3f} | {d['kl'][min(100, ages[-1])]:.4f} |"
          for lr, d in drift.items()],
        "",
        "τ: least squares of log ESS/n on age through the origin over ages with ESS/n ≥ 0.05 "
        f"(ESS/n averaged over seeds and the learning-phase snapshots, on-policy J < "
        f"{LEARNING_PHASE_REWARD}; `ess_vs_age.csv`, `ess_vs_age.png`). The sequence weight is the "
        "product of the T per-step weights, so its ESS falls faster. Where the rules for τ fall "
        f"on the grid {list(scale.taus)} + ∞: the authors' README default, 500 versions "
        f"{position_on_grid(500.0, scale.taus)}, and their older heuristic capacity / (2 · batch) = "
        f"{half:g} versions {position_on_grid(half, scale.taus)}; the ESS rule (τ = τ_ESS of the data) "
        "at the learning rate `freshper_authors` was tuned to most often, "
        f"{fresh_lr}: {drift[fresh_lr]['tau_trajectory']:.1f} from trajectory weights "
        f"{position_on_grid(drift[fresh_lr]['tau_trajectory'], scale.taus)}, "
        f"{drift[fresh_lr]['tau_step']:.1f} from per-step weights "
        f"{position_on_grid(drift[fresh_lr]['tau_step'], scale.taus)}.",
        "",
        "## Scores (scoring seeds, each arm at its tuned learning rate; 95% Student-t intervals)",
        "",
        "| arm | tuned lr | mean J over the run | final J | mean sampled age | buffer span / τ "
        "| sampled-age gap to per_authors |",
        "|---|---|---|---|---|---|---|",
        *[row(a) for a in named],
        "",
        "Tuning means per learning rate: `tuning.csv`. Score against τ: `score_vs_tau.png`. The "
        "sampled-age gap is the gate of every FreshPER-vs-PER cell (≥ 20%, "
        "experiments/claims/freshper_bandit.toml).",
        "",
        "## Reading",
        "",
        *_reading(scale, table, tau_arms, picked),
        "",
        "## Verdicts",
        "",
        "Every claim of this bed is decided in [results/VERDICTS.md](../VERDICTS.md#freshper_bandit) "
        "(generated by `python experiments/verdicts.py` from `runs.csv`, `tuning.csv`, "
        "`sampled_age.csv`, `ess_vs_age.csv` and the declaration "
        "experiments/claims/freshper_bandit.toml): one pooled Student-t test per claim over its "
        "τ cells on the seed-paired mean J, the cells Holm-corrected.",
    ]
    (out_dir / "README.md").write_text("\n".join(text) + "\n")
    return "\n".join(text)


def run(scale: Scale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started = time.perf_counter()
    out_dir = Path(out_dir)
    with output_lock(out_dir):
        pilot = drift_pilot(scale, out_dir, seed)
        log("tau per lr (trajectory / per-step ESS): " + ", ".join(
            f"{lr}: {d['tau_trajectory']:.1f} / {d['tau_step']:.1f}" for lr, d in pilot["by_lr"].items()))
        tuning = tune(scale, out_dir, seed, log)
        grid, out, scoring_seconds = score(scale, tuning["picked"], out_dir, seed, log)
        header = provenance(started=started)
        (out_dir / "config.json").write_text(json.dumps(
            {"scale": scale.label, "seed": seed, "bed": dataclasses.asdict(scale.bed),
             "learning_rates": list(scale.learning_rates), "tuning_seeds": scale.tuning_seeds,
             "scoring_seeds": scale.scoring_seeds, "taus": list(scale.taus),
             "arms": {a: [m, t if math.isfinite(t) else "inf"] for a, (m, t) in arms(scale).items()},
             "picked_learning_rates": tuning["picked"],
             "tau_ess": {str(lr): {"trajectory": d["tau_trajectory"], "step": d["tau_step"]}
                         for lr, d in pilot["by_lr"].items()}, **header}, indent=1))
        return write_outputs(scale, pilot, tuning, grid, out, out_dir,
                             {**header, "seed": seed, "scoring_seconds": scoring_seconds})


def main(argv=None):
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
