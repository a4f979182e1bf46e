"""FreshPER in control: actor-critic with trajectory replay, every method under matched controls.

The trainer (:func:`fresh_rl.control.train.train` with the data source ``replay_freshper``,
method ``ppo_clip``, one epoch of one minibatch, actors at lag 0; every replay method a row of
the traced replay leaves of its ``HyperParams``) rolls out with the current policy, makes one
full-batch update on the fresh data, stores each env's T-step row with its behaviour
log-probs, then makes K extra updates chosen by the method (:mod:`fresh_rl.replay.methods`,
the registry of the exact bandit bed): none (on-policy), K epochs on the fresh batch (matched
updates), or K V-trace-corrected replay steps with uniform, PER (given priorities or the
authors' max-priority insertion) or FreshPER sampling (τ = {0.3, 1, 3} × the measured ESS time
constant, with and without IS weights). Replay steps share the Adam state (the authors'
setup); uniform, PER and FreshPER also run with a separate Adam state and with plain SGD, to
separate Adam's momentum from the data replayed. Scores are learner evaluation episodes.

Per task, two stages, each one vmapped program over a ``fresh_rl.sweep.product_grid`` run by
``fresh_rl.sweep.run_stage`` in chunks saved as they finish (a rerun skips saved chunks):

1. *drift pilot*: on-policy runs at every learning rate; per-step ESS/n of the stored rows
   against the learner by age, averaged over seeds and snapshots, fitted by ``exp(−a/τ_fit)``;
2. *study*: every variant × the same learning-rate grid × seeds; each method is reported at
   every learning rate (no method is tuned alone);
3. *IS normalisation*: the PER and FreshPER variants again with importance weights normalised
   per sampled batch instead of by the buffer-wide maximum (the same seeds, so paired);
4. *short τ*: FreshPER at τ = 3, 10 and 30 iterations. With two actions the per-step ESS/n
   flattens near ½ instead of decaying, so τ_fit (fitted to it) lies near the buffer length
   while the per-step KL of the stored data already passes 1 nat at a few tens of
   iterations; these τ follow the KL instead (our addition, same seeds).

Outputs (``results/freshper_control/``): ``runs.csv``, ``final.csv``, ``ess_vs_age.csv``,
``short_tau.csv``, ``short_tau_runs.csv`` (one row per short-τ run), ``drift_by_method.csv`` (ESS/n and KL by age of every variant's stored data),
``sampled_age.csv``, ``score_vs_tau.csv``, ``verdicts.csv``, ``is_normalization.csv``,
``score_vs_tau.png`` (per task: ESS/n against age with the fit; learner return, mean over
evaluations, against τ/τ_fit for the τ_fit multiples and the short τ) and ``README.md``; the
claims are decided by experiments/verdicts.py into results/VERDICTS.md.

    python experiments/freshper_control.py --scale ci     # the tests (CartPole, tiny)
    python experiments/freshper_control.py --scale cpu    # CartPole + Acrobot, 10 seeds
    python experiments/freshper_control.py --scale paper  # + Breakout-MinAtar, 30 seeds (accelerator)

Cost and memory: a Breakout-MinAtar run keeps its buffer of 300 iterations × 8 rows × 64 steps
of [10, 10, 4] observations (twice: s and s') in float32, ~0.5 GB per run, ~44 GB for a chunk of
90 runs; on the 2-core CPU one run-iteration took 0.8 s (10 vmapped runs × 40 iterations in
324 s), so even a 5-variant × 10-seed × 300-iteration MinAtar study would take ~3.3 h there.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from pathlib import Path

import jax
import numpy as np
import optax

from fresh_rl.control.config import TrainConfig
from fresh_rl.control.freshper_study import (BATCH_NORMALIZED, SCALES, SHORT_TAUS, Scale, config_fingerprint,
                                             variant_name, variants)
from fresh_rl.control.hyperparams import replay_grid
from fresh_rl.control.train import train
from fresh_rl.eval import holm_over_cells, paired_claim, seed_interval
from fresh_rl.lag import fit_ess_time_constant
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_csv
from fresh_rl.replay.methods import REPLAY_METHODS, replay_hparams
from fresh_rl.sweep import output_lock, product_grid, run_stage
from fresh_rl.sweep.study_cli import study_main

RESULTS = REPOSITORY_ROOT / "results" / "freshper_control"
KEEP = ("eval/return_deterministic", "eval/valid", "episode_return", "drift/ess", "drift/kl",
        "sampled_age_counts", "num_updates", "adam_count")


def _adam_count(opt_state) -> jax.Array:
    """The step count of the (one) Adam state in ``opt_state``: the updates it has taken."""
    (count,) = [s.count for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(
        s, optax.ScaleByAdamState)) if isinstance(s, optax.ScaleByAdamState)]
    return count


def train_kept(config: TrainConfig, key, hp) -> dict:
    """One run of the study: the :data:`KEEP` outputs (per-iteration metrics, drift snapshots,
    replayed rows per age, optimizer updates and the shared Adam state's step count)."""
    out = train(config, key, hp)
    state = out.state
    kept = {k: out.metrics[k] for k in KEEP[:5]}
    kept.update({"sampled_age_counts": state.replay.sampled_age_counts, "num_updates": state.num_updates,
                 "adam_count": _adam_count(state.opt_state)})
    return kept


def _run_grid(config, grid, hp, directory: Path, fingerprint: str, chunk: int):
    """``train_kept`` over the grid as one resumable stage (:func:`fresh_rl.sweep.run_stage`)."""
    return run_stage(functools.partial(train_kept, config), grid.keys, hp, directory=directory,
                     fingerprint=fingerprint, chunk_size=chunk)


def drift_pilot(config, scale: Scale, out_dir: Path, seed: int) -> dict:
    """On-policy runs per learning rate → per-step ESS/n and KL by age, τ_fit per learning rate
    (ESS/n averaged over seeds and over every snapshot that holds rows of that age)."""
    lrs, env = scale.learning_rates, config.env_name
    grid = product_grid(scale.num_seeds, seed, learning_rate=lrs)
    hp = replay_grid(config, [replay_hparams("onpolicy")] * grid.size,
                     {"learning_rate": [r["learning_rate"] for r in grid.rows]})
    out, seconds = _run_grid(config, grid, hp, out_dir / "runs" / f"{env}-pilot",
                             f"pilot {config_fingerprint(config)} seeds={scale.num_seeds}@{seed} lrs={lrs}",
                             scale.num_seeds * len(lrs))
    ages = np.arange(config.replay.buffer_iterations)
    drift = {}
    for i, lr in enumerate(lrs):
        rows = slice(i * scale.num_seeds, (i + 1) * scale.num_seeds)
        ess = np.where(out["drift/ess"][rows] >= 0, out["drift/ess"][rows], np.nan)
        kl = np.where(out["drift/kl"][rows] >= 0, out["drift/kl"][rows], np.nan)
        with np.errstate(all="ignore"):
            ess_mean, kl_mean = np.nanmean(ess, axis=(0, 1)), np.nanmean(kl, axis=(0, 1))
        drift[lr] = {"ess": ess_mean, "kl": kl_mean,
                     "tau_fit": fit_ess_time_constant(ages, ess_mean), "stage_seconds": seconds}
    return drift


def study(config, scale: Scale, drift: dict, out_dir: Path, seed: int, log=print,
          names=None, stage="study"):
    """Every (method, optimizer) of ``names`` (default :func:`variants`) × lrs × seeds."""
    lrs, env, names = scale.learning_rates, config.env_name, names or variants()
    grid = product_grid(scale.num_seeds, seed, variant=list(range(len(names))), learning_rate=lrs)
    rows = [replay_hparams(names[r["variant"]][0], drift[r["learning_rate"]]["tau_fit"],
                           names[r["variant"]][1]) for r in grid.rows]
    hp = replay_grid(config, rows, {"learning_rate": [r["learning_rate"] for r in grid.rows]})
    taus = {lr: drift[lr]["tau_fit"] for lr in lrs}
    log(f"{env} {stage}: {grid.size} runs ({len(names)} variants x {len(lrs)} lrs x "
        f"{scale.num_seeds} seeds), tau_fit={taus}")
    out, seconds = _run_grid(config, grid, hp, out_dir / "runs" / f"{env}-{stage}",
                             f"{stage} {config_fingerprint(config)} seeds={scale.num_seeds}@{seed} lrs={lrs} "
                             f"tau_fit={taus} variants={names}", scale.num_seeds * len(lrs))
    shape = (len(names), len(lrs), scale.num_seeds)
    return grid, rows, {k: v.reshape(*shape, *v.shape[1:]) for k, v in out.items()}, seconds


def short_tau_stage(config, scale: Scale, out_dir: Path, seed: int, log=print):
    """FreshPER (shared Adam, IS) at the absolute τ of ``SHORT_TAUS`` × lrs × seeds."""
    lrs, env = scale.learning_rates, config.env_name
    grid = product_grid(scale.num_seeds, seed, tau=SHORT_TAUS, learning_rate=lrs)
    rows = [replay_hparams("freshper_1", r["tau"]) for r in grid.rows]
    hp = replay_grid(config, rows, {"learning_rate": [r["learning_rate"] for r in grid.rows]})
    log(f"{env} short_tau: {grid.size} runs (tau {SHORT_TAUS} x {len(lrs)} lrs x {scale.num_seeds} seeds)")
    out, seconds = _run_grid(config, grid, hp, out_dir / "runs" / f"{env}-short_tau",
                             f"short_tau {config_fingerprint(config)} seeds={scale.num_seeds}@{seed} lrs={lrs} "
                             f"taus={SHORT_TAUS}", scale.num_seeds * len(lrs))
    shape = (len(SHORT_TAUS), len(lrs), scale.num_seeds)
    return {k: v.reshape(*shape, *v.shape[1:]) for k, v in out.items()}, seconds


def _tau_row(env, lr, tau_fit, tau, stage, final, mean) -> dict:
    f, m = seed_interval(final), seed_interval(mean)
    return {"task": env, "learning_rate": lr, "stage": stage, "tau": float(tau),
            "tau_over_tau_fit": float(tau / tau_fit), "final": float(f[0]), "final_low": float(f[1]),
            "final_high": float(f[2]), "mean": float(m[0]), "mean_low": float(m[1]),
            "mean_high": float(m[2])}


def _scores(data: dict) -> tuple[np.ndarray, np.ndarray]:
    """Final learner score (the last evaluation's deterministic return) and the mean over
    every evaluation of the run (learning speed), ``[variants, lrs, seeds]``."""
    ret, valid = data["eval/return_deterministic"], data["eval/valid"].astype(bool)
    return ret[..., -1], np.where(valid, ret, 0).sum(-1) / np.maximum(valid.sum(-1), 1)


CLAIMS = (("standard PER (authors') < on-policy", "per_authors", "onpolicy", False),
          ("standard PER (given priorities) < on-policy", "per_given", "onpolicy", False),
          ("FreshPER > PER (authors')", "freshper_1", "per_authors", True),
          ("FreshPER > PER (given priorities)", "freshper_1", "per_given", True),
          ("FreshPER > uniform replay", "freshper_1", "uniform", True),
          ("FreshPER > on-policy", "freshper_1", "onpolicy", True),
          ("FreshPER > on-policy with 1 + K epochs (same number of updates)", "freshper_1",
           "onpolicy_epochs", True),
          ("IS matters (FreshPER with IS > without)", "freshper_1", "freshper_1_no_is", True),
          ("FreshPER > PER with replay steps on a separate Adam state", "freshper_1@separate",
           "per_given@separate", True),
          ("FreshPER > PER with SGD replay steps", "freshper_1@sgd", "per_given@sgd", True))


def summarize(scale: Scale, results: dict, batch_normalized: dict, short_tau: dict,
              out_dir: Path, header: dict) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    lrs, names = scale.learning_rates, [variant_name(*v) for v in variants()]
    first_seed = next(iter(results.values()))[2].rows[0]["seed"]
    run_rows, final_rows, ess_rows, age_rows, tau_rows, verdict_rows, drift_rows = ([] for _ in range(7))
    fig, axes = plt.subplots(2, len(results), figsize=(5 * len(results), 7), squeeze=False)
    for c, (env, (config, drift, grid, rows, data, seconds)) in enumerate(results.items()):
        final, mean = _scores(data)
        ages = np.arange(config.replay.buffer_iterations)
        for r, hp in zip(grid.rows, rows):
            v, li, s = r["variant"], lrs.index(r["learning_rate"]), r["seed"] - grid.rows[0]["seed"]
            counts = data["sampled_age_counts"][v, li, s]
            run_rows.append({"task": env, "variant": names[v], "learning_rate": r["learning_rate"],
                             "seed": r["seed"], "age_decay_tau": hp["age_decay_tau"],
                             "final_return": float(final[v, li, s]),
                             "mean_eval_return": float(mean[v, li, s]),
                             "mean_sampled_age": float((counts * ages).sum() / max(counts.sum(), 1)),
                             "num_updates": int(data["num_updates"][v, li, s]),
                             "adam_count": int(data["adam_count"][v, li, s])})
        for v, name in enumerate(names):
            for li, lr in enumerate(lrs):
                f, m = seed_interval(final[v, li]), seed_interval(mean[v, li])
                final_rows.append({"task": env, "variant": name, "learning_rate": lr,
                                   "seeds": scale.num_seeds, "final": float(f[0]),
                                   "final_low": float(f[1]), "final_high": float(f[2]),
                                   "mean": float(m[0]), "mean_low": float(m[1]),
                                   "mean_high": float(m[2])})
                counts = data["sampled_age_counts"][v, li].sum(0)
                if counts.sum():
                    age_rows += [{"task": env, "variant": name, "learning_rate": lr, "age": int(a),
                                  "fraction": float(counts[a] / counts.sum())} for a in ages]
        with np.errstate(all="ignore"):  # ages no run reached stay NaN
            method_drift = {k: np.nanmean(np.where(data[f"drift/{k}"] >= 0, data[f"drift/{k}"], np.nan),
                                          axis=(2, 3)) for k in ("ess", "kl")}  # [V, L, H]
        drift_rows += [{"task": env, "variant": name, "learning_rate": lr, "age": int(a),
                        "ess_fraction": float(method_drift["ess"][v, li, a]),
                        "kl_k3": float(method_drift["kl"][v, li, a])}
                       for v, name in enumerate(names) for li, lr in enumerate(lrs) for a in ages]
        for lr in lrs:
            ess_rows += [{"task": env, "learning_rate": lr, "age": int(a),
                          "ess_fraction": float(drift[lr]["ess"][a]), "kl_k3": float(drift[lr]["kl"][a]),
                          "tau_fit": drift[lr]["tau_fit"]} for a in ages]
            line, = axes[0, c].plot(ages, drift[lr]["ess"], label=f"lr {lr} (τ_fit {drift[lr]['tau_fit']:.0f})")
            if math.isfinite(drift[lr]["tau_fit"]):
                axes[0, c].plot(ages, np.exp(-ages / drift[lr]["tau_fit"]), "--", color=line.get_color())
        axes[0, c].set(title=env, xlabel="age (iterations)", ylabel="per-step ESS/n (on-policy pilot)")
        axes[0, c].legend(fontsize=8)
        for li, lr in enumerate(lrs):
            tau_rows += [_tau_row(env, lr, drift[lr]["tau_fit"], REPLAY_METHODS[n].tau_factor
                                  * drift[lr]["tau_fit"], "study", final[names.index(n), li],
                                  mean[names.index(n), li])
                         for n in ("freshper_0.3", "freshper_1", "freshper_3")]
            for text, a, b, positive in CLAIMS:
                for metric, values in (("final", final), ("mean", mean)):
                    verdict_rows.append({"task": env, "learning_rate": lr, "claim": text, "score": metric,
                                         **paired_claim(values[names.index(a), li],
                                                        values[names.index(b), li], positive)})
    norm_rows = []
    for env, (grid, rows, data, seconds) in batch_normalized.items():
        buffer_scores, batch_scores = _scores(results[env][4]), _scores(data)
        for v, method in enumerate(BATCH_NORMALIZED):
            for li, lr in enumerate(lrs):
                row = {"task": env, "variant": method, "learning_rate": lr, "stage_seconds": seconds}
                for score, buffer_wide, per_batch in zip(("final", "mean"), buffer_scores, batch_scores):
                    b = seed_interval(per_batch[v, li])
                    row.update({f"{score}_batch_is": float(b[0]), f"{score}_batch_is_low": float(b[1]),
                                f"{score}_batch_is_high": float(b[2])})
                    row.update({f"{score}_{k}": x for k, x in paired_claim(
                        per_batch[v, li], buffer_wide[names.index(method), li], True).items()})
                norm_rows.append(row)
    short_rows = []
    for env, (data, seconds) in short_tau.items():
        config, drift, _, _, base_data, _ = results[env]
        base_final, base_mean = _scores(base_data)
        final, mean = _scores(data)
        ages = np.arange(config.replay.buffer_iterations)
        for ti, tau in enumerate(SHORT_TAUS):
            for li, lr in enumerate(lrs):
                counts = data["sampled_age_counts"][ti, li].sum(0)
                f, m = seed_interval(final[ti, li]), seed_interval(mean[ti, li])
                per = names.index("per_given")
                short_rows.append({
                    "task": env, "tau": tau, "learning_rate": lr,
                    "pilot_kl_at_age_tau": float(drift[lr]["kl"][min(int(tau), len(ages) - 1)]),
                    "mean_sampled_age": float((counts * ages).sum() / max(counts.sum(), 1)),
                    "final": float(f[0]), "final_low": float(f[1]), "final_high": float(f[2]),
                    "mean": float(m[0]), "mean_low": float(m[1]), "mean_high": float(m[2]),
                    "stage_seconds": seconds,
                    **{f"vs_per_{k}_{key}": v for k, values, base in (
                        ("final", final, base_final), ("mean", mean, base_mean))
                       for key, v in paired_claim(values[ti, li], base[per, li], True).items()},
                    **{f"vs_onpolicy_epochs_mean_{key}": v for key, v in paired_claim(
                        mean[ti, li], base_mean[names.index("onpolicy_epochs"), li], True).items()}})
    for c, (env, (data, _)) in enumerate(short_tau.items()):
        config, drift, _, _, base_data, _ = results[env]
        final, mean = _scores(data)
        base_mean = _scores(base_data)[1]
        for li, lr in enumerate(lrs):
            tau_rows += [_tau_row(env, lr, drift[lr]["tau_fit"], tau, "short_tau", final[ti, li],
                                  mean[ti, li]) for ti, tau in enumerate(SHORT_TAUS)]
            points = sorted((r for r in tau_rows if r["task"] == env and r["learning_rate"] == lr),
                            key=lambda r: r["tau_over_tau_fit"])
            x = [r["tau_over_tau_fit"] for r in points]
            y = np.array([[r["mean"], r["mean"] - r["mean_low"], r["mean_high"] - r["mean"]] for r in points])
            bars = axes[1, c].errorbar(x, y[:, 0], yerr=y[:, 1:].T, fmt="o-", capsize=2, label=f"lr {lr}")
            color = bars[0].get_color()
            for variant, style in (("per_given", ":"), ("onpolicy", "--"), ("onpolicy_epochs", "-.")):
                axes[1, c].axhline(base_mean[names.index(variant), li].mean(), ls=style, color=color, lw=1)
        axes[1, c].set(xscale="log", xlabel="τ / τ_fit (dotted: PER; dashed: on-policy; dash-dot: "
                       "1 + K epochs)", ylabel="learner return, mean over evaluations")
        axes[1, c].xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axes[1, c].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axes[1, c].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "score_vs_tau.png", dpi=110)
    plt.close(fig)
    verdict_rows = holm_over_cells(verdict_rows, family=("claim", "score"))
    for name, table in (("runs", run_rows), ("final", final_rows), ("ess_vs_age", ess_rows),
                        ("sampled_age", age_rows), ("score_vs_tau", tau_rows),
                        ("verdicts", verdict_rows), ("is_normalization", norm_rows),
                        ("drift_by_method", drift_rows), ("short_tau", short_rows),
                        ("short_tau_runs", short_tau_run_rows(scale, short_tau, first_seed))):
        write_csv(out_dir / f"{name}.csv", table)
    return _readme(scale, results, final_rows, verdict_rows, norm_rows, short_rows, out_dir, header)


