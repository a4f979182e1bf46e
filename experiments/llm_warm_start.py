"""Supervised warm start of the tiny Qwen2-architecture LM on the four text tasks.

  .venv/bin/python experiments/llm_warm_start.py --scale cpu      # ~15 min on 2 CPU cores

Writes results/llm_warm_start/: success.csv (per task: success rate, return, format-ok
fraction and |log r_d| of the bf16 sampler vs the fp32 trainer, at temperature 1),
history.csv (training loss), config.json, checkpoint/ (orbax, float32 params) and README.md.
`--scale ci` is a minutes-long smoke run (written to --out, default results/llm_warm_start_ci
so it never overwrites the committed cpu results).

  .venv/bin/python experiments/llm_warm_start.py --specialize arithmetic   # ~15 min, 1 core

continues from the multi-task checkpoint on the arithmetic task alone (SPECIALIZE: rounds of
behaviour cloning, each a fresh warmup + cosine cycle) and writes
results/llm_warm_start_arithmetic/ (checkpoint, success.csv with the success at temperature 1
and greedy after every round, history.csv, README.md). The multi-task model answers 2–5% of
the arithmetic prompts; the specialised one answers about a fifth, the starting point of the
RL learning-rate probe (experiments/llm_rl_probe.py).

``--model PATH`` (any Hugging Face folder with its tokenizer, e.g. Qwen2.5-0.5B-Instruct)
fine-tunes that model instead of a fresh tiny one (with --specialize: instead of the
multi-task checkpoint), the tasks speaking its tokenizer and chat template, e.g.:

  .venv/bin/python experiments/llm_warm_start.py --scale ci --model tests/fixtures/qwen2_bpe_tiny \
      --out /tmp/llm_warm_start_standin
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import jax

from fresh_rl.compilation_cache import add_compilation_cache_flag, enable_from_args
from fresh_rl.llm.checkpoint import add_model_flag, load_hf_model
from fresh_rl.llm.model import preset
from fresh_rl.llm.presets import CYCLE, RESULTS, SPECIALIZE, TASKS, WARM_START
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.llm.warm_start import (WarmStartConfig, evaluate, restore_params, save_params,
                                     warm_start)
from fresh_rl.provenance import provenance, provenance_line, write_csv
from fresh_rl.sweep.keys import seed_key, split_run_key

# Task settings, cycle and specialisation: fresh_rl.llm.presets (shared with the RL experiments).
SCALES = {
    "ci": WarmStartConfig(steps=24, batch_size=8, warmup_steps=4, eval_episodes=16),
    "cpu": WarmStartConfig(steps=600, batch_size=16, warmup_steps=20, eval_episodes=128),
    "paper": WarmStartConfig(steps=4000, batch_size=64, warmup_steps=100, eval_episodes=512),
}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="ci")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None,
                        help="output folder (default results/llm_warm_start[_ci])")
    parser.add_argument("--specialize", choices=sorted(SPECIALIZE), default=None,
                        help="continue from results/llm_warm_start/checkpoint on one task")
    add_model_flag(parser)
    add_compilation_cache_flag(parser)
    args = parser.parse_args(argv)
    enable_from_args(args)
    if args.specialize:
        return specialize(args.specialize, args.out, argv, args.model)
    model_config, params, tasks = load_model(args.model)
    out = args.out or str(RESULTS / ("llm_warm_start" if args.scale != "ci"
                                     else "llm_warm_start_ci"))
    os.makedirs(out, exist_ok=True)
    config = SCALES[args.scale]
    start, started = time.time(), time.perf_counter()
    key_train, key_eval = split_run_key(seed_key(args.seed))
    params, history = warm_start(model_config, tasks, config, key_train, params=params,
                                 cycle=CYCLE)
    train_seconds = time.time() - start
    rows = []
    for name, env in tasks.items():
        metrics = evaluate(params, model_config, env, jax.random.fold_in(key_eval, len(rows)),
                           config.eval_episodes, config.eval_temperature)
        rows.append({"task": name, **metrics})
        print(name, metrics, flush=True)
    info = provenance(command=command(argv), started=started)
    wall = info["wall_seconds"]
    save_params(os.path.join(out, "checkpoint"), params)
    write_csv(os.path.join(out, "success.csv"), rows)
    write_csv(os.path.join(out, "history.csv"), history)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"scale": args.scale, "seed": args.seed, "model": args.model or "tiny", **info,
                   "warm_start": dataclasses.asdict(config), "cycle": CYCLE,
                   "tasks": {k: {"class": type(v).__name__, **dataclasses.asdict(v)}
                             for k, v in tasks.items()}}, f, indent=1)
    table = "\n".join(f"| {r['task']} | {r['success']:.3f} | {r['return']:.3f} | "
                      f"{r['format_ok']:.3f} | {r['abs_log_rd_mean']:.2e} | "
                      f"{r['abs_log_rd_max']:.2e} |" for r in rows)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(f"""# Supervised warm start of the tiny LM ({args.scale} scale)

