"""Benchmark: seeds per second of one vmapped ``train`` over N seeds vs N sequential runs.

Both sides run the same control run (PPO-clip on gymnax CartPole, 8 envs × 32 steps × 20
iterations, a (64, 64) network) with the same keys. "vmapped" is one compiled
``jit(vmap(train))`` program over N seeds; "sequential" is one compiled single-seed program
called N times, each call waited for. Compile time is reported apart from steady-state time;
steady state is the median of ``--repeats`` timings. The speed-up is vmapped seeds/s ÷
sequential seeds/s. On a 2-core CPU the gain comes from batching many small matrix products
and env steps into fewer, larger ones (no extra cores to spread over), so it is sub-linear in N.

    .venv/bin/python benchmarks/sweep_bench.py       # writes results/bench/sweep.{csv,md}
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import jax

from fresh_rl.provenance import git_commit, write_csv
from fresh_rl.control import TrainConfig, train

CONFIG = TrainConfig(env_name="CartPole-v1", num_envs=8, rollout_length=32, total_env_steps=8 * 32 * 20,
                     num_epochs=4, num_minibatches=4, method="ppo_clip")
OUT = Path(__file__).resolve().parents[1] / "results" / "bench"


def _timed(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)

    single = jax.jit(train, static_argnums=0)
    start = time.perf_counter()
    single_c = single.lower(CONFIG, jax.random.PRNGKey(0)).compile()
    single_compile = time.perf_counter() - start
    rows = []
    for n in args.seeds:
        keys = jax.random.split(jax.random.PRNGKey(0), n)
        start = time.perf_counter()
        batched = jax.jit(jax.vmap(train, in_axes=(None, 0)), static_argnums=0).lower(CONFIG, keys).compile()
        batched_compile = time.perf_counter() - start
        vmapped = _timed(lambda: batched(keys), args.repeats)
        sequential = _timed(lambda: [jax.block_until_ready(single_c(k)) for k in keys], args.repeats)
        rows.append({"seeds": n, "vmapped_s": vmapped, "sequential_s": sequential,
                     "vmapped_seeds_per_s": n / vmapped, "sequential_seeds_per_s": n / sequential,
                     "speedup": sequential / vmapped, "vmapped_compile_s": batched_compile,
                     "single_compile_s": single_compile,
                     "env_steps_per_s_vmapped": n * CONFIG.num_iterations * CONFIG.batch_size / vmapped})
        print(rows[-1])

    write_csv(OUT / "sweep.csv", rows)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, jax {jax.__version__} on {jax.default_backend()}"
    commit = git_commit()
    lines = [
        "# Sweep benchmark: vmapped seeds vs sequential runs", "",
        f"Command: `python benchmarks/sweep_bench.py --repeats {args.repeats}`; commit {commit}; {machine}.",
        f"Run: PPO-clip on CartPole-v1, {CONFIG.num_envs} envs × {CONFIG.rollout_length} steps × "
        f"{CONFIG.num_iterations} iterations per seed; medians of {args.repeats} repeats; compile apart.", "",
        "| seeds | vmapped (s) | sequential (s) | vmapped seeds/s | sequential seeds/s | speed-up | vmapped compile (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['seeds']} | {r['vmapped_s']:.3f} | {r['sequential_s']:.3f} | {r['vmapped_seeds_per_s']:.1f} | "
                     f"{r['sequential_seeds_per_s']:.1f} | {r['speedup']:.1f}× | {r['vmapped_compile_s']:.1f} |")
    lines.append(f"\nSingle-seed program compile: {single_compile:.1f} s.")
    (OUT / "sweep.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
