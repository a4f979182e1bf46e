"""The mask × clip factorial of the old-logit routes in control (``experiments/old_logits_factorial.py``):
its scale, staleness settings, the three resumable stages of one (task, setting) cell
(:func:`run_cell`: tuning, reset calibration, scoring) and the seed-paired effects (:func:`effects`).

Every run is :func:`fresh_rl.control.train.train` with ``method="decoupled_ppo"`` (MIS token mask on
r_d = π_old/π_infer, PPO clip on r_s = π_θ/π_clip), engine mean |log r_d| 0.02, every route of
:data:`ROUTES` in one program (the traced ``HyperParams.route``).
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import numpy as np

from fresh_rl.control.config import DEFAULT_MIS, TrainConfig
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.train import train
from fresh_rl.eval import eval_mean_score, seed_interval
from fresh_rl.eval.route_claims import FACTORIAL_ARMS, factorial_effects, nearest_reset_rate, reset_rates
from fresh_rl.lag import DelayConfig
from fresh_rl.presets import Preset
from fresh_rl.sweep import run_stage
from fresh_rl.sweep.keys import seed_keys

ROUTES = FACTORIAL_ARMS + ("ewma", "ewma_no_reset")
"""The factorial's four arms (:data:`fresh_rl.eval.route_claims.FACTORIAL_ARMS`) and the EWMA
route with and without reset, in the order of the committed runs (``TrainConfig.routes``)."""
TUNED = FACTORIAL_ARMS + ("ewma_no_reset",)
"""The routes whose learning rate the tuning stage picks (``ewma`` takes ``ewma_no_reset``'s)."""
KEEP = ("eval/return_deterministic", "eval/valid", "loss/active_token_fraction", "loss/clip_fraction",
        "old_logits/reset", "lag/version_gap_mean")
SETTINGS = {"fixed4": DelayConfig.fixed(4, 5), "fixed16": DelayConfig.fixed(16, 17),
            "uniform16": DelayConfig.uniform(0, 16, 17)}
"""The staleness settings: fixed lag 4, fixed lag 16, U{0..16} redrawn per iteration."""
RESET_CONTRAST = "reset: ewma − ewma_no_reset"


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    tasks: tuple[TrainConfig, ...]
    settings: tuple[str, ...]
    learning_rates: tuple[float, ...]
    thresholds: tuple[float, ...]
    tuning_seeds: int
    scoring_seeds: int
    chunk: int  # runs per vmapped chunk, the same in every stage (one compiled program per cell)


def factorial_task(env, envs, steps, iterations, every, episodes) -> TrainConfig:
    """A task of the study: ``envs`` × ``steps`` per iteration, 4 epochs × 4 minibatches, every
    route of :data:`ROUTES`, the decoupled loss and the engine."""
    return TrainConfig(env_name=env, num_envs=envs, rollout_length=steps, total_env_steps=envs * steps * iterations,
                       num_epochs=4, num_minibatches=4, num_actor_groups=envs, eval_every=every,
                       eval_episodes=episodes, method="decoupled_ppo", data_source="lagged_actors",
                       route="snapshot", routes=ROUTES, inference_discrepancy=0.02, max_logit_noise=1.0,
                       decoupled_mis=DEFAULT_MIS, tis_cap=None, ewma_beta_rule="mean_age")


def _train_kept(config, key, hp):
    out = train(config, key, hp)
    return {k: out.metrics[k] for k in KEEP}


def stage(config: TrainConfig, scale: Scale, rows: list[dict], out_dir: Path, name: str) -> tuple[list[dict], float]:
    """Every row ``{arm, learning_rate, threshold, seed}`` of one stage, one vmapped program saved
    under ``runs/<task>-<kind>-lag≤<L>-<name>-<digest>``; each row with its scores and measures."""
    hp = HyperParams.from_grid(config, {"route": [ROUTES.index(r["arm"]) for r in rows],
                                        "learning_rate": [r["learning_rate"] for r in rows],
                                        "ewma_reset_threshold": [r["threshold"] for r in rows]})
    label = f"{config.env_name} {config.delay.kind} lag≤{config.delay.ring_size - 1} {name}"
    out, seconds = run_stage(functools.partial(_train_kept, config), seed_keys([r["seed"] for r in rows]), hp,
                             directory=out_dir / "runs" / f"{label.replace(' ', '-')}",
                             fingerprint=f"{name} {config!r} rows={rows}", chunk_size=scale.chunk, label=label)
    return [{**r, "mean_return": float(m), "final_return": float(f), "active_fraction": float(a.mean()),
             "clip_fraction": float(c.mean()), "reset_rate": float(z.mean()), "version_gap": float(g.mean())}
            for r, m, f, a, c, z, g in zip(rows, eval_mean_score(out["eval/return_deterministic"], out["eval/valid"]),
                                           out["eval/return_deterministic"][:, -1], out["loss/active_token_fraction"],
                                           out["loss/clip_fraction"], out["old_logits/reset"],
                                           out["lag/version_gap_mean"])], seconds


def run_cell(task: TrainConfig, setting: str, scale: Scale, out_dir: Path, seed: int) -> dict:
    """The three stages of one (task, setting): tuning (each of :data:`TUNED` × the learning
    rates, tuning seeds), calibration (``ewma`` at every threshold, ``ewma_no_reset``'s rate,
    tuning seeds; :func:`fresh_rl.eval.route_claims.nearest_reset_rate` keeps one), scoring
    (every route at its pick, scoring seeds). Returns the three tables, seconds and the threshold."""
    config = dataclasses.replace(task, delay=SETTINGS[setting])
    tuning_seeds = range(seed, seed + scale.tuning_seeds)
    rows = [{"arm": a, "learning_rate": lr, "threshold": 0.9, "seed": s}
            for a in TUNED for lr in scale.learning_rates for s in tuning_seeds]
    tuning, t1 = stage(config, scale, rows, out_dir, "tuning")
    means = {(r["arm"], r["learning_rate"]): np.mean([q["mean_return"] for q in tuning if q["arm"] == r["arm"]
                                                      and q["learning_rate"] == r["learning_rate"]]) for r in rows}
    lr = {a: max(scale.learning_rates, key=lambda x: means[a, x]) for a in TUNED}
    lr["ewma"] = lr["ewma_no_reset"]
    rows = [{"arm": "ewma", "learning_rate": lr["ewma"], "threshold": t, "seed": s}
            for t in scale.thresholds for s in tuning_seeds]
    calibration, t2 = stage(config, scale, rows, out_dir, "calibration")
    threshold = nearest_reset_rate(reset_rates(calibration, scale.thresholds))
    scoring_seeds = range(seed + scale.tuning_seeds, seed + scale.tuning_seeds + scale.scoring_seeds)
    rows = [{"arm": a, "learning_rate": lr[a], "threshold": threshold, "seed": s}
            for a in ROUTES for s in scoring_seeds]
    scoring, t3 = stage(config, scale, rows, out_dir, "scoring")
    cell = {"task": task.env_name, "setting": setting}
    return {"tuning": [{**cell, **r} for r in tuning], "calibration": [{**cell, **r} for r in calibration],
            "runs": [{**cell, **r} for r in scoring], "seconds": t1 + t2 + t3, "threshold": threshold}


def effects(runs: list[dict]) -> list[dict]:
    """Per cell and metric: the factorial's contrasts
    (:data:`fresh_rl.eval.route_claims.FACTORIAL_CONTRASTS`) and the reset's, seed-paired."""
    out = []
    for cell in dict.fromkeys((r["task"], r["setting"]) for r in runs):
        by = {}
        for r in runs:
            if (r["task"], r["setting"]) == cell:
                by.setdefault(r["arm"], {})[r["seed"]] = r
        seeds = sorted(by["snapshot"])
        per_metric = {}
        for metric in ("mean_return", "active_fraction"):
            values = {arm: np.array([by[arm][s][metric] for s in seeds]) for arm in ROUTES}
            m, lo, hi = (float(x) for x in seed_interval(values["ewma"] - values["ewma_no_reset"]))
            per_metric[metric] = factorial_effects(values) + [
                {"contrast": RESET_CONTRAST, "difference": m, "low": lo, "high": hi, "seeds": len(seeds)}]
        out += [{"task": cell[0], "setting": cell[1], "contrast": r["contrast"], "metric": metric,
                 **{k: r[k] for k in ("difference", "low", "high", "seeds")}}
                for rows in zip(*per_metric.values()) for metric, r in zip(per_metric, rows)]
    return out


__all__ = ["KEEP", "RESET_CONTRAST", "ROUTES", "SETTINGS", "TUNED", "Scale", "effects", "factorial_task",
           "run_cell", "stage"]
