"""FreshPER as its authors run it in the LLM RL loop (``experiments/freshper_llm.py``, arXiv
2604.16918): one arm's vmapped run with its held-out scores and final-buffer drift, the study's
tables, its figure and its README lines.

An arm is one program of :func:`fresh_rl.llm.replay_trainer.train_loop` whose rows are the
scale's (τ, seed) pairs (:meth:`fresh_rl.llm.presets.FreshPERScale.run_rows`), saved as
``runs/<arm>.npz`` once finished and checkpointed every 5 iterations before that.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import jax
import numpy as np

from fresh_rl.eval import seed_interval
from fresh_rl.lag import fit_ess_time_constant
from fresh_rl.llm import replay_trainer as rt
from fresh_rl.llm.evaluation import EVAL_SEED, EvalTask, make_evaluator
from fresh_rl.llm.presets import SYNC, FreshPERScale
from fresh_rl.report import grouped, interval, interval_text, markdown_table, position_on_grid, save_panels
from fresh_rl.sweep import saved_arrays
from fresh_rl.sweep.checkpoint import RunCheckpointer
from fresh_rl.sweep.integrity import tree_checksum
from fresh_rl.sweep.keys import seed_key


def run_arm(scale: FreshPERScale, task: str, method: str, replay_config, params, model_config, env,
            out: Path) -> dict:
    """One arm on ``task``, all rows vmapped: its history, held-out success per row, final-buffer
    drift; saved as ``runs/<method>.npz`` (checkpoints in ``checkpoints/<method>``)."""
    def train() -> dict:
        rows = scale.run_rows(task, method)
        state = None
        if scale.ablates_tau(task, method):
            state = rt.set_initial_tau(rt.init_state(scale.rl, SYNC, replay_config, params, env),
                                       replay_config, scale.rl.batch_size, [tau for tau, _ in rows])
        checkpointer = RunCheckpointer(out / "checkpoints" / method,
                                       fingerprint=repr((scale, method, tree_checksum(params))))
        started = time.perf_counter()
        state, history = rt.train_loop(scale.rl, SYNC, replay_config, [seed for _, seed in rows],
                                       scale.iterations, params=params, env=env, model_config=model_config,
                                       state=state, checkpointer=checkpointer, checkpoint_every=5,
                                       log=lambda i, m: print(f"[{method}] iteration {i + 1}/{scale.iterations}: "
                                                              f"success {np.mean(m['success_rate']):.3f}, "
                                                              f"{time.perf_counter() - started:.0f} s", flush=True))
        seconds = time.perf_counter() - started
        evaluate = make_evaluator(EvalTask(scale.rl, env, scale.eval_episodes), model_config)
        final = state.pipeline.train.params
        held_out = [float(np.mean(evaluate(jax.tree.map(lambda x: x[i], final), seed_key(EVAL_SEED))))
                    for i in range(len(rows))]
        # one row at a time: a forward over a whole buffer per row is already GBs (vmapped, the 10 τ rows OOM)
        drift_of = jax.jit(lambda p, r, now: rt.drift_by_age(p, r, config=scale.rl, model_config=model_config, now=now))
        per_row = [jax.device_get(drift_of(*jax.tree.map(lambda x: x[i], (final, state.replay,
                                                                           state.pipeline.ring.latest_version))))
                   for i in range(len(rows))]
        drift = {k: np.stack([d[k] for d in per_row]) for k in per_row[0]}
        return {**{f"h:{k}": np.asarray(v) for k, v in history.items()},
                **{f"d:{k}": np.asarray(v) for k, v in drift.items()},
                "held_out": np.asarray(held_out), "tau": np.asarray([math.inf if t is None else t for t, _ in rows]),
                "seed": np.asarray([s for _, s in rows]), "seconds": np.asarray(seconds)}

    return saved_arrays(out / "runs" / f"{method}.npz", train)


def arm_name(method: str, tau: float) -> str:
    """An arm's name in the tables: the method, with its τ for ``freshper_authors``."""
    return f"{method}_tau{tau:g}" if method == "freshper_authors" else method