def short_tau_run_rows(scale: Scale, short_tau: dict, first_seed: int) -> list[dict]:
    """One row per run of the short-τ stage (``short_tau[env] = (data, seconds)``): task, τ,
    lr, seed and the two learner scores, the per-seed data its claims are decided on."""
    rows = []
    for env, (data, _) in short_tau.items():
        final, mean = _scores(data)  # [taus, lrs, seeds]
        rows += [{"task": env, "tau": tau, "learning_rate": lr, "seed": first_seed + s,
                  "final_return": float(final[ti, li, s]), "mean_eval_return": float(mean[ti, li, s])}
                 for ti, tau in enumerate(SHORT_TAUS) for li, lr in enumerate(scale.learning_rates)
                 for s in range(final.shape[-1])]
    return rows


def _stage_seconds(rows, env) -> float:
    return next((r["stage_seconds"] for r in rows if r["task"] == env), math.nan)


def _readme(scale, results, final_rows, verdict_rows, norm_rows, short_rows, out_dir: Path,
            header: dict) -> str:
    lrs = scale.learning_rates
    config = next(iter(results.values()))[0]
    t, replay = config, config.replay
    text = ["# FreshPER in control: replay with matched controls", "", provenance_line(header),
            "Stage wall times (compilation included; a rerun restores saved chunks): " + ", ".join(
                f"{env} pilot {r[1][lrs[0]]['stage_seconds']:.0f} s, study {r[5]:.0f} s, "
                f"per-batch IS {_stage_seconds(norm_rows, env):.0f} s, short τ "
                f"{_stage_seconds(short_rows, env):.0f} s" for env, r in results.items()) + ".", "",
            f"Trainer: `fresh_rl.control.train` with data source `{t.data_source}` (method "
            f"`{t.method}`, actors at lag 0), {t.num_envs} envs × T = {t.rollout_length} "
            f"steps per iteration, {t.num_iterations} iterations, 1 fresh full-batch step + "
            f"K = {replay.extra_updates} extra steps, buffer of {replay.buffer_iterations} iterations "
            f"({t.num_envs * replay.buffer_iterations} rows), priority `{replay.priority}`, "
            f"α = {replay.priority_exponent}, β = {replay.importance_exponent}, floor "
            f"{replay.min_decayed_priority}, IS normalisation `{replay.importance_weight_normalization}`; "
            f"Adam (clip {t.max_grad_norm}); learner evaluation every {t.eval_every} iterations, "
            f"{t.eval_episodes} deterministic episodes. {scale.num_seeds} seeds per cell; every "
            f"variant at every lr of {list(lrs)}.", "",
            "## Drift (on-policy pilot, per-step ESS/n of stored rows by age)", "",
            "| task | lr | τ_fit (iterations) | buffer / τ_fit | ESS/n at age 10 | at 50 | at 200 "
            "| KL at age 10 | at 50 | at 200 |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for env, (config, drift, *_rest) in results.items():
        for lr in lrs:
            h = config.replay.buffer_iterations
            ess, kl = (" | ".join(f"{drift[lr][k][min(a, h - 1)]:.3f}" for a in (10, 50, 200))
                       for k in ("ess", "kl"))
            text.append(f"| {env} | {lr} | {drift[lr]['tau_fit']:.1f} | "
                        f"{h / drift[lr]['tau_fit']:.2f} | {ess} | {kl} |")
    text += ["", "## Final learner return (95% Student-t intervals over seeds)", "",
             "| task | variant | lr | final return | mean over evaluations |", "|---|---|---|---|---|"]
    text += [f"| {r['task']} | {r['variant']} | {r['learning_rate']} | {r['final']:.1f} "
             f"[{r['final_low']:.1f}, {r['final_high']:.1f}] | {r['mean']:.1f} "
             f"[{r['mean_low']:.1f}, {r['mean_high']:.1f}] |" for r in final_rows]
    text += ["", "## Verdicts", "",
             "Every claim of this bed is decided in [results/VERDICTS.md](../VERDICTS.md) (generated by "
             "`python experiments/verdicts.py` from `runs.csv`, `short_tau_runs.csv` and the declaration "
             "experiments/claims/freshper_control.toml): one pooled Student-t test over the (task, lr) cells "
             "whose buffer is stale enough, per-cell results Holm-corrected. `verdicts.csv` has the per-cell "
             "paired differences (Holm-corrected per claim and score).",
             "", "## IS weights normalised per batch instead of buffer-wide (`is_normalization.csv`)",
             "", "The same seeds, so the difference is paired; claim tested: per-batch > buffer-wide.",
             "", "| task | variant | lr | final, per-batch weights | Δ final vs buffer-wide (95% CI) "
             "| mean over evaluations, per-batch | Δ mean |",
             "|---|---|---|---|---|---|---|"]
    text += ["| " + " | ".join([r["task"], r["variant"], str(r["learning_rate"])] + [
        f"{r[f'{s}_batch_is']:.1f} [{r[f'{s}_batch_is_low']:.1f}, {r[f'{s}_batch_is_high']:.1f}] | "
        f"{r[f'{s}_difference']:+.1f} [{r[f'{s}_low']:+.1f}, {r[f'{s}_high']:+.1f}]"
        for s in ("final", "mean")]) + " |" for r in norm_rows]
    text += ["", "## FreshPER at short τ (`short_tau.csv`)", "",
             "τ in iterations; KL = the pilot's per-step KL of data of age τ; age = mean age of the "
             "replayed rows; Δ paired against PER with given priorities (mean over evaluations) "
             "and against on-policy with 1 + K epochs.", "",
             "| task | lr | τ | KL at age τ | age | mean over evaluations | Δ vs PER "
             "| Δ vs 1 + K epochs |", "|---|---|---|---|---|---|---|---|"]
    text += [f"| {r['task']} | {r['learning_rate']} | {r['tau']:.0f} | {r['pilot_kl_at_age_tau']:.3f} | "
             f"{r['mean_sampled_age']:.1f} | {r['mean']:.1f} [{r['mean_low']:.1f}, {r['mean_high']:.1f}] | "
             f"{r['vs_per_mean_difference']:+.1f} [{r['vs_per_mean_low']:+.1f}, {r['vs_per_mean_high']:+.1f}] | "
             f"{r['vs_onpolicy_epochs_mean_difference']:+.1f} "
             f"[{r['vs_onpolicy_epochs_mean_low']:+.1f}, {r['vs_onpolicy_epochs_mean_high']:+.1f}] |"
             for r in short_rows]
    (out_dir / "README.md").write_text("\n".join(text) + "\n")
    return "\n".join(text)


def run(scale: Scale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started = time.perf_counter()
    out_dir = Path(out_dir)
    with output_lock(out_dir):
        results, batch_normalized, short_tau = {}, {}, {}
        for config in scale.configs:
            env = config.env_name
            drift = drift_pilot(config, scale, out_dir, seed)
            log(f"{env} tau_fit per lr: " + ", ".join(f"{lr}: {d['tau_fit']:.1f}" for lr, d in drift.items()))
            results[env] = (config, drift, *study(config, scale, drift, out_dir, seed, log))
            batch_config = dataclasses.replace(config, replay=dataclasses.replace(
                config.replay, importance_weight_normalization="batch"))
            batch_normalized[env] = study(batch_config, scale, drift, out_dir, seed, log,
                                          [(m, "shared") for m in BATCH_NORMALIZED], "batch_is")
            short_tau[env] = short_tau_stage(config, scale, out_dir, seed, log)
        header = provenance(started=started)
        (out_dir / "config.json").write_text(json.dumps(
            {"scale": scale.label, "seed": seed, "num_seeds": scale.num_seeds,
             "learning_rates": list(scale.learning_rates),
             "configs": {env: repr(r[0]) for env, r in results.items()},
             "tau_fit": {env: {str(lr): d["tau_fit"] for lr, d in r[1].items()}
                         for env, r in results.items()}, **header}, indent=1))
        return summarize(scale, results, batch_normalized, short_tau, out_dir, header)


def main(argv=None):
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
