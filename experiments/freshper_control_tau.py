"""FreshPER as its authors run it in control, τ in absolute versions, learning rates tuned apart.

Trainer :func:`fresh_rl.control.train.train` (data source ``replay_freshper``: every replay
method is a row of traced leaves; method ``ppo_clip``, one full-batch fresh step per iteration,
actors at lag 0, K = 2 extra updates, replay updates on an Adam state of their own). Arms:
on-policy, 1 + K epochs (matched updates), uniform replay, ``per_authors`` (new rows at the
running max priority, sampled rows refreshed; τ = ∞) and ``freshper_authors`` (that pipeline plus
p·exp(−age/τ)) at τ ∈ {1, 3, 10, 30, 100} versions. One version per iteration; the buffer spans
300 versions (≥ 10 τ for τ ≤ 30, the τ the claims use) and runs of 400 fill it.

Two stages per task, each a resumable :func:`fresh_rl.sweep.run_stage`:

1. *tuning* (seeds 0–4): every arm × the learning-rate grid; each arm keeps the rate with the best
   mean learner return over the run's evaluations. Its on-policy rows are the drift pilot:
   per-step and per-row (trajectory) ESS/n of the stored rows against the learner, by age, each
   fitted by exp(−age/τ);
2. *scoring* (seeds 5–14): every arm at its tuned rate.

Outputs in ``results/freshper_control_tau/``: ``runs.csv``, ``tuning.csv``, ``ess_vs_age.csv``,
``sampled_age.csv``, ``score_vs_tau.{csv,png}``, ``ess_vs_age.png``, ``config.json``,
``README.md``; the claims (experiments/claims/freshper_control_tau.toml) are decided by
experiments/verdicts.py.

    python experiments/freshper_control_tau.py --scale ci   # the tests
    python experiments/freshper_control_tau.py --scale cpu  # CartPole-v1 + Acrobot-v1, 5 + 10 seeds
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from pathlib import Path

import numpy as np

from fresh_rl.control.config import TrainConfig
from fresh_rl.control.data_sources import ReplaySettings
from fresh_rl.control.hyperparams import replay_grid
from fresh_rl.control.train import train
from fresh_rl.eval import eval_mean_score
from fresh_rl.lag import fit_ess_time_constant
from fresh_rl.presets import Preset, named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_csv
from fresh_rl.replay.methods import replay_hparams
from fresh_rl.report import histogram_mean, interval, interval_text, plot_score_vs_tau, position_on_grid
from fresh_rl.sweep import output_lock, product_grid, run_stage
from fresh_rl.sweep.study_cli import study_main

RESULTS = REPOSITORY_ROOT / "results" / "freshper_control_tau"
CONTROLS = ("onpolicy", "onpolicy_epochs", "uniform", "per_authors")
KEEP = ("eval/return_deterministic", "eval/valid", "drift/ess", "drift/ess_row", "drift/kl")


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    configs: tuple[TrainConfig, ...]
    learning_rates: tuple[float, ...]
    tuning_seeds: int
    scoring_seeds: int
    taus: tuple[float, ...]


def _config(env_name, envs, steps, iterations, buffer, every, episodes) -> TrainConfig:
    return TrainConfig(env_name=env_name, num_envs=envs, rollout_length=steps,
                       total_env_steps=envs * steps * iterations, num_epochs=1, num_minibatches=1,
                       method="ppo_clip", eval_every=every, eval_episodes=episodes,
                       data_source="replay_freshper",
                       replay=ReplaySettings(extra_updates=2, buffer_iterations=buffer, drift_every=every))


SCALES = named({
    "ci": Scale((_config("CartPole-v1", 4, 16, 20, 8, 5, 2),), (1e-3, 3e-3), 1, 2, (1.0, 3.0)),
    "cpu": Scale(tuple(_config(env, 8, 64, 400, 300, 25, 8) for env in ("CartPole-v1", "Acrobot-v1")),
                 (1e-3, 3e-3, 1e-2), 5, 10, (1.0, 3.0, 10.0, 30.0, 100.0)),
})


def arms(scale: Scale) -> dict[str, tuple[str, float]]:
    """Arm name → (registry method, τ in versions; ∞ for the arms without decay)."""
    out = {name: (name, math.inf) for name in CONTROLS}
    out.update({f"freshper_authors_tau{tau:g}": ("freshper_authors", tau) for tau in scale.taus})
    return out


def train_kept(config: TrainConfig, key, hp) -> dict:
    out = train(config, key, hp)
    return {**{k: out.metrics[k] for k in KEEP}, "sampled_age_counts": out.state.replay.sampled_age_counts,
            "num_updates": out.state.num_updates}


def run_arms(config, scale, grid, lrs, out_dir, stage, chunk):
    """``train_kept`` over ``grid`` (rows with an ``arm``) at learning rates ``lrs[i]``."""
    named = arms(scale)
    rows = [replay_hparams(named[r["arm"]][0], named[r["arm"]][1], "separate") for r in grid.rows]
    hp = replay_grid(config, rows, {"learning_rate": list(lrs)})
    return run_stage(functools.partial(train_kept, config), grid.keys, hp,
                     directory=out_dir / "runs" / f"{config.env_name}-{stage}",
                     fingerprint=f"{stage} {config!r} seeds={[r['seed'] for r in grid.rows]} "
                                 f"arms={[r['arm'] for r in grid.rows]} lrs={list(lrs)}",
                     chunk_size=chunk, label=f"{config.env_name} {stage}")


def drift_curves(config: TrainConfig, out: dict, lrs, n: int) -> dict:
    """Per lr: seed- and snapshot-mean per-step / per-row ESS/n and KL by age of the on-policy
    tuning runs (the first ``n · len(lrs)`` rows), and their τ fits. The row fit uses ages
    whose ESS/n ≥ 2/num_envs (our choice: one age holds num_envs rows, so 1/num_envs is the
    floor of a fully degenerate weight set)."""
    curves = {}
    for i, lr in enumerate(lrs):
        part = {k: out[f"drift/{k}"][i * n:(i + 1) * n] for k in ("ess", "ess_row", "kl")}
        mean = {k: np.nanmean(np.where(v >= 0, v, np.nan), axis=(0, 1)) for k, v in part.items()}
        ages = np.arange(mean["ess"].size)
        curves[lr] = {**mean, "tau_step": fit_ess_time_constant(ages, mean["ess"]),
                      "tau_trajectory": fit_ess_time_constant(ages, mean["ess_row"], 2 / config.num_envs)}
    return curves


def run_task(config: TrainConfig, scale: Scale, out_dir: Path, seed: int) -> dict:
    named, lrs, n = arms(scale), scale.learning_rates, scale.tuning_seeds
    chunk = n * len(lrs)
    grid = product_grid(n, seed, arm=list(named), learning_rate=lrs)
    tuning, tuning_seconds = run_arms(config, scale, grid, [r["learning_rate"] for r in grid.rows],
                                      out_dir, "tuning", chunk)
    mean = eval_mean_score(tuning["eval/return_deterministic"], tuning["eval/valid"])
    tuned = mean.reshape(len(named), len(lrs), n).mean(-1)
    picked = {arm: lrs[int(np.argmax(tuned[a]))] for a, arm in enumerate(named)}
    scoring_grid = product_grid(scale.scoring_seeds, seed + n, arm=list(named))
    scoring, scoring_seconds = run_arms(config, scale, scoring_grid, [picked[r["arm"]] for r in scoring_grid.rows],
                                        out_dir, "scoring", chunk)
    return {"config": config, "tuned": tuned, "picked": picked, "grid": scoring_grid, "out": scoring,
            "drift": drift_curves(config, tuning, lrs, n), "seconds": (tuning_seconds, scoring_seconds)}


def tables(scale: Scale, results: dict) -> dict[str, list[dict]]:
    """The study's CSV tables (name → rows) from :func:`run_task`'s results per task."""
    named, lrs, t = arms(scale), scale.learning_rates, {}
    for env, res in results.items():
        out, picked = res["out"], res["picked"]
        final = out["eval/return_deterministic"][:, -1]
        mean = eval_mean_score(out["eval/return_deterministic"], out["eval/valid"])
        t.setdefault("runs", []).extend(
            {"task": env, "arm": r["arm"], "method": named[r["arm"]][0], "tau": named[r["arm"]][1],
             "learning_rate": picked[r["arm"]], "seed": r["seed"], "final_return": float(final[i]),
             "mean_eval_return": float(mean[i]), "mean_sampled_age": histogram_mean(out["sampled_age_counts"][i]),
             "num_updates": int(out["num_updates"][i])} for i, r in enumerate(res["grid"].rows))
        t.setdefault("tuning", []).extend(
            {"task": env, "arm": arm, "method": named[arm][0], "tau": named[arm][1], "learning_rate": lr,
             "tuning_seeds": scale.tuning_seeds, "mean_eval_return": float(res["tuned"][a, li]),
             "picked": lr == picked[arm]} for a, arm in enumerate(named) for li, lr in enumerate(lrs))
        t.setdefault("ess_vs_age", []).extend(
            {"task": env, "learning_rate": lr, "age": a, "ess_fraction": float(d["ess_row"][a]),
             "ess_step_fraction": float(d["ess"][a]), "kl": float(d["kl"][a]),
             "tau_trajectory": d["tau_trajectory"], "tau_step": d["tau_step"]}
            for lr, d in res["drift"].items() for a in range(d["ess"].size))
        counts = out["sampled_age_counts"].reshape(len(named), scale.scoring_seeds, -1).sum(1)
        t.setdefault("sampled_age", []).extend(
            {"task": env, "arm": arm, "method": named[arm][0], "learning_rate": picked[arm], "age": a,
             "fraction": float(counts[i, a] / max(counts[i].sum(), 1))}
            for i, arm in enumerate(named) if named[arm][0] not in ("onpolicy", "onpolicy_epochs")
            for a in range(counts.shape[-1]))
        per_age = histogram_mean(counts[list(named).index("per_authors")])
        buffer = res["config"].replay.buffer_iterations
        for arm in named:
            rows = [r for r in t["runs"] if r["task"] == env and r["arm"] == arm]
            m, f = interval([r["mean_eval_return"] for r in rows]), interval([r["final_return"] for r in rows])
            age, tau = histogram_mean(counts[list(named).index(arm)]), named[arm][1]
            t.setdefault("score_vs_tau", []).append(
                {"task": env, "arm": arm, "tau": tau, "learning_rate": picked[arm], "mean": m[0],
                 "mean_low": m[1], "mean_high": m[2], "final": f[0], "final_low": f[1], "final_high": f[2],
                 "sampled_age": age, "buffer_over_tau": buffer / tau if math.isfinite(tau) else 0.0,
                 "age_gap_vs_per": abs(age - per_age) / max(per_age, 1e-12)})
    return t


def write_readme(scale: Scale, results: dict, t: dict, out_dir: Path, header: dict) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    named, lrs, seed = arms(scale), scale.learning_rates, header["seed"]
    tau_arms = [a for a in named if named[a][0] == "freshper_authors"] + ["per_authors"]
    figs = {name: plt.subplots(1, len(results), figsize=(5.5 * len(results), 4), squeeze=False)
            for name in ("score_vs_tau", "ess_vs_age")}
    drift_lines, score_lines, rule_lines, reading = [], [], [], []
    for c, (env, res) in enumerate(results.items()):
        table = {r["arm"]: r for r in t["score_vs_tau"] if r["task"] == env}
        plot_score_vs_tau(figs["score_vs_tau"][1][0, c], scale.taus, [table[a] for a in tau_arms],
                          {a: table[a]["mean"] for a in ("onpolicy", "onpolicy_epochs", "uniform")},
                          f"{env}: learner return, mean over evaluations")
        ax = figs["ess_vs_age"][1][0, c]
        for lr, d in res["drift"].items():
            line, = ax.plot(d["ess_row"], label=f"lr {lr}: per row (τ {d['tau_trajectory']:.1f})")
            ax.plot(d["ess"], ":", color=line.get_color(), label=f"lr {lr}: per step (τ {d['tau_step']:.1f})")
            drift_lines.append(f"| {env} | {lr} | {d['tau_trajectory']:.1f} | {d['tau_step']:.1f} | "
                               f"{d['ess_row'][min(10, d['ess'].size - 1)]:.3f} | "
                               f"{d['ess'][min(10, d['ess'].size - 1)]:.3f} | {d['kl'][min(10, d['ess'].size - 1)]:.3f} |")
        ax.set(title=env, xlabel="age (versions)", ylabel="ESS/n of stored rows (on-policy tuning runs)",
               xscale="symlog")
        ax.legend(fontsize=7)
        fresh_lr = max(set(res["picked"][a] for a in tau_arms[:-1]),
                       key=[res["picked"][a] for a in tau_arms[:-1]].count)
        d = res["drift"][fresh_lr]
        score_lines += [f"| {env} | {a} | {r['learning_rate']} | {interval_text(r['mean'], r['mean_low'], r['mean_high'])} "
                        f"| {interval_text(r['final'], r['final_low'], r['final_high'])} | {r['sampled_age']:.1f} | "
                        + (f"{r['buffer_over_tau']:.0f} | {100 * r['age_gap_vs_per']:.0f}% |" if a in tau_arms else " | |")
                        for a, r in table.items()]
        rule_lines.append(f"- {env}, at lr {fresh_lr} (the rate most FreshPER arms were tuned to): τ_ESS from "
                          f"per-row weights {d['tau_trajectory']:.1f} {position_on_grid(d['tau_trajectory'], scale.taus)}, "
                          f"from per-step weights {d['tau_step']:.1f} {position_on_grid(d['tau_step'], scale.taus)}; the "
                          f"authors' default 500 {position_on_grid(500.0, scale.taus)}; their capacity/(2·batch) "
                          f"heuristic {res['config'].replay.buffer_iterations / 2:g} "
                          f"{position_on_grid(res['config'].replay.buffer_iterations / 2, scale.taus)}.")
        scores = {a: table[a]["mean"] for a in tau_arms}
        best = max(tau_arms, key=scores.get)
        reading.append(f"- {env}: seed-mean return against τ is highest at `{best}` ({scores[best]:.1f}; PER, τ = ∞: "
                       f"{scores['per_authors']:.1f}; τ = {scale.taus[0]:g}: {scores[tau_arms[0]]:.1f}); on-policy "
                       f"{table['onpolicy']['mean']:.1f}, 1 + K epochs {table['onpolicy_epochs']['mean']:.1f}, uniform "
                       f"{table['uniform']['mean']:.1f}.")
    for name, (fig, _) in figs.items():
        fig.tight_layout()
        fig.savefig(out_dir / f"{name}.png", dpi=110)
        plt.close(fig)
    c0 = scale.configs[0]
    stages = ", ".join(f"{env} tuning {r['seconds'][0]:.0f} s, scoring {r['seconds'][1]:.0f} s"
                       for env, r in results.items())
    text = [
        "# FreshPER as its authors run it, in control, τ in versions", "", provenance_line(header),
        f"Stage wall times (the invocation that computed each; compilation included): {stages}.", "",
        f"Setup: `ppo_clip`, {c0.num_envs} envs × T = {c0.rollout_length} per iteration (one policy version), "
        f"{c0.num_iterations} iterations, 1 fresh full-batch step + K = {c0.replay.extra_updates} extra updates "
        f"(replay on its own Adam state), buffer of {c0.replay.buffer_iterations} versions, priority "
        f"`{c0.replay.priority}`, α = {c0.replay.priority_exponent}, IS β = {c0.replay.importance_exponent}; "
        f"learner evaluation every {c0.eval_every} iterations ({c0.eval_episodes} deterministic episodes). "
        f"Learning-rate grid {list(lrs)} for every arm, picked per task on tuning seeds {seed}–"
        f"{seed + scale.tuning_seeds - 1} by mean evaluation return, scored on seeds {seed + scale.tuning_seeds}–"
        f"{seed + scale.tuning_seeds + scale.scoring_seeds - 1}.", "",
        "## Drift of stored data (on-policy tuning runs)", "",
        "| task | lr | τ from per-row (trajectory) ESS | τ from per-step ESS | row ESS/n at age 10 | "
        "step ESS/n at 10 | KL at 10 |", "|---|---|---|---|---|---|---|", *drift_lines, "",
        "Fits: least squares of log ESS/n on age through the origin, per-step over ESS/n ≥ 0.05, per-row "
        f"over ESS/n ≥ 2/{c0.num_envs} (one age holds {c0.num_envs} rows, so 1/{c0.num_envs} is a fully "
        "degenerate set). `ess_vs_age.csv`, `ess_vs_age.png`.", "",
        "## Scores (scoring seeds, tuned lr, 95% Student-t intervals)", "",
        "| task | arm | tuned lr | mean return over evaluations | final return | mean sampled age | "
        "buffer span / τ | sampled-age gap to per_authors |", "|---|---|---|---|---|---|---|---|",
        *score_lines, "",
        "The sampled-age gap is the gate of every FreshPER-vs-PER cell (≥ 20%); the claims use τ ≤ 30 "
        "(buffer ≥ 10 τ). `score_vs_tau.png`; tuning means: `tuning.csv`.", "",
        "Where the rules for τ fall on the grid:", "", *rule_lines, "",
        "## Reading", "", *reading, "",
        "## Verdicts", "",
        "Decided in [results/VERDICTS.md](../VERDICTS.md#freshper_control_tau) by `python experiments/verdicts.py` "
        "from `runs.csv`, `tuning.csv`, `ess_vs_age.csv`, `sampled_age.csv` and "
        "experiments/claims/freshper_control_tau.toml: one pooled Student-t test per claim over its cells "
        "(seed-paired mean return), the cells Holm-corrected.",
    ]
    (out_dir / "README.md").write_text("\n".join(text) + "\n")
    return "\n".join(text)


def run(scale: Scale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started, out_dir = time.perf_counter(), Path(out_dir)
    with output_lock(out_dir):
        results = {c.env_name: run_task(c, scale, out_dir, seed) for c in scale.configs}
        t = tables(scale, results)
        for name, rows in t.items():
            write_csv(out_dir / f"{name}.csv", rows)
        header = {**provenance(started=started), "seed": seed}
        (out_dir / "config.json").write_text(json.dumps(
            {"scale": scale.label, "configs": [repr(c) for c in scale.configs],
             "learning_rates": scale.learning_rates, "tuning_seeds": scale.tuning_seeds,
             "scoring_seeds": scale.scoring_seeds, "taus": scale.taus,
             "picked_learning_rates": {env: r["picked"] for env, r in results.items()}, **header}, indent=1) + "\n")
        return write_readme(scale, results, t, out_dir, header)


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
