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

import dataclasses
import json
import time
from pathlib import Path

import jax
import numpy as np

from fresh_rl.control import HyperParams, ReplaySettings, TrainConfig, train
from fresh_rl.eval import eval_final_score, seed_interval
from fresh_rl.lag import DelayConfig
from fresh_rl.presets import Preset, named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_atomic
from fresh_rl.sweep import saved_arrays
from fresh_rl.sweep.keys import seed_keys
from fresh_rl.sweep.study_cli import study_main

ARMS: dict[str, dict] = {
    "ppo_clip": dict(method="ppo_clip", data_source="lagged_actors", route="behaviour"),
    "vaco": dict(method="vaco", data_source="lagged_actors", route="recompute_current"),
    "freshper": dict(method="ppo_clip", data_source="replay_freshper", route="behaviour"),
    "ewma": dict(method="ppo_clip", data_source="lagged_actors", route="ewma"),
    "composed": dict(method="vaco", data_source="replay_freshper", route="ewma"),
}
FIRST_SEED = 100
"""Scoring seeds are ``FIRST_SEED + seed + range(num_seeds)`` (experiments/claims/compose.toml)."""


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    """One scale: the task's TrainConfig (without the arm's seams), the seeds and the buffer's
    drift snapshots (every ``drift_every`` iterations, in the arms with a buffer)."""

    base: TrainConfig
    num_seeds: int
    drift_every: int


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


def arm_config(scale: Scale, arm: str) -> TrainConfig:
    """The arm's static config: the scale's task with the arm's three seams (drift snapshots
    only where there is a buffer to score)."""
    seams = ARMS[arm]
    drift_every = 0 if seams["data_source"] == "lagged_actors" else scale.drift_every
    return dataclasses.replace(scale.base, replay=dataclasses.replace(scale.base.replay, drift_every=drift_every),
                               **seams)


def run_arm(config: TrainConfig, seeds: list[int]) -> dict[str, np.ndarray]:
    """All seeds of one arm as one vmapped program: per seed the evaluation curve, its validity,
    the final score and the gate measurements."""
    hparams = HyperParams.from_grid(config, {}, size=len(seeds))
    out = jax.jit(jax.vmap(train, (None, 0, 0)), static_argnums=0)(config, seed_keys(seeds), hparams)
    m = {k: np.asarray(v) for k, v in out.metrics.items()}
    result = {"seeds": np.asarray(seeds), "eval_return": m["eval/return_deterministic"], "eval_valid": m["eval/valid"],
              "final_eval_return": eval_final_score(m["eval/return_deterministic"], m["eval/valid"]),
              "lag_tv": m["lag/tv"].mean(axis=1), "ewma_reset_rate": m["old_logits/reset"].mean(axis=1),
              "forward_tv": m["lag/forward_tv"].mean(axis=1)}
    if "drift/ess" in m:
        ess = np.where(m["drift/ess"] >= 0, m["drift/ess"], np.nan)  # [seeds, snapshots, H]
        counts = np.asarray(out.state.replay.sampled_age_counts, np.float64)  # [seeds, H]
        per_age = np.nanmean(ess, axis=1)
        seen = np.isfinite(per_age) & (counts > 0)
        result["replayed_ess"] = (np.where(seen, per_age * counts, 0).sum(1)
                                  / np.maximum(np.where(seen, counts, 0).sum(1), 1))
    return result


def _figure(runs: dict, out: Path, task: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, r in runs.items():
        valid = r["eval_valid"][0].astype(bool)
        x = np.flatnonzero(valid) + 1
        mean, low, high = seed_interval(r["eval_return"][:, valid], axis=0)
        ax.plot(x, mean, label=arm)
        ax.fill_between(x, low, high, alpha=0.15)
    ax.set_xlabel("learner version (iteration)")
    ax.set_ylabel("learner return, deterministic evaluation")
    ax.set_title(f"{task} under lag (geometric, mean 8): mean and 95% Student-t band over seeds", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    write_atomic(out / "learning_curves.png", lambda f: fig.savefig(f, format="png", dpi=110), binary=True)
    plt.close(fig)


def run(scale: Scale, out: Path, seed: int, fresh: bool) -> str:
    """Run every arm not saved yet, then write runs.json, the figure and the README."""
    seeds = [FIRST_SEED + seed + i for i in range(scale.num_seeds)]
    (out / "runs").mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runs = {}
    for arm in ARMS:  # --fresh: study_main cleared runs/ first
        t0 = time.perf_counter()
        runs[arm] = saved_arrays(out / "runs" / f"{arm}.npz", lambda a=arm: run_arm(arm_config(scale, a), seeds))
        print(f"[compose] {arm}: {len(seeds)} seeds ({time.perf_counter() - t0:.0f} s), final return "
              f"{runs[arm]['final_eval_return'].mean():.1f}", flush=True)
    info = provenance(started=started)
    table = {arm: {"seeds": [int(s) for s in r["seeds"]],
                   **{k: [float(v) for v in r[k]] for k in ("final_eval_return", "lag_tv", "ewma_reset_rate",
                                                            "forward_tv", "replayed_ess") if k in r},
                   **ARMS[arm]} for arm, r in runs.items()}
    write_atomic(out / "runs.json", json.dumps({"scale": scale.label, "task": scale.base.env_name, "arms": table,
                                                "provenance": info}, indent=1) + "\n")
    _figure(runs, out, scale.base.env_name)
    readme = _readme(scale.label, scale.base.env_name, table, info)
    write_atomic(out / "README.md", readme)
    return readme


def _readme(scale_name: str, task: str, table: dict, info: dict) -> str:
    study = "compose" if task == "CartPole-v1" else "compose_acrobot"
    lines = [f"# The three papers composed (control, {task})", "",
             "VACO's realign + TV filter, the age-decayed (FreshPER) replay buffer and the EWMA old-log-prob "
             "route in one run of the one control trainer, against each part alone and plain PPO-clip, on "
             f"{task} with lagged actors (geometric delay, mean 8 versions, 4 actor groups). Arms, settings "
             "and why: `experiments/compose.py`; claims declared before the runs: "
             f"`experiments/claims/{study}.toml`; verdicts: [results/VERDICTS.md](../VERDICTS.md#{study}).", "",
             f"Scale `{scale_name}`. {provenance_line(info)}", "",
             "| arm | method | data source | route | final return, mean [95% t] | batch-start TV(π_T, β) | "
             "EWMA resets / iteration | replayed ESS/n |", "|---|---|---|---|---|---|---|---|"]
    for arm, r in table.items():
        mean, low, high = seed_interval(np.asarray(r["final_eval_return"]))
        ess = f"{np.mean(r['replayed_ess']):.3f}" if "replayed_ess" in r else "–"
        resets = f"{np.mean(r['ewma_reset_rate']):.2f}" if r["route"] == "ewma" else "–"
        lines.append(f"| `{arm}` | `{r['method']}` | `{r['data_source']}` | `{r['route']}` | "
                     f"{mean:.1f} [{low:.1f}, {high:.1f}] | {np.mean(r['lag_tv']):.3f} | {resets} | {ess} |")
    lines += ["", "Final return: the mean of the last 10% of the learner's deterministic evaluations "
              f"(16 episodes each), per seed; seeds {table['ppo_clip']['seeds'][0]}–{table['ppo_clip']['seeds'][-1]}. "
              "The gates of the claims are the TV, reset and ESS columns.", "",
              "![learning curves](learning_curves.png)", ""]
    return "\n".join(lines)


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, REPOSITORY_ROOT / "results" / "compose", run, argv)


if __name__ == "__main__":
    main()
