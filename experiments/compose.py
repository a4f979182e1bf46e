"""The three papers composed in one control run: VACO + age-decayed replay + EWMA old log-probs.

  python experiments/compose.py --scale cpu --out results/compose     # ~10 min on 2 CPU cores
  python experiments/compose.py --scale cpu_acrobot --out results/compose_acrobot
  python experiments/compose.py --scale ci --out /tmp/compose         # the tests' smoke scale

Each arm is one (method, data source, old-log-prob route) triple of the one control trainer
(:func:`fresh_rl.control.train.train`); each differs from plain PPO-clip in one seam, and the
composed arm in all three:

==========  ==============  ===============  ==================
arm         method          data source      route
==========  ==============  ===============  ==================
ppo_clip    ppo_clip        lagged_actors    behaviour
vaco        vaco            lagged_actors    recompute_current
freshper    ppo_clip        replay_freshper  behaviour
ewma        ppo_clip        lagged_actors    ewma
composed    vaco            replay_freshper  ewma
==========  ==============  ===============  ==================

The actors are lagged (a geometric delay of mean 8 versions per actor group and iteration, 4
groups), so every correction has something to correct. Settings are documented defaults, none
tuned (experiments/claims/compose.toml): δ = 0.2 (VACO's), τ = H/2 iterations (the FreshPER
authors' capacity/(2·batch) heuristic, H = 16 iterations of buffer, K = 2 replay updates per
iteration), EWMA β = W/(W + 2) = 32/34 from the ring's window W = 32 (the ``half_window`` variant,
pinned: the library's default rule would centre θ_ref on the mean lag 8, β = 8/9) with reset
threshold 0.9. The seeds of an arm are one vmapped
program; an arm's finished runs are saved (``runs/<arm>.npz``) and reused on a rerun, so the
study resumes where it stopped. Claims and verdicts: results/VERDICTS.md (``experiments/verdicts.py``).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from fresh_rl.control import ReplaySettings, TrainConfig
from fresh_rl.control.compose_study import ARMS, Scale, arm_config, arm_table, readme_table, run_arm
from fresh_rl.lag import DelayConfig
from fresh_rl.presets import named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, write_atomic
from fresh_rl.report import plot_seed_bands, save_panels, write_readme
from fresh_rl.sweep import saved_arrays
from fresh_rl.sweep.study_cli import study_main


def _base(env_name: str, total_env_steps: int, num_envs: int, rollout_length: int, eval_every: int, eval_episodes: int,
          buffer_iterations: int) -> TrainConfig:
    return TrainConfig(
        env_name=env_name, num_envs=num_envs, rollout_length=rollout_length, num_epochs=4, num_minibatches=4,
        learning_rate=1e-3, normalize_obs=True, hidden_sizes=(64, 64), total_env_steps=total_env_steps,
        eval_every=eval_every, eval_episodes=eval_episodes,
        delay=DelayConfig.geometric(mean_lag=8.0, ring_size=33), num_actor_groups=4,
        ewma_beta_rule="half_window",  # β = W/(W + 2) = 32/34, the β of the committed runs (docstring)
        replay=ReplaySettings(extra_updates=2, buffer_iterations=buffer_iterations,
                              age_decay_tau=buffer_iterations / 2))


SCALES = named({
    "ci": Scale(_base("CartPole-v1", 8 * 16 * 6, 8, 16, 3, 2, 4), num_seeds=2, drift_every=3),
    "cpu": Scale(_base("CartPole-v1", 16 * 64 * 98, 16, 64, 7, 16, 16), num_seeds=10, drift_every=14),
    "cpu_acrobot": Scale(_base("Acrobot-v1", 16 * 64 * 98, 16, 64, 7, 16, 16), num_seeds=10, drift_every=14),
})


def learning_curves(runs: dict, path: Path, task: str) -> None:
    """Learner return against version per arm: mean and 95% Student-t band over seeds."""
    def draw(ax, title):
        valid = {arm: r["eval_valid"][0].astype(bool) for arm, r in runs.items()}
        plot_seed_bands(ax, {arm: (valid[arm].nonzero()[0] + 1, r["eval_return"][:, valid[arm]])
                             for arm, r in runs.items()},
                        "learner version (iteration)", "learner return, deterministic evaluation", alpha=0.15)
    save_panels(path, [f"{task} under lag (geometric, mean 8), 95% Student-t bands"], draw, width=7, height=4)


def readme_lines(scale: Scale, table: dict) -> list[str]:
    task = scale.base.env_name
    study = "compose" if task == "CartPole-v1" else "compose_acrobot"
    seeds = table["ppo_clip"]["seeds"]
    return ["", "VACO's realign + TV filter, the age-decayed (FreshPER) replay buffer and the EWMA old-log-prob "
            "route in one run of the one control trainer, against each part alone and plain PPO-clip, on "
            f"{task} with lagged actors (geometric delay, mean 8 versions, 4 actor groups). Arms, settings "
            "and why: `experiments/compose.py`; claims declared before the runs: "
            f"`experiments/claims/{study}.toml`; verdicts: [results/VERDICTS.md](../VERDICTS.md#{study}).", "",
            f"Scale `{scale.label}`.", "", *readme_table(table), "",
            "Final return: the mean of the last 10% of the learner's deterministic evaluations "
            f"(16 episodes each), per seed; seeds {seeds[0]}–{seeds[-1]}. "
            "The gates of the claims are the TV, reset and ESS columns.", "",
            "![learning curves](learning_curves.png)"]


def run(scale: Scale, out: Path, seed: int, fresh: bool) -> str:
    """Run every arm not saved yet, then write runs.json, the figure and the README."""
    seeds = scale.seeds(seed)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runs = {}
    for arm in ARMS:  # --fresh: study_main cleared runs/ first
        t0 = time.perf_counter()
        runs[arm] = saved_arrays(out / "runs" / f"{arm}.npz", lambda a=arm: run_arm(arm_config(scale, a), seeds))
        print(f"[compose] {arm}: {len(seeds)} seeds ({time.perf_counter() - t0:.0f} s), final return "
              f"{runs[arm]['final_eval_return'].mean():.1f}", flush=True)
    info, table = provenance(started=started), arm_table(runs)
    write_atomic(out / "runs.json", json.dumps({"scale": scale.label, "task": scale.base.env_name, "arms": table,
                                                "provenance": info}, indent=1) + "\n")
    learning_curves(runs, out / "learning_curves.png", scale.base.env_name)
    return write_readme(out, f"The three papers composed (control, {scale.base.env_name})", info,
                        readme_lines(scale, table))


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, REPOSITORY_ROOT / "results" / "compose", run, argv)


if __name__ == "__main__":
    main()
