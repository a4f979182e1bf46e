"""The composition study (``experiments/compose.py``): VACO, age-decayed replay and EWMA old
log-probs in one control run, against each part alone and plain PPO-clip.

An arm is one (method, data source, old-log-prob route) triple of the one control trainer
(:func:`fresh_rl.control.train.train`), :data:`ARMS`; all seeds of an arm run as one vmapped
program (:func:`run_arm`), saved whole as ``runs/<arm>.npz``. :func:`arm_table` is the per-seed
record of ``runs.json`` (what :func:`fresh_rl.eval.verdicts.compose_reader` reads) and
:func:`readme_table` its Markdown table.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np

from fresh_rl.control import HyperParams, TrainConfig, train
from fresh_rl.eval import eval_final_score
from fresh_rl.presets import Preset
from fresh_rl.report import interval, interval_text, markdown_table
from fresh_rl.sweep.keys import seed_keys

ARMS: dict[str, dict] = {
    "ppo_clip": dict(method="ppo_clip", data_source="lagged_actors", route="behaviour"),
    "vaco": dict(method="vaco", data_source="lagged_actors", route="recompute_current"),
    "freshper": dict(method="ppo_clip", data_source="replay_freshper", route="behaviour"),
    "ewma": dict(method="ppo_clip", data_source="lagged_actors", route="ewma"),
    "composed": dict(method="vaco", data_source="replay_freshper", route="ewma"),
}
FIRST_SEED = 100
"""Scoring seeds are ``FIRST_SEED + seed + range(num_seeds)`` (experiments/claims/compose.toml)."""
MEASURED = ("final_eval_return", "lag_tv", "ewma_reset_rate", "forward_tv", "replayed_ess")
"""The per-seed values of an arm that ``runs.json`` records (``replayed_ess`` only with a buffer)."""


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    """One scale: the task's TrainConfig (without the arm's seams), the seeds and the buffer's
    drift snapshots (every ``drift_every`` iterations, in the arms with a buffer)."""

    base: TrainConfig
    num_seeds: int
    drift_every: int

    def seeds(self, seed: int) -> list[int]:
        """The scoring seeds of a run started with ``--seed seed``."""
        return [FIRST_SEED + seed + i for i in range(self.num_seeds)]


def arm_config(scale: Scale, arm: str) -> TrainConfig:
    """The arm's static config: the scale's task with the arm's three seams (drift snapshots
    only where there is a buffer to score)."""
    seams = ARMS[arm]
    drift_every = 0 if seams["data_source"] == "lagged_actors" else scale.drift_every
    return dataclasses.replace(scale.base, replay=dataclasses.replace(scale.base.replay, drift_every=drift_every),
                               **seams)


def run_arm(config: TrainConfig, seeds: list[int]) -> dict[str, np.ndarray]:
    """All seeds of one arm as one vmapped program: per seed the evaluation curve, its validity,
    the final score and the gate measurements (replayed ESS/n: the drift snapshots' ESS per age,
    averaged over snapshots, weighted by how often each age was sampled)."""
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


def arm_table(runs: dict[str, dict]) -> dict[str, dict]:
    """Arm → its seeds, the :data:`MEASURED` values per seed (floats) and its three seams: the
    ``arms`` of ``runs.json``."""
    return {arm: {"seeds": [int(s) for s in r["seeds"]],
                  **{k: [float(v) for v in r[k]] for k in MEASURED if k in r}, **ARMS[arm]}
            for arm, r in runs.items()}


def readme_table(table: dict[str, dict]) -> list[str]:
    """One row per arm: its seams, the final return with its 95% t interval and the gates' means
    (batch-start TV; EWMA resets per iteration where the route is ``ewma``; replayed ESS/n where
    there is a buffer)."""
    return markdown_table(
        ("arm", "method", "data source", "route", "final return, mean [95% t]", "batch-start TV(π_T, β)",
         "EWMA resets / iteration", "replayed ESS/n"),
        ([f"`{arm}`", f"`{r['method']}`", f"`{r['data_source']}`", f"`{r['route']}`",
          interval_text(*interval(r["final_eval_return"])), f"{np.mean(r['lag_tv']):.3f}",
          f"{np.mean(r['ewma_reset_rate']):.2f}" if r["route"] == "ewma" else "–",
          f"{np.mean(r['replayed_ess']):.3f}" if "replayed_ess" in r else "–"] for arm, r in table.items()))


__all__ = ["ARMS", "FIRST_SEED", "MEASURED", "Scale", "arm_config", "arm_table", "readme_table", "run_arm"]
