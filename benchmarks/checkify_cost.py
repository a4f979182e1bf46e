"""Cost of the ``fresh_rl.checked`` switch: one jitted step (VACO loss + GAE + a FreshPER
buffer sample) with the switch off and on.

Off, the step is traced without the switch: its jaxpr holds no checkify op (asserted here and
in tests/test_validation_checked.py), so off costs nothing by construction. On, it runs as
``fresh_rl.checked(step)``: ``jit(checkify(step))`` plus ``err.throw()`` on the host after
every call. Steady state is the median over ``--repeats`` timings of ``--inner`` back-to-back
calls (each synchronised); off and on alternate within every repeat, so load from other
processes hits both alike. Writes results/bench/checkify.md.

    .venv/bin/python benchmarks/checkify_cost.py
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import fresh_rl
from fresh_rl.corrections import generalized_advantage_estimation, vaco_policy_loss
from fresh_rl.provenance import provenance, provenance_line
from fresh_rl.replay import ReplayConfig, make_trajectory_buffer

BATCH, STEPS, CAPACITY, SAMPLE = 64, 256, 4096, 64
CHECK_OP = re.compile(r"\bcheck\[")  # checkify's primitive in a printed jaxpr


def make_step():
    """The step and its inputs: ``step(data, state, key, delta, lambda_, beta)``."""
    rng = np.random.default_rng(0)
    data = {k: jnp.asarray(rng.normal(size=(BATCH, STEPS)).astype(np.float32) * 0.1)
            for k in ("log_probs", "start", "behaviour", "rewards", "values")}
    buffer = make_trajectory_buffer(ReplayConfig(capacity=CAPACITY, sample_batch_size=SAMPLE,
                                                 new_item_priority="given"))
    state = buffer.init(jnp.zeros((STEPS,), jnp.float32))
    items = jnp.asarray(rng.normal(size=(CAPACITY, STEPS)).astype(np.float32))
    state = buffer.add(state, items, jnp.arange(CAPACITY, dtype=jnp.int32) // 64,
                       jnp.asarray(rng.uniform(0.1, 2.0, CAPACITY).astype(np.float32)))

    def step(data, state, key, delta, lambda_, beta):
        gae = generalized_advantage_estimation(data["rewards"], data["values"], data["values"],
                                               jnp.full((BATCH, STEPS), 0.99), lambda_=lambda_)
        loss, _ = vaco_policy_loss(data["log_probs"], data["start"], data["behaviour"],
                                   gae.advantages, delta=delta)
        sample = buffer.sample(state, key, beta)
        return loss + jnp.sum(sample.importance_weights * sample.experience.sum(-1))

    args = (data, state, jax.random.key(0), jnp.float32(0.2), jnp.float32(0.95), jnp.float32(0.4))
    return step, args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--inner", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    parser.add_argument("--allow-dirty", action="store_true", help="stamp a +dirty commit")
    args = parser.parse_args()
    started = time.perf_counter()
    info = provenance(allow_dirty=args.allow_dirty)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())

    step, inputs = make_step()
    jaxpr_off = str(jax.make_jaxpr(step)(*inputs))
    with fresh_rl.checked():
        jaxpr_on = str(jax.make_jaxpr(step)(*inputs))
    assert not CHECK_OP.search(jaxpr_off) and CHECK_OP.search(jaxpr_on), "checks only when on"
    runs = {"off": jax.jit(step), "on": fresh_rl.checked(step)}
    for fn in runs.values():  # compile, and same numbers both ways
        fn(*inputs)
    assert float(runs["off"](*inputs)) == float(runs["on"](*inputs))

    times = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            t0 = time.perf_counter()
            for _ in range(args.inner):
                jax.block_until_ready(fn(*inputs))
            times[name].append((time.perf_counter() - t0) / args.inner)
    off, on = (1e3 * statistics.median(times[k]) for k in ("off", "on"))
    paired = statistics.median(b / a for a, b in zip(times["off"], times["on"]))
    checks = len(CHECK_OP.findall(jaxpr_on))
    lines = [
        "# Cost of the `fresh_rl.checked` switch",
        "",
        provenance_line({**info, "wall_seconds": round(time.perf_counter() - started, 1)}),
        "",
        f"One jitted step: `vaco_policy_loss` + `generalized_advantage_estimation` on [{BATCH}, {STEPS}] "
        f"float32 and a FreshPER `sample` of {SAMPLE} from {CAPACITY} items of [{STEPS}] (traced δ, λ, β).",
        f"Median of {args.repeats} repeats of {args.inner} synchronised calls; off and on alternate "
        f"(load average {load} at start: a shared machine inflates both sides, the ratio less).",
        "",
        "| switch | ms / step | ratio on/off |",
        "|---|---|---|",
        f"| off (`jax.jit(step)`) | {off:.3f} | 1 |",
        f"| on (`fresh_rl.checked(step)`) | {on:.3f} | {on / off:.2f} (paired median {paired:.2f}) |",
        "",
        f"Off: the traced step holds no checkify op (asserted), so its cost is 0 by construction. "
        f"On: {checks} check ops in the jaxpr; the difference is the checks' reductions plus the "
        f"error read-back and `err.throw()` on the host every call.",
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "checkify.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
