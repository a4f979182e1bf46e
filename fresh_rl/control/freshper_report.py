"""The FreshPER control study's tables and README lines (``experiments/freshper_control.py``,
arXiv 2604.16918), from the stages of :mod:`fresh_rl.control.freshper_study`: per-run and per-arm
learner scores with seed intervals, ESS and KL by age (the drift pilot's fit and per arm), sampled
ages, score against τ, the short-τ stage, per-batch IS normalisation and the paired claims
(Holm-corrected per claim and score over tasks and learning rates).
"""
from __future__ import annotations

import math

import numpy as np

from fresh_rl.control.freshper_study import BATCH_NORMALIZED, SHORT_TAUS, Scale, variant_name, variants
from fresh_rl.eval import holm_over_cells, learner_scores, paired_claim, seed_interval
from fresh_rl.replay.methods import REPLAY_METHODS
from fresh_rl.report import histogram_mean, interval_text, markdown_table
from fresh_rl.results import NamedArrays
from fresh_rl.studies.freshper_tau_sweep import mean_by_age


def plot_drift_fit(ax, buffer: int, drift: dict) -> None:
    """The pilot's per-step ESS/n against age per learning rate with its fit exp(−age/τ_fit) (dashed)."""
    ages = np.arange(buffer)
    for lr, d in drift.items():
        line, = ax.plot(ages, d["ess"], label=f"lr {lr} (τ_fit {d['tau_fit']:.0f})")
        if math.isfinite(d["tau_fit"]):
            ax.plot(ages, np.exp(-ages / d["tau_fit"]), "--", color=line.get_color())
    ax.set(xlabel="age (iterations)", ylabel="per-step ESS/n (on-policy pilot)")


def _interval_columns(values, prefix: str) -> dict:
    m = seed_interval(values)
    return {prefix: float(m[0]), f"{prefix}_low": float(m[1]), f"{prefix}_high": float(m[2])}


def _tau_row(env, lr, tau_fit, tau, stage, cell: NamedArrays) -> dict:
    return {"task": env, "learning_rate": lr, "stage": stage, "tau": float(tau), "tau_over_tau_fit": float(tau / tau_fit),
            **_interval_columns(cell["final"], "final"), **_interval_columns(cell["mean"], "mean")}