def tables(scale: FreshPERScale, arms: dict) -> dict[str, list[dict]]:
    """The study's CSV tables (name → rows) from :func:`run_arm`'s arrays per method: ``runs``,
    ``curves`` (training success per iteration, 95% Student-t over seeds), ``ess_vs_age`` and
    ``ess_fit`` (token and sequence ESS/n of PER's final buffers by age, their τ fits)."""
    third = max(1, scale.iterations // 3)
    t = {"runs": [], "curves": [], "ess_vs_age": [], "ess_fit": []}
    for method, data in arms.items():
        success = data["h:success_rate"]
        for i, (tau, seed) in enumerate(zip(data["tau"], data["seed"])):
            t["runs"].append({"arm": arm_name(method, tau), "method": method, "tau": float(tau), "seed": int(seed),
                              "held_out_success": float(data["held_out"][i]),
                              "train_success_last_third": float(success[i, -third:].mean()),
                              "mean_sampled_age": float(data["h:replay/age_mean"][i].mean()),
                              "seconds_per_iteration": float(data["seconds"]) / scale.iterations})
        for tau in np.unique(data["tau"]):
            m, lo, hi = seed_interval(success[data["tau"] == tau], axis=0)
            t["curves"] += [{"arm": arm_name(method, tau), "iteration": j, "train_success": float(m[j]),
                             "low": float(lo[j]), "high": float(hi[j])} for j in range(success.shape[1])]
        if method == "per_authors":  # the drift of stored data: every age stays in PER's buffer
            drift = {k[2:]: data[k] for k in data if k.startswith("d:")}
            points = rt.ess_by_age(drift, np.ones(len(data["seed"]), bool))
            t["ess_vs_age"] = points
            ages = np.array([p["age"] for p in points], float)
            t["ess_fit"] = [{"weights": name, "tau_ess": fit_ess_time_constant(ages, [p[key] for p in points])}
                            for name, key in (("token", "ess_fraction"), ("sequence", "sequence_ess_fraction"))]
    return t


def plot_curves(path: Path, scale: FreshPERScale, t: dict) -> None:
    """Training-pool success per arm against the iteration (seed mean, 95% band) and the ESS/n of
    PER's final buffers by age, the FreshPER arms' τ as grey lines."""
    def draw(ax, title):
        if title == "training-pool success":
            for arm, rows in grouped(t["curves"], ("arm",)).items():
                ax.plot([r["iteration"] for r in rows], [r["train_success"] for r in rows], label=arm[0])
                ax.fill_between([r["iteration"] for r in rows], [r["low"] for r in rows], [r["high"] for r in rows],
                                alpha=0.15)
            return ax.set(xlabel="iteration (policy version)", ylabel="training-pool success (seed mean, 95% t)")
        for key, label in (("ess_fraction", "token"), ("sequence_ess_fraction", "sequence")):
            ax.plot([p["age"] for p in t["ess_vs_age"]], [p[key] for p in t["ess_vs_age"]], "o-", label=label)
        for tau in scale.taus:
            ax.axvline(tau, color="grey", lw=0.6)
        ax.set(xlabel="age (versions); grey: the τ of the FreshPER arms", ylabel="ESS/n of PER's final buffer",
               yscale="log")
        ax.legend(fontsize=7)
    save_panels(path, ["training-pool success", "drift of stored data"], draw)


def readme_lines(scale: FreshPERScale, arms: dict, t: dict) -> list[str]:
    """The README's lines after its provenance line: the setup, the score table per arm, the drift
    of stored data against the τ grid, the sizing and where the verdicts are decided."""
    by_arm = grouped(t["runs"], ("arm",))
    per_age = np.mean([r["mean_sampled_age"] for r in by_arm["per_authors",]])
    cells = []
    for (arm,), rows in by_arm.items():
        age, tau = np.mean([r["mean_sampled_age"] for r in rows]), rows[0]["tau"]
        cells.append((arm, interval_text(*interval([r["held_out_success"] for r in rows]), digits=3),
                      interval_text(*interval([r["train_success_last_third"] for r in rows]), digits=3), f"{age:.1f}",
                      f"{scale.iterations / tau if math.isfinite(tau) else 0:.1f}",
                      f"{100 * abs(age - per_age) / per_age if arm.startswith('freshper') else 0:.0f}%",
                      f"{rows[0]['seconds_per_iteration']:.1f}"))
    fits, rl = {f["weights"]: f["tau_ess"] for f in t["ess_fit"]}, scale.rl
    seconds = {m: float(d["seconds"]) for m, d in arms.items()}
    per_iteration = sum(seconds.values()) / scale.iterations
    token, sequence = fits.get("token", math.nan), fits.get("sequence", math.nan)
    return [
        "", f"Setup: REINFORCE++, lr {rl.learning_rate}, {rl.num_groups} prompts × {rl.group_size} rollouts per "
        f"iteration from a pool of {rl.prompt_pool} training prompts, K = 1 replay update of {rl.batch_size} "
        f"trajectories, {scale.iterations} iterations, a buffer holding the whole run, {scale.seeds} seeds "
        f"vmapped per arm; held-out success of each final policy on {scale.eval_episodes} held-out episodes.", "",
        *markdown_table(("arm", "held-out success", "training success, last third", "mean replayed age",
                         "run length / τ", "sampled-age gap to per_authors", "s per iteration (all rows)"), cells), "",
        f"Drift of stored data (PER's final buffers, `ess_vs_age.csv`): τ_ESS from token weights "
        f"{token:.1f} {position_on_grid(token, scale.taus)}, from sequence weights {sequence:.1f} "
        f"{position_on_grid(sequence, scale.taus)} "
        "(least squares of log ESS/n on age through the origin over ESS/n ≥ 0.05).", "",
        f"Sizing (the 2-core CPU budget of ≤ 3 h): the arms took {', '.join(f'{m} {v / 60:.0f} min' for m, v in seconds.items())} "
        f"(training with its compilation; the held-out scoring after it is not counted), "
        f"{sum(seconds.values()) / 3600:.2f} h in all, {per_iteration:.0f} s per iteration of all arms; a buffer "
        f"spanning 5 τ at the larger τ = {max(scale.taus):g} needs ≥ {5 * max(scale.taus):.0f} iterations, "
        f"≈ {5 * max(scale.taus) * per_iteration / 3600:.1f} h at that rate. Runs were shortened, not seeds.", "",
        "Verdicts: [results/VERDICTS.md](../VERDICTS.md#freshper_llm) (experiments/claims/freshper_llm.toml).",
    ]


__all__ = ["arm_name", "plot_curves", "readme_lines", "run_arm", "tables"]
