"""FreshPER in the LLM RL loop (arXiv 2604.16918): on-policy vs standard PER vs FreshPER.

  .venv/bin/python experiments/freshper.py --scale cpu      # the committed results
  .venv/bin/python experiments/freshper.py --scale drift    # stronger drift: search_qa, lr 1e-4, K = 4
  .venv/bin/python experiments/freshper.py --scale ci --out /tmp/freshper_ci

From the warm-started tiny LM (results/llm_warm_start/checkpoint), per task, runs the replay
trainer (fresh_rl.llm.replay_trainer: one fresh update plus K replay updates per iteration,
REINFORCE++ as in the paper) for each method, all seeds vmapped in one compiled program per
(task, method). The τ ablation runs inside the FreshPER program: τ is a state leaf of the
buffer, so every τ and seed is one row of the same vmapped run (common seeds across τ).
Writes to --out (default results/freshper for cpu, results/freshper_<scale> otherwise):

  runs/<task>_<method>.npz   per-iteration metrics [rows, iterations] (rows = seeds, or
                             τ × seeds for the ablation); a rerun skips finished runs
  checkpoints/               orbax checkpoints of unfinished runs (resume after a kill)
  curves.csv      mean and 95% seed-bootstrap interval of success and return per step
  final.csv       per (task, method): final success and return (mean of the last third of
                  the iterations), 95% interval, relative change of the return vs on-policy
                  (the paper's table)
  tau_ablation.csv, is_ablation rows in final.csv (method freshper_no_is)
  ess_vs_age.csv  per (task, method, age): token ESS/n and KL(π_old‖π_θ) of the stored
                  trajectories at the end of the run; ess_fit.csv: fitted decay rates
  learning_curves.png, tau_ablation.png, ess_vs_age.png, config.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fresh_rl.eval import seed_interval  # noqa: E402
from fresh_rl.llm import async_pipeline as ap  # noqa: E402
from fresh_rl.llm import replay_trainer as rt  # noqa: E402
from fresh_rl.llm.trainer import RLConfig  # noqa: E402
from fresh_rl.sweep.checkpoint import RunCheckpointer  # noqa: E402
from llm_warm_start import TASKS  # noqa: E402  (the warm start's task settings)
from old_logits import ROOT, load_params, write_csv  # noqa: E402
from old_logits import WARM_START  # noqa: E402, F401  (used by the tests and notebook 4)
# REINFORCE++ as the paper (batch normalisation, whitening, clip 2 as ROLL's
# example_reinforce_pp.yaml; the FreshPER configs' clip of 0.2 is not known to be the paper's).
# lr 3e-5: Adam's steps have size ≈ lr per weight whatever the gradient's scale, and on the
# 0.8M-parameter tiny model one step at 1e-4 already moved a sequence's log-prob by 3.6 nats;
# RL at 1e-3 lowered success on sokoban and arithmetic (results/old_logits/README.md, "lr").
RL_TINY = RLConfig(estimator="reinforce_pp", num_groups=4, group_size=8, learning_rate=3e-5,
                   loss="decoupled")
SYNC = ap.AsyncConfig(staleness_window=0, old_logit_route="snapshot")


@dataclasses.dataclass(frozen=True)
class Scale:
    """``methods``: name → replay settings; ``taus``: the τ ablation rows of "freshper" on
    the ``tau_ablation_tasks`` (None: every task); ``task_methods``: the methods run on a
    task (None: all)."""

    rl: RLConfig
    tasks: tuple[str, ...]
    methods: tuple[tuple[str, rt.LLMReplayConfig], ...]
    taus: tuple[float, ...]
    seeds: int
    iterations: int
    model: str = "tiny"
    tau_ablation_tasks: tuple[str, ...] | None = None
    task_methods: dict[str, tuple[str, ...]] | None = None

    def ablates_tau(self, task: str, method: str) -> bool:
        return bool(method == "freshper" and self.taus and (
            self.tau_ablation_tasks is None or task in self.tau_ablation_tasks))

    def runs(self, task: str, method: str) -> bool:
        return self.task_methods is None or method in self.task_methods.get(
            task, tuple(dict(self.methods)))


def methods_for(tau: float, replay_updates: int, capacity: int):
    base = rt.LLMReplayConfig(replay_updates=replay_updates, capacity=capacity,
                              age_decay_tau=tau)
    return (("on_policy", dataclasses.replace(base, replay_updates=0, sampling="uniform")),
            ("per", dataclasses.replace(base, sampling="per")),
            ("freshper", base),
            ("freshper_no_is", dataclasses.replace(base, importance_correction=False)),
            ("freshper_auto_tau", dataclasses.replace(base, auto_tau=True)))


SCALES = {
    "ci": Scale(rl=dataclasses.replace(RL_TINY, num_groups=2, group_size=4),
                tasks=("arithmetic",),
                methods=methods_for(tau=4.0, replay_updates=1, capacity=32)[:3],
                taus=(), seeds=2, iterations=3),
    # τ = ∞ is standard PER exactly (tests/test_llm_replay.py), so the "per" rows stand for it.
    # The 2-core budget: the τ, IS and auto-τ ablations on sokoban only (the τ ablation alone
    # is 4 × the cost of a method); the headline three methods on every task.
    "cpu": Scale(rl=dataclasses.replace(RL_TINY, num_groups=2), tasks=(
        "sokoban", "frozenlake", "arithmetic", "search_qa"), methods=methods_for(8.0, 1, 256),
                 taus=(2.0, 8.0, 32.0), seeds=5, iterations=16, tau_ablation_tasks=("sokoban",),
                 task_methods={t: ("on_policy", "per", "freshper")
                               for t in ("frozenlake", "arithmetic", "search_qa")}),
    # The stronger-drift diagnostic of the cpu verdicts (the policy barely moved there): the
    # fastest-drifting task, lr 1e-4 (the highest the old-logits probe found harmless),
    # K = 4 replay updates per iteration, 32 iterations.
    "drift": Scale(rl=dataclasses.replace(RL_TINY, num_groups=2, learning_rate=1e-4),
                   tasks=("search_qa",), methods=methods_for(8.0, 4, 256)[:3], taus=(),
                   seeds=5, iterations=32),
    "paper": Scale(rl=dataclasses.replace(RL_TINY, num_groups=128, group_size=8,
                                          learning_rate=1e-6, minibatches=4),
                   tasks=tuple(TASKS), methods=methods_for(500.0, 1, 50_000),
                   taus=(100.0, 250.0, 500.0, 1000.0, math.inf), seeds=5, iterations=300,
                   model="qwen2.5-0.5b"),
}


def run_rows(scale: Scale, task: str, method: str) -> list[tuple[float, int]]:
    """(τ, seed) of every vmapped row of a run: the τ ablation rows for "freshper"."""
    taus = scale.taus if scale.ablates_tau(task, method) else (None,)
    return [(tau, seed) for tau in taus for seed in range(scale.seeds)]


def run_method(scale: Scale, task: str, method: str, replay_config, params, model_config,
               out: str, log):
    """One vmapped run (all rows); its history and the ESS-vs-age statistics of the final
    buffers. Resumes from ``out/checkpoints`` after an interruption."""
    env, rows = TASKS[task], run_rows(scale, task, method)
    state = rt.init_state(scale.rl, SYNC, replay_config, params, env)
    if scale.ablates_tau(task, method):
        state = rt.set_initial_tau(state, replay_config, scale.rl.batch_size,
                                   [tau for tau, _ in rows])
    else:
        state = jax.tree_util.tree_map(lambda x: jnp.stack([x] * len(rows)), state)
    seed_keys = jnp.stack([jax.random.PRNGKey(seed) for _, seed in rows])
    checkpointer = RunCheckpointer(os.path.join(out, "checkpoints", f"{task}_{method}"),
                                   fingerprint=repr((scale, task, method)))
    start = time.time()
    state, history = rt.train_loop(
        scale.rl, SYNC, replay_config, None, scale.iterations, params=params, env=env,
        model_config=model_config, num_seeds=len(rows), seed_keys=seed_keys, state=state,
        checkpointer=checkpointer, checkpoint_every=5)
    drift = jax.jit(jax.vmap(lambda p, r, now: rt.drift_by_age(
        p, r, config=scale.rl, model_config=model_config, now=now)))(
        state.pipeline.train.params, state.replay, state.pipeline.ring.latest_version)
    drift = {k: np.asarray(v) for k, v in drift.items()}
    log(f"{task}/{method}: {time.time() - start:.0f} s, final success "
        f"{history['success_rate'][:, -max(1, scale.iterations // 3):].mean():.3f}")
    return history, drift, rows


def ess_by_age(drift: dict, row_mask) -> list[dict]:
    """Token ESS/n and token-weighted KL (k1, k3) of the stored trajectories grouped by age
    (pooled over the rows in ``row_mask``)."""
    valid = drift["valid"] & row_mask[:, None]
    out = []
    for age in np.unique(drift["age"][valid]):
        sel = valid & (drift["age"] == age)
        s, s2, n = drift["ratio_sum"][sel].sum(), drift["ratio_sq_sum"][sel].sum(), \
            drift["tokens"][sel].sum()
        out.append({"age": int(age), "trajectories": int(sel.sum()), "tokens": int(n),
                    "ess_fraction": float(s * s / max(n * s2, 1e-30)),
                    **{k: float(np.average(drift[k][sel], weights=drift["tokens"][sel]))
                       for k in ("kl_k1", "kl_k3")}})
    return out


def fit_decay(points: list[dict]) -> dict:
    """Least squares through the origin of −log(ESS/n) = λ·age and KL = κ·age."""
    age = np.array([p["age"] for p in points], float)
    w = np.array([p["trajectories"] for p in points], float)
    neg_log_ess = -np.log(np.clip([p["ess_fraction"] for p in points], 1e-12, 1.0))
    kl = np.array([p["kl_k3"] for p in points])
    denom = max(float(np.sum(w * age * age)), 1e-12)
    lam = float(np.sum(w * age * neg_log_ess) / denom)
    kappa = float(np.sum(w * age * kl) / denom)
    return {"ess_decay_rate": lam, "tau_from_ess": 1.0 / lam if lam > 0 else math.inf,
            "kl_per_version": kappa, "tau_from_kl": 1.0 / kappa if kappa > 0 else math.inf}


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
        points = ess_by_age(drift, base_rows)
        ess_rows += [{"task": task, "method": method, **p} for p in points]
        if points:
            fits.append({"task": task, "method": method, **fit_decay(points)})
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
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="ci")
    parser.add_argument("--out", default=None, help="output folder (default results/freshper[_<scale>])")
    parser.add_argument("--checkpoint", default=None,
                        help="initial parameters (default: the tiny warm start)")
    parser.add_argument("--tasks", default=None,
                        help="comma-separated subset of the scale's tasks")
    parser.add_argument("--methods", default=None,
                        help="comma-separated subset of the scale's methods")
    args = parser.parse_args(argv)
    scale = SCALES[args.scale]
    tasks = scale.tasks if args.tasks is None else tuple(args.tasks.split(","))
    methods = [m for m, _ in scale.methods] if args.methods is None else args.methods.split(",")
    unknown = sorted(set(tasks) - set(TASKS)) + sorted(set(methods) - dict(scale.methods).keys())
    if unknown:
        raise ValueError(f"unknown --tasks/--methods {unknown}; tasks {list(TASKS)}, methods "
                         f"{[m for m, _ in scale.methods]}")
    out = args.out or os.path.join(ROOT, "results", "freshper" if args.scale == "cpu"
                                   else f"freshper_{args.scale}")
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    start = time.time()
    log = lambda msg: print(f"[{time.time() - start:7.0f}s] {msg}", flush=True)  # noqa: E731
    model_config, params = load_params(scale, args.checkpoint)
    results = {}
    for task in scale.tasks:
        for method, replay_config in scale.methods:
            path = os.path.join(out, "runs", f"{task}_{method}.npz")
            if os.path.exists(path):  # finished earlier: load, never rerun
                data = np.load(path, allow_pickle=False)
                history = {k[2:]: data[k] for k in data.files if k.startswith("h:")}
                drift = {k[2:]: data[k] for k in data.files if k.startswith("d:")}
                results[(task, method)] = (history, drift, run_rows(scale, task, method))
                continue
            if task not in tasks or method not in methods or not scale.runs(task, method):
                continue
            history, drift, rows = run_method(scale, task, method, replay_config, params,
                                              model_config, out, log)
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
    wall = time.time() - start
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"scale": args.scale, "command": " ".join(["experiments/freshper.py"]
                                                            + (argv or sys.argv[1:])),
                   "wall_seconds": wall, "machine": f"{platform.machine()}, "
                   f"{os.cpu_count()} CPU cores, {platform.platform()}, jax {jax.__version__} "
                   f"on {jax.default_backend()}",
                   "scale_config": dataclasses.asdict(scale), "tasks": {
                       k: {"class": type(v).__name__, **dataclasses.asdict(v)}
                       for k, v in TASKS.items() if k in scale.tasks}},
                  f, indent=1, default=str)
    log(f"wrote {out} in {wall:.0f} s")
    return out


if __name__ == "__main__":
    main()
