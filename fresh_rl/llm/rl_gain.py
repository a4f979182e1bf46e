"""The RL-gain study (``experiments/llm_rl_gain.py``; scales
:data:`fresh_rl.llm.presets.RL_GAIN_SCALES`): GRPO from a warm start per task × seed, scored
before and after on the same held-out episodes (:func:`run_seeds`); a run's file name and
fingerprint, loading a saved record, the per-setting table of held-out gains (:func:`summarize`)
and the tables of a folder's saved runs (:func:`write_tables`)."""
from __future__ import annotations

import json
import os
import shutil
import time

import jax
import numpy as np

from fresh_rl.eval import seed_interval
from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm.evaluation import EvalTask, evaluate_policies
from fresh_rl.llm.presets import RL_GAIN_RL, RLGainScale, rl_gain_pipeline
from fresh_rl.provenance import write_atomic, write_csv
from fresh_rl.sweep.checkpoint import RunCheckpointer

SETTING = ("task", "learning_rate", "epochs", "minibatches", "num_groups", "prompt_pool", "staleness_window",
           "iterations")
"""The record fields that name a setting: one row of :func:`summarize` per setting."""


def run_name(scale: RLGainScale, task: str, seed: int) -> str:
    """A run's file name: task, the probed settings (learning rate, epochs; minibatches, prompts
    per iteration and the training prompt pool when not the default :data:`RL_GAIN_RL`'s;
    staleness window, iterations), seed."""
    minibatches = "" if scale.rl.minibatches == RL_GAIN_RL.minibatches else f"_mb{scale.rl.minibatches}"
    groups = "" if scale.rl.num_groups == RL_GAIN_RL.num_groups else f"_g{scale.rl.num_groups}"
    pool = "" if scale.rl.prompt_pool == RL_GAIN_RL.prompt_pool else f"_pool{scale.rl.prompt_pool}"
    return (f"{task}_lr{scale.rl.learning_rate:g}_ep{scale.rl.epochs}{minibatches}{groups}{pool}_W{scale.staleness_window}"
            f"_it{scale.iterations}_seed{seed}")


def fingerprint(scale: RLGainScale, env, seed: int, params_checksum: str) -> str:
    """What a saved run must match to be reused: the RL settings, staleness window, budget,
    evaluation size, task, seed and initial weights (not the scale's other tasks or seed count)."""
    return repr((scale.rl, scale.staleness_window, scale.iterations, scale.eval_episodes, env, seed,
                 params_checksum))


def load_record(path: str) -> dict:
    """A saved run; records written before ``minibatches``, ``num_groups``, ``prompt_pool`` and
    ``staleness_window`` were recorded ran :data:`RL_GAIN_RL`'s one minibatch of 8 fresh prompts
    per iteration at window 1 (one version stale)."""
    with open(path) as f:
        record = json.load(f)
    record.setdefault("minibatches", RL_GAIN_RL.minibatches)
    record.setdefault("prompt_pool", RL_GAIN_RL.prompt_pool)
    record.setdefault("num_groups", RL_GAIN_RL.num_groups)
    record.setdefault("staleness_window", 1)
    return record


def summarize(records: list[dict]) -> list[dict]:
    """Per setting (task, learning rate, epochs, minibatches, prompts, pool, window, iterations): the
    seed-mean held-out success before / after and the gain with its 95% Student-t interval over
    seeds (none with one seed)."""
    rows = []
    for setting in dict.fromkeys(tuple(r[k] for k in SETTING) for r in records):
        runs = [r for r in records if tuple(r[k] for k in SETTING) == setting]
        gain = np.array([r["gain"] for r in runs])
        mean, low, high = (float(x) for x in seed_interval(gain))
        seconds = np.array([r["train_seconds"] for r in runs])
        rows.append({**dict(zip(SETTING, setting)), "seeds": len(runs),
                     "before": np.mean([r["before"] for r in runs]),
                     "after": np.mean([r["after"] for r in runs]), "gain": mean, "gain_ci_low": low,
                     "gain_ci_high": high, "episodes_per_run": runs[0]["episodes"],
                     "train_minutes_per_run": float(np.mean(seconds)) / 60,
                     # success on the fixed training prompts (runs with a prompt pool)
                     **({f"pool_{k}": np.mean([r[f"pool_{k}"] for r in runs]) for k in ("before", "after")}
                        if all("pool_after" in r for r in runs) else {})})
    return rows


