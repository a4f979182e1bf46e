"""Replay throughput: fresh_rl's buffer vs flashbax's prioritised buffer, side by side.

Same data in both (full trajectories as items: ``tokens [16] int32`` + ``reward`` float32),
same capacity and batch, both jitted, in one process. Each operation (add, sample,
set_priorities, and the training-loop step sample+set_priorities) is timed

* inside one ``lax.scan`` of ``--scan-steps`` calls with the state donated (the headline
  figure), and
* as a Python loop of single jitted calls with donated state (per-call figure, includes
  dispatch overhead),

with compile time reported apart. The implementations of a cell take turns within every
repeat (flashbax, ours, flashbax, ours, …), so load from other processes hits them alike;
the tables give the median over ``--repeats``.

A K sweep times the training step of our FreshPER buffer at every tree fan-out K (the
default is chosen from it), and a growth table its time from the smallest to the largest
capacity. FreshPER is also run the authors' way ("eager refresh"): every step recompute the
decayed leaf ``(p·exp(−age/τ))^α`` of every item and rebuild the tree before sampling
(vectorised here, so already much faster than the authors' per-item Python loop), versus our
time-invariant keys.

Writes ``results/bench/replay.csv``, ``replay_fanout.csv`` and ``replay.md``.

    python benchmarks/replay_bench.py                 # full grid, 2^12 … 2^20, batch 256/4096
    python benchmarks/replay_bench.py --quick         # 2^12 and 2^16 only, fewer repeats
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import flashbax as fbx
import jax
import jax.numpy as jnp

from fresh_rl.provenance import command_line, git_commit, write_csv
from fresh_rl.replay import ReplayConfig, make_trajectory_buffer, segment_tree

TOKENS = 16
ALPHA, TAU = 0.6, 500.0
RESULTS = Path(__file__).resolve().parents[1] / "results" / "bench"
OPS = ("add", "sample", "set_priorities", "sample+set_priorities")


def item():
    return {"tokens": jnp.zeros((TOKENS,), jnp.int32), "reward": jnp.zeros((), jnp.float32)}


def batch_of(n, value):
    return {"tokens": jnp.full((n, TOKENS), value, jnp.int32),
            "reward": jnp.full((n,), 1.0, jnp.float32)}


# ---------------------------------------------------------------------------------------------
# The implementations, each reduced to four pure functions over its own state.


def ours(capacity, batch, sampling, normalization="buffer",
         fanout=segment_tree.DEFAULT_FANOUT, min_decayed_priority=1e-8, floored_fraction=0.0):
    """``floored_fraction`` > 0: that share of the items is inserted 20τ versions before the
    rest, so their decayed priority e^−20 ≈ 2e-9 is below the default floor 1e-8. The fresh
    chunks are written first: the old ones then arrive below the floor of the buffer's clock and
    join the floored set in one vectorised write, where writing them first would leave the floor
    to move them one min-descent at a time when the clock jumps (2^19 loop steps at 2^20)."""
    buffer = make_trajectory_buffer(ReplayConfig(
        capacity=capacity, sample_batch_size=batch, sampling=sampling,
        priority_exponent=ALPHA, age_decay_tau=TAU,
        importance_weight_normalization=normalization, tree_fanout=fanout,
        min_decayed_priority=min_decayed_priority))

    def fill(version):
        state = buffer.init(item())
        chunk = min(capacity, 4096)
        add = jax.jit(buffer.add, donate_argnums=0)
        chunks = capacity // chunk
        num_old = round(floored_fraction * chunks)
        for i in [*range(num_old, chunks), *range(num_old)]:
            old = i < num_old
            state = add(state, batch_of(chunk, i), version + (0 if old else int(20 * TAU)), None)
        if int(state.floored.size) != (num_old * chunk if min_decayed_priority > 0 else 0):
            raise RuntimeError(f"fill: {int(state.floored.size)} items floored, expected "
                               f"{num_old * chunk} of {capacity}")
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
        state = state.replace(priority_tree=segment_tree.build(
            leaves, ("sum", "min"), state.priority_tree.fanout))
        return impl["sample"](state, key)

    return {**impl, "sample": refresh_then_sample}


# ---------------------------------------------------------------------------------------------
# Timing


def _block(tree):
    jax.tree.map(lambda x: x.block_until_ready(), tree)


def _steps(impl, capacity, batch):
    """One step function per operation, ``(state, key) -> (state, output)``."""

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

    return dict(zip(OPS, (add_step, sample_step, set_step, train_step)))


def time_cell(impls, ops, capacity, batch, scan_steps, repeats, loop_calls):
    """Compiles every (implementation, op) of one cell, then times them in turns.

    Returns ``{(impl, op): dict(compile_s, scan_us, loop_us)}``: compile time of the scanned
    program, and medians over ``repeats`` of the per-step time inside the scan and of the
    per-call time of a Python loop of single jitted calls (``loop_calls`` 0: not timed).
    """
    keys = jax.random.split(jax.random.key(0), scan_steps)
    programs, states, compile_s = {}, {}, {}
    for name, impl in impls.items():
        states[name] = impl["fill"](0)
        for op in ops[name]:
            step = _steps(impl, capacity, batch)[op]
            scanned = jax.jit(lambda st, ks, f=step: jax.lax.scan(f, st, ks), donate_argnums=0)
            t0 = time.perf_counter()
            programs[name, op] = (scanned.lower(states[name], keys).compile(),
                                  jax.jit(step, donate_argnums=0))
            compile_s[name, op] = time.perf_counter() - t0
            states[name], out = programs[name, op][0](states[name], keys)  # warm-up
            _block((states[name], out))
            if loop_calls:
                states[name], out = programs[name, op][1](states[name], jax.random.key(0))
                _block((states[name], out))
    scan_runs = {cell: [] for cell in programs}
    loop_runs = {cell: [] for cell in programs}
    for r in range(repeats):
        keys = jax.random.split(jax.random.key(r + 1), scan_steps)
        for (name, op), (scanned, single) in programs.items():
            t0 = time.perf_counter()
            states[name], out = scanned(states[name], keys)
            _block((states[name], out))
            scan_runs[name, op].append((time.perf_counter() - t0) / scan_steps)
            if loop_calls:
                t0 = time.perf_counter()
                for i in range(loop_calls):
                    states[name], out = single(states[name], jax.random.key(i))
                _block((states[name], out))
                loop_runs[name, op].append((time.perf_counter() - t0) / loop_calls)
    return {cell: dict(compile_s=compile_s[cell],
                       scan_us=1e6 * statistics.median(scan_runs[cell]),
                       loop_us=1e6 * statistics.median(loop_runs[cell]) if loop_calls
                       else float("nan"))
            for cell in programs}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacities", type=int, nargs="+", default=[12, 14, 16, 18, 20],
                        help="log2 capacities")
    parser.add_argument("--batches", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--fanouts", type=int, nargs="+", default=list(segment_tree.FANOUTS),
                        help="tree fan-outs K of the sweep")
    parser.add_argument("--sweep-capacities", type=int, nargs="+", default=[12, 16, 20],
                        help="log2 capacities of the K sweep")
    parser.add_argument("--scan-steps", type=int, default=30)
    parser.add_argument("--loop-calls", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true",
                        help="capacities 2^12 and 2^16 only, 3 repeats, K sweep at 2^16")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.quick:
        args.capacities, args.sweep_capacities, args.repeats = [12, 16], [16], 3

    uptime_start = _uptime()
    impls = {
        "flashbax_per": lambda c, b: flashbax(c, b),
        "ours_per": lambda c, b: ours(c, b, "per"),
        "ours_freshper": lambda c, b: ours(c, b, "freshper"),
        # one tree column: batch-normalised weights and no floor (a floor keeps the min
        # column, its trigger, whatever the normalisation)
        "ours_freshper_sum_only": lambda c, b: ours(c, b, "freshper", "batch",
                                                    min_decayed_priority=0.0),
        "freshper_eager_refresh": eager_refresh,
    }
    records, sweep = [], []
    wall0 = time.perf_counter()
    for log_c in args.capacities:
        capacity = 1 << log_c
        for batch in args.batches:
            if batch > capacity:
                continue
            # The eager refresh costs the same at every batch: batch 256 only, one op.
            cell = {name: make(capacity, batch) for name, make in impls.items()
                    if name != "freshper_eager_refresh" or batch == 256}
            ops = {name: ("sample+set_priorities",) if name == "freshper_eager_refresh"
                   else OPS for name in cell}
            timings = time_cell(cell, ops, capacity, batch, args.scan_steps, args.repeats,
                                args.loop_calls)
            for (name, op), t in timings.items():
                records.append(dict(impl=name, capacity=capacity, batch=batch, op=op, **t))
                print(f"{name:24s} C=2^{log_c:<2d} B={batch:<5d} {op:22s} "
                      f"scan {t['scan_us']:10.1f} us  loop {t['loop_us']:10.1f} us  "
                      f"compile {t['compile_s']:.2f} s", flush=True)
    for log_c in args.sweep_capacities:
        capacity = 1 << log_c
        for batch in args.batches:
            if batch > capacity:
                continue
            cell = {"flashbax_per": flashbax(capacity, batch)}
            cell.update({f"K={k}": ours(capacity, batch, "freshper", fanout=k)
                         for k in args.fanouts})
            timings = time_cell(cell, {name: ("sample+set_priorities",) for name in cell},
                                capacity, batch, args.scan_steps, args.repeats, 0)
            for (name, op), t in timings.items():
                sweep.append(dict(impl=name, capacity=capacity, batch=batch, op=op,
                                  compile_s=t["compile_s"], scan_us=t["scan_us"]))
                print(f"sweep {name:14s} C=2^{log_c:<2d} B={batch:<5d} scan "
                      f"{t['scan_us']:10.1f} us  compile {t['compile_s']:.2f} s", flush=True)
    wall = time.perf_counter() - wall0
    write_tables(records, sweep, args, wall, uptime_start, _uptime())


def _uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True, check=False).stdout.strip()


def write_tables(records, sweep, args, wall, uptime_start, uptime_end):
    write_csv(args.out / "replay.csv", records)
    write_csv(args.out / "replay_fanout.csv", sweep)

    def get(impl, c, b, op, field="scan_us", rows=records):
        for r in rows:
            if (r["impl"], r["capacity"], r["batch"], r["op"]) == (impl, c, b, op):
                return r[field]
        return float("nan")

    train = "sample+set_priorities"
    keys = sorted({(r["capacity"], r["batch"]) for r in records})
    lines = [
        "# Replay buffer throughput: fresh_rl vs flashbax",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (this process pinned to "
        f"{sorted(os.sched_getaffinity(0))}), jax {jax.__version__}, "
        f"flashbax {getattr(fbx, '__version__', '0.1.3')}; commit {git_commit()}; "
        f"wall time {wall / 60:.1f} min; tree fan-out K = {segment_tree.DEFAULT_FANOUT} "
        "(the default).",
        f"Command: `{command_line()}`.",
        f"Load: `{uptime_start}` at start, `{uptime_end}` at the end (other processes share "
        "the CPUs; the implementations of a cell take turns within each repeat, so the "
        "ratios are the figures to read).",
        "",
        "Microseconds per call, median of steady-state repeats; `scan` = inside one jitted "
        "`lax.scan` with donated state, `loop` = Python loop of single jitted calls. "
        "Speed-up = flashbax time / our time (> 1: we are faster). `ours PER` and `ours "
        "FreshPER` (the defaults) keep two tree columns: the sum and the min of log-keys (the "
        "buffer-wide normaliser of the importance weights and the floor's trigger), work "
        "flashbax does not do, and a set of the floored items (`fresh_rl.replay.slot_set`); "
        "a sample's descent reads the sum column only; `sum only` is FreshPER with "
        "batch-normalised weights and no floor (`min_decayed_priority=0`), one column, the same "
        "tree work as flashbax. Compile = seconds to "
        "compile the scanned program (flashbax / ours FreshPER).",
        "",
        "| capacity | batch | op | flashbax scan | ours PER scan | ours FreshPER scan | "
        "ours FreshPER sum only | speed-up PER | speed-up FreshPER | speed-up sum only | "
        "FreshPER/PER | flashbax loop | ours FreshPER loop | compile (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c, b in keys:
        for op in OPS:
            fb, per, fresh, lean = (get(i, c, b, op) for i in (
                "flashbax_per", "ours_per", "ours_freshper", "ours_freshper_sum_only"))
            lines.append(
                f"| 2^{c.bit_length() - 1} | {b} | {op} | {fb:.1f} | {per:.1f} | {fresh:.1f} | "
                f"{lean:.1f} | {fb / per:.2f}x | {fb / fresh:.2f}x | {fb / lean:.2f}x | "
                f"{fresh / per:.2f} | "
                f"{get('flashbax_per', c, b, op, 'loop_us'):.1f} | "
                f"{get('ours_freshper', c, b, op, 'loop_us'):.1f} | "
                f"{get('flashbax_per', c, b, op, 'compile_s'):.1f} / "
                f"{get('ours_freshper', c, b, op, 'compile_s'):.1f} |")

    def ratios(op, num, den):
        return [get(num, c, b, op) / get(den, c, b, op) for c, b in keys]

    lines += ["", "## Summary over the cells (median, min, max)", "",
              "| ratio | median | min | max |", "|---|---|---|---|"]
    for label, op, num, den in (
        ("sample+set_priorities: flashbax / ours FreshPER", train, "flashbax_per",
         "ours_freshper"),
        ("sample+set_priorities: flashbax / ours sum only", train, "flashbax_per",
         "ours_freshper_sum_only"),
        ("add: flashbax / ours FreshPER", "add", "flashbax_per", "ours_freshper"),
        ("sample+set_priorities: ours FreshPER / ours PER", train, "ours_freshper", "ours_per"),
    ):
        values = ratios(op, num, den)
        lines.append(f"| {label} | {statistics.median(values):.2f} | {min(values):.2f} | "
                     f"{max(values):.2f} |")

    lines += ["", "## Growth of the sample+set_priorities step with capacity", "",
              "| batch | implementation | smallest capacity (us) | largest capacity (us) | "
              "ratio |", "|---|---|---|---|---|"]
    for b in sorted({k[1] for k in keys}):
        caps = sorted(c for c, bb in keys if bb == b)
        for impl in ("ours_freshper", "ours_freshper_sum_only", "flashbax_per"):
            lo, hi = get(impl, caps[0], b, train), get(impl, caps[-1], b, train)
            lines.append(f"| {b} | {impl} | 2^{caps[0].bit_length() - 1}: {lo:.1f} | "
                         f"2^{caps[-1].bit_length() - 1}: {hi:.1f} | {hi / lo:.2f} |")

    if sweep:
        fanouts = sorted({int(r["impl"][2:]) for r in sweep if r["impl"].startswith("K=")})
        cells = sorted({(r["capacity"], r["batch"]) for r in sweep})
        lines += ["", "## K sweep: sample+set_priorities of ours FreshPER by tree fan-out K",
                  "", "Microseconds per step inside the scan (speed-up over flashbax, timed "
                  "in the same turns); compile seconds in `replay_fanout.csv`.", "",
                  "| capacity | batch | flashbax | " + " | ".join(f"K={k}" for k in fanouts)
                  + " |", "|---|---|---|" + "---|" * len(fanouts)]
        for c, b in cells:
            fb = get("flashbax_per", c, b, train, rows=sweep)
            lines.append(f"| 2^{c.bit_length() - 1} | {b} | {fb:.1f} | " + " | ".join(
                f"{get(f'K={k}', c, b, train, rows=sweep):.1f} "
                f"({fb / get(f'K={k}', c, b, train, rows=sweep):.2f}x)" for k in fanouts)
                + " |")

    lines += ["", "## FreshPER: time-invariant keys vs eager refresh of every leaf (batch 256)",
              "", "| capacity | eager refresh (us/step) | ours (us/step) | speed-up |",
              "|---|---|---|---|"]
    for c, b in keys:
        if b != 256:
            continue
        eager = get("freshper_eager_refresh", c, b, train)
        fresh = get("ours_freshper", c, b, train)
        lines.append(f"| 2^{c.bit_length() - 1} | {eager:.1f} | {fresh:.1f} | "
                     f"{eager / fresh:.1f}x |")
    (args.out / "replay.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
