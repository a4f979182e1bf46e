"""The priority-staleness simulation (``experiments/priority_staleness.py``): one stream of
trajectories whose reward-based priorities shrink as training goes on, replayed by each sampler of
:func:`fresh_rl.replay.make_trajectory_buffer`, all seeds vmapped in one jitted scan; its table,
summary and figure.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.presets import Preset, named
from fresh_rl.replay import ReplayConfig, magnitude_priority, make_trajectory_buffer
from fresh_rl.report import markdown_table, save_panels
from fresh_rl.sweep import product_grid, run_sharded, to_host

METRICS = ("mean_age", "stale_share", "ess_fraction")


@dataclasses.dataclass(frozen=True)
class StalenessConfig(Preset):
    """One simulated stream.

    Attributes:
      num_versions: policy versions simulated.
      insert_batch: trajectories inserted per version.
      sample_batch: trajectories replayed per version.
      capacity: buffer capacity (FIFO).
      reward_scale_decay: early rewards have scale 1, decaying as exp(−v/reward_scale_decay)
        towards ``reward_floor`` (a policy whose returns stop being surprising); it should be
        comparable to the buffer's lifetime ``capacity / insert_batch`` versions so that the
        buffer holds items of very different priority.
      reward_floor: late-training reward scale.
      drift_kl_per_version: κ, KL between consecutive policies (ESS fraction exp(−κ·age)).
      num_seeds: independent streams (vmapped).
    """

    num_versions: int
    insert_batch: int
    sample_batch: int
    capacity: int
    reward_scale_decay: float = 1000.0
    reward_floor: float = 0.05
    drift_kl_per_version: float = 0.002
    num_seeds: int = 5


SCALES = named({  # experiments/priority_staleness.py --scale; the quickstart runs cpu
    # The buffer holds 256 versions, longer than τ = 100, so the decay is visible at ci scale.
    "ci": StalenessConfig(num_versions=300, insert_batch=16, sample_batch=16, capacity=4096,
                          reward_scale_decay=100.0, num_seeds=3),
    "cpu": StalenessConfig(num_versions=2000, insert_batch=64, sample_batch=64, capacity=50_000),
})


def simulate(config: StalenessConfig, replay: ReplayConfig, key: jax.Array):
    """Per-version metrics of one stream: mean sampled age, share of samples from the older
    half of the buffer's span (``age > capacity / (2 · insert_batch)``; 0.5 for uniform replay
    of a full buffer), mean ESS fraction exp(−κ·age) of the sampled batch."""
    buffer = make_trajectory_buffer(replay)
    example = {"reward": jnp.zeros((), jnp.float32)}

    def version_step(state, inputs):
        version, key = inputs
        k_reward, k_sample = jax.random.split(key)
        scale = config.reward_floor + (1 - config.reward_floor) * jnp.exp(
            -version / config.reward_scale_decay
        )
        rewards = scale * jax.random.normal(k_reward, (config.insert_batch,))
        priorities = magnitude_priority(rewards)
        state = buffer.add(state, {"reward": rewards}, version, priorities)
        sample = buffer.sample(state, k_sample, current_version=version)
        state = buffer.set_priorities(
            state, sample.indices, magnitude_priority(sample.experience["reward"])
        )
        age = sample.age.astype(jnp.float32)
        metrics = {
            "mean_age": age.mean(),
            "stale_share": jnp.mean(age > config.capacity / (2 * config.insert_batch)),
            "ess_fraction": jnp.mean(jnp.exp(-config.drift_kl_per_version * age)),
        }
        return state, metrics

    versions = jnp.arange(config.num_versions, dtype=jnp.int32)
    keys = jax.random.split(key, config.num_versions)
    _, metrics = jax.lax.scan(version_step, buffer.init(example), (versions, keys))
    return metrics


def run_samplers(config: StalenessConfig, samplers: Mapping[str, Mapping], seed: int = 0) -> dict:
    """Every sampler (name → :class:`fresh_rl.replay.ReplayConfig` fields) on the same streams:
    seeds ``seed … seed + num_seeds − 1`` (one grid, sharded over all devices by
    :func:`fresh_rl.sweep.run_sharded`); per sampler its metrics, each ``[seeds, versions]``."""
    grid = product_grid(config.num_seeds, seed=seed)
    results = {}
    for name, overrides in samplers.items():
        replay = ReplayConfig(capacity=config.capacity, sample_batch_size=config.sample_batch,
                              new_item_priority="given", **overrides)
        results[name] = to_host(run_sharded(functools.partial(simulate, config, replay), grid.keys))
    return results


def version_rows(results: Mapping[str, Mapping], seed: int) -> list[dict]:
    """``priority_staleness.csv``: every sampler, seed and version's metrics (fixed decimals)."""
    return [{"sampler": name, "seed": seed + s, "version": v, "mean_age": f"{m['mean_age'][s, v]:.3f}",
             "stale_share": f"{m['stale_share'][s, v]:.4f}", "ess_fraction": f"{m['ess_fraction'][s, v]:.4f}"}
            for name, m in results.items()
            for s in range(m["mean_age"].shape[0]) for v in range(m["mean_age"].shape[1])]


def summary_lines(results: Mapping[str, Mapping], config: StalenessConfig) -> list[str]:
    """The summary's lines after its provenance line: the config, then per sampler the metrics
    averaged over the last 10% of versions and over seeds (± std across seeds)."""
    last = slice(-max(1, config.num_versions // 10), None)
    return ["", f"Config: `{config}`", "",
            "Averages over the last 10% of versions and over seeds (± std across seeds):", "",
            *markdown_table(("sampler", "mean sampled age", "share from the older half of the buffer",
                             "mean ESS fraction"), (
                (name, *(f"{s.mean():.3f} ± {s.std():.3f}" for s in (m[k][:, last].mean(1) for k in METRICS)))
                for name, m in results.items()))]


def plot_streams(path: Path, results: Mapping[str, Mapping], config: StalenessConfig) -> None:
    """One panel per metric against the policy version: each sampler's seed mean with the 2.5–97.5
    percentile band over seeds."""
    titles = {"mean age of replayed trajectories (versions)": "mean_age",
              "share of replay from the older half of the buffer": "stale_share",
              f"mean ESS fraction exp(−κ·age), κ={config.drift_kl_per_version}": "ess_fraction"}
    versions = np.arange(config.num_versions)

    def draw(ax, title):
        for name, m in results.items():
            values = m[titles[title]]
            ax.plot(versions, values.mean(0), label=name)
            ax.fill_between(versions, *np.percentile(values, [2.5, 97.5], axis=0), alpha=0.2)
        ax.set(xlabel="policy version", ylabel=f"mean over {config.num_seeds} seeds (band: 95% of seeds)")
    save_panels(path, list(titles), draw, width=5)


__all__ = ["METRICS", "SCALES", "StalenessConfig", "plot_streams", "run_samplers", "simulate", "summary_lines",
           "version_rows"]
