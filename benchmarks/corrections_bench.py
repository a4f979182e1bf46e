"""Benchmark: our batch-major V-trace vs ``jax.vmap(rlax.vtrace_td_error_and_advantage)``.

Both sides are jitted and do the same work on the same ``[B, T]`` float32 data (λ = 0.95,
ρ̄ = c̄ = ρ̄_pg = 1, random episode cuts through the discounts): V-trace targets plus the
IMPALA policy-gradient advantage. Compile time (lower + compile) is reported separately; the
steady-state time is the median over ``--repeats`` timings of ``--inner`` back-to-back calls.
The ratio is ours/rlax *throughput* (= rlax time / our time): ≥ 1 means we are not slower.
Ours and rlax alternate within every repeat, so load from other processes hits both alike;
the median of the per-repeat ratios is reported next to the ratio of medians.

    .venv/bin/python benchmarks/corrections_bench.py            # writes results/bench/corrections.{csv,md}
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import rlax

from fresh_rl.provenance import git_commit, write_csv
from fresh_rl.corrections import VTraceConfig, vtrace

SHAPES = ((256, 128), (4096, 32))
LAMBDA = 0.95
CONFIG = VTraceConfig(lambda_=LAMBDA, rho_bar=1.0, c_bar=1.0, impala_bootstrap="lambda_mixed")


def make_inputs(batch: int, time_steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(batch, time_steps)).astype(np.float32)
    next_values = np.concatenate([values[:, 1:], rng.normal(size=(batch, 1)).astype(np.float32)], axis=1)
    return dict(
        values=values,
        next_values=next_values,
        rewards=rng.normal(size=(batch, time_steps)).astype(np.float32),
        discounts=(0.99 * (rng.random((batch, time_steps)) > 0.02)).astype(np.float32),
        log_rhos=(0.5 * rng.normal(size=(batch, time_steps))).astype(np.float32),
    )


@jax.jit
def ours(values, next_values, rewards, discounts, log_rhos):
    out = vtrace(values, next_values, rewards, discounts, log_rhos, config=CONFIG)
    return out.targets, out.impala_advantages


@jax.jit
def rlax_vmapped(values, next_values, rewards, discounts, log_rhos):
    fn = lambda v_tm1, v_t, r_t, d_t, rho: rlax.vtrace_td_error_and_advantage(
        v_tm1, v_t, r_t, d_t, rho, lambda_=LAMBDA, clip_rho_threshold=1.0, clip_pg_rho_threshold=1.0
    )
    out = jax.vmap(fn)(values, next_values, rewards, discounts, jnp.exp(log_rhos))
    return out.errors + values, out.pg_advantage


def compile_seconds(fn, args) -> tuple[float, object]:
    """Wall time of lowering + compiling ``fn`` for ``args``, and the compiled executable."""
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    return time.perf_counter() - start, compiled


def paired_timings(ours_exe, rlax_exe, args, repeats: int, inner: int) -> dict[str, dict[str, list[float]]]:
    """Per-call wall and process-CPU seconds of ``inner`` back-to-back calls, alternating ours /
    rlax in each repeat so that load from other processes hits both sides alike. CPU time
    (all threads of this process) is less disturbed by preemption than wall time."""
    for exe in (ours_exe, rlax_exe):  # warm caches
        for _ in range(3):
            jax.block_until_ready(exe(*args))
    samples = {side: {"wall": [], "cpu": []} for side in ("ours", "rlax")}
    for repeat in range(repeats):
        order = (("ours", ours_exe), ("rlax", rlax_exe))
        for side, exe in order if repeat % 2 == 0 else order[::-1]:
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(inner):
                out = exe(*args)
            jax.block_until_ready(out)
            samples[side]["wall"].append((time.perf_counter() - wall) / inner)
            samples[side]["cpu"].append((time.process_time() - cpu) / inner)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--inner", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()

    load_at_start = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    run_start = time.perf_counter()
    rows = []
    for batch, time_steps in SHAPES:
        inputs = [jnp.asarray(x) for x in make_inputs(batch, time_steps).values()]
        ours_compile, ours_exe = compile_seconds(ours, inputs)
        rlax_compile, rlax_exe = compile_seconds(rlax_vmapped, inputs)
        # same numbers first: the comparison is only meaningful if both compute the same thing
        max_err = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(ours_exe(*inputs), rlax_exe(*inputs)))
        samples = paired_timings(ours_exe, rlax_exe, inputs, args.repeats, args.inner)
        median = {side: {k: statistics.median(v) for k, v in s.items()} for side, s in samples.items()}
        paired = statistics.median(r / o for o, r in zip(samples["ours"]["wall"], samples["rlax"]["wall"]))
        rows.append(dict(
            B=batch, T=time_steps,
            ours_ms=1e3 * median["ours"]["wall"], rlax_ms=1e3 * median["rlax"]["wall"],
            ratio=median["rlax"]["wall"] / median["ours"]["wall"],
            paired_ratio_median=paired,
            ours_cpu_ms=1e3 * median["ours"]["cpu"], rlax_cpu_ms=1e3 * median["rlax"]["cpu"],
            cpu_ratio=median["rlax"]["cpu"] / median["ours"]["cpu"],
            ours_compile_s=ours_compile, rlax_compile_s=rlax_compile,
            ours_msteps_per_s=batch * time_steps / median["ours"]["wall"] / 1e6,
            max_abs_diff=max_err,
        ))
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)

    write_csv(args.out / "corrections.csv", rows)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, jax {jax.__version__} on {jax.default_backend()}"
    commit = git_commit()
    lines = [
        "# V-trace: fresh_rl.corrections.vtrace vs jax.vmap(rlax.vtrace_td_error_and_advantage)",
        "",
        f"Command: `.venv/bin/python benchmarks/corrections_bench.py --repeats {args.repeats} --inner {args.inner}`  ",
        f"Machine: {machine}  ",
        f"Commit: {commit or 'unknown'} (plus uncommitted changes, if any)  ",
        f"Wall time of the whole run: {time.perf_counter() - run_start:.1f} s  ",
        f"Load average at start: {load_at_start}  ",
        "Both jitted, float32, λ = 0.95, ρ̄ = c̄ = 1, targets + IMPALA advantage. Time per call =",
        "median over repeats of the mean of back-to-back calls (steady state), ours and rlax",
        "alternating within each repeat; lower+compile time reported separately.",
        "ratio = ours/rlax throughput from the median wall times; paired = median of per-repeat",
        "wall ratios; cpu ratio = the same from process CPU time (least disturbed by other",
        "processes on a shared machine). ≥ 1: not slower.",
        "",
        "| B | T | ours (ms) | rlax (ms) | ratio | paired ratio | ours CPU (ms) | rlax CPU (ms) | CPU ratio | ours compile (s) | rlax compile (s) | ours Msteps/s | max abs diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['B']} | {r['T']} | {r['ours_ms']:.3f} | {r['rlax_ms']:.3f} | {r['ratio']:.2f} | "
            f"{r['paired_ratio_median']:.2f} | {r['ours_cpu_ms']:.3f} | {r['rlax_cpu_ms']:.3f} | {r['cpu_ratio']:.2f} | "
            f"{r['ours_compile_s']:.2f} | {r['rlax_compile_s']:.2f} | "
            f"{r['ours_msteps_per_s']:.1f} | "
            f"{r['max_abs_diff']:.1e} |"
        )
    (args.out / "corrections.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
