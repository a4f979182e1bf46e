"""VACO in the regime its paper describes: backward lag small against the run, forward lag swept, equal tuning.

Control trainer (:func:`fresh_rl.control.train.train`). A cell is a backward lag (fixed 0, 4 or 16
versions, one traced ``HyperParams.lag`` program; or a geometric mixture of mean 4 per actor group
and iteration) × a forward lag M ∈ {4, 16, 64} updates per batch (epochs × 4 minibatches, the batch
fixed). Actors act on-policy for the first :attr:`Scale.warmup` versions
(``TrainConfig.lag_warmup_versions``), so the ring never serves θ0 to a lagged actor beyond that;
every run has :attr:`Scale.iterations` versions, so the largest fixed lag is ≤ 10% of them.

Equal tuning: each method gets the same 3 × 3 grid, learning rate × its own knob (PPO-clip's ε,
PPO-KL's fixed β, SPO's ε, IMPALA's ρ̄, VACO's δ), on tuning seeds at the middle cell (lag 4,
M = 16), picked by mean learner return over the run's evaluations; every cell is then scored on
other seeds at the pick. Ablations at M = 16 over every backward lag, at VACO's pick: align-only,
filter-only and VACO's δ curve. Each stage is a resumable :func:`fresh_rl.sweep.run_stage`.

Outputs (``results/vaco_forward_lag/``): ``runs.csv`` (per scoring run: task, method, knob, lr, backward lag, M,
seed, mean and final learner return, measured backward TV, forward TV after the batch's last update (a run's median:
unbounded under backward lag), masked and clip fractions, versions), ``tuning.csv``, ``forward_tv.csv`` (the
compared methods rerun on the first scoring seeds, keeping also the importance-sampled forward TV, unbiased at
every lag), ``score_vs_{forward_lag,backward_lag,tv}.png``, ``config.json``, ``README.md``.

    python experiments/vaco_forward_lag.py --scale ci    # the tests
    python experiments/vaco_forward_lag.py --scale cpu      # CartPole-v1, Acrobot-v1, brax/inverted_pendulum
    python experiments/vaco_forward_lag.py --scale minatar --out results/vaco_forward_lag_minatar
                                # Breakout-MinAtar, same design: ~17-34 CPU-hours on 2 cores (measured), not run
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from fresh_rl.control.config import TrainConfig
from fresh_rl.control.forward_lag_report import figures, forward_tv_lines, readme_lines
from fresh_rl.control.forward_lag_study import Scale, measure_forward_tv, score, task_folder, tune
from fresh_rl.presets import named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, write_atomic, write_csv
from fresh_rl.report import write_readme
from fresh_rl.sweep import output_lock
from fresh_rl.sweep.study_cli import study_main

RESULTS = REPOSITORY_ROOT / "results" / "vaco_forward_lag"


def _task(env, envs, steps, iterations, every, episodes, **overrides) -> TrainConfig:
    return TrainConfig(env_name=env, num_envs=envs, rollout_length=steps, total_env_steps=envs * steps * iterations,
                       num_minibatches=4, eval_every=every, eval_episodes=episodes, num_actor_groups=4,
                       **overrides)


SCALES = named({
    "ci": Scale((_task("CartPole-v1", 8, 16, 12, 6, 2, normalize_obs=True),), (0, 2), 2.0, (4,), 2,
                (1e-3,), 1, 2, 6, forward_tv_seeds=1, knobs=(("ppo_clip", (0.2,)), ("vaco", (0.1, 0.2)))),
    "cpu": Scale((_task("CartPole-v1", 8, 64, 200, 20, 8, normalize_obs=True),
                  _task("Acrobot-v1", 8, 64, 200, 20, 8, normalize_obs=True),
                  _task("brax/inverted_pendulum", 8, 64, 200, 20, 8, brax_backend="spring", normalize_obs=True,
                        entropy_coef=0.0, advantage_normalization="standardize")),
                 (0, 4, 16), 4.0, (4, 16, 64), 16, (3e-4, 1e-3, 3e-3), 5, 10, 15),
    # the same design on Breakout-MinAtar: 121 s per run measured here (~34 h), over the cpu preset's 12 h
    "minatar": Scale((_task("Breakout-MinAtar", 8, 64, 200, 20, 8, normalize_obs=False, hidden_sizes=(64,),
                            entropy_coef=0.01),), (0, 4, 16), 4.0, (4, 16, 64), 16, (3e-4, 1e-3, 3e-3), 5, 10, 15),
})


def run(scale: Scale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started, out_dir = time.perf_counter(), Path(out_dir)
    with output_lock(out_dir):
        t, picks = {"tuning": [], "runs": [], "forward_tv": []}, {}
        for task in scale.tasks:
            picks[task.env_name], tuning = tune(task, scale, out_dir, seed)
            t["tuning"] += tuning
            t["runs"] += score(task, scale, picks[task.env_name], out_dir, seed)
        for task in scale.tasks:  # after every scoring stage: the reruns that measure the forward TV both ways
            t["forward_tv"] += measure_forward_tv(task, scale, picks[task.env_name], out_dir, seed)
        for name, rows in t.items():
            write_csv(out_dir / f"{name}.csv", rows)
        figures(t["runs"], t["forward_tv"], scale, out_dir)
        stage_seconds = {p.name: float(p.read_text()) for p in (out_dir / "runs").glob("*.seconds")}
        seconds = {task.env_name: [v for name, v in stage_seconds.items()
                                   if name.startswith(f"{task_folder(task.env_name)}-")] for task in scale.tasks}
        seconds = {task: (len(s), sum(s)) for task, s in seconds.items()}  # programs, wall seconds
        reruns = sum(v for name, v in stage_seconds.items() if "-forward_tv-" in name)
        header = {**provenance(started=started), "seed": seed}
        write_atomic(out_dir / "config.json", json.dumps(
            {"scale": scale.label, "scale_config": repr(scale), "picks": {k: {m: list(v) for m, v in p.items()}
                                                                         for k, p in picks.items()}, **header},
            indent=1, default=str) + "\n")
        return write_readme(out_dir, "VACO with backward lag small against the run, forward lag swept and equal tuning",
                            header, readme_lines(scale, t, picks, seconds, seed) + forward_tv_lines(t, reruns))


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
