"""Benchmark: one RL iteration of the Qwen2.5-0.5B preset at paper batch size on an accelerator.

The iteration of :func:`fresh_rl.llm.trainer.iteration`, split into its three jitted stages so
each is timed on its own (the same functions the fused iteration calls, same keys):

* ``decode``: :func:`~fresh_rl.llm.trainer.collect`, 512 episodes of the old-logits paper task
  (``OLD_LOGITS_SCALES["paper"]``: 64 groups × 8, arithmetic 2 digits × 2 steps) with the bf16
  KV-cache sampler (prefill, decode and the task's steps); tokens/s = generated action tokens
  / wall time;
* ``old_logprobs``: :func:`~fresh_rl.llm.trainer.prepare_batch`, the fp32 forward of the
  current weights on the whole batch plus the advantages; tokens/s = valid tokens
  (``mask``) / wall time;
* ``update``: :func:`~fresh_rl.llm.trainer.update`, epochs × minibatches AdamW steps (4 of 128
  episodes); tokens/s = valid tokens × epochs / wall time.

Each stage is compiled and run once untimed, then timed over ``--repeats`` runs (median,
``block_until_ready``). Memory: the device's ``peak_bytes_in_use`` after the run (where the
backend reports it; not on CPU) and each stage's compiled peak (XLA's memory analysis:
arguments + outputs + temporaries − aliased). Parameters are random (``init_params``): no
checkpoint is needed, and an untrained model rarely emits its stop token, so episodes run to
the task's full action length, the slowest case. The task speaks its char vocabulary widened
to the model's (:func:`fresh_rl.llm.presets.char_task_for`). ``--remat`` (default on):
rematerialise each layer in the update (the 128 × 142 minibatch without it needs ~80 GB,
results/bench/llm_scale.md).

    python benchmarks/llm_gpu10.py            # the 0.5B preset, paper batch: writes
                                              # results/bench/llm_gpu10.{csv,md}
    python benchmarks/llm_gpu10.py --tiny --out /tmp   # the tiny preset, 8 episodes: a
                                              # smoke run on CPU (llm_gpu10_tiny.{csv,md})
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp

OUT = Path(__file__).resolve().parents[1] / "results" / "bench"


def setup(tiny: bool, remat: bool):
    """``(rl_config, env, model_config, params)`` of the paper scale or the tiny smoke run."""
    from fresh_rl.llm.model import init_params, preset
    from fresh_rl.llm.presets import OLD_LOGITS_SCALES, char_task_for
    from fresh_rl.llm.tasks import ArithmeticTask
    from fresh_rl.llm.trainer import RLConfig

    if tiny:
        model = preset("tiny")
        rl = RLConfig(estimator="grpo", num_groups=2, group_size=4, minibatches=2,
                      loss="decoupled", remat=remat)
        env = ArithmeticTask(digits=1, steps=2)
    else:
        scale = OLD_LOGITS_SCALES["paper"]
        model = preset(scale.model)
        rl = dataclasses.replace(scale.rl, remat=remat)
        env = char_task_for(scale.env, model)
    return rl, env, model, init_params(model, jax.random.PRNGKey(0))


def _compiled_peak_gb(compiled) -> float:
    memory = compiled.memory_analysis()
    if memory is None:
        return float("nan")
    return (memory.argument_size_in_bytes + memory.output_size_in_bytes
            + memory.temp_size_in_bytes - memory.alias_size_in_bytes) / 1e9


def _timed(compiled, args, repeats: int):
    """(output of the untimed first run, median wall seconds of ``repeats`` further runs)."""
    out = jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def stage_keys():
    """``(collect key, update key)`` of the iteration's stages."""
    return tuple(jax.random.split(jax.random.PRNGKey(1)))


