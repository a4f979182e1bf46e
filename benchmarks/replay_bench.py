"""Replay throughput: fresh_rl's buffer vs flashbax's prioritised buffer, side by side.

Same data in both (full trajectories as items: ``tokens [16] int32`` + ``reward`` float32),
same capacity and batch, both jitted. Each operation (add, sample, set_priorities, and the
training-loop step sample+set_priorities) is timed

* inside one ``lax.scan`` of ``--scan-steps`` calls with the state donated (the headline
  figure), and
* as a Python loop of single jitted calls with donated state (per-call figure, includes
  dispatch overhead),

with compile time reported apart and the median over ``--repeats`` steady-state runs.

FreshPER is also run the authors' way ("eager refresh"): every step recompute the decayed
leaf ``(p·exp(−age/τ))^α`` of every item and rebuild the tree before sampling (vectorised here,
so already much faster than the authors' per-item Python loop), versus our time-invariant keys.

Writes ``results/bench/replay.csv`` and ``results/bench/replay.md``.

    python benchmarks/replay_bench.py                 # full grid, 2^12 … 2^20, batch 256/4096
    python benchmarks/replay_bench.py --quick         # 2^12 and 2^16 only
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import flashbax as fbx
import jax
import jax.numpy as jnp

from fresh_rl.provenance import git_commit, write_csv
from fresh_rl.replay import ReplayConfig, make_trajectory_buffer, segment_tree

TOKENS = 16
ALPHA, TAU = 0.6, 500.0
RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench"
LOAD_AT_START = ", ".join(f"{x:.2f}" for x in os.getloadavg())


def item():
    return {"tokens": jnp.zeros((TOKENS,), jnp.int32), "reward": jnp.zeros((), jnp.float32)}


def batch_of(n, value):
    return {"tokens": jnp.full((n, TOKENS), value, jnp.int32),
            "reward": jnp.full((n,), 1.0, jnp.float32)}


# ---------------------------------------------------------------------------------------------
# The implementations, each reduced to four pure functions over its own state.


def ours(capacity, batch, sampling, normalization="buffer"):
    buffer = make_trajectory_buffer(ReplayConfig(
        capacity=capacity, sample_batch_size=batch, sampling=sampling,
        priority_exponent=ALPHA, age_decay_tau=TAU,
        importance_weight_normalization=normalization))

    def fill(version):
        state = buffer.init(item())
        chunk = min(capacity, 4096)
        add = jax.jit(buffer.add, donate_argnums=0)
        for i in range(capacity // chunk):
            state = add(state, batch_of(chunk, i), version, None)
        return state

    return dict(
        fill=fill,
        add=lambda s, data, version: buffer.add(s, data, version),
        sample=lambda s, key: buffer.sample(s, key),
        set_priorities=lambda s, idx, p: buffer.set_priorities(s, idx, p),
        indices=lambda sample: sample.indices,
        probabilities=lambda sample: sample.probabilities,
    )


def flashbax(capacity, batch):
    buffer = fbx.make_prioritised_item_buffer(
        max_length=capacity, min_length=1, sample_batch_size=batch, add_sequences=True,
        priority_exponent=ALPHA, device="cpu")

    def fill(version):
        state = buffer.init(jax.tree.map(lambda x: x, item()))
        chunk = min(capacity, 4096)
        add = jax.jit(buffer.add, donate_argnums=0)
        for i in range(capacity // chunk):
            state = add(state, batch_of(chunk, i))
        return state

    return dict(
        fill=fill,
        add=lambda s, data, version: buffer.add(s, data),
        sample=lambda s, key: buffer.sample(s, key),
        set_priorities=lambda s, idx, p: buffer.set_priorities(s, idx, p),
        indices=lambda sample: sample.indices,
        probabilities=lambda sample: sample.probabilities,
    )


def eager_refresh(capacity, batch):
    """FreshPER as the authors run it: rewrite every decayed leaf each step, then sample."""
    impl = ours(capacity, batch, "per")  # stores plain p^α; decay applied by the refresh

    def refresh_then_sample(state, key):
        # Every step, every leaf: (p_i · exp(−(t − t_i)/τ))^α, and the tree rebuilt from them.
        age = (state.latest_version - state.insert_version).astype(jnp.float32)
        decayed = jnp.where(state.valid, (state.base_priority * jnp.exp(-age / TAU)) ** ALPHA, 0.0)
        leaves = jnp.stack([decayed, jnp.where(decayed > 0, jnp.log(decayed), jnp.inf)], -1)
        state = state.replace(priority_tree=segment_tree.build(leaves, ("sum", "min")))
        return impl["sample"](state, key)

    return {**impl, "sample": refresh_then_sample}


# ---------------------------------------------------------------------------------------------
# Timing


def _block(tree):
    jax.tree.map(lambda x: x.block_until_ready(), tree)


def _ops(impl, capacity, batch):
    """Scanned and single-call versions of each operation, all with donated state."""

    def add_step(state, key):
        return impl["add"](state, batch_of(batch, 1), 1), None

    def sample_step(state, key):
        s = impl["sample"](state, key)
        # Make the result live without mutating the buffer in a way that changes the op cost.
        return state, jnp.sum(impl["indices"](s)) + jnp.sum(impl["probabilities"](s))

    def set_step(state, key):
        k1, k2 = jax.random.split(key)
        idx = jax.random.randint(k1, (batch,), 0, capacity)
        pri = jax.random.uniform(k2, (batch,), minval=0.01, maxval=2.0)
        return impl["set_priorities"](state, idx, pri), None

    def train_step(state, key):
        k1, k2 = jax.random.split(key)
        s = impl["sample"](state, k1)
        pri = jax.random.uniform(k2, (batch,), minval=0.01, maxval=2.0)
        return impl["set_priorities"](state, impl["indices"](s), pri), None

    steps = {"add": add_step, "sample": sample_step, "set_priorities": set_step,
             "sample+set_priorities": train_step}
    scanned = {name: jax.jit(lambda st, keys, f=f: jax.lax.scan(f, st, keys), donate_argnums=0)
               for name, f in steps.items()}
    single = {name: jax.jit(f, donate_argnums=0) for name, f in steps.items()}
    return scanned, single


def time_impl(impl, capacity, batch, scan_steps, repeats, loop_calls):
    scanned, single = _ops(impl, capacity, batch)
    rows = {}
    state = impl["fill"](0)
    for name in scanned:
        keys = jax.random.split(jax.random.key(0), scan_steps)
        t0 = time.perf_counter()
        compiled = scanned[name].lower(state, keys).compile()
        compile_s = time.perf_counter() - t0
        state, out = compiled(state, keys)  # warm-up
        _block((state, out))
        runs = []
        for r in range(repeats):
            keys = jax.random.split(jax.random.key(r + 1), scan_steps)
            t0 = time.perf_counter()
            state, out = compiled(state, keys)
            _block((state, out))
            runs.append((time.perf_counter() - t0) / scan_steps)
        # Python loop of single jitted calls.
        state, out = single[name](state, jax.random.key(0))
        _block((state, out))
        loop = []
        for r in range(repeats):
            t0 = time.perf_counter()
            for i in range(loop_calls):
                state, out = single[name](state, jax.random.key(i))
            _block((state, out))
            loop.append((time.perf_counter() - t0) / loop_calls)
        rows[name] = dict(compile_s=compile_s, scan_us=1e6 * statistics.median(runs),
                          loop_us=1e6 * statistics.median(loop))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacities", type=int, nargs="+", default=[12, 14, 16, 18, 20],
                        help="log2 capacities")
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--scan-steps", type=int, default=50)
    parser.add_argument("--loop-calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="capacities 2^12 and 2^16 only")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.capacities = [12, 16]

    impls = {
        "flashbax_per": lambda c, b: flashbax(c, b),
        "ours_per": lambda c, b: ours(c, b, "per"),
        "ours_freshper": lambda c, b: ours(c, b, "freshper"),
        "ours_freshper_sum_only": lambda c, b: ours(c, b, "freshper", "batch"),
        "freshper_eager_refresh": eager_refresh,
    }
    records = []
    wall0 = time.perf_counter()
    for log_c in args.capacities:
        capacity = 1 << log_c
        for batch in args.batches:
            if batch > capacity:
                continue
            for name, make in impls.items():
                if name == "freshper_eager_refresh" and batch != 256:
                    continue  # the refresh cost is independent of the batch
                timings = time_impl(make(capacity, batch), capacity, batch,
                                    args.scan_steps, args.repeats, args.loop_calls)
                for op, t in timings.items():
                    if name == "freshper_eager_refresh" and op != "sample+set_priorities":
                        continue
                    records.append(dict(impl=name, capacity=capacity, batch=batch, op=op, **t))
                    print(f"{name:24s} C=2^{log_c:<2d} B={batch:<5d} {op:22s} "
                          f"scan {t['scan_us']:10.1f} us  loop {t['loop_us']:10.1f} us  "
                          f"compile {t['compile_s']:.2f} s", flush=True)
    wall = time.perf_counter() - wall0
    write_tables(records, args, wall)


def write_tables(records, args, wall):
    write_csv(args.out / "replay.csv", records)

    def get(impl, c, b, op, field="scan_us"):
        for r in records:
            if (r["impl"], r["capacity"], r["batch"], r["op"]) == (impl, c, b, op):
                return r[field]
        return float("nan")

    commit = git_commit()
    lines = [
        "# Replay buffer throughput: fresh_rl vs flashbax",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (this process pinned to "
        f"{sorted(os.sched_getaffinity(0))}), jax {jax.__version__}, "
        f"flashbax {getattr(fbx, '__version__', '0.1.3')}; commit {commit}; "
        f"wall time {wall / 60:.1f} min.",
        f"Command: `python benchmarks/replay_bench.py {' '.join(_cli(args))}`".rstrip()
        + f"; load average at start {LOAD_AT_START}.",
        "",
        "Microseconds per call, median of steady-state repeats; `scan` = inside one jitted "
        "`lax.scan` with donated state, `loop` = Python loop of single jitted calls. "
        "Speed-up = flashbax time / our time (> 1: we are faster). `ours PER` and `ours "
        "FreshPER` keep a second tree column (min of log-keys) for buffer-wide normalisation of "
        "the importance weights, work flashbax does not do; `sum only` is FreshPER with "
        "batch-normalised weights, the same tree work as flashbax.",
        "",
        "| capacity | batch | op | flashbax scan | ours PER scan | ours FreshPER scan | "
        "ours FreshPER sum only | speed-up PER | speed-up FreshPER | speed-up sum only | "
        "FreshPER/PER | flashbax loop | ours FreshPER loop |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(r["capacity"], r["batch"]) for r in records})
    for c, b in keys:
        for op in ("add", "sample", "set_priorities", "sample+set_priorities"):
            fb, per, fresh, lean = (get(i, c, b, op) for i in (
                "flashbax_per", "ours_per", "ours_freshper", "ours_freshper_sum_only"))
            lines.append(
                f"| 2^{c.bit_length() - 1} | {b} | {op} | {fb:.1f} | {per:.1f} | {fresh:.1f} | "
                f"{lean:.1f} | {fb / per:.2f}x | {fb / fresh:.2f}x | {fb / lean:.2f}x | "
                f"{fresh / per:.2f} | "
                f"{get('flashbax_per', c, b, op, 'loop_us'):.1f} | "
                f"{get('ours_freshper', c, b, op, 'loop_us'):.1f} |")
    lines += ["", "## FreshPER: time-invariant keys vs eager refresh of every leaf (batch 256)", "",
              "| capacity | eager refresh (us/step) | ours (us/step) | speed-up |", "|---|---|---|---|"]
    for c, b in keys:
        if b != 256:
            continue
        eager = get("freshper_eager_refresh", c, b, "sample+set_priorities")
        fresh = get("ours_freshper", c, b, "sample+set_priorities")
        lines.append(f"| 2^{c.bit_length() - 1} | {eager:.1f} | {fresh:.1f} | {eager / fresh:.1f}x |")
    lines += ["", "## Growth of our sample+set_priorities step with capacity", "",
              "| batch | smallest capacity (us) | largest capacity (us) | ratio |", "|---|---|---|---|"]
    for b in sorted({k[1] for k in keys}):
        caps = sorted(c for c, bb in keys if bb == b)
        lo = get("ours_freshper", caps[0], b, "sample+set_priorities")
        hi = get("ours_freshper", caps[-1], b, "sample+set_priorities")
        lines.append(f"| {b} | 2^{caps[0].bit_length() - 1}: {lo:.1f} | "
                     f"2^{caps[-1].bit_length() - 1}: {hi:.1f} | {hi / lo:.2f} |")
    lines += ["", "Compile times (s) are in `replay.csv` (column `compile_s`)."]
    (args.out / "replay.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _cli(args):
    if args.quick:
        return ["--quick"]
    return [f"--capacities {' '.join(map(str, args.capacities))}",
            f"--batches {' '.join(map(str, args.batches))}", f"--scan-steps {args.scan_steps}",
            f"--loop-calls {args.loop_calls}", f"--repeats {args.repeats}"]


if __name__ == "__main__":
    main()