CURVES = {"success": "success_rate", "entropy": "entropy", "kl_k3": "kl_k3", "grad_norm": "grad_norm"}
"""Per-iteration curves of a run (record key ``train_<name>`` → the pipeline's metric): the fresh
batch's success, the policy's mean token entropy, the KL (k3) of the update's ratio and the
gradient norm."""


def success_of(scale: RLGainScale, env, model_config, params) -> dict[str, float]:
    """``{"held_out": s}`` on the scale's held-out episodes (``EVAL_SEED``: the same for every
    policy), plus ``"training"``: the same number of episodes on the training prompts when the
    scale trains on a fixed prompt pool."""
    rows = evaluate_policies(EvalTask(scale.rl, env, scale.eval_episodes), model_config, {"policy": params})
    return {row["prompts"]: row["success"] for row in rows}


def run_seeds(scale: RLGainScale, task: str, env, seeds: list[int], params, params_checksum: str,
              model_config, out: str, before: dict[str, float]) -> list[dict]:
    """GRPO on ``task`` from ``params`` (``tree_checksum`` ``params_checksum``, held-out success
    ``before``, :func:`success_of`) for each of ``seeds``; returns (and writes) one record per seed. Saved runs are
    loaded; the missing seeds run ``scale.seeds_per_program`` at a time, vmapped in one program
    (their per-seed keys are those of single runs)."""
    records, missing = {}, []
    for seed in seeds:
        path = os.path.join(out, "runs", run_name(scale, task, seed) + ".json")
        if os.path.exists(path):
            record = load_record(path)
            if record["fingerprint"] == fingerprint(scale, env, seed, params_checksum):
                print(f"[resume] {run_name(scale, task, seed)}: loaded", flush=True)
                records[seed] = record
                continue
        missing.append(seed)
    for start in range(0, len(missing), scale.seeds_per_program):
        group = missing[start:start + scale.seeds_per_program]
        for record in _run_program(scale, task, env, group, params, params_checksum, model_config, out, before):
            records[record["seed"]] = record
    return [records[seed] for seed in seeds]


