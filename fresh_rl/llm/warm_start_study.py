"""The warm-start study (``experiments/llm_warm_start.py``): behaviour cloning
(:func:`fresh_rl.llm.warm_start.warm_start`) run three ways, each writing its folder's tables,
``config.json`` and README.

* :func:`char_warm_start`: the tiny model (or a Hugging Face folder) on the character-level
  tasks :data:`fresh_rl.llm.presets.TASKS`, one checkpoint at the end.
* :func:`specialize`: rounds of behaviour cloning on one task from the multi-task checkpoint
  (:data:`fresh_rl.llm.presets.SPECIALIZE`), scored at temperature 1 and greedy after each.
* :func:`fresh_rl.llm.bpe_warm_start_study.bpe_warm_start`: a model from scratch in the BPE
  stand-in's tokenizer, resumable (its own module).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time

import jax

from fresh_rl.llm.checkpoint import load_hf_model
from fresh_rl.llm.model import preset
from fresh_rl.llm.presets import CYCLE, SPECIALIZE, TASKS, WARM_START
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.llm.warm_start import WarmStartConfig, evaluate, restore_params, save_params, warm_start
from fresh_rl.presets import Preset
from fresh_rl.provenance import provenance, write_atomic, write_csv
from fresh_rl.report import markdown_table, write_readme
from fresh_rl.sweep.keys import seed_key, split_run_key


@dataclasses.dataclass(frozen=True)
class WarmStartScale(Preset):
    """A scale of the character-level warm start: its training settings."""

    warm_start: WarmStartConfig


def _model_and_tasks(model: str | None):
    """(model_config, initial params, tasks): the tiny preset (fresh parameters, None) on
    the char vocabulary, or the Hugging Face folder ``model`` with the tasks speaking its
    tokenizer."""
    if model is None:
        return preset("tiny"), None, TASKS
    model_config, params, vocab = load_hf_model(model)
    return model_config, params, {name: with_vocab(env, vocab) for name, env in TASKS.items()}


def success_table(rows: list[dict]) -> list[str]:
    """Per task: success, mean return, format-ok fraction and |log r_d| (mean, max)."""
    return markdown_table(("task", "success", "mean return", "format ok", "mean abs log r_d", "max abs log r_d"), (
        (r["task"], f"{r['success']:.3f}", f"{r['return']:.3f}", f"{r['format_ok']:.3f}",
         f"{r['abs_log_rd_mean']:.2e}", f"{r['abs_log_rd_max']:.2e}") for r in rows))


def _settings(env) -> dict:
    return {"class": type(env).__name__, **dataclasses.asdict(env)}


def char_warm_start(scale: WarmStartScale, out: str, seed: int, model: str | None, command: str) -> None:
    """The character-level warm start at ``scale`` from the tiny model (``model`` None) or a
    Hugging Face folder: trains on :data:`~fresh_rl.llm.presets.CYCLE`, evaluates every task on
    held-out keys, writes ``checkpoint/``, ``success.csv``, ``history.csv``, ``config.json`` and
    the README."""
    model_config, params, tasks = _model_and_tasks(model)
    os.makedirs(out, exist_ok=True)
    config = scale.warm_start
    start, started = time.time(), time.perf_counter()
    key_train, key_eval = split_run_key(seed_key(seed))
    params, history = warm_start(model_config, tasks, config, key_train, params=params, cycle=CYCLE)
    train_seconds = time.time() - start
    rows = []
    for name, env in tasks.items():
        metrics = evaluate(params, model_config, env, jax.random.fold_in(key_eval, len(rows)),
                           config.eval_episodes, config.eval_temperature)
        rows.append({"task": name, **metrics})
        print(name, metrics, flush=True)
    info = provenance(command=command, started=started)
    save_params(os.path.join(out, "checkpoint"), params)
    write_csv(os.path.join(out, "success.csv"), rows)
    write_csv(os.path.join(out, "history.csv"), history)
    write_atomic(os.path.join(out, "config.json"), json.dumps(
        {"scale": scale.name, "seed": seed, "model": model or "tiny", **info, "warm_start": dataclasses.asdict(config),
         "cycle": CYCLE, "tasks": {k: _settings(v) for k, v in tasks.items()}}, indent=1))
    write_readme(out, f"Supervised warm start of the tiny LM ({scale.name} scale)", info, [
        f"Wall time: {info['wall_seconds']:.0f} s total, of which training {train_seconds:.0f} s",
        f"({config.steps} steps, batch {config.batch_size}, task cycle {list(CYCLE)}; includes compile).", "",
        f"Evaluation: {config.eval_episodes} episodes per task, bf16 KV-cache sampler at temperature",
        f"{config.eval_temperature}; success is the task's verifiable success. |log r_d| compares the",
        "sampler's log-probs of its own action tokens with the float32 training forward.", "",
        *success_table(rows), "",
        "Task settings and the warm-start config: config.json. Training loss: history.csv.",
        "Parameters: checkpoint/ (orbax StandardCheckpointer; restore with",
        '`fresh_rl.llm.warm_start.restore_params(path, preset("tiny"))`).'])
    print(f"wrote {out} in {info['wall_seconds']:.0f} s")


def specialize(task: str, out: str, command: str, model: str | None = None) -> str:
    """Rounds of behaviour cloning on ``task`` alone (:data:`~fresh_rl.llm.presets.SPECIALIZE`)
    from the multi-task checkpoint (or the Hugging Face folder ``model``), the same evaluation
    prompts at temperature 1 and greedy before and after each round."""
    os.makedirs(out, exist_ok=True)
    rounds, config, seed = SPECIALIZE[task]
    model_config, params, tasks = _model_and_tasks(model)
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
        params, part = warm_start(model_config, {task: env}, config, jax.random.fold_in(key, r), params=params)
        history += [{**row, "round": r} for row in part]
        evaluate_both(params, (r + 1) * config.steps)
    info = provenance(command=command, started=started)
    save_params(os.path.join(out, "checkpoint"), params)
    write_csv(os.path.join(out, "success.csv"), rows)
    write_csv(os.path.join(out, "history.csv"), history)
    write_atomic(os.path.join(out, "config.json"), json.dumps(
        {"specialize": task, "rounds": rounds, "seed": seed, **info,
         "init": model or "results/llm_warm_start/checkpoint", "warm_start": dataclasses.asdict(config),
         "task": _settings(env)}, indent=1))
    write_readme(out, "Arithmetic-specialised warm start of the tiny LM", info, [
        "", f"From results/llm_warm_start/checkpoint (the multi-task warm start), {rounds} rounds of",
        f"{config.steps} behaviour-cloning steps at batch {config.batch_size} on {type(env).__name__}",
        f"({dataclasses.asdict(env)}) alone, lr {config.learning_rate} with a {config.warmup_steps}-step",
        f"warmup and cosine decay per round. Evaluation: the same {config.eval_episodes} prompts each",
        "time, bf16 sampler.", "",
        *markdown_table(("after steps", "success (temperature 1)", "success (greedy)", "format ok (temperature 1)"),
                        ((r["after_steps"], f"{r['success_t1']:.3f}", f"{r['success_greedy']:.3f}",
                          f"{r['format_ok_t1']:.3f}") for r in rows)), "",
        "The starting point of the RL learning-rate probe (experiments/llm_rl_probe.py;",
        "results/old_logits/README.md): does RL improve arithmetic from a model that already answers a",
        "fifth of the prompts? Parameters: checkpoint/ (restore with",
        '`fresh_rl.llm.warm_start.restore_params(path, preset("tiny"))`).'])
    print(f"wrote {out} in {info['wall_seconds']:.0f} s")
    return out


__all__ = ["WarmStartScale", "char_warm_start", "specialize", "success_table"]