def tables(scale: Scale, tasks: dict, claims) -> dict[str, list[dict]]:
    """The study's CSV tables (name → rows) from :func:`run_task` per task; ``claims`` are
    (text, variant, baseline variant, positive) for ``verdicts.csv`` (paired per task and lr,
    Holm-corrected per claim and score)."""
    lrs, names = scale.learning_rates, [variant_name(*v) for v in variants()]
    t = {name: [] for name in ("runs", "final", "ess_vs_age", "sampled_age", "score_vs_tau", "verdicts",
                               "is_normalization", "drift_by_method", "short_tau", "short_tau_runs")}
    for env, task in tasks.items():
        drift, grid, data = task["drift"], task["study"]["grid"], task["study"]["data"]
        score, seed_totals = learner_scores(data), data.sum("seed")
        ages = np.arange(task["config"].replay.buffer_iterations)
        for r, hp in zip(grid.rows, task["study"]["rows"]):
            point = {"variant": names[r["variant"]], "learning_rate": r["learning_rate"], "seed": r["seed"]}
            run, run_score = data.sel(**point), score.sel(**point)
            t["runs"].append({"task": env, "variant": point["variant"], "learning_rate": r["learning_rate"],
                              "seed": r["seed"], "age_decay_tau": hp["age_decay_tau"],
                              "final_return": float(run_score["final"]), "mean_eval_return": float(run_score["mean"]),
                              "mean_sampled_age": histogram_mean(run["sampled_age_counts"]),
                              "num_updates": int(run["num_updates"]), "adam_count": int(run["adam_count"])})
        for name in names:
            for lr in lrs:
                cell, cell_score = data.sel(variant=name, learning_rate=lr), score.sel(variant=name, learning_rate=lr)
                t["final"].append({"task": env, "variant": name, "learning_rate": lr, "seeds": scale.num_seeds,
                                   **_interval_columns(cell_score["final"], "final"),
                                   **_interval_columns(cell_score["mean"], "mean")})
                counts = seed_totals.sel(variant=name, learning_rate=lr)["sampled_age_counts"]
                if counts.sum():
                    t["sampled_age"] += [{"task": env, "variant": name, "learning_rate": lr, "age": int(a),
                                          "fraction": float(counts[a] / counts.sum())} for a in ages]
                ess, kl = (mean_by_age(cell[f"drift/{k}"]) for k in ("ess", "kl"))
                t["drift_by_method"] += [{"task": env, "variant": name, "learning_rate": lr, "age": int(a),
                                          "ess_fraction": float(ess[a]), "kl_k3": float(kl[a])} for a in ages]
        t["ess_vs_age"] += [{"task": env, "learning_rate": lr, "age": int(a), "ess_fraction": float(drift[lr]["ess"][a]),
                             "kl_k3": float(drift[lr]["kl"][a]), "tau_fit": drift[lr]["tau_fit"]}
                            for lr in lrs for a in ages]
        for lr in lrs:
            at_lr = score.sel(learning_rate=lr)
            t["score_vs_tau"] += [_tau_row(env, lr, drift[lr]["tau_fit"], REPLAY_METHODS[n].tau_factor
                                           * drift[lr]["tau_fit"], "study", at_lr.sel(variant=n))
                                  for n in ("freshper_0.3", "freshper_1", "freshper_3")]
            t["verdicts"] += [{"task": env, "learning_rate": lr, "claim": text, "score": metric,
                               **paired_claim(at_lr.sel(variant=a)[metric], at_lr.sel(variant=b)[metric], positive)}
                              for text, a, b, positive in claims for metric in ("final", "mean")]
        batch_scores = learner_scores(task["batch_is"]["data"])
        for method in BATCH_NORMALIZED:
            for lr in lrs:
                per_batch, buffer_wide = (x.sel(variant=method, learning_rate=lr) for x in (batch_scores, score))
                row = {"task": env, "variant": method, "learning_rate": lr, "stage_seconds": task["batch_is"]["seconds"]}
                for metric in ("final", "mean"):
                    row.update(_interval_columns(per_batch[metric], f"{metric}_batch_is"))
                    row.update({f"{metric}_{k}": x for k, x in paired_claim(
                        per_batch[metric], buffer_wide[metric], True).items()})
                t["is_normalization"].append(row)
    for env, task in tasks.items():
        drift, short = task["drift"], task["short_tau"]
        base, short_score = learner_scores(task["study"]["data"]), learner_scores(short["data"])
        ages = np.arange(task["config"].replay.buffer_iterations)
        for tau in SHORT_TAUS:
            for lr in lrs:
                cell = short_score.sel(tau=tau, learning_rate=lr)
                per, epochs = (base.sel(variant=v, learning_rate=lr) for v in ("per_given", "onpolicy_epochs"))
                t["short_tau"].append({
                    "task": env, "tau": tau, "learning_rate": lr,
                    "pilot_kl_at_age_tau": float(drift[lr]["kl"][min(int(tau), len(ages) - 1)]),
                    "mean_sampled_age": histogram_mean(short["data"].sel(tau=tau, learning_rate=lr)["sampled_age_counts"]),
                    **_interval_columns(cell["final"], "final"), **_interval_columns(cell["mean"], "mean"),
                    "stage_seconds": short["seconds"],
                    **{f"vs_per_{metric}_{key}": v for metric in ("final", "mean")
                       for key, v in paired_claim(cell[metric], per[metric], True).items()},
                    **{f"vs_onpolicy_epochs_mean_{key}": v for key, v in paired_claim(
                        cell["mean"], epochs["mean"], True).items()}})
                t["short_tau_runs"] += [{"task": env, "tau": tau, "learning_rate": lr, "seed": s,
                                         "final_return": float(cell.sel(seed=s)["final"]),
                                         "mean_eval_return": float(cell.sel(seed=s)["mean"])} for s in cell.coords["seed"]]
    for env, task in tasks.items():
        short_score = learner_scores(task["short_tau"]["data"])
        t["score_vs_tau"] += [_tau_row(env, lr, task["drift"][lr]["tau_fit"], tau, "short_tau",
                                       short_score.sel(tau=tau, learning_rate=lr)) for lr in lrs for tau in SHORT_TAUS]
    t["verdicts"] = holm_over_cells(t["verdicts"], family=("claim", "score"))
    return t


def _interval(r: dict, column: str) -> str:
    """The table cell of a row's ``column`` with its interval columns."""
    return interval_text(r[column], r[f"{column}_low"], r[f"{column}_high"])


def _difference(r: dict, prefix: str) -> str:
    """The table cell of a row's paired difference ``prefix`` with its interval, signed."""
    return f"{r[f'{prefix}_difference']:+.1f} [{r[f'{prefix}_low']:+.1f}, {r[f'{prefix}_high']:+.1f}]"


