"""FreshPER in the LLM RL loop (arXiv 2604.16918): on-policy vs standard PER vs FreshPER.

  .venv/bin/python experiments/freshper.py --scale cpu      # the committed results
  .venv/bin/python experiments/freshper.py --scale drift    # stronger drift: search_qa, lr 1e-4, K = 4
  .venv/bin/python experiments/freshper.py --scale ci --out /tmp/freshper_ci
  .venv/bin/python experiments/freshper.py --scale bpe-pilot  # ESS time constant on the BPE warm start

From the warm-started tiny LM (results/llm_warm_start/checkpoint), per task, runs the replay
trainer (fresh_rl.llm.replay_trainer: one fresh update plus K replay updates per iteration,
REINFORCE++ as in the paper) for each method, all seeds vmapped in one compiled program per
(task, method). The τ ablation runs inside the FreshPER program: τ is a state leaf of the
buffer, so every τ and seed is one row of the same vmapped run (common seeds across τ).
Writes to --out (default results/freshper for cpu, results/freshper_<scale> otherwise):

  runs/<task>_<method>.npz   per-iteration metrics [rows, iterations] (rows = seeds, or
                             τ × seeds for the ablation); a rerun skips finished runs
  checkpoints/               orbax checkpoints of unfinished runs (resume after a kill)
  curves.csv      mean and 95% Student-t interval over seeds of success and return per step
  final.csv       per (task, method): final success and return (mean of the last third of
                  the iterations), 95% interval, relative change of the return vs on-policy
                  (the paper's table)
  tau_ablation.csv, is_ablation rows in final.csv (method freshper_no_is)
  ess_vs_age.csv  per (task, method, age): token ESS/n and KL(π_old‖π_θ) of the stored
                  trajectories at the end of the run; ess_fit.csv: fitted decay rates
  learning_curves.png, tau_ablation.png, ess_vs_age.png, config.json

``--model PATH`` (any Hugging Face folder with its tokenizer, e.g. Qwen2.5-0.5B-Instruct)
starts from that model, the tasks speaking its tokenizer and chat template, e.g.:

  .venv/bin/python experiments/freshper.py --scale ci --model tests/fixtures/qwen2_bpe_tiny \
      --out /tmp/freshper_standin
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

import jax
import numpy as np

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.eval import seed_interval
from fresh_rl.llm import replay_trainer as rt
from fresh_rl.llm.checkpoint import add_model_flag, load_hf_model
from fresh_rl.llm.presets import FRESHPER_SCALES as SCALES
from fresh_rl.llm.presets import BPE_TASKS, RESULTS, SYNC, FreshPERScale, load_params, model_folder
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.provenance import provenance, write_csv
from fresh_rl.sweep.checkpoint import RunCheckpointer
from fresh_rl.sweep.integrity import tree_checksum
from fresh_rl.sweep.study_cli import NO_CHECKED, add_preset_arguments, chosen_preset, start_study

Scale = FreshPERScale
# npz runs written before the metric renames load under the current names
RENAMED_METRICS = {"lag_mean": "lag/version_gap_mean", "lag_max": "lag/version_gap_max"}


def run_method(scale: Scale, task: str, env, method: str, replay_config, params, model_config,
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


def summarise(results: dict, scale: Scale):
    curves, final, taus, ess_rows, fits = [], [], [], [], []
    third = max(1, scale.iterations // 3)
    for (task, method), (history, drift, rows) in results.items():
        base_rows = np.array([tau is None or tau == replay_tau(scale, method)
                              for tau, _ in rows])
        if not base_rows.any():
            base_rows[:scale.seeds] = True
        for metric in ("success_rate", "mean_return"):
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
                for metric in ("success_rate", "mean_return"):
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
                 for metric in ("success_rate", "mean_return")]
    for row in final:
        base = next((r for r in final if r["task"] == row["task"]
                     and r["method"] == "on_policy"), None)
        for metric in ("success_rate", "mean_return"):
            ref = base[metric] if base else float("nan")
            row[f"{metric}_change_vs_on_policy"] = ((row[metric] - ref) / abs(ref)
                                                    if ref != 0 else float("nan"))
    return curves, final, taus, ess_rows, fits


def replay_tau(scale: Scale, method: str):
    return dict(scale.methods)[method].age_decay_tau


def plot(curves, taus, ess_rows, scale: Scale, out: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [t for t in scale.tasks if any(r["task"] == t for r in curves)]
    fig, axes = plt.subplots(2, len(tasks), squeeze=False, figsize=(3.8 * len(tasks), 5.6))
    for j, task in enumerate(tasks):
        for i, metric in enumerate(("success_rate", "mean_return")):
            ax = axes[i, j]
            for method, _ in scale.methods:
                rows = [r for r in curves if (r["task"], r["method"], r["metric"])
                        == (task, method, metric)]
                if rows:
                    step = [r["step"] for r in rows]
                    ax.plot(step, [r["mean"] for r in rows], label=method)
                    ax.fill_between(step, [r["low"] for r in rows], [r["high"] for r in rows],
                                    alpha=0.15)
            ax.set_title(task, fontsize=9)
            ax.set_xlabel("iteration")
            ax.set_ylabel(metric, fontsize=8)
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "learning_curves.png"), dpi=110)
    plt.close(fig)
    if taus:
        tau_tasks = [t for t in tasks if any(r["task"] == t for r in taus)]
        fig, axes = plt.subplots(1, len(tau_tasks), squeeze=False,
                                 figsize=(3.8 * len(tau_tasks), 3))
        for j, task in enumerate(tau_tasks):
            rows = [r for r in taus if r["task"] == task and r["metric"] == "mean_return"]
            labels = ["∞" if math.isinf(r["tau"]) else f"{r['tau']:g}" for r in rows]
            ax = axes[0, j]
            ax.errorbar(range(len(rows)), [r["mean"] for r in rows],
                        yerr=[[r["mean"] - r["low"] for r in rows],
                              [r["high"] - r["mean"] for r in rows]], fmt="o")
            ax.set_xticks(range(len(rows)), labels)
            ax.set_xlabel("τ (iterations)")
            ax.set_ylabel("final return", fontsize=8)
            ax.set_title(task, fontsize=9)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "tau_ablation.png"), dpi=110)
        plt.close(fig)
    if ess_rows:
        fig, axes = plt.subplots(2, len(tasks), squeeze=False, figsize=(3.8 * len(tasks), 5.6))
        for j, task in enumerate(tasks):
            for method, _ in scale.methods:
                rows = [r for r in ess_rows if (r["task"], r["method"]) == (task, method)]
                if rows:
                    axes[0, j].semilogy([r["age"] for r in rows],
                                        [r["ess_fraction"] for r in rows], "o-", label=method)
                    axes[1, j].plot([r["age"] for r in rows], [r["kl_k3"] for r in rows], "o-",
                                    label=method)
            axes[0, j].set_title(task, fontsize=9)
            axes[0, j].set_ylabel("token ESS / n", fontsize=8)
            axes[1, j].set_ylabel("KL(π_old ‖ π_θ) per token", fontsize=8)
            axes[1, j].set_xlabel("age (iterations)")
        axes[0, -1].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "ess_vs_age.png"), dpi=110)
        plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=NO_CHECKED)
    add_preset_arguments(parser, SCALES, default="ci")
    parser.add_argument("--out", default=None, help="output folder (default results/freshper[_<scale>])")
    parser.add_argument("--checkpoint", default=None,
                        help="initial parameters (default: the tiny warm start)")
    add_model_flag(parser)
    parser.add_argument("--tasks", default=None,
                        help="comma-separated subset of the scale's tasks")
    parser.add_argument("--methods", default=None,
                        help="comma-separated subset of the scale's methods")
    add_compilation_cache_flag(parser)
    args = parser.parse_args(argv)
    scale = chosen_preset(parser, args, SCALES)
    tasks = scale.tasks if args.tasks is None else tuple(args.tasks.split(","))
    methods = [m for m, _ in scale.methods] if args.methods is None else args.methods.split(",")
    unknown = sorted(set(tasks) - set(BPE_TASKS)) + sorted(set(methods) - dict(scale.methods).keys())
    if unknown:
        raise ValueError(f"unknown --tasks/--methods {unknown}; tasks {list(BPE_TASKS)}, methods "
                         f"{[m for m, _ in scale.methods]}")
    out = args.out or str(RESULTS / ("freshper" if args.scale == "cpu"
                                     else f"freshper_{args.scale.replace('-', '_')}"))
    # --tasks and --methods run parts of the same study: not part of its identity
    identity = {"study": "freshper", "scale": scale.label, "model": args.model, "checkpoint": args.checkpoint}
    start_study(parser, args, identity, out, argv, hint="choose another --out")
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    start, started = time.time(), time.perf_counter()
    log = lambda msg: print(f"[{time.time() - start:7.0f}s] {msg}", flush=True)  # noqa: E731
    envs = BPE_TASKS  # the char-vocabulary tasks (countdown included), or in the folder's tokenizer
    folder = args.model or model_folder(scale.model)  # --model, or a scale's own HF folder
    if folder:
        model_config, params, vocab = load_hf_model(folder)
        scale = dataclasses.replace(scale, model=folder)
        envs = {name: with_vocab(env, vocab) for name, env in BPE_TASKS.items()}
    else:
        model_config, params = load_params(scale.model, args.checkpoint)
    results = {}
    for task in scale.tasks:
        for method, replay_config in scale.methods:
            path = os.path.join(out, "runs", f"{task}_{method}.npz")
            if os.path.exists(path):  # finished earlier: load, never rerun
                data = np.load(path, allow_pickle=False)
                history = {RENAMED_METRICS.get(k[2:], k[2:]): data[k] for k in data.files
                           if k.startswith("h:")}
                drift = {k[2:]: data[k] for k in data.files if k.startswith("d:")}
                results[(task, method)] = (history, drift, scale.run_rows(task, method))
                continue
            if task not in tasks or method not in methods or not scale.runs(task, method):
                continue
            history, drift, rows = run_method(scale, task, envs[task], method, replay_config,
                                              params, model_config, out, log)
            np.savez(path, **{f"h:{k}": v for k, v in history.items()},
                     **{f"d:{k}": v for k, v in drift.items()})
            results[(task, method)] = (history, drift, rows)
    if not results:
        raise SystemExit("nothing to summarise")
    curves, final, taus, ess_rows, fits = summarise(results, scale)
    write_csv(os.path.join(out, "curves.csv"), curves)
    write_csv(os.path.join(out, "final.csv"), final)
    for name, rows in (("tau_ablation.csv", taus), ("ess_vs_age.csv", ess_rows),
                       ("ess_fit.csv", fits)):
        if rows:
            write_csv(os.path.join(out, name), rows)
    plot(curves, taus, ess_rows, scale, out)
    info = provenance(command=" ".join(["python experiments/freshper.py"]
                                       + list(argv if argv is not None else sys.argv[1:])),
                      started=started)
    wall = info["wall_seconds"]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"scale": scale.label, **info,
                   "scale_config": dataclasses.asdict(scale), "tasks": {
                       k: {"class": type(v).__name__, **dataclasses.asdict(v)}
                       for k, v in envs.items() if k in scale.tasks}},
                  f, indent=1, default=str)
    log(f"wrote {out} in {wall:.0f} s")
    return out


if __name__ == "__main__":
    main()