def _run_program(scale: RLGainScale, task: str, env, seeds: list[int], params, params_checksum: str,
                 model_config, out: str, before: dict[str, float]) -> list[dict]:
    """One program of ``seeds`` (vmapped rows when more than one), checkpointed every
    ``scale.checkpoint_every`` iterations under ``checkpoints/`` and resumed from there. A
    record's ``train_seconds`` is its share of the program's wall time; the steady iteration time
    (all rows) excludes the first iteration (compilation)."""
    name = run_name(scale, task, seeds[0]) + (f"-{seeds[-1]}" if len(seeds) > 1 else "")
    folder = os.path.join(out, "checkpoints", name)
    fingerprints = [fingerprint(scale, env, seed, params_checksum) for seed in seeds]
    stamps, block = [], []

    def log(i, metrics):
        """Iteration times (throughput) and, every ``checkpoint_every`` iterations, the block's
        mean fresh-batch success and entropy (progress of a long cell)."""
        stamps.append(time.perf_counter())
        block.append((float(np.mean(metrics["success_rate"])), float(np.mean(metrics["entropy"]))))
        if (i + 1) % scale.checkpoint_every == 0:
            success, entropy = np.mean(block, axis=0)
            print(f"{name} iterations {i + 2 - len(block)}-{i + 1}: success {success:.3f}, "
                  f"entropy {entropy:.3f}", flush=True)
            block.clear()

    start = time.perf_counter()
    state, history = ap.train_loop(scale.rl, rl_gain_pipeline(scale.staleness_window),
                                   seeds[0] if len(seeds) == 1 else seeds, scale.iterations, params=params, env=env,
                                   model_config=model_config, window=scale.staleness_window,
                                   checkpointer=RunCheckpointer(folder, fingerprint=repr(fingerprints)),
                                   checkpoint_every=scale.checkpoint_every, log=log)
    program_seconds = time.perf_counter() - start
    steady = float(np.median(np.diff(stamps))) if len(stamps) > 1 else None
    records = []
    for row, seed in enumerate(seeds):
        pick = (lambda x: x) if len(seeds) == 1 else (lambda x, row=row: x[row])
        after = success_of(scale, env, model_config, jax.tree_util.tree_map(pick, state.train.params))
        episodes = scale.iterations * scale.rl.batch_size
        record = {"task": task, "seed": seed, "learning_rate": scale.rl.learning_rate,
                  "epochs": scale.rl.epochs, "minibatches": scale.rl.minibatches,
                  "num_groups": scale.rl.num_groups, "prompt_pool": scale.rl.prompt_pool,
                  "staleness_window": scale.staleness_window, "fingerprint": fingerprints[row],
                  "before": before["held_out"], "after": after["held_out"],
                  "gain": after["held_out"] - before["held_out"],
                  **({"pool_before": before["training"], "pool_after": after["training"]}
                     if "training" in after else {}),
                  "iterations": scale.iterations,
                  "episodes": episodes, "seeds_in_program": len(seeds),
                  "train_seconds": program_seconds / len(seeds), "steady_seconds_per_iteration": steady,
                  "generated_tokens_per_episode": float(np.mean(pick(history["response_tokens"]))),
                  **{f"train_{name}": [float(x) for x in pick(history[metric])]
                     for name, metric in CURVES.items()}}
        write_atomic(os.path.join(out, "runs", run_name(scale, task, seed) + ".json"), json.dumps(record))
        pool = (f", training pool {record['pool_before']:.3f} -> {record['pool_after']:.3f}"
                if "pool_after" in record else "")
        print(f"{run_name(scale, task, seed)}: held-out success {record['before']:.3f} -> {record['after']:.3f}{pool} "
              f"({episodes} episodes, {record['train_seconds']:.0f} s per seed)", flush=True)
        records.append(record)
    shutil.rmtree(folder, ignore_errors=True)  # the runs are saved; their resume state is not needed
    if not os.listdir(os.path.dirname(folder)):
        os.rmdir(os.path.dirname(folder))
    return records


def seeds_in_program(record: dict) -> int:
    """Seeds vmapped in the record's program (1 for runs saved before programs had rows)."""
    return record.get("seeds_in_program", 1)


def saved_records(out: str) -> list[dict]:
    """Every saved run of ``out/runs`` (the probe cells and the study alike), by setting, then seed."""
    saved = [load_record(os.path.join(out, "runs", name)) for name in sorted(os.listdir(os.path.join(out, "runs")))]
    return sorted(saved, key=lambda r: (tuple(str(r[k]) for k in SETTING), r["seed"]))


def write_tables(out: str, saved: list[dict]) -> list[dict]:
    """``gain.csv`` (:func:`summarize`), ``curves.csv`` (:data:`CURVES` per iteration) and
    ``throughput.csv`` (steady state: episodes/s and generated tokens/s, compilation excluded) of
    the records ``saved``; returns the gain rows."""
    rows = summarize(saved)
    write_csv(os.path.join(out, "gain.csv"), rows)
    write_csv(os.path.join(out, "curves.csv"), [
        {**{k: r[k] for k in SETTING}, "seed": r["seed"], "iteration": i,
         **{f"train_{name}": r[f"train_{name}"][i] for name in CURVES if f"train_{name}" in r}}
        for r in saved for i in range(len(r["train_success"]))])
    write_csv(os.path.join(out, "throughput.csv"), [
        {**{k: r[k] for k in SETTING}, "seed": r["seed"], "seeds_in_program": seeds_in_program(r),
         "episodes_per_iteration": r["episodes"] // r["iterations"] * seeds_in_program(r),
         "seconds_per_iteration": r["steady_seconds_per_iteration"],
         "episodes_per_s": r["episodes"] / r["iterations"] * seeds_in_program(r) / r["steady_seconds_per_iteration"],
         "generated_tokens_per_s": (r["generated_tokens_per_episode"] * r["episodes"] / r["iterations"]
                                    * seeds_in_program(r) / r["steady_seconds_per_iteration"])}
        for r in saved if r["steady_seconds_per_iteration"]])
    return rows
