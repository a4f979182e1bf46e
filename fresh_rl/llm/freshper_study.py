"""FreshPER in the LLM RL loop (``experiments/freshper.py``, arXiv 2604.16918): one vmapped run
per (task, method) of the replay trainer, the finished runs saved and reloaded, the study's
tables (curves, final scores, τ ablation, drift of stored data) and its figures.

A run's rows are the scale's (τ, seed) pairs (:meth:`fresh_rl.llm.presets.FreshPERScale.run_rows`):
the τ ablation runs inside the FreshPER program, τ a state leaf of the buffer, so every τ and
seed is one row of the same vmapped run (common seeds across τ).
"""
from __future__ import annotations

import math
import os
import time
from typing import Callable, Sequence

import jax
import numpy as np

from fresh_rl.eval import seed_interval
from fresh_rl.llm import replay_trainer as rt
from fresh_rl.llm.presets import SYNC, FreshPERScale
from fresh_rl.report import grouped, save_panel_grid, save_panels, titled
from fresh_rl.sweep.checkpoint import RunCheckpointer
from fresh_rl.sweep.integrity import tree_checksum

RENAMED_METRICS = {"lag_mean": "lag/version_gap_mean", "lag_max": "lag/version_gap_max"}
"""npz runs written before the metric renames load under the current names."""
METRICS = ("success_rate", "mean_return")


def run_method(scale: FreshPERScale, task: str, env, method: str, replay_config, params, model_config,
               out: str, log):
    """One vmapped run (all rows) of ``env`` (the settings of task ``task``); its history and
    the ESS-vs-age statistics of the final buffers. Resumes from ``out/checkpoints`` after an
    interruption."""
    rows = scale.run_rows(task, method)
    state = None
    if scale.ablates_tau(task, method):  # τ rows of one program, common seeds across τ
        state = rt.set_initial_tau(rt.init_state(scale.rl, SYNC, replay_config, params, env),
                                   replay_config, scale.rl.batch_size, [tau for tau, _ in rows])
    checkpointer = RunCheckpointer(os.path.join(out, "checkpoints", f"{task}_{method}"),
                                   fingerprint=repr((scale, task, method, tree_checksum(params))))
    start = time.time()
    state, history = rt.train_loop(
        scale.rl, SYNC, replay_config, [seed for _, seed in rows], scale.iterations,
        params=params, env=env, model_config=model_config, state=state,
        checkpointer=checkpointer, checkpoint_every=5)
    drift = jax.jit(jax.vmap(lambda p, r, now: rt.drift_by_age(
        p, r, config=scale.rl, model_config=model_config, now=now)))(
        state.pipeline.train.params, state.replay, state.pipeline.ring.latest_version)
    drift = {k: np.asarray(v) for k, v in drift.items()}
    log(f"{task}/{method}: {time.time() - start:.0f} s, final success "
        f"{history['success_rate'][:, -max(1, scale.iterations // 3):].mean():.3f}")
    return history, drift, rows


def run_methods(scale: FreshPERScale, envs: dict, params, model_config, out: str, tasks: Sequence[str],
                methods: Sequence[str], log: Callable[[str], None]) -> dict:
    """(task, method) → (history, drift, rows) of every run of the scale: a finished run
    (``out/runs/<task>_<method>.npz``) loaded, never rerun; an unfinished one of ``tasks`` ×
    ``methods`` that the scale runs (:func:`run_method`) run and saved there."""
    results = {}
    for task in scale.tasks:
        for method, replay_config in scale.methods:
            path = os.path.join(out, "runs", f"{task}_{method}.npz")
            if os.path.exists(path):
                data = np.load(path, allow_pickle=False)
                history = {RENAMED_METRICS.get(k[2:], k[2:]): data[k] for k in data.files if k.startswith("h:")}
                drift = {k[2:]: data[k] for k in data.files if k.startswith("d:")}
                results[(task, method)] = (history, drift, scale.run_rows(task, method))
                continue
            if task not in tasks or method not in methods or not scale.runs(task, method):
                continue
            history, drift, rows = run_method(scale, task, envs[task], method, replay_config, params, model_config,
                                              out, log)
            np.savez(path, **{f"h:{k}": v for k, v in history.items()}, **{f"d:{k}": v for k, v in drift.items()})
            results[(task, method)] = (history, drift, rows)
    return results


def replay_tau(scale: FreshPERScale, method: str):
    """The τ of ``method``'s replay settings."""
    return dict(scale.methods)[method].age_decay_tau


