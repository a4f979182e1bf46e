"""One prepared accelerator check: correctness against the CPU, then the throughput figures, in one process.

    python benchmarks/device_check.py [--budget-s 480] [--out DIR] [--cache-dir DIR] [--allow-dirty]
    python benchmarks/device_check.py --dry-run-cpu --out /tmp/check   # same code, tiny shapes, CPU

Stages, in order (each in try/except: a failing stage records its one-line error and the run
goes on; ``results/bench/device_check.{md,json}`` are rewritten atomically after every stage,
so a run cut off by its lease keeps what it measured):

1. **correctness** — replay buffer (add / sample / set-priorities, PER and the age-decayed
   FreshPER buffer), V-trace, the VACO TV filter, the decoupled loss, the EWMA reference
   update, one control training iteration (stage 3's VACO run cut to one iteration) and one
   LLM tiny-preset iteration (decode, old log-probs, update), each computed on the default
   device and on ``jax.devices("cpu")[0]`` from the same inputs and compared within a tolerance
   that carries its float32 argument (in the tables; optimiser steps compared as the norm of
   their difference). On an accelerator it runs under ``jax.default_matmul_precision("highest")``:
   TF32 matmuls (the GPU default for float32) round at 2^-11, a precision choice, not a bug.
2. **replay** — sample + set-priorities in one ``lax.scan`` (``replay_bench.time_cell``) at
   capacities 2^16, 2^20 × batch 256, 4096: ours PER, ours FreshPER, flashbax 0.1.3's
   prioritised buffer side by side; speed-up = flashbax µs / ours µs (> 1: ours faster).
3. **control** — env steps/s of our PPO-clip and VACO (lag 0) against
   ``brax.training.agents.ppo`` on inverted_pendulum at 2048 envs, same settings
   (``control_bench.time_side_by_side``); compile seconds apart.
4. **llm** — one Qwen2.5-0.5B iteration with random weights at the paper batch
   (``llm_gpu10.measure``): decode / old-log-prob / update tokens/s, device peak memory, each
   stage's compiled peak (XLA's memory analysis on this device) and the CPU estimate of
   ``results/bench/llm_scale.csv``.
5. **study** — VACO backward lag {0, 4, 16} × forward lag M = epochs × minibatches ∈ {4, 16, 64}
   on inverted_pendulum, seeds vmapped (one compile per M: the lag is a traced
   hyperparameter), as many seeds as the remaining budget allows; mean final return with a
   Student-t 95 % interval over seeds (``fresh_rl.eval.seed_interval``), and the trainer's
   measured TV and filtered fraction.

**Estimates.** Before a stage runs it prints its estimate, compile + run seconds, and is
skipped (reason recorded) when that exceeds the budget left. Compile seconds
(``CPU_COMPILE_S``) = the stage's programs × their idle XLA:CPU compile time on the 2-core
x86_64 VM: ≈ 11 s per control trainer program (``results/bench/compile_profile.md``: 5–6 s on a fast
day of the VM, 10–13 s on a slow one; the slow figure is used), ≈ 1 s
per replay scan, 5–7 s per 0.5B stage (``llm_scale.md``), Brax's PPO ≈ 2 × 10 s (its epoch
compiles twice); correctness 70 s (8 small programs, the control iteration and the three tiny
LLM stages, each compiled for the device and for the CPU), replay 8 s, control 45 s, llm 30 s,
study 35 s (3 programs). The cold dry run (XLA's lowest optimisation level and its loop emitters; the same programs
except one forward lag and CartPole instead of the Brax task in the study, and only our VACO
against Brax in the control stage) took (compile / total s, idle 2-core VM) 23.7/26.4, 2.6/2.6,
10.9/9.7, 2.9/4.0 (its LLM programs come from the correctness stage's cache) and 3.2/3.1 s:
49 s wall, 55 s of CPU time. Scaled by ``COMPILE_FACTOR`` = 1.0: XLA:GPU compiles a program in about the time XLA:CPU does,
and one compile does not use the GPU host's extra cores. Run seconds on one H100
(``DEVICE_RUN_S``) are reckoned from the shapes: correctness 15 s (the CPU side's 2048-env
iteration), replay 40 s (fills of 2^20 items, 4 cells × 3 scans × 5 repeats), control 90 s
(2 × 1.3 M env steps of ours per round and Brax's epochs at ≈ 1 M steps/s with learning), llm
60 s (3 timed runs of each stage, ≈ 2 s each), study 20 s per 8 seeds; together within the
default 480 (413 s). A second run in the same window loads every program from the persistent
compilation cache (``--cache-dir``, default ``fresh_rl.compilation_cache``'s folder,
``~/.cache/fresh_rl/xla``), so only the run seconds count.

**Reading it.** Correctness rows must all say ``pass`` before any speed figure means
anything. Ratios (speed-up, vs Brax) are > 1 where ours is faster; both sides ran
interleaved in the same process on the same device, so the ratios are the figures to quote.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.compilation_cache import CompileMeter, enable_compilation_cache, with_fast_compile_flags
from fresh_rl.provenance import (DirtyCheckoutError, git_commit, machine_description, provenance, provenance_line,
                                 read_csv, require_clean, write_atomic)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "bench"
STAGES = ("correctness", "replay", "control", "llm", "study")
COMPILE_FACTOR = 1.0
CPU_COMPILE_S = {"correctness": 70.0, "replay": 8.0, "control": 45.0, "llm": 30.0, "study": 35.0}
DEVICE_RUN_S = {"correctness": 15.0, "replay": 40.0, "control": 90.0, "llm": 60.0, "study": 20.0}
STUDY_BACKWARD_LAGS = (0, 4, 16)
STUDY_FORWARD_LAGS = {4: (1, 4), 16: (4, 4), 64: (4, 16)}  # M → (epochs, minibatches)
BRAX_TASK = "inverted_pendulum"


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Shapes of every stage: the device run's, or the dry run's tiny ones."""

    replay_log_capacities: tuple
    replay_batches: tuple
    replay_scan_steps: int
    replay_repeats: int
    check_capacity: int
    check_batch: int
    control_envs: int
    control_unroll: int
    control_hidden: tuple
    control_iterations: int
    control_repeats: int
    control_variants: tuple  # of control_bench's jobs, timed against Brax PPO
    llm_tiny: bool
    llm_repeats: int
    study_envs: int
    study_unroll: int
    study_iterations: int
    study_forward_lags: tuple  # keys of STUDY_FORWARD_LAGS
    study_seeds: tuple  # (fewest, most)
    study_task: str  # the dry run's is a gymnax task: the same code, a third of Brax's compile


