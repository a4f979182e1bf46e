"""FreshPER as its authors run it in the LLM RL loop: on-policy vs their PER vs FreshPER at two τ.

From the BPE warm start on the arithmetic task with a fixed pool of 64 training prompts (the bed
where RL learns), REINFORCE++ with one fresh and K = 1 replay update per iteration
(:mod:`fresh_rl.llm.replay_trainer`; the buffer holds the whole run). Arms: ``on_policy``
(K = 0), ``per_authors`` (new trajectories at the running max priority, sampled ones refreshed;
τ = ∞) and ``freshper_authors`` (that pipeline plus p·exp(−age/τ)) at the scale's two τ, rows of
one program with common seeds. All seeds of an arm are one vmapped program, checkpointed every
5 iterations (a rerun resumes; a finished arm is loaded from ``runs/<arm>.npz``). Every final
policy is scored on the same held-out prompts (:data:`fresh_rl.llm.evaluation.EVAL_SEED`).

Outputs (``results/freshper_llm/``): ``runs.csv`` (one row per run: arm, τ, seed, held-out
success, training success over the last third, mean replayed age, seconds per iteration),
``curves.csv``, ``ess_vs_age.csv`` (token and sequence ESS/n of PER's final buffers by age),
``ess_fit.csv``, ``learning_curves.png``, ``ess_vs_age.png``, ``config.json``, ``README.md``.
Claims: experiments/claims/freshper_llm.toml, decided by experiments/verdicts.py.

    python experiments/freshper_llm.py --scale bpe-slice-ci   # the tests (random-weight stand-in)
    python experiments/freshper_llm.py --scale bpe-slice      # the committed results (2-core CPU)
    python experiments/freshper_llm.py --scale paper-slice    # Qwen2.5-0.5B, one accelerator
      (needs the Hugging Face folder at fresh_rl.llm.presets.QWEN2_5_0_5B_FOLDER, models/Qwen2.5-0.5B)
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import jax
import numpy as np

from fresh_rl.eval import seed_interval
from fresh_rl.lag import fit_ess_time_constant
from fresh_rl.llm import replay_trainer as rt
from fresh_rl.llm.checkpoint import load_hf_model
from fresh_rl.llm.evaluation import EVAL_SEED, EvalTask, make_evaluator
from fresh_rl.llm.presets import BPE_TASKS, FRESHPER_SCALES, RESULTS, SYNC, FreshPERScale
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.provenance import provenance, provenance_line, write_csv
from fresh_rl.report import interval, interval_text, position_on_grid
from fresh_rl.sweep import output_lock, saved_arrays
from fresh_rl.sweep.checkpoint import RunCheckpointer
from fresh_rl.sweep.integrity import tree_checksum
from fresh_rl.sweep.keys import seed_key
from fresh_rl.sweep.study_cli import study_main

SCALES = {name: FRESHPER_SCALES[name] for name in ("bpe-slice", "bpe-slice-ci", "paper-slice")}
TASK = "arithmetic"


def run_arm(scale, method, replay_config, params, model_config, env, out: Path) -> dict:
    """One arm, all rows vmapped: its history, held-out success per row, final-buffer drift; saved as
    ``runs/<method>.npz`` (checkpoints in ``checkpoints/<method>``)."""
    def train() -> dict:
        rows = scale.run_rows(TASK, method)
        state = None
        if scale.ablates_tau(TASK, method):
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
        data = {**{f"h:{k}": np.asarray(v) for k, v in history.items()},
                **{f"d:{k}": np.asarray(v) for k, v in drift.items()},
                "held_out": np.asarray(held_out), "tau": np.asarray([math.inf if t is None else t for t, _ in rows]),
                "seed": np.asarray([s for _, s in rows]), "seconds": np.asarray(seconds)}
        return data

    return saved_arrays(out / "runs" / f"{method}.npz", train)


def arm_name(method: str, tau: float) -> str:
    return f"{method}_tau{tau:g}" if method == "freshper_authors" else method


def tables(scale, arms: dict) -> dict[str, list[dict]]:
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


def write_readme(scale, arms: dict, t: dict, out: Path, header: dict) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm in dict.fromkeys(r["arm"] for r in t["curves"]):
        rows = [r for r in t["curves"] if r["arm"] == arm]
        axes[0].plot([r["iteration"] for r in rows], [r["train_success"] for r in rows], label=arm)
        axes[0].fill_between([r["iteration"] for r in rows], [r["low"] for r in rows], [r["high"] for r in rows], alpha=0.15)
    axes[0].set(xlabel="iteration (policy version)", ylabel="training-pool success (seed mean, 95% t)")
    axes[0].legend(fontsize=7)
    for key, label in (("ess_fraction", "token"), ("sequence_ess_fraction", "sequence")):
        axes[1].plot([p["age"] for p in t["ess_vs_age"]], [p[key] for p in t["ess_vs_age"]], "o-", label=label)
    for tau in scale.taus:
        axes[1].axvline(tau, color="grey", lw=0.6)
    axes[1].set(xlabel="age (versions); grey: the τ of the FreshPER arms", ylabel="ESS/n of PER's final buffer",
                yscale="log")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "learning_curves.png", dpi=110)
    plt.close(fig)
    by_arm = {a: [r for r in t["runs"] if r["arm"] == a] for a in dict.fromkeys(r["arm"] for r in t["runs"])}
    per_age = np.mean([r["mean_sampled_age"] for r in by_arm["per_authors"]])
    lines = []
    for arm, rows in by_arm.items():
        h, s = interval([r["held_out_success"] for r in rows]), interval([r["train_success_last_third"] for r in rows])
        age = np.mean([r["mean_sampled_age"] for r in rows])
        tau = rows[0]["tau"]
        lines.append(f"| {arm} | {interval_text(*h, digits=3)} | {interval_text(*s, digits=3)} | "
                     f"{age:.1f} | {scale.iterations / tau if math.isfinite(tau) else 0:.1f} | "
                     f"{100 * abs(age - per_age) / per_age if arm.startswith('freshper') else 0:.0f}% | "
                     f"{rows[0]['seconds_per_iteration']:.1f} |")
    fits = {f["weights"]: f["tau_ess"] for f in t["ess_fit"]}
    rl = scale.rl
    seconds = {m: float(d["seconds"]) for m, d in arms.items()}
    per_iteration = sum(seconds.values()) / scale.iterations
    sizing = (f"Sizing (the 2-core CPU budget of ≤ 3 h): the arms took {', '.join(f'{m} {v / 60:.0f} min' for m, v in seconds.items())} "
              f"(training with its compilation; the held-out scoring after it is not counted), "
              f"{sum(seconds.values()) / 3600:.2f} h in all, {per_iteration:.0f} s per iteration of all arms; a buffer "
              f"spanning 5 τ at the larger τ = {max(scale.taus):g} needs ≥ {5 * max(scale.taus):.0f} iterations, "
              f"≈ {5 * max(scale.taus) * per_iteration / 3600:.1f} h at that rate. Runs were shortened, not seeds.")
    text = [
        "# FreshPER as its authors run it, in the LLM RL loop (BPE warm start, arithmetic)", "",
        provenance_line(header), "",
        f"Setup: REINFORCE++, lr {rl.learning_rate}, {rl.num_groups} prompts × {rl.group_size} rollouts per "
        f"iteration from a pool of {rl.prompt_pool} training prompts, K = 1 replay update of {rl.batch_size} "
        f"trajectories, {scale.iterations} iterations, a buffer holding the whole run, {scale.seeds} seeds "
        f"vmapped per arm; held-out success of each final policy on {scale.eval_episodes} held-out episodes.", "",
        "| arm | held-out success | training success, last third | mean replayed age | run length / τ | "
        "sampled-age gap to per_authors | s per iteration (all rows) |", "|---|---|---|---|---|---|---|", *lines, "",
        f"Drift of stored data (PER's final buffers, `ess_vs_age.csv`): τ_ESS from token weights "
        f"{fits.get('token', math.nan):.1f} {position_on_grid(fits.get('token', math.nan), scale.taus)}, from "
        f"sequence weights {fits.get('sequence', math.nan):.1f} {position_on_grid(fits.get('sequence', math.nan), scale.taus)} "
        "(least squares of log ESS/n on age through the origin over ESS/n ≥ 0.05).", "", sizing, "",
        "Verdicts: [results/VERDICTS.md](../VERDICTS.md#freshper_llm) (experiments/claims/freshper_llm.toml).",
    ]
    (out / "README.md").write_text("\n".join(text) + "\n")
    return "\n".join(text)


def run(scale: FreshPERScale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started, out = time.perf_counter(), Path(out_dir)
    if seed != 0:
        raise ValueError("--seed: this study's seeds are the scale's 0 … seeds − 1")
    if not Path(scale.model, "config.json").is_file():
        raise SystemExit(f"--scale {scale.label}: no Hugging Face model folder at {scale.model} (config.json "
                         "missing); put the model there first")
    model_config, params, vocab = load_hf_model(scale.model)
    env = with_vocab(BPE_TASKS[TASK], vocab)
    with output_lock(out):
        arms = {m: run_arm(scale, m, c, params, model_config, env, out) for m, c in scale.methods}
        t = tables(scale, arms)
        for name, rows in t.items():
            write_csv(out / f"{name}.csv", rows)
        header = provenance(started=started)
        (out / "config.json").write_text(json.dumps({"scale": scale.label, "scale_config": repr(scale), **header},
                                                    indent=1) + "\n")
        return write_readme(scale, arms, t, out, header)


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, RESULTS / "freshper_llm", run, argv)


if __name__ == "__main__":
    main()