def readme_lines(scale: Scale, tasks: dict, t: dict) -> list[str]:
    """The README's lines after its provenance line: stage wall times, the trainer settings, the
    pilot's drift, the final returns, where the verdicts are decided, the per-batch IS weights and
    short τ tables, from :func:`run_task` per task and :func:`tables`."""
    lrs, c = scale.learning_rates, next(iter(tasks.values()))["config"]
    replay, h = c.replay, c.replay.buffer_iterations

    return [
        "Stage wall times (compilation included; a rerun restores saved chunks): " + ", ".join(
            f"{env} pilot {k['drift'][lrs[0]]['stage_seconds']:.0f} s, study {k['study']['seconds']:.0f} s, "
            f"per-batch IS {k['batch_is']['seconds']:.0f} s, short τ {k['short_tau']['seconds']:.0f} s"
            for env, k in tasks.items()) + ".", "",
        f"Trainer: `fresh_rl.control.train` with data source `{c.data_source}` (method `{c.method}`, actors at lag 0), "
        f"{c.num_envs} envs × T = {c.rollout_length} steps per iteration, {c.num_iterations} iterations, 1 fresh "
        f"full-batch step + K = {replay.extra_updates} extra steps, buffer of {h} iterations ({c.num_envs * h} rows), "
        f"priority `{replay.priority}`, α = {replay.priority_exponent}, β = {replay.importance_exponent}, floor "
        f"{replay.min_decayed_priority}, IS normalisation `{replay.importance_weight_normalization}`; Adam (clip "
        f"{c.max_grad_norm}); learner evaluation every {c.eval_every} iterations, {c.eval_episodes} deterministic "
        f"episodes. {scale.num_seeds} seeds per cell; every variant at every lr of {list(lrs)}.", "",
        "## Drift (on-policy pilot, per-step ESS/n of stored rows by age)", "",
        *markdown_table(("task", "lr", "τ_fit (iterations)", "buffer / τ_fit", "ESS/n at age 10", "at 50", "at 200",
                         "KL at age 10", "at 50", "at 200"), (
            (env, lr, f"{d['tau_fit']:.1f}", f"{k['config'].replay.buffer_iterations / d['tau_fit']:.2f}",
             *(f"{d[m][min(a, k['config'].replay.buffer_iterations - 1)]:.3f}" for m in ("ess", "kl") for a in (10, 50, 200)))
            for env, k in tasks.items() for lr, d in k["drift"].items())), "",
        "## Final learner return (95% Student-t intervals over seeds)", "",
        *markdown_table(("task", "variant", "lr", "final return", "mean over evaluations"), (
            (r["task"], r["variant"], r["learning_rate"], _interval(r, "final"), _interval(r, "mean")) for r in t["final"])), "",
        "## Verdicts", "",
        "Every claim of this bed is decided in [results/VERDICTS.md](../VERDICTS.md) (generated by "
        "`python experiments/verdicts.py` from `runs.csv`, `short_tau_runs.csv` and the declaration "
        "experiments/claims/freshper_control.toml): one pooled Student-t test over the (task, lr) cells "
        "whose buffer is stale enough, per-cell results Holm-corrected. `verdicts.csv` has the per-cell "
        "paired differences (Holm-corrected per claim and score).", "",
        "## IS weights normalised per batch instead of buffer-wide (`is_normalization.csv`)", "",
        "The same seeds, so the difference is paired; claim tested: per-batch > buffer-wide.", "",
        *markdown_table(("task", "variant", "lr", "final, per-batch weights", "Δ final vs buffer-wide (95% CI)",
                         "mean over evaluations, per-batch", "Δ mean"), (
            (r["task"], r["variant"], r["learning_rate"], _interval(r, "final_batch_is"),
             _difference(r, "final"), _interval(r, "mean_batch_is"), _difference(r, "mean")) for r in t["is_normalization"])), "",
        "## FreshPER at short τ (`short_tau.csv`)", "",
        "τ in iterations; KL = the pilot's per-step KL of data of age τ; age = mean age of the "
        "replayed rows; Δ paired against PER with given priorities (mean over evaluations) "
        "and against on-policy with 1 + K epochs.", "",
        *markdown_table(("task", "lr", "τ", "KL at age τ", "age", "mean over evaluations", "Δ vs PER",
                         "Δ vs 1 + K epochs"), (
            (r["task"], r["learning_rate"], f"{r['tau']:.0f}", f"{r['pilot_kl_at_age_tau']:.3f}",
             f"{r['mean_sampled_age']:.1f}", _interval(r, "mean"), _difference(r, "vs_per_mean"),
             _difference(r, "vs_onpolicy_epochs_mean")) for r in t["short_tau"]))]