{provenance_line(info)}
Wall time: {wall:.0f} s total, of which training {train_seconds:.0f} s
({config.steps} steps, batch {config.batch_size}, task cycle {list(CYCLE)}; includes compile).

Evaluation: {config.eval_episodes} episodes per task, bf16 KV-cache sampler at temperature
{config.eval_temperature}; success is the task's verifiable success. |log r_d| compares the
sampler's log-probs of its own action tokens with the float32 training forward.

| task | success | mean return | format ok | mean abs log r_d | max abs log r_d |
|---|---|---|---|---|---|
{table}

Task settings and the warm-start config: config.json. Training loss: history.csv.
Parameters: checkpoint/ (orbax StandardCheckpointer; restore with
`fresh_rl.llm.warm_start.restore_params(path, preset("tiny"))`).
""")
    print(f"wrote {out} in {wall:.0f} s")


def load_model(model: str | None):
    """(model_config, initial params, tasks): the tiny preset (fresh parameters, None) on
    the char vocabulary, or the Hugging Face folder ``model`` with the tasks speaking its
    tokenizer."""
    if model is None:
        return preset("tiny"), None, TASKS
    model_config, params, vocab = load_hf_model(model)
    return model_config, params, {name: with_vocab(env, vocab) for name, env in TASKS.items()}


def command(argv) -> str:
    """The command line of this run, as a user would retype it."""
    return " ".join(["python experiments/llm_warm_start.py"]
                    + list(argv if argv is not None else sys.argv[1:]))


def specialize(task: str, out: str | None, argv=None, model: str | None = None):
    """Rounds of behaviour cloning on ``task`` alone from the multi-task checkpoint (or the
    Hugging Face folder ``model``)."""
    out = out or str(RESULTS / f"llm_warm_start_{task}")
    os.makedirs(out, exist_ok=True)
    rounds, config, seed = SPECIALIZE[task]
    model_config, params, tasks = load_model(model)
    env = tasks[task]
    params = restore_params(WARM_START, model_config) if params is None else params
    key = seed_key(seed)
    started, rows, history = time.perf_counter(), [], []

    def evaluate_both(params, after):
        row = {"after_steps": after}
        for name, temperature in (("t1", 1.0), ("greedy", 0.0)):
            metrics = evaluate(params, model_config, env, key, config.eval_episodes, temperature)
            row.update({f"{k}_{name}": v for k, v in metrics.items()})
        rows.append(row)
        print(row, flush=True)

    evaluate_both(params, 0)
    for r in range(rounds):
        params, part = warm_start(model_config, {task: env}, config, jax.random.fold_in(key, r),
                                  params=params)
        history += [{**row, "round": r} for row in part]
        evaluate_both(params, (r + 1) * config.steps)
    info = provenance(command=command(argv), started=started)
    wall = info["wall_seconds"]
    save_params(os.path.join(out, "checkpoint"), params)
    write_csv(os.path.join(out, "success.csv"), rows)
    write_csv(os.path.join(out, "history.csv"), history)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"specialize": task, "rounds": rounds, "seed": seed, **info,
                   "init": model or "results/llm_warm_start/checkpoint",
                   "warm_start": dataclasses.asdict(config),
                   "task": {"class": type(env).__name__, **dataclasses.asdict(env)}}, f, indent=1)
    table = "\n".join(f"| {r['after_steps']} | {r['success_t1']:.3f} | {r['success_greedy']:.3f} "
                      f"| {r['format_ok_t1']:.3f} |" for r in rows)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write(f"""# Arithmetic-specialised warm start of the tiny LM

{provenance_line(info)}

From results/llm_warm_start/checkpoint (the multi-task warm start), {rounds} rounds of
{config.steps} behaviour-cloning steps at batch {config.batch_size} on {type(env).__name__}
({dataclasses.asdict(env)}) alone, lr {config.learning_rate} with a {config.warmup_steps}-step
warmup and cosine decay per round. Evaluation: the same {config.eval_episodes} prompts each
time, bf16 sampler.

| after steps | success (temperature 1) | success (greedy) | format ok (temperature 1) |
|---|---|---|---|
{table}

The starting point of the RL learning-rate probe (experiments/llm_rl_probe.py;
results/old_logits/README.md): does RL improve arithmetic from a model that already answers a
fifth of the prompts? Parameters: checkpoint/ (restore with
`fresh_rl.llm.warm_start.restore_params(path, preset("tiny"))`).
""")
    print(f"wrote {out} in {wall:.0f} s")
    return out


if __name__ == "__main__":
    main()