DEVICE_SIZES = Sizes(replay_log_capacities=(16, 20), replay_batches=(256, 4096), replay_scan_steps=30,
                     replay_repeats=5, check_capacity=4096, check_batch=256, control_envs=2048,
                     control_unroll=16, control_hidden=(64, 64), control_iterations=40, control_repeats=3,
                     control_variants=("ours ppo_clip lag 0", "ours vaco lag 0"),
                     llm_tiny=False, llm_repeats=3, study_envs=256, study_unroll=16, study_iterations=100,
                     study_forward_lags=(4, 16, 64), study_seeds=(3, 16),
                     study_task=f"brax/{BRAX_TASK}")
DRY_SIZES = Sizes(replay_log_capacities=(8,), replay_batches=(16,), replay_scan_steps=4, replay_repeats=1,
                  check_capacity=256, check_batch=16, control_envs=8, control_unroll=8, control_hidden=(16, 16),
                  control_iterations=1, control_repeats=1,
                  control_variants=("ours vaco lag 0",), llm_tiny=True, llm_repeats=1, study_envs=8,
                  study_unroll=8, study_iterations=2, study_forward_lags=(4,), study_seeds=(2, 2),
                  study_task="CartPole-v1")
# The dry run's estimates: its cold run on the idle 2-core VM (docstring).
DRY_RUN_S = {"correctness": 27.0, "replay": 3.0, "control": 10.0, "llm": 4.0, "study": 4.0}


def estimate_s(stage: str, dry_run: bool) -> float:
    """Seconds a stage should take: compile (CPU-measured × ``COMPILE_FACTOR``) + run."""
    if dry_run:
        return DRY_RUN_S[stage]
    return CPU_COMPILE_S[stage] * COMPILE_FACTOR + DEVICE_RUN_S[stage]


# ---------------------------------------------------------------------------------------------
# Report: md + json, rewritten after every stage (write_atomic: temporary file, then os.replace).


