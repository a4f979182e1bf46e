"""FreshPER as its authors run it in control, τ in absolute versions, learning rates tuned apart.

Trainer :func:`fresh_rl.control.train.train` (data source ``replay_freshper``: every replay
method is a row of traced leaves; method ``ppo_clip``, one full-batch fresh step per iteration,
actors at lag 0, K = 2 extra updates, replay updates on an Adam state of their own). Arms
(:mod:`fresh_rl.studies.freshper_tau_sweep`): on-policy, 1 + K epochs (matched updates), uniform replay,
``per_authors`` (new rows at the running max priority, sampled rows refreshed; τ = ∞) and
``freshper_authors`` (that pipeline plus p·exp(−age/τ)) at τ ∈ {1, 3, 10, 30, 100} versions. One
version per iteration; the buffer spans 300 versions (≥ 10 τ for τ ≤ 30, the τ the claims use)
and runs of 400 fill it.

Two stages per task (:mod:`fresh_rl.control.freshper_tau_study`), each a resumable
:func:`fresh_rl.sweep.run_stage`:

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

import json
import time
from pathlib import Path

from fresh_rl.control.freshper_study import study_config
from fresh_rl.control.freshper_tau_study import Scale, run_task, tables
from fresh_rl.presets import named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, write_atomic, write_csv
from fresh_rl.studies import freshper_tau_sweep
from fresh_rl.report import markdown_table, plot_score_vs_tau, position_on_grid, save_panels, write_readme
from fresh_rl.sweep import output_lock
from fresh_rl.sweep.study_cli import study_main

RESULTS = REPOSITORY_ROOT / "results" / "freshper_control_tau"
SCALES = named({
    "ci": Scale((study_config("CartPole-v1", 4, 16, 20, 8, 5, 5, 2),), (1e-3, 3e-3), 1, 2, (1.0, 3.0)),
    "cpu": Scale(tuple(study_config(env, 8, 64, 400, 300, 25, 25, 8) for env in ("CartPole-v1", "Acrobot-v1")),
                 (1e-3, 3e-3, 1e-2), 5, 10, (1.0, 3.0, 10.0, 30.0, 100.0)),
})


def figures(scale: Scale, results: dict, scores: dict, out_dir: Path) -> None:
    """Score against τ (controls as lines) and the drift pilot's ESS/n by age, a panel per task."""
    on_axis = freshper_tau_sweep.tau_arms(freshper_tau_sweep.arms(scale.taus))
    save_panels(out_dir / "score_vs_tau.png", list(results), lambda ax, env: plot_score_vs_tau(
        ax, scale.taus, [scores[env][a] for a in on_axis], {a: scores[env][a]["mean"] for a in freshper_tau_sweep.CONTROLS[:3]},
        "learner return, mean over evaluations"))
    save_panels(out_dir / "ess_vs_age.png", list(results), lambda ax, env: freshper_tau_sweep.plot_ess_by_age(
        ax, results[env]["drift"], scale.taus, "ESS/n of stored rows (on-policy tuning runs)"))


