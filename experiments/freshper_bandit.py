"""FreshPER on an exact stale-buffer test bed: on-policy vs replay methods where staleness bites.

The bed (:mod:`fresh_rl.tabular_bandit`) is a tabular softmax policy over 4-token sequences of
8 actions with a graded sparse reward, so expected reward, KL(β‖π) and ESS/n of every stored
behaviour policy are exact. Two stages, each one vmapped program over a
``fresh_rl.sweep.product_grid``, run by ``fresh_rl.sweep.run_sharded`` in chunks saved as they
finish (a rerun skips the saved chunks; ``--fresh`` recomputes):

1. *drift pilot*: on-policy runs at every learning rate of the shared grid; the exact ESS/n of
   the behaviour policy of age a against the learner, averaged over seeds and snapshots, is
   fitted by ``exp(−a/τ_fit)`` (one τ_fit per learning rate);
2. *study*: every method of ``fresh_rl.replay.methods.REPLAY_METHODS`` × the same
   learning-rate grid × seeds (FreshPER's τ = {0.3, 1, 3} × τ_fit of that learning rate). No method is tuned
   alone: all share the grid and each is reported at every learning rate and at its best one.

Outputs (``results/freshper_bandit/``): ``runs.csv`` (one row per run), ``final.csv`` (exact final
and mean expected reward per method and learning rate with 95% Student-t intervals over
seeds), ``ess_vs_age.csv`` and ``ess_kl_vs_age.png`` (exact ESS/n and KL against age, fit),
``sampled_age.csv`` and ``sampled_age.png``, ``score_vs_tau.csv`` and ``score_vs_tau.png``,
``final_scores.png``, and ``README.md`` (the claims are decided by experiments/verdicts.py into
results/VERDICTS.md).

    python experiments/freshper_bandit.py --scale ci    # seconds of running, the tests
    python experiments/freshper_bandit.py --scale cpu   # the committed results, 10 seeds
    python experiments/freshper_bandit.py --scale paper # 30 seeds, longer runs (accelerator)
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np

from fresh_rl.eval import seed_interval
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_csv
from fresh_rl.replay.methods import REPLAY_METHODS
from fresh_rl.sweep import RunCheckpointer, output_lock, product_grid, run_sharded
from fresh_rl.sweep.study_cli import study_main
from fresh_rl.lag import fit_ess_time_constant
from fresh_rl.tabular_bandit import BedConfig, method_hparams, stack_hparams, train

# The study's arms, as when its runs were committed (the registry may grow past them).
METHODS = {n: REPLAY_METHODS[n] for n in (
    "onpolicy", "onpolicy_epochs", "uniform", "per_authors", "per_given", "freshper_0.3",
    "freshper_1", "freshper_3", "freshper_1_no_is")}

RESULTS = REPOSITORY_ROOT / "results" / "freshper_bandit"


@dataclasses.dataclass(frozen=True)
class Scale:
    bed: BedConfig
    num_seeds: int
    learning_rates: tuple[float, ...]


SCALES = {
    "ci": Scale(BedConfig(batch_size=16, num_iterations=40, extra_updates=2, buffer_iterations=32,
                          log_every=10), 2, (0.03,)),
    "cpu": Scale(BedConfig(batch_size=32, num_iterations=400, extra_updates=2,
                           buffer_iterations=512, log_every=10), 10, (0.01, 0.03, 0.1, 0.3)),
    "paper": Scale(BedConfig(batch_size=64, num_iterations=2000, extra_updates=2,
                             buffer_iterations=2048, log_every=50), 30,
                   (0.003, 0.01, 0.03, 0.1, 0.3)),
}
KEEP = ("expected_reward", "extra_update_cosine", "ess_by_age", "kl_by_age", "sampled_age_counts",
        "num_updates", "adam_count")
LEARNING_PHASE_REWARD = 0.9  # τ_fit uses the snapshots where on-policy J < 0.9 (our choice)


def _run_grid(bed: BedConfig, grid, rows, directory: Path, fingerprint: str, chunk: int):
    """``train`` over the grid rows, chunk by chunk, every chunk saved under ``directory``."""
    fn = functools.partial(_train_kept, bed)
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:10]  # new settings, new folder
    folder = directory.with_name(f"{directory.name}-{digest}")
    timing = folder.with_name(folder.name + ".seconds")  # wall time of the run that finished it
    started = time.perf_counter()
    out = run_sharded(fn, grid.keys, stack_hparams(rows), chunk_size=chunk,
                      checkpointer=RunCheckpointer(folder, fingerprint=fingerprint))
    if not timing.exists():
        timing.write_text(f"{time.perf_counter() - started:.1f}\n")
    return out, float(timing.read_text())


def _train_kept(bed, key, hp):
    out = train(bed, key, hp)
    return {k: out[k] for k in KEEP}


def drift_pilot(scale: Scale, out_dir: Path, seed: int):
    """On-policy runs per learning rate → exact ESS/KL by age and τ_fit per learning rate.

    The policy stops drifting once it has converged (ESS/n → 1 at every age), so ESS/n is
    averaged over seeds and over the snapshots of the *learning phase* only: those where the
    seed-mean on-policy J is below ``LEARNING_PHASE_REWARD`` (all snapshots if none is)."""
    bed, lrs = scale.bed, scale.learning_rates
    grid = product_grid(scale.num_seeds, seed, learning_rate=lrs)
    rows = [method_hparams("onpolicy", r["learning_rate"]) for r in grid.rows]
    chunk = scale.num_seeds * len(lrs)
    out, seconds = _run_grid(bed, grid, rows, out_dir / "runs" / "pilot",
                             f"pilot {bed!r} seeds={scale.num_seeds}@{seed} lrs={lrs}", chunk)
    reached = np.asarray(out["ess_by_age"]) >= 0  # −1: age not reached at that snapshot
    ess = np.where(reached, out["ess_by_age"], np.nan).reshape(
        len(lrs), scale.num_seeds, -1, bed.buffer_iterations)
    kl = np.where(reached, out["kl_by_age"], np.nan).reshape(ess.shape)
    snapshot_j = np.asarray(out["expected_reward"]).reshape(len(lrs), scale.num_seeds, -1)[
        ..., bed.log_every - 1::bed.log_every].mean(1)  # [lrs, snapshots]
    ages = np.arange(bed.buffer_iterations)
    drift = {}
    for i, lr in enumerate(lrs):
        learning = snapshot_j[i] < LEARNING_PHASE_REWARD
        learning = learning if learning.any() else np.ones_like(learning)
        with np.errstate(all="ignore"):
            ess_mean = np.nanmean(ess[i][:, learning], axis=(0, 1))
            kl_mean = np.nanmean(kl[i][:, learning], axis=(0, 1))
        drift[lr] = {"ess": ess_mean, "kl": kl_mean,
                     "tau_fit": fit_ess_time_constant(ages, ess_mean),
                     "learning_snapshots": int(learning.sum()),
                     "snapshots": int(learning.size), "stage_seconds": seconds}
    return drift


def study(scale: Scale, drift: dict, out_dir: Path, seed: int, log=print):
    bed, lrs = scale.bed, scale.learning_rates
    grid = product_grid(scale.num_seeds, seed, method=list(METHODS), learning_rate=lrs)
    rows = [method_hparams(r["method"], r["learning_rate"], drift[r["learning_rate"]]["tau_fit"])
            for r in grid.rows]
    taus = {lr: drift[lr]["tau_fit"] for lr in lrs}
    log(f"study: {grid.size} runs ({len(METHODS)} methods x {len(lrs)} lrs x {scale.num_seeds} "
        f"seeds), tau_fit={taus}")
    out, seconds = _run_grid(
        bed, grid, rows, out_dir / "runs" / "study",
        f"study {bed!r} seeds={scale.num_seeds}@{seed} lrs={lrs} tau_fit={taus}",
        scale.num_seeds * len(lrs))
    shape = (len(METHODS), len(lrs), scale.num_seeds)
    data = {k: np.asarray(v).reshape(*shape, *np.shape(v)[1:]) for k, v in out.items()}
    return grid, rows, data, seconds


def _interval(values):
    mean, low, high = seed_interval(np.asarray(values))
    return float(mean), float(low), float(high)


def summarize(scale: Scale, drift, grid, rows, data, out_dir: Path, header: dict) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bed, lrs, names = scale.bed, scale.learning_rates, list(METHODS)
    final = data["expected_reward"][..., -1]  # [M, L, S] exact J after the last iteration
    mean_j = data["expected_reward"].mean(-1)
    ages = np.arange(bed.buffer_iterations)

    run_rows = []
    for r, hp in zip(grid.rows, rows):
        m, li, s = names.index(r["method"]), lrs.index(r["learning_rate"]), r["seed"] - grid.rows[0]["seed"]
        counts = data["sampled_age_counts"][m, li, s]
        run_rows.append({"method": r["method"], "learning_rate": r["learning_rate"], "seed": r["seed"],
                         "age_decay_tau": hp["age_decay_tau"],
                         "final_expected_reward": float(final[m, li, s]),
                         "mean_expected_reward": float(mean_j[m, li, s]),
                         "extra_update_cosine": float(data["extra_update_cosine"][m, li, s].mean()),
                         "mean_sampled_age": float((counts * ages).sum() / max(counts.sum(), 1)),
                         "num_updates": int(data["num_updates"][m, li, s]),
                         "adam_count": int(data["adam_count"][m, li, s])})
    write_csv(out_dir / "runs.csv", run_rows)

    table = {}
    for m, name in enumerate(names):
        for li, lr in enumerate(lrs):
            f, fl, fh = _interval(final[m, li])
            a, al, ah = _interval(mean_j[m, li])
            table[name, lr] = {"method": name, "learning_rate": lr, "seeds": scale.num_seeds,
                               "final": f, "final_low": fl, "final_high": fh,
                               "mean": a, "mean_low": al, "mean_high": ah}
    best_lr = {n: max(lrs, key=lambda lr: table[n, lr]["final"]) for n in names}
    for n in names:
        table[n, best_lr[n]]["best_lr_of_method"] = True
    write_csv(out_dir / "final.csv", list(table.values()))

    write_csv(out_dir / "ess_vs_age.csv", [
        {"learning_rate": lr, "age": int(a), "ess_fraction": float(drift[lr]["ess"][a]),
         "kl": float(drift[lr]["kl"][a]), "fit": float(math.exp(-a / drift[lr]["tau_fit"])),
         "tau_fit": drift[lr]["tau_fit"]} for lr in lrs for a in ages])
    sampled = data["sampled_age_counts"].sum(2)  # [M, L, H]
    write_csv(out_dir / "sampled_age.csv", [
        {"method": n, "learning_rate": lr, "age": int(a),
         "fraction": float(sampled[m, li, a] / max(sampled[m, li].sum(), 1))}
        for m, n in enumerate(names) if METHODS[n].extra == "replay"
        for li, lr in enumerate(lrs) for a in ages])
    tau_methods = [n for n in names if n.startswith("freshper_") and METHODS[n].importance] + ["per_given"]
    tau_rows = [{"method": n, "learning_rate": lr, "tau_over_tau_fit": METHODS[n].tau_factor,
                 "final": table[n, lr]["final"], "final_low": table[n, lr]["final_low"],
                 "final_high": table[n, lr]["final_high"]} for n in tau_methods for lr in lrs]
    write_csv(out_dir / "score_vs_tau.csv", tau_rows)

    # Figures.
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / len(lrs)
    for li, lr in enumerate(lrs):
        x = np.arange(len(names)) + li * width
        f = np.array([table[n, lr]["final"] for n in names])
        err = np.array([[f[i] - table[n, lr]["final_low"], table[n, lr]["final_high"] - f[i]]
                        for i, n in enumerate(names)]).T
        ax.bar(x, f, width, yerr=err, label=f"lr {lr}", capsize=2)
    ax.set_xticks(np.arange(len(names)) + 0.4 - width / 2, names, rotation=30, ha="right")
    ax.set_ylabel("exact final expected reward J")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "final_scores.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for lr in lrs:
        line, = axes[0].plot(ages, drift[lr]["ess"], label=f"lr {lr} (τ_fit {drift[lr]['tau_fit']:.1f})")
        axes[0].plot(ages, np.exp(-ages / drift[lr]["tau_fit"]), "--", color=line.get_color())
        axes[1].plot(ages, drift[lr]["kl"], label=f"lr {lr}")
    axes[0].set(xlabel="age (iterations)", ylabel="exact ESS/n (on-policy pilot)")
    axes[1].set(xlabel="age (iterations)", ylabel="exact KL(β‖π)", yscale="log")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out_dir / "ess_kl_vs_age.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(lrs), figsize=(4 * len(lrs), 3.5), squeeze=False)
    for li, lr in enumerate(lrs):
        for m, n in enumerate(names):
            if METHODS[n].extra == "replay":
                frac = sampled[m, li] / max(sampled[m, li].sum(), 1)
                axes[0, li].plot(ages, np.cumsum(frac), label=n)
        axes[0, li].set(title=f"lr {lr}", xlabel="age of replayed item", ylabel="CDF", xscale="symlog")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "sampled_age.png", dpi=110)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    factors = [METHODS[n].tau_factor for n in tau_methods[:-1]]
    for ax, key, label in ((axes[0], "final", "exact final expected reward J"),
                           (axes[1], "mean", "exact J averaged over the run")):
        for lr in lrs:
            line, = ax.plot(factors, [table[n, lr][key] for n in tau_methods[:-1]], "o-",
                            label=f"lr {lr}")
            ax.axhline(table["per_given", lr][key], ls=":", color=line.get_color())
            ax.axhline(table["onpolicy", lr][key], ls="--", color=line.get_color())
        ax.set(xscale="log", xlabel="τ / τ_fit (dotted: PER = τ ∞; dashed: on-policy)",
               ylabel=label)
        ax.set_xticks(factors, [str(f) for f in factors])
        ax.minorticks_off()
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out_dir / "score_vs_tau.png", dpi=110)
    plt.close(fig)

    def row(n, lr):
        t = table[n, lr]
        return (f"| {n} | {lr} | {t['final']:.4f} [{t['final_low']:.4f}, {t['final_high']:.4f}] | "
                f"{t['mean']:.4f} [{t['mean_low']:.4f}, {t['mean_high']:.4f}] |")

    replay_names = [n for n in names if METHODS[n].extra != "none"]
    age_lines = ["| method | " + " | ".join(f"lr {lr}" for lr in lrs) + " |",
                 "|---|" + "---|" * len(lrs)]
    for n in replay_names:
        cells = []
        for li in range(len(lrs)):
            counts = data["sampled_age_counts"][names.index(n), li].sum(0)
            age = (counts * ages).sum() / max(counts.sum(), 1)
            cosine = data["extra_update_cosine"][names.index(n), li].mean()
            cells.append(f"{age:.1f} / {cosine:+.3f}")
        age_lines.append(f"| {n} | " + " | ".join(cells) + " |")
    cap = bed.batch_size * bed.buffer_iterations
    text = [
        "# FreshPER on an exact stale-buffer test bed",
        "",
        provenance_line(header),
        f"The runs were computed by the invocation that finished each stage (pilot "
        f"{header['stage_seconds']['pilot']:.0f} s, study {header['stage_seconds']['study']:.0f} s "
        "wall time, compilation included); a rerun restores its saved chunks.",
        "",
        f"Bed: tabular softmax policy, T = {bed.num_steps} tokens × A = {bed.num_actions} actions, "
        f"reward = matched target prefix / T; B = {bed.batch_size} sequences per iteration, "
        f"1 + K = {1 + bed.extra_updates} updates per iteration for replay and epoch methods, "
        f"{bed.num_iterations} iterations, buffer of {cap} items = {bed.buffer_iterations} "
        f"iterations, PPO-clip ε = {bed.clip_epsilon}, Adam, priority source "
        f"`{bed.priority}`, α = {bed.priority_exponent}, β = {bed.importance_exponent_default}, "
        f"floor {bed.min_decayed_priority}. {scale.num_seeds} seeds per cell; shared lr grid "
        f"{list(lrs)} for every method. Every J, ESS/n and KL below is exact (closed form), "
        "not estimated.",
        "",
        "## Drift: exact ESS/n against age (on-policy pilot)",
        "",
        "| lr | learning-phase snapshots | τ_fit (iterations) | buffer / τ_fit | ESS/n at age 10 "
        "| at 50 | KL at age 10 | at 50 |",
        "|---|---|---|---|---|---|---|---|",
        *[f"| {lr} | {drift[lr]['learning_snapshots']}/{drift[lr]['snapshots']} "
          f"| {drift[lr]['tau_fit']:.1f} | {bed.buffer_iterations / drift[lr]['tau_fit']:.1f} "
          f"| {drift[lr]['ess'][min(10, len(ages) - 1)]:.3f} | {drift[lr]['ess'][min(50, len(ages) - 1)]:.3f} "
          f"| {drift[lr]['kl'][min(10, len(ages) - 1)]:.4f} | {drift[lr]['kl'][min(50, len(ages) - 1)]:.4f} |"
          for lr in lrs],
        "",
        "τ_fit: least squares of log ESS/n on age through the origin over ages with ESS/n ≥ 0.05, "
        "ESS/n averaged over seeds and over the learning-phase snapshots (on-policy J < "
        f"{LEARNING_PHASE_REWARD}; `ess_vs_age.csv`, `ess_kl_vs_age.png`).",
        "",
        "## Exact final expected reward (95% Student-t intervals over seeds)",
        "",
        "| method | lr | final J | mean J over the run |",
        "|---|---|---|---|",
        *[row(n, lr) for n in names for lr in lrs],
        "",
        "Best lr per method (by final J, picked on the scoring seeds: descriptive only, no claim "
        "uses it): " + ", ".join(f"{n} {best_lr[n]}" for n in names) + ".",
        "",
        "## What the K extra updates see",
        "",
        "Mean age of the replayed items (iterations; `sampled_age.csv`, `sampled_age.png`) / mean "
        "cosine between an extra update's gradient step and the exact policy gradient ∇J at "
        "that moment (1 = the true ascent direction):",
        "",
        *age_lines,
        "",
        "## Verdicts",
        "",
        "Every claim of this bed is decided in [results/VERDICTS.md](../VERDICTS.md) (generated by "
        "`python experiments/verdicts.py` from `runs.csv` and the declaration "
        "experiments/claims/freshper_bandit.toml): one pooled Student-t test over the learning rates "
        "on the seed-paired mean J, gated on the staleness of the buffer.",
        "",
        "## Caveats",
        "",
        f"* Replay and epoch methods make 1 + K = {1 + bed.extra_updates} optimizer updates per "
        "batch, on-policy makes 1: \"> on-policy\" mixes the value of replayed data with the "
        "value of more updates; `onpolicy_epochs` (same updates, fresh data only) separates them.",
        "* The final J saturates near 1 at the larger learning rates; the mean J over the run "
        "(learning speed) is the sharper measure there.",
        "* Buffer shorter than 10 τ_fit at lr " + (", ".join(
            str(lr) for lr in lrs if bed.buffer_iterations < 10 * drift[lr]["tau_fit"]) or "none")
        + f" ({bed.buffer_iterations} iterations; the runs last {bed.num_iterations}, so the "
        "oldest data is at most that old).",
        "* ESS/n decays faster than exponentially in age when the policy drifts in a persistent "
        "direction (`ess_kl_vs_age.png`); τ_fit is the best single exponential over ages with "
        "ESS/n ≥ 0.05.",
    ]
    (out_dir / "README.md").write_text("\n".join(text) + "\n")
    return "\n".join(text)


def run(scale_name: str, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started = time.perf_counter()
    scale = SCALES[scale_name]
    out_dir = Path(out_dir)
    with output_lock(out_dir):
        if fresh and (out_dir / "runs").exists():
            shutil.rmtree(out_dir / "runs")
        drift = drift_pilot(scale, out_dir, seed)
        log("tau_fit per lr: " + ", ".join(f"{lr}: {d['tau_fit']:.2f}" for lr, d in drift.items()))
        grid, rows, data, study_seconds = study(scale, drift, out_dir, seed, log)
        header = provenance(started=started)
        (out_dir / "config.json").write_text(json.dumps(
            {"scale": scale_name, "seed": seed, "bed": dataclasses.asdict(scale.bed),
             "num_seeds": scale.num_seeds, "learning_rates": list(scale.learning_rates),
             "tau_fit": {str(lr): d["tau_fit"] for lr, d in drift.items()}, **header}, indent=1))
        header["stage_seconds"] = {"pilot": next(iter(drift.values()))["stage_seconds"],
                                   "study": study_seconds}
        return summarize(scale, drift, grid, rows, data, out_dir, header)


def main(argv=None):
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