def markdown_table(rows: list) -> list:
    names = list(dict.fromkeys(name for row in rows for name in row))
    cell = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)
    return (["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
            + ["| " + " | ".join(cell(row.get(n, "")) for n in names) + " |" for row in rows])


class Report:
    """The stages recorded so far; :meth:`add` appends one and rewrites both files."""

    def __init__(self, out: Path, args, started: float):
        self.out, self.args, self.started, self.stages = out, args, started, []

    def add(self, section: dict) -> None:
        self.stages.append(section)
        info = provenance(started=self.started, allow_dirty=self.args.allow_dirty or self.args.dry_run_cpu)
        device = jax.devices()[0]
        header = {**info, "device": f"{device.platform} {device.device_kind}", "budget_s": self.args.budget_s,
                  "dry_run_cpu": self.args.dry_run_cpu}
        write_atomic(self.out / "device_check.json",
                         json.dumps({**header, "stages": self.stages}, indent=1, default=str) + "\n")
        lines = ["# Device check: correctness against the CPU, then throughput", "",
                 provenance_line(info) + f" Device: {header['device']}; budget {self.args.budget_s:.0f} s"
                 + ("; dry run on the CPU (tiny shapes)." if self.args.dry_run_cpu else "."),
                 "", "How to read each table: see the docstring of `benchmarks/device_check.py`."]
        for number, stage in enumerate(self.stages, 1):
            lines += ["", f"## {number}. {stage['name']}: {stage['status']}", "",
                      f"Estimate {stage['estimate_s']:.0f} s; took {stage.get('seconds', 0.0):.1f} s "
                      f"(compile {stage.get('compile_s', 0.0):.1f} s)."]
            if stage.get("reason"):
                lines.append(f"Reason: {stage['reason']}")
            if stage.get("error"):
                lines.append(f"Error: `{stage['error']}`")
            lines += [f"* {note}" for note in stage.get("notes", [])]
            if stage.get("rows"):
                lines += [""] + markdown_table(stage["rows"])
        write_atomic(self.out / "device_check.md", "\n".join(lines) + "\n")
        print(f"[{section['name']}] wrote device_check.md and device_check.json ({len(self.stages)} "
              f"stage(s)) in {self.out}", flush=True)


# ---------------------------------------------------------------------------------------------
# Stage 1: correctness on the device against the CPU.


def placed(tree, device):
    """``tree`` as it is for the default device (uncommitted, as the benchmarks pass their
    inputs: the compilation cache keys on commitment, so the dry run's programs are shared),
    committed to ``device`` otherwise."""
    return tree if device == jax.devices()[0] else jax.device_put(tree, device)


def on_both(fn, *args):
    """``(on the default device, on the CPU)``: ``jax.jit(fn)`` of ``args`` placed on each, as numpy."""
    jitted = jax.jit(fn)
    return [jax.tree.map(np.asarray, jitted(*placed(args, device)))
            for device in (jax.devices()[0], jax.devices("cpu")[0])]


def compare(check: str, device_out, cpu_out, rtol: float, atol: float, argument: str) -> dict:
    """``pass`` when every float leaf has ``|device − cpu| ≤ atol + rtol·|cpu|`` and every
    integer or boolean leaf is equal."""
    worst, excess, mismatched = 0.0, -math.inf, 0
    for a, b in zip(jax.tree.leaves(device_out), jax.tree.leaves(cpu_out)):
        if np.issubdtype(b.dtype, np.floating):
            a, b = a.astype(np.float64), b.astype(np.float64)
            diff = np.abs(a - b)
            worst = max(worst, float(np.max(diff, initial=0.0)))
            excess = max(excess, float(np.max(diff - (atol + rtol * np.abs(b)), initial=-math.inf)))
        else:
            mismatched += int(np.sum(a != b))
    ok = excess <= 0.0 and mismatched == 0
    return {"check": check, "status": "pass" if ok else "fail", "max_abs_diff": worst,
            "unequal_integers": mismatched, "rtol": rtol, "atol": atol, "argument": argument}


def compare_step(check: str, device_after, cpu_after, before, rtol: float, argument: str) -> dict:
    """``pass`` when the two optimisation steps agree, ``‖Δ_device − Δ_cpu‖ ≤ rtol · ‖Δ_cpu‖``
    with ``Δ = after − before`` over all parameter leaves (one norm: Adam may flip the step of a
    coordinate whose gradient is round-off, a tiny share of the norm, not of the maximum)."""
    flat = lambda tree: np.concatenate([np.ravel(x).astype(np.float64) for x in jax.tree.leaves(tree)])
    step_cpu, step_device = flat(cpu_after) - flat(before), flat(device_after) - flat(before)
    gap = float(np.linalg.norm(step_device - step_cpu) / max(np.linalg.norm(step_cpu), 1e-30))
    return {"check": check, "status": "pass" if gap <= rtol else "fail",
            "max_abs_diff": float(np.max(np.abs(step_device - step_cpu))), "relative step gap": gap,
            "rtol": rtol, "atol": "", "argument": argument}


def replay_outputs(config, rewards, priorities, key):
    """Fill, sample, set priorities, sample again: ``(indices, probabilities, weights)`` of both draws."""
    from fresh_rl.replay import make_trajectory_buffer

    buffer = make_trajectory_buffer(config)
    state = buffer.init({"reward": jnp.zeros((), jnp.float32)})
    half = rewards.shape[0] // 2
    state = buffer.add(state, {"reward": rewards[:half]}, 0, priorities[:half])
    state = buffer.add(state, {"reward": rewards[half:]}, 40, priorities[half:])
    first_key, second_key = jax.random.split(key)
    first = buffer.sample(state, first_key)
    state = buffer.set_priorities(state, first.indices, jnp.abs(first.experience["reward"]) + 0.01)
    second = buffer.sample(state, second_key)
    return [(s.indices, s.probabilities, s.importance_weights) for s in (first, second)]


def correctness_rows(sizes: Sizes, log) -> list:
    from fresh_rl import corrections
    from fresh_rl.replay import ReplayConfig

    rows = []
    keys = jax.random.split(jax.random.PRNGKey(7), 8)
    capacity, batch = sizes.check_capacity, sizes.check_batch
    rewards = jax.random.normal(keys[0], (capacity,))
    priorities = jax.random.uniform(keys[1], (capacity,), minval=0.01, maxval=2.0)
    for sampling in ("per", "freshper"):
        config = ReplayConfig(capacity=capacity, sample_batch_size=batch, sampling=sampling,
                              priority_exponent=0.6, age_decay_tau=50.0)
        outs = on_both(lambda r, p, k: replay_outputs(config, r, p, k), rewards, priorities, keys[2])
        rows.append(compare(
            f"replay {sampling}: add, sample, set_priorities, sample", *outs, 1e-5, 0.0,
            "keys and tree sums pass through ≤ 2 log2(capacity) float32 roundings (2^-24 each) "
            "≤ 1e-5 relative for 2^20 slots; an index differs only if a target lands within that "
            "of a prefix-sum boundary, chance ≈ batch · 1e-5 / capacity (none expected)"))
        log(rows[-1])

    b, t = 32, 64
    values, next_values, rewards_bt = (jax.random.normal(k, (b, t)) for k in jax.random.split(keys[3], 3))
    discounts = jnp.full((b, t), 0.99)
    log_rhos = 0.3 * jax.random.normal(keys[4], (b, t))
    outs = on_both(lambda *x: corrections.vtrace(*x), values, next_values, rewards_bt, discounts, log_rhos)
    rows.append(compare(
        "V-trace targets and advantages", *outs, 1e-5, 1e-5,
        "a reverse recurrence of T = 64 steps with decay ≤ 0.99: each output sums ≤ 64 rounded "
        "terms, ≤ 64 · 2^-24 ≈ 4e-6 relative to their magnitude (≤ 1e-5 absolute at |v| ~ 1)"))
    log(rows[-1])

    log_probs = -1.0 + 0.1 * jax.random.normal(keys[5], (b, t))
    start_log_probs = log_probs + 0.2 * jax.random.normal(keys[6], (b, t))
    behaviour_log_probs = start_log_probs + 0.1 * jax.random.normal(keys[7], (b, t))
    advantages = jax.random.normal(keys[0], (b, t))
    mask = jnp.arange(t)[None] < jnp.arange(b)[:, None] + t // 2
    for delta in (0.02, 1.0):  # filter on, filter off (D̂ ≈ 0.08 here); δ traced: one program
        outs = on_both(lambda *x: corrections.vaco_policy_loss(*x[:-1], delta=x[-1]), log_probs,
                       start_log_probs, behaviour_log_probs, advantages, mask, jnp.float32(delta))
        rows.append(compare(
            f"VACO TV filter, δ = {delta}", *outs, 1e-5, 1e-6,
            "means of ≤ 2048 terms in float32: ≤ 2048 · 2^-24 ≈ 1.2e-4 worst case, ~√2048 · 2^-24 "
            "≈ 3e-6 typical; D̂ ≈ 0.08 is far from δ, so the keep-mask is exact"))
        log(rows[-1])
    outs = on_both(lambda *x: corrections.decoupled_ppo_loss(*x), log_probs, start_log_probs,
                   behaviour_log_probs, advantages, mask)
    rows.append(compare(
        "decoupled PPO loss (MIS, clip)", *outs, 1e-5, 1e-6,
        "as the VACO loss: masked means of ≤ 2048 float32 terms, exp of differences of ≈ 0.2"))
    log(rows[-1])
    params = {"w": jax.random.normal(keys[1], (64, 64)), "b": jax.random.normal(keys[2], (64,))}
    reference = corrections.init_ewma_reference(jax.tree.map(lambda x: 0.5 * x, params))
    outs = on_both(lambda r, p: corrections.ewma_update(r, p, beta=0.9).params, reference, params)
    rows.append(compare(
        "EWMA reference update", *outs, 0.0, 1e-6,
        "β·a + (1 − β)·b: ≤ 3 roundings of O(1) values, ≤ 3 · 2^-24 · 4 < 1e-6 with or without FMA"))
    log(rows[-1])

    rows.append(control_iteration_check(sizes))
    log(rows[-1])
    rows += llm_iteration_checks(sizes)
    for row in rows[-4:]:
        log(row)
    return rows


def control_args(sizes: Sizes, iterations: int) -> SimpleNamespace:
    """``control_bench``'s settings: 4 epochs × 4 minibatches, spring backend."""
    return SimpleNamespace(backend="spring", num_envs=sizes.control_envs, unroll=sizes.control_unroll,
                           minibatches=4, epochs=4, hidden=list(sizes.control_hidden), iterations=iterations,
                           repeats=sizes.control_repeats)


def control_iteration_check(sizes: Sizes) -> dict:
    """One iteration of stage 3's VACO run (in the dry run, whose runs are one iteration long,
    the very program stage 3 times, so it is compiled once)."""
    import control_bench
    from fresh_rl.control import init_state, train
    from fresh_rl.sweep.keys import split_run_key

    config = control_bench.our_variants(control_args(sizes, 1), BRAX_TASK)["ours vaco lag 0"]
    run, key = jax.jit(train, static_argnums=0), jax.random.PRNGKey(0)
    outs = [jax.tree.map(np.asarray, run(config, placed(key, device)).params)
            for device in (jax.devices()[0], jax.devices("cpu")[0])]
    cpu = jax.devices("cpu")[0]
    before = jax.jit(init_state, static_argnums=0)(config, jax.device_put(split_run_key(key)[0], cpu)).params
    return compare_step(
        f"control: one VACO iteration ({config.num_envs} envs × {config.rollout_length} steps, 16 Adam "
        "steps), parameter step", *outs, jax.tree.map(np.asarray, before), 1e-3,
        "each Adam step lr·m/(√v + ε) carries the gradient's relative round-off, ≲ 1e-5 after the "
        "float32 rollout and losses, except coordinates with round-off-sized gradients (sign may "
        "flip), a share ≪ 1e-3 of the step's norm")


def llm_iteration_checks(sizes: Sizes) -> list:
    """Tiny preset, llm_gpu10's three stages; old log-probs and update from the CPU's episodes
    on both sides, so a token the bf16 sampler drew differently does not spread."""
    import llm_gpu10
    from fresh_rl.llm import trainer

    rl, env, model, params = llm_gpu10.setup(tiny=True, remat=True)
    stages = llm_gpu10.stage_programs(rl, env, model)
    collect_key, update_key = llm_gpu10.stage_keys()
    device, cpu = jax.devices()[0], jax.devices("cpu")[0]

    def run(where, episodes=None):  # the arguments llm_gpu10.measure passes, placed on ``where``
        state = trainer.init_train_state(rl, jax.device_put(params, where))
        episodes = stages["decode"](state.params, placed(collect_key, where)) if episodes is None \
            else jax.device_put(episodes, where)
        batch = stages["old_logprobs"](state.params, episodes)
        state, metrics = stages["update"](state, batch, placed(update_key, where))
        return jax.tree.map(np.asarray, (episodes, batch.old_logprobs, state.params, metrics["loss"]))

    cpu_episodes, cpu_logprobs, cpu_params, cpu_loss = run(cpu)
    device_episodes = run(device)[0]
    _, device_logprobs, device_params, device_loss = run(device, cpu_episodes)
    same_rows = np.all(device_episodes.tokens == cpu_episodes.tokens, axis=1).mean()
    return [
        {"check": "LLM tiny: decode, episodes with identical tokens", "status": "pass" if same_rows >= 0.85
         else "fail", "max_abs_diff": float(1 - same_rows), "rtol": "", "atol": 0.15,
         "argument": "a token flips only when two Gumbel-perturbed bf16 logits tie within half a bf16 "
                     "ulp (2^-9): ≈ 2e-3 per token, ≤ 8 % of rows over ≤ 40 tokens; 15 % allowed"},
        compare("LLM tiny: old log-probs (fp32 forward) on the CPU's episodes", device_logprobs, cpu_logprobs,
                1e-4, 1e-5, "4 layers of width 128 in float32: ≈ √128 · 2^-24 per dot product, ≲ 1e-5 "
                            "through 4 layers and a 128-way log-softmax"),
        compare("LLM tiny: loss of the update", device_loss, cpu_loss, 1e-4, 1e-6,
                "a token mean over the minibatch's log-probs: their 1e-5 agreement above, averaged"),
        compare_step("LLM tiny: parameter step of the update", device_params, cpu_params,
                     jax.tree.map(np.asarray, params), 1e-3,
                     "AdamW steps lr·m/(√v + ε) carry the gradient's relative round-off (≲ 1e-5 from "
                     "the forward above), except round-off-sized gradients, ≪ 1e-3 of the norm"),
    ]


def stage_correctness(sizes: Sizes, budget_left: float, log) -> dict:
    # float32 matmuls at full precision on the device (on a CPU they are already: no context,
    # so the dry run's programs are those of the later stages, compiled once).
    on_cpu = jax.devices()[0].platform == "cpu"
    with contextlib.nullcontext() if on_cpu else jax.default_matmul_precision("highest"):
        rows = correctness_rows(sizes, log)
    failed = [row["check"] for row in rows if row["status"] != "pass"]
    return {"rows": rows, "notes": [f"{len(rows) - len(failed)} of {len(rows)} checks pass"
                                    + (f"; failed: {', '.join(failed)}" if failed else "")]}


# ---------------------------------------------------------------------------------------------
# Stage 2: replay vs flashbax.


def stage_replay(sizes: Sizes, budget_left: float, log) -> dict:
    import replay_bench

    op = "sample+set_priorities"
    rows = []
    for log_capacity in sizes.replay_log_capacities:
        capacity = 1 << log_capacity
        for batch in sizes.replay_batches:
            cell = {"flashbax_per": replay_bench.flashbax(capacity, batch),
                    "ours_per": replay_bench.ours(capacity, batch, "per"),
                    "ours_freshper": replay_bench.ours(capacity, batch, "freshper")}
            timings = replay_bench.time_cell(cell, {name: (op,) for name in cell}, capacity, batch,
                                             sizes.replay_scan_steps, sizes.replay_repeats, 0)
            us = {name: timings[name, op]["scan_us"] for name in cell}
            rows.append({"capacity": f"2^{log_capacity}", "batch": batch, "flashbax µs": us["flashbax_per"],
                         "ours PER µs": us["ours_per"], "ours FreshPER µs": us["ours_freshper"],
                         "speed-up PER": us["flashbax_per"] / us["ours_per"],
                         "speed-up FreshPER": us["flashbax_per"] / us["ours_freshper"],
                         "compile s (flashbax / FreshPER)":
                             f"{timings['flashbax_per', op]['compile_s']:.1f} / "
                             f"{timings['ours_freshper', op]['compile_s']:.1f}"})
            log(rows[-1])
    return {"rows": rows, "notes": [
        f"{op} per step inside one lax.scan of {sizes.replay_scan_steps} steps, median of "
        f"{sizes.replay_repeats} repeats taken in turns; speed-up = flashbax / ours (> 1: ours faster)"]}


# ---------------------------------------------------------------------------------------------
# Stage 3: control vs Brax PPO.


def stage_control(sizes: Sizes, budget_left: float, log) -> dict:
    import control_bench

    args = control_args(sizes, sizes.control_iterations)
    timings = control_bench.time_side_by_side(args, BRAX_TASK, sizes.control_variants)
    brax_sps = timings["brax ppo"]["sps"]
    rows = [{"implementation": name, "env steps/s": t["sps"], "vs Brax PPO": t["sps"] / brax_sps,
             "compile s": t["compile_s"], "s per run": t["epoch_s"]} for name, t in timings.items()]
    for row in rows:
        log(row)
    return {"rows": rows, "notes": [
        f"{BRAX_TASK} (spring), {args.num_envs} envs × T {args.unroll}, 4 epochs × 4 minibatches, "
        f"MLP {args.hidden} tanh, {args.iterations} updates per run, median of {args.repeats}; "
        "learning included, compile excluded (control_bench.py's docstring says how each side is timed)"]}


# ---------------------------------------------------------------------------------------------
# Stage 4: the LLM iteration at paper shape.


def llm_scale_estimates() -> dict:
    """Program → XLA's CPU estimate of its peak GB (``results/bench/llm_scale.csv``, label after, 1 device)."""
    return {row["program"]: float(row["peak_gb"]) for row in read_csv(RESULTS / "llm_scale.csv")
            if row["label"] == "after" and row["devices"] == "1"}


def stage_llm(sizes: Sizes, budget_left: float, log) -> dict:
    import llm_gpu10

    rows, rl, env, model = llm_gpu10.measure(sizes.llm_tiny, remat=True, repeats=sizes.llm_repeats)
    estimates = {} if sizes.llm_tiny else llm_scale_estimates()
    program = {"decode": "sampler", "old_logprobs": "old_logprobs", "update": "update_remat"}
    for row in rows:
        row["llm_scale CPU estimate GB"] = estimates.get(program[row["stage"]], "")
    return {"rows": rows, "notes": [
        f"model {model.num_hidden_layers} layers × {model.hidden_size}, random weights; {rl.batch_size} "
        f"episodes of {type(env).__name__}, median of {sizes.llm_repeats} timed runs; device peak = the "
        f"device's peak_bytes_in_use over the whole process (NaN where not reported, e.g. CPU); whole "
        f"iteration's CPU estimate: {estimates.get('iteration', 'n/a')} GB"]}


# ---------------------------------------------------------------------------------------------
# Stage 5: the backward × forward lag study slice.


def stage_study(sizes: Sizes, budget_left: float, log) -> dict:
    from fresh_rl.control import HyperParams, TrainConfig, train
    from fresh_rl.eval import seed_interval
    from fresh_rl.lag import DelayConfig

    fewest, most = sizes.study_seeds
    per_seed = DEVICE_RUN_S["study"] / 8  # device run seconds per seed (docstring)
    seeds = int(min(most, max(fewest, (budget_left - CPU_COMPILE_S["study"] * COMPILE_FACTOR) // per_seed)))
    rows = []
    forward_lags = {m: STUDY_FORWARD_LAGS[m] for m in sizes.study_forward_lags}
    for forward_lag, (epochs, minibatches) in forward_lags.items():
        config = TrainConfig(env_name=sizes.study_task, num_envs=sizes.study_envs,
                             rollout_length=sizes.study_unroll,
                             total_env_steps=sizes.study_iterations * sizes.study_envs * sizes.study_unroll,
                             num_epochs=epochs, num_minibatches=minibatches, hidden_sizes=sizes.control_hidden,
                             method="vaco", delay=DelayConfig.fixed(0, max(STUDY_BACKWARD_LAGS) + 1))
        lags = np.repeat(np.array(STUDY_BACKWARD_LAGS), seeds)
        hparams = HyperParams.from_grid(config, {"lag": lags})
        keys = jnp.tile(jax.random.split(jax.random.PRNGKey(11), seeds), (len(STUDY_BACKWARD_LAGS), 1))
        metrics = jax.jit(jax.vmap(train, in_axes=(None, 0, 0)), static_argnums=0)(config, keys, hparams).metrics
        final = np.asarray(metrics["episode_return"][:, -1]).reshape(len(STUDY_BACKWARD_LAGS), seeds)
        extra = {name: np.asarray(metrics[name]).mean(axis=1).reshape(len(STUDY_BACKWARD_LAGS), seeds)
                 for name in ("lag/forward_tv", "loss/tv_filter_estimate", "loss/mask_fraction") if name in metrics}
        for i, backward_lag in enumerate(STUDY_BACKWARD_LAGS):
            mean, low, high = seed_interval(final[i])
            rows.append({"backward lag": backward_lag, "forward lag M": forward_lag, "seeds": seeds,
                         "final return": float(mean), "95% low": float(low), "95% high": float(high),
                         **{f"mean {name}": float(v[i].mean()) for name, v in extra.items()}})
            log(rows[-1])
    return {"rows": rows, "notes": [
        f"VACO on {sizes.study_task}, {sizes.study_envs} envs × T {sizes.study_unroll}, {sizes.study_iterations} "
        f"iterations; M = epochs × minibatches ({forward_lags}); final return = the last iteration's "
        f"episode_return; Student-t 95 % interval over {seeds} seeds (fresh_rl.eval.seed_interval); "
        "TV and filtered fraction: the trainer's per-iteration metrics averaged over the run"]}


STAGE_FUNCTIONS = {"correctness": stage_correctness, "replay": stage_replay, "control": stage_control,
                   "llm": stage_llm, "study": stage_study}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-s", type=float, default=480.0, help="seconds the whole check may take")
    parser.add_argument("--dry-run-cpu", action="store_true", help="tiny shapes on the CPU (the test's run)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder of device_check.{md,json} (default results/bench; required with --dry-run-cpu)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="persistent compilation cache (default: fresh_rl.compilation_cache's folder)")
    parser.add_argument("--allow-dirty", action="store_true", help="stamp a +dirty commit")
    args = parser.parse_args(argv)
    if args.dry_run_cpu and args.out is None:
        parser.error("--dry-run-cpu writes only under --out DIR")
    started = time.perf_counter()
    try:  # before any device time is spent
        require_clean(git_commit(), args.allow_dirty or args.dry_run_cpu)
    except DirtyCheckoutError as error:
        parser.error(str(error))
    if args.dry_run_cpu:  # plumbing, not speed: XLA:CPU's fastest compile, as the test suite
        jax.config.update("jax_platforms", "cpu")
        os.environ["XLA_FLAGS"] = with_fast_compile_flags(os.environ.get("XLA_FLAGS", ""))
    out = args.out or RESULTS
    out.mkdir(parents=True, exist_ok=True)
    cache = enable_compilation_cache(args.cache_dir, min_compile_seconds=0.0)
    sizes = DRY_SIZES if args.dry_run_cpu else DEVICE_SIZES
    print(f"device check on {machine_description()}; compilation cache {cache}", flush=True)
    report = Report(out, args, started)
    for name in STAGES:
        left = max(0.0, args.budget_s - (time.perf_counter() - started))
        estimate = estimate_s(name, args.dry_run_cpu)
        print(f"[{name}] estimate {estimate:.0f} s, {left:.0f} s of the budget left", flush=True)
        section = {"name": name, "estimate_s": estimate}
        if estimate > left:
            report.add({**section, "status": "skipped",
                        "reason": f"estimate {estimate:.0f} s > {left:.0f} s left of the budget"})
            continue
        meter, stage_start = CompileMeter(), time.perf_counter()
        try:
            section.update(STAGE_FUNCTIONS[name](sizes, left, lambda row: print(f"  {row}", flush=True)),
                           status="ran")
        except Exception as error:  # noqa: BLE001 (a failing stage must not end the check)
            traceback.print_exc()
            section.update(status="failed", error=f"{type(error).__name__}: {error}".splitlines()[0][:300])
        section.update(seconds=time.perf_counter() - stage_start, compile_s=meter.total)
        meter.close()
        report.add(section)
        print(f"[{name}] {section['status']} in {section['seconds']:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