def readme_lines(scale: Scale, results: dict, scores: dict, seed: int) -> list[str]:
    named, c0, drift_rows, scored, rule_lines, reading = freshper_tau_sweep.arms(scale.taus), scale.configs[0], [], [], [], []
    on_axis = freshper_tau_sweep.tau_arms(named)
    for env, res in results.items():
        table, fresh_lr, half = scores[env], freshper_tau_sweep.usual_rate(res["picked"], named), res["config"].replay.buffer_iterations / 2
        drift_rows += [(env, lr, f"{d['tau_trajectory']:.1f}", f"{d['tau_step']:.1f}",
                        *(f"{d[k][min(10, d['ess_step'].size - 1)]:.3f}" for k in ("ess_trajectory", "ess_step", "kl")))
                       for lr, d in res["drift"].items()]
        scored += freshper_tau_sweep.score_lines(table, on_axis, 1, (env,))
        d = res["drift"][fresh_lr]
        rule_lines.append(f"- {env}, at lr {fresh_lr} (the rate most FreshPER arms were tuned to): τ_ESS from "
                          f"per-row weights {d['tau_trajectory']:.1f} {position_on_grid(d['tau_trajectory'], scale.taus)}, "
                          f"from per-step weights {d['tau_step']:.1f} {position_on_grid(d['tau_step'], scale.taus)}; the "
                          f"authors' default 500 {position_on_grid(500.0, scale.taus)}; their capacity/(2·batch) "
                          f"heuristic {half:g} {position_on_grid(half, scale.taus)}.")
        means = {a: table[a]["mean"] for a in on_axis}
        best = max(on_axis, key=means.get)
        reading.append(f"- {env}: seed-mean return against τ is highest at `{best}` ({means[best]:.1f}; PER, τ = ∞: "
                       f"{means['per_authors']:.1f}; τ = {scale.taus[0]:g}: {means[on_axis[0]]:.1f}); on-policy "
                       f"{table['onpolicy']['mean']:.1f}, 1 + K epochs {table['onpolicy_epochs']['mean']:.1f}, uniform "
                       f"{table['uniform']['mean']:.1f}.")
    stages = ", ".join(f"{env} tuning {r['seconds'][0]:.0f} s, scoring {r['seconds'][1]:.0f} s"
                       for env, r in results.items())
    s0 = seed + scale.tuning_seeds
    return [
        f"Stage wall times (the invocation that computed each; compilation included): {stages}.", "",
        f"Setup: `ppo_clip`, {c0.num_envs} envs × T = {c0.rollout_length} per iteration (one policy version), "
        f"{c0.num_iterations} iterations, 1 fresh full-batch step + K = {c0.replay.extra_updates} extra updates "
        f"(replay on its own Adam state), buffer of {c0.replay.buffer_iterations} versions, priority "
        f"`{c0.replay.priority}`, α = {c0.replay.priority_exponent}, IS β = {c0.replay.importance_exponent}; "
        f"learner evaluation every {c0.eval_every} iterations ({c0.eval_episodes} deterministic episodes). "
        f"Learning-rate grid {list(scale.learning_rates)} for every arm, picked per task on tuning seeds {seed}–"
        f"{s0 - 1} by mean evaluation return, scored on seeds {s0}–{s0 + scale.scoring_seeds - 1}.", "",
        "## Drift of stored data (on-policy tuning runs)", "",
        *markdown_table(("task", "lr", "τ from per-row (trajectory) ESS", "τ from per-step ESS", "row ESS/n at age 10",
                         "step ESS/n at 10", "KL at 10"), drift_rows), "",
        "Fits: least squares of log ESS/n on age through the origin, per-step over ESS/n ≥ 0.05, per-row "
        f"over ESS/n ≥ 2/{c0.num_envs} (one age holds {c0.num_envs} rows, so 1/{c0.num_envs} is a fully "
        "degenerate set). `ess_vs_age.csv`, `ess_vs_age.png`.", "",
        "## Scores (scoring seeds, tuned lr, 95% Student-t intervals)", "",
        *markdown_table(("task", "arm", "tuned lr", "mean return over evaluations", "final return",
                         "mean sampled age", "buffer span / τ", "sampled-age gap to per_authors"), []),
        *scored, "",
        "The sampled-age gap is the gate of every FreshPER-vs-PER cell (≥ 20%); the claims use τ ≤ 30 "
        "(buffer ≥ 10 τ). `score_vs_tau.png`; tuning means: `tuning.csv`.", "",
        "Where the rules for τ fall on the grid:", "", *rule_lines, "", "## Reading", "", *reading, "",
        "## Verdicts", "",
        "Decided in [results/VERDICTS.md](../VERDICTS.md#freshper_control_tau) by `python experiments/verdicts.py` "
        "from `runs.csv`, `tuning.csv`, `ess_vs_age.csv`, `sampled_age.csv` and "
        "experiments/claims/freshper_control_tau.toml: one pooled Student-t test per claim over its cells "
        "(seed-paired mean return), the cells Holm-corrected."]


def run(scale: Scale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started, out_dir = time.perf_counter(), Path(out_dir)
    with output_lock(out_dir):
        results = {c.env_name: run_task(c, scale, out_dir, seed) for c in scale.configs}
        t, scores = tables(scale, results)
        for name, rows in t.items():
            write_csv(out_dir / f"{name}.csv", rows)
        figures(scale, results, scores, out_dir)
        header = {**provenance(started=started), "seed": seed}
        write_atomic(out_dir / "config.json", json.dumps(
            {"scale": scale.label, "configs": [repr(c) for c in scale.configs],
             "learning_rates": scale.learning_rates, "tuning_seeds": scale.tuning_seeds,
             "scoring_seeds": scale.scoring_seeds, "taus": scale.taus,
             "picked_learning_rates": {env: r["picked"] for env, r in results.items()}, **header}, indent=1) + "\n")
        return write_readme(out_dir, "FreshPER as its authors run it, in control, τ in versions", header,
                            readme_lines(scale, results, scores, seed))


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
