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

Per task, four stages (:mod:`fresh_rl.control.freshper_study`), each a resumable
:func:`fresh_rl.sweep.run_stage` (a rerun skips saved chunks):

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
``short_tau.csv``, ``short_tau_runs.csv``, ``drift_by_method.csv``, ``sampled_age.csv``,
``score_vs_tau.{csv,png}``, ``verdicts.csv``, ``is_normalization.csv``, ``config.json``,
``README.md``; the claims are decided by experiments/verdicts.py into results/VERDICTS.md.

    python experiments/freshper_control.py --scale ci     # the tests (CartPole, tiny)
    python experiments/freshper_control.py --scale cpu    # CartPole + Acrobot, 10 seeds
    python experiments/freshper_control.py --scale paper  # + Breakout-MinAtar, 30 seeds (accelerator)
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from fresh_rl.control.freshper_report import plot_drift_fit, readme_lines, tables
from fresh_rl.control.freshper_study import SCALES, Scale, run_task
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, write_atomic, write_csv
from fresh_rl.report import grouped, save_panel_grid, titled, write_readme
from fresh_rl.sweep import output_lock
from fresh_rl.sweep.study_cli import study_main

RESULTS = REPOSITORY_ROOT / "results" / "freshper_control"
CLAIMS = (("standard PER (authors') < on-policy", "per_authors", "onpolicy", False),
          ("standard PER (given priorities) < on-policy", "per_given", "onpolicy", False),
          ("FreshPER > PER (authors')", "freshper_1", "per_authors", True),
          ("FreshPER > PER (given priorities)", "freshper_1", "per_given", True),
          ("FreshPER > uniform replay", "freshper_1", "uniform", True),
          ("FreshPER > on-policy", "freshper_1", "onpolicy", True),
          ("FreshPER > on-policy with 1 + K epochs (same number of updates)", "freshper_1", "onpolicy_epochs", True),
          ("IS matters (FreshPER with IS > without)", "freshper_1", "freshper_1_no_is", True),
          ("FreshPER > PER with replay steps on a separate Adam state", "freshper_1@separate", "per_given@separate", True),
          ("FreshPER > PER with SGD replay steps", "freshper_1@sgd", "per_given@sgd", True))
"""(claim, variant, baseline, positive): the per-cell paired differences of ``verdicts.csv``."""


def figure(scale: Scale, tasks: dict, t: dict, out_dir: Path) -> None:
    """A column per task: the pilot's ESS/n against age with its exp(−age/τ_fit) above, the learner
    return against τ/τ_fit (the τ_fit multiples and the short τ) with PER and the on-policy controls below."""
    import matplotlib.ticker

    final = {k: r["mean"] for k, (r,) in grouped(t["final"], ("task", "variant", "learning_rate")).items()}

    def draw(ax, title):
        env, panel = title.split(": ", 1)
        if panel == "drift of stored rows":
            return plot_drift_fit(ax, tasks[env]["config"].replay.buffer_iterations, tasks[env]["drift"])
        for lr in scale.learning_rates:
            points = sorted((r for r in t["score_vs_tau"] if r["task"] == env and r["learning_rate"] == lr),
                            key=lambda r: r["tau_over_tau_fit"])
            y = np.array([[r["mean"], r["mean"] - r["mean_low"], r["mean_high"] - r["mean"]] for r in points])
            bars = ax.errorbar([r["tau_over_tau_fit"] for r in points], y[:, 0], yerr=y[:, 1:].T, fmt="o-", capsize=2,
                               label=f"lr {lr}")
            for variant, style in (("per_given", ":"), ("onpolicy", "--"), ("onpolicy_epochs", "-.")):
                ax.axhline(final[env, variant, lr], ls=style, color=bars[0].get_color(), lw=1)
        ax.set(xscale="log", xlabel="τ / τ_fit (dotted: PER; dashed: on-policy; dash-dot: 1 + K epochs)",
               ylabel="learner return, mean over evaluations")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.legend(fontsize=8)
    save_panel_grid(out_dir / "score_vs_tau.png", ("drift of stored rows", "return against τ"), list(tasks),
                    lambda ax, panel, env: titled(draw, ax, f"{env}: {panel}"), width=5, height=4.0)


def run(scale: Scale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started, out_dir = time.perf_counter(), Path(out_dir)
    with output_lock(out_dir):
        tasks = {c.env_name: run_task(c, scale, out_dir, seed, log) for c in scale.configs}
        header = provenance(started=started)
        write_atomic(out_dir / "config.json", json.dumps(
            {"scale": scale.label, "seed": seed, "num_seeds": scale.num_seeds,
             "learning_rates": list(scale.learning_rates), "configs": {env: repr(k["config"]) for env, k in tasks.items()},
             "tau_fit": {env: {str(lr): d["tau_fit"] for lr, d in k["drift"].items()} for env, k in tasks.items()},
             **header}, indent=1))
        t = tables(scale, tasks, CLAIMS)
        figure(scale, tasks, t, out_dir)
        for name, rows in t.items():
            write_csv(out_dir / f"{name}.csv", rows)
        return write_readme(out_dir, "FreshPER in control: replay with matched controls", header,
                            readme_lines(scale, tasks, t))


def main(argv=None):
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