def summarise(results: dict, scale: FreshPERScale):
    """The study's tables from :func:`run_methods`' runs: curves (95% Student-t over seeds per
    iteration), final scores over the last third of the iterations with the change vs on-policy,
    the τ ablation (τ = ∞: the PER rows), ESS/n and KL of the final buffers by age and their fits.
    A run's base rows are its seeds at the method's own τ."""
    curves, final, taus, ess_rows, fits = [], [], [], [], []
    third = max(1, scale.iterations // 3)
    for (task, method), (history, drift, rows) in results.items():
        base_rows = np.array([tau is None or tau == replay_tau(scale, method)
                              for tau, _ in rows])
        if not base_rows.any():
            base_rows[:scale.seeds] = True
        for metric in METRICS:
            mean, low, high = seed_interval(history[metric][base_rows], axis=0)
            curves += [{"task": task, "method": method, "metric": metric, "step": i,
                        "mean": mean[i], "low": low[i], "high": high[i]}
                       for i in range(len(mean))]
        row = {"task": task, "method": method, "seeds": int(base_rows.sum())}
        for metric in ("success_rate", "mean_return", "replay/kl_k3", "replay/age_mean",
                       "age_decay_tau"):
            values = history[metric][base_rows][:, -third:].mean(axis=1)
            name = metric.replace("replay/", "replay_")
            if not np.all(np.isfinite(values)):  # τ = ∞ (no decay): no interval
                row.update({name: float(values.mean()), f"{name}_low": float(values.min()),
                            f"{name}_high": float(values.max())})
                continue
            mean, low, high = seed_interval(values, axis=0)
            row.update({name: float(mean), f"{name}_low": float(low), f"{name}_high": float(high)})
        final.append(row)
        if scale.ablates_tau(task, method):
            for tau in scale.taus:
                sel = np.array([t == tau for t, _ in rows])
                for metric in METRICS:
                    values = history[metric][sel][:, -third:].mean(axis=1)
                    mean, low, high = seed_interval(values, axis=0)
                    taus.append({"task": task, "tau": tau, "metric": metric, "mean": float(mean),
                                 "low": float(low), "high": float(high)})
        points = rt.ess_by_age(drift, base_rows)
        ess_rows += [{"task": task, "method": method, **p} for p in points]
        if points:
            fits.append({"task": task, "method": method, **rt.fit_decay(points)})
    if scale.taus:  # τ = ∞ is standard PER exactly (tests/test_llm_replay.py): its rows
        taus += [{"task": r["task"], "tau": math.inf, "metric": metric, "mean": r[metric],
                  "low": r[f"{metric}_low"], "high": r[f"{metric}_high"]}
                 for r in final if r["method"] == "per" and scale.ablates_tau(r["task"], "freshper")
                 for metric in METRICS]
    for row in final:
        base = next((r for r in final if r["task"] == row["task"]
                     and r["method"] == "on_policy"), None)
        for metric in METRICS:
            ref = base[metric] if base else float("nan")
            row[f"{metric}_change_vs_on_policy"] = ((row[metric] - ref) / abs(ref)
                                                    if ref != 0 else float("nan"))
    return curves, final, taus, ess_rows, fits


def plot(curves, taus, ess_rows, scale: FreshPERScale, out: str) -> None:
    """``learning_curves.png`` (success and return per method against the iteration, a column per
    task), ``tau_ablation.png`` (final return against τ) and ``ess_vs_age.png`` (token ESS/n and
    KL of the final buffers by age, a column per task), the last two where their tables have rows."""
    tasks = [t for t in scale.tasks if any(r["task"] == t for r in curves)]
    by_curve = grouped(curves, ("task", "metric", "method"))

    def draw_curves(ax, title):
        task, metric = title.split(": ")
        for method, _ in scale.methods:
            rows = by_curve.get((task, metric, method), [])
            if rows:
                step = [r["step"] for r in rows]
                ax.plot(step, [r["mean"] for r in rows], label=method)
                ax.fill_between(step, [r["low"] for r in rows], [r["high"] for r in rows], alpha=0.15)
        ax.set(xlabel="iteration", ylabel=metric)
    save_panel_grid(os.path.join(out, "learning_curves.png"), METRICS, tasks,
                    lambda ax, m, t: titled(draw_curves, ax, f"{t}: {m}"), width=3.8, height=2.8)
    if taus:
        by_task = grouped((r for r in taus if r["metric"] == "mean_return"), ("task",))

        def draw_taus(ax, task):
            rows = by_task[task,]
            ax.errorbar(range(len(rows)), [r["mean"] for r in rows], fmt="o", label="mean_return",
                        yerr=[[r["mean"] - r["low"] for r in rows], [r["high"] - r["mean"] for r in rows]])
            ax.set_xticks(range(len(rows)), ["∞" if math.isinf(r["tau"]) else f"{r['tau']:g}" for r in rows])
            ax.set(xlabel="τ (iterations)", ylabel="final return")
        save_panels(os.path.join(out, "tau_ablation.png"), [t for t in tasks if (t,) in by_task], draw_taus,
                    width=3.8, height=3)
    if ess_rows:
        by_run = grouped(ess_rows, ("task", "method"))

        quantities = {"token ESS/n": ("ess_fraction", "token ESS / n", "log"),
                      "KL": ("kl_k3", "KL(π_old ‖ π_θ) per token", "linear")}

        def draw_ess(ax, title):
            task, quantity = title.split(": ")
            key, ylabel, yscale = quantities[quantity]
            for method, _ in scale.methods:
                rows = by_run.get((task, method), [])
                if rows:
                    ax.plot([r["age"] for r in rows], [r[key] for r in rows], "o-", label=method)
            ax.set(xlabel="age (iterations)", ylabel=ylabel, yscale=yscale)
        save_panel_grid(os.path.join(out, "ess_vs_age.png"), list(quantities), tasks,
                        lambda ax, q, t: titled(draw_ess, ax, f"{t}: {q}"), width=3.8, height=2.8)


__all__ = ["METRICS", "RENAMED_METRICS", "plot", "replay_tau", "run_method", "run_methods", "summarise"]
