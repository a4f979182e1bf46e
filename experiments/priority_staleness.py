"""Priority staleness: what standard PER and FreshPER sample as the buffer ages.

A controlled simulation of the failure FreshPER (arXiv 2604.16918) fixes. Each policy version
inserts a batch of trajectories whose base priority is ``|reward| + ε``; early in training the
rewards are large and noisy (the policy is bad and explores), later they shrink as it
improves, so old trajectories carry the largest priorities. Each version also replays one
batch and writes its (static, reward-based) priority back, as the authors' code does. The
policy drifts by a constant KL ``κ`` per version, so a trajectory of age ``a`` has expected
importance-sampling ESS fraction ``exp(−κ·a)`` under the current policy (the ESS argument of
the paper; its exact constants are not known, so κ is a knob).

Standard PER keeps drawing the stale, high-priority early trajectories; FreshPER's
``exp(−age/τ)`` decay moves the sampled mass to recent data; uniform replay sits between.
The script runs every sampler on the same stream, all seeds vmapped in one jitted scan, and
writes ``results/freshper/priority_staleness.{csv,png,md}``.

    python experiments/priority_staleness.py --scale ci     # seconds
    python experiments/priority_staleness.py --scale cpu    # the committed figure
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.presets import Preset, named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_csv
from fresh_rl.replay import ReplayConfig, magnitude_priority, make_trajectory_buffer
from fresh_rl.sweep import product_grid, run_sharded, to_host
from fresh_rl.sweep.study_cli import NO_CHECKED, add_preset_arguments, chosen_preset, start_study

RESULTS = REPOSITORY_ROOT / "results" / "freshper"


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


SCALES = named({
    # The buffer holds 256 versions, longer than τ = 100, so the decay is visible at ci scale.
    "ci": StalenessConfig(num_versions=300, insert_batch=16, sample_batch=16, capacity=4096,
                          reward_scale_decay=100.0, num_seeds=3),
    "cpu": StalenessConfig(num_versions=2000, insert_batch=64, sample_batch=64, capacity=50_000),
})
SAMPLERS = {
    "uniform": dict(sampling="uniform"),
    "PER": dict(sampling="per"),
    "FreshPER τ=500": dict(sampling="freshper", age_decay_tau=500.0),
    "FreshPER τ=100": dict(sampling="freshper", age_decay_tau=100.0),
}


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


def run(config: StalenessConfig, seed: int = 0):
    """Every sampler on the same streams: seeds ``seed … seed + num_seeds − 1`` (one grid,
    sharded over all devices by :func:`fresh_rl.sweep.run_sharded`)."""
    grid = product_grid(config.num_seeds, seed=seed)
    results = {}
    for name, overrides in SAMPLERS.items():
        replay = ReplayConfig(capacity=config.capacity, sample_batch_size=config.sample_batch,
                              new_item_priority="given", **overrides)
        metrics = run_sharded(functools.partial(simulate, config, replay), grid.keys)
        results[name] = to_host(metrics)  # each [seeds, versions]
    return results


def write_outputs(results, config: StalenessConfig, seed: int, out: Path, info: dict, scale: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "priority_staleness.csv", (
        {"sampler": name, "seed": seed + s, "version": v, "mean_age": f"{m['mean_age'][s, v]:.3f}",
         "stale_share": f"{m['stale_share'][s, v]:.4f}", "ess_fraction": f"{m['ess_fraction'][s, v]:.4f}"}
        for name, m in results.items()
        for s in range(m["mean_age"].shape[0]) for v in range(m["mean_age"].shape[1])))

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    panels = [("mean_age", "mean age of replayed trajectories (versions)"),
              ("stale_share", "share of replay from the older half of the buffer"),
              ("ess_fraction", f"mean ESS fraction exp(−κ·age), κ={config.drift_kl_per_version}")]
    versions = np.arange(config.num_versions)
    for ax, (metric, title) in zip(axes, panels):
        for name, m in results.items():
            mean = m[metric].mean(0)
            lo, hi = np.percentile(m[metric], [2.5, 97.5], axis=0)
            ax.plot(versions, mean, label=name)
            ax.fill_between(versions, lo, hi, alpha=0.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("policy version")
    axes[0].legend()
    fig.suptitle(f"Priority staleness: PER vs FreshPER ({scale} scale, {config.num_seeds} seeds)")
    fig.tight_layout()
    fig.savefig(out / "priority_staleness.png", dpi=120)

    last = slice(-max(1, config.num_versions // 10), None)
    lines = [
        "# Priority staleness (FreshPER motivation)", "",
        provenance_line(info), "",
        f"Config: `{config}`", "",
        "Averages over the last 10% of versions and over seeds (± std across seeds):", "",
        "| sampler | mean sampled age | share from the older half of the buffer | mean ESS fraction |",
        "|---|---|---|---|",
    ]
    for name, m in results.items():
        cells = []
        for metric in ("mean_age", "stale_share", "ess_fraction"):
            per_seed = m[metric][:, last].mean(1)
            cells.append(f"{per_seed.mean():.3f} ± {per_seed.std():.3f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (out / "priority_staleness.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=NO_CHECKED)
    add_preset_arguments(parser, SCALES, default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--fresh", action="store_true", help="take over an --out folder made by another scale or seed")
    add_compilation_cache_flag(parser)
    args = parser.parse_args(argv)
    config = chosen_preset(parser, args, SCALES)
    identity = {"study": "priority_staleness", "scale": config.label, "seed": args.seed}
    # its own record: the default folder is results/freshper, shared with experiments/freshper.py
    start_study(parser, args, identity, args.out, argv, fresh=args.fresh, record="priority_staleness.run.json")
    start = time.perf_counter()
    results = run(config, args.seed)
    write_outputs(results, config, args.seed, args.out, provenance(started=start), args.scale)


if __name__ == "__main__":
    main()