def stage_programs(rl, env, model) -> dict:
    """The iteration's three stages, jitted: ``decode(params, key) → episodes``,
    ``old_logprobs(params, episodes) → batch``, ``update(state, batch, key) → (state, metrics)``."""
    from fresh_rl.llm import trainer

    return {
        "decode": jax.jit(lambda p, k: trainer.collect(p, k, config=rl, env=env,
                                                       model_config=model)),
        "old_logprobs": jax.jit(lambda p, e: trainer.prepare_batch(p, e, config=rl,
                                                                   model_config=model)),
        "update": jax.jit(lambda s, b, k: trainer.update(s, b, k, config=rl,
                                                         model_config=model)),
    }


def measure(tiny: bool, remat: bool, repeats: int):
    """``(rows, rl_config, env, model_config)``: one row per stage."""
    from fresh_rl.llm import trainer

    rl, env, model, params = setup(tiny, remat)
    state = trainer.init_train_state(rl, params)
    k_collect, k_update = stage_keys()
    stages = stage_programs(rl, env, model)
    rows, args = [], {"decode": (state.params, k_collect)}
    for name, fn in stages.items():
        start = time.perf_counter()
        compiled = fn.lower(*args[name]).compile()
        compile_s = time.perf_counter() - start
        out, seconds = _timed(compiled, args[name], repeats)
        if name == "decode":
            episodes = out
            tokens = int(jnp.sum(episodes.action_mask & episodes.mask))
            args["old_logprobs"] = (state.params, episodes)
        elif name == "old_logprobs":
            tokens = int(jnp.sum(episodes.mask))
            args["update"] = (state, out, k_update)
        else:
            tokens = int(jnp.sum(episodes.mask)) * rl.epochs
        rows.append({"stage": name, "tokens": tokens, "seconds": seconds,
                     "tokens_per_s": tokens / seconds, "compile_s": compile_s,
                     "compiled_peak_gb": _compiled_peak_gb(compiled)})
        print(json.dumps(rows[-1]), flush=True)
    stats = jax.devices()[0].memory_stats() or {}
    peak = stats.get("peak_bytes_in_use")
    for row in rows:
        row["device_peak_gb"] = float("nan") if peak is None else peak / 1e9
    return rows, rl, env, model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiny", action="store_true",
                        help="tiny preset, 8 episodes (CPU smoke run, < 2 minutes)")
    parser.add_argument("--remat", action=argparse.BooleanOptionalAction, default=True,
                        help="rematerialise each layer in the update (default on)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per stage")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the tables")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    from fresh_rl.provenance import git_commit, write_csv

    started = time.perf_counter()
    rows, rl, env, model = measure(args.tiny, args.remat, args.repeats)
    wall = time.perf_counter() - started
    device = jax.devices()[0]
    commit = git_commit()
    stem = "llm_gpu10_tiny" if args.tiny else "llm_gpu10"
    write_csv(args.out / f"{stem}.csv", [{"commit": commit, "device": device.device_kind,
                                     "remat": args.remat, **row} for row in rows])
    lines = [
        "# One RL iteration at paper batch size: throughput and memory per stage", "",
        f"Command: `python benchmarks/llm_gpu10.py{' --tiny' if args.tiny else ''}"
        f"{'' if args.remat else ' --no-remat'} --repeats {args.repeats}`; commit {commit}; "
        f"{device.platform} {device.device_kind} × {jax.device_count()}, jax {jax.__version__}; "
        f"wall {wall:.0f} s; load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs. Model "
        f"{model.num_hidden_layers} layers × {model.hidden_size}, vocab {model.vocab_size}; "
        f"{rl.batch_size} episodes ({rl.num_groups} × {rl.group_size}) of {type(env).__name__}, "
        f"{rl.epochs} epoch × {rl.minibatches} minibatches, remat {args.remat}; median of "
        f"{args.repeats} timed runs after one untimed run.", "",
        "| stage | tokens | seconds | tokens/s | compile (s) | compiled peak (GB) "
        "| device peak, whole run (GB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['stage']} | {r['tokens']} | {r['seconds']:.3f} | "
                     f"{r['tokens_per_s']:.0f} | {r['compile_s']:.1f} | "
                     f"{r['compiled_peak_gb']:.2f} | {r['device_peak_gb']:.2f} |")
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
