"""Does RL raise held-out success from the BPE warm start? GRPO per task × seed, before and after.

For each task of the scale (``fresh_rl.llm.presets.RL_GAIN_SCALES``) and each seed: synchronous
GRPO from the Hugging Face folder (the pipeline at ``staleness_window`` 0, on-policy, with
snapshot old logits; the first probe cells ran at window 1, every batch one version stale),
``iterations`` iterations of
``num_groups`` prompts × ``group_size`` rollouts on fresh prompts. Then the warm start and the
final policy are scored on the same ``eval_episodes`` held-out episodes (prompts and sampling
keys of ``fresh_rl.llm.evaluation.EVAL_SEED``, disjoint from the training keys; bf16 sampler at
temperature 1): a paired comparison. Gain = after − before per seed; ``gain.csv`` has the seed
mean with its 95% Student-t interval per task, ``curves.csv`` the training success, entropy,
update KL and gradient norm per iteration,
and ``throughput.csv`` episodes/s and generated tokens/s of the RL iteration in steady state
(median iteration time, the first iteration's compilation and the evaluation excluded).

Seeds run ``seeds_per_program`` at a time, vmapped in one compiled program (each row has the
key schedule of a single run). Resumable: a finished run is
``runs/<task>_lr<lr>_ep<epochs>[_mb<minibatches>][_g<groups>][_pool<P>]_W<window>_it<iterations>_seed<s>.json``; a running program checkpoints
every ``checkpoint_every`` iterations (``checkpoints/``) and restarts from there. The tables cover every saved run of the output folder, one row per setting (``SETTING``:
task, learning rate, epochs, minibatches, prompts per iteration, prompt pool, window,
iterations), so the probe's cells (``--lr``, ``--epochs``, ``--minibatches``, ``--groups``,
``--prompt-pool``, ``--window``, ``--iterations``, ``--seeds 1``) and the study's runs share one
folder.

  python experiments/llm_rl_gain.py --scale ci                  # the stand-in, 2 iterations (tests)
  python experiments/llm_rl_gain.py --scale cpu                 # results/llm_rl_gain
  python experiments/llm_rl_gain.py --scale cpu --task countdown --lr 3e-4 --iterations 30 \\
      --seeds 1 --out /tmp/probe                               # one probe cell
  python experiments/llm_rl_gain.py --scale paper --model PATH  # a real checkpoint, one GPU
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time

import jax
import numpy as np

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm.checkpoint import add_model_flag, load_hf_model
from fresh_rl.llm.evaluation import EvalTask, evaluate_policies
from fresh_rl.llm.presets import BPE_TASKS, RESULTS, RL_GAIN_SCALES as SCALES, RLGainScale, rl_gain_pipeline
from fresh_rl.llm.rl_gain import SETTING, fingerprint, load_record, run_name, summarize
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.provenance import provenance, write_csv
from fresh_rl.sweep.checkpoint import RunCheckpointer
from fresh_rl.sweep.integrity import tree_checksum
from fresh_rl.sweep.study_cli import NO_CHECKED, add_preset_arguments, chosen_preset, start_study


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
    (their per-seed keys are those of single runs). A record's ``train_seconds`` is its share of
    the program's wall time; the steady iteration time (all rows) excludes the first iteration
    (compilation)."""
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
        for record in run_program(scale, task, env, group, params, params_checksum, model_config, out, before):
            records[record["seed"]] = record
    return [records[seed] for seed in seeds]


def run_program(scale: RLGainScale, task: str, env, seeds: list[int], params, params_checksum: str,
                model_config, out: str, before: dict[str, float]) -> list[dict]:
    """One program of ``seeds`` (vmapped rows when more than one), checkpointed every
    ``scale.checkpoint_every`` iterations under ``checkpoints/`` and resumed from there."""
    name = run_name(scale, task, seeds[0]) + (f"-{seeds[-1]}" if len(seeds) > 1 else "")
    folder = os.path.join(out, "checkpoints", name)
    fingerprints = [fingerprint(scale, env, seed, params_checksum) for seed in seeds]
    key = repr(fingerprints)
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
    state, history = ap.train_loop(scale.rl, rl_gain_pipeline(scale.staleness_window), seeds[0] if len(seeds) == 1 else seeds,
                                   scale.iterations, params=params, env=env, model_config=model_config,
                                   window=scale.staleness_window,
                                   checkpointer=RunCheckpointer(folder, fingerprint=key),
                                   checkpoint_every=scale.checkpoint_every,
                                   log=log)
    program_seconds = time.perf_counter() - start
    steady = float(np.median(np.diff(stamps))) if len(stamps) > 1 else None
    records = []
    for row, seed in enumerate(seeds):
        pick = (lambda x: x) if len(seeds) == 1 else (lambda x, row=row: x[row])
        final = jax.tree_util.tree_map(pick, state.train.params)
        after = success_of(scale, env, model_config, final)
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
        path = os.path.join(out, "runs", run_name(scale, task, seed) + ".json")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)
        pool = (f", training pool {record['pool_before']:.3f} -> {record['pool_after']:.3f}"
                if "pool_after" in record else "")
        print(f"{run_name(scale, task, seed)}: held-out success {record['before']:.3f} -> {record['after']:.3f}{pool} "
              f"({episodes} episodes, {record['train_seconds']:.0f} s per seed)", flush=True)
        records.append(record)
    shutil.rmtree(folder, ignore_errors=True)  # the runs are saved; their resume state is not needed
    if not os.listdir(os.path.dirname(folder)):
        os.rmdir(os.path.dirname(folder))
    return records


# per-iteration curves of a run (record key train_<name>): the fresh batch's success, the
# policy's mean token entropy, the KL (k3) of the update's ratio and the gradient norm
CURVES = {"success": "success_rate", "entropy": "entropy", "kl_k3": "kl_k3", "grad_norm": "grad_norm"}


def rows_of(record: dict) -> int:
    """Seeds vmapped in the record's program (1 for runs saved before programs had rows)."""
    return record.get("seeds_in_program", 1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=NO_CHECKED)
    add_preset_arguments(parser, SCALES, default="ci")
    add_model_flag(parser)
    parser.add_argument("--task", action="append", choices=sorted(BPE_TASKS),
                        help="run only these tasks (repeatable; default: the scale's)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: the scale's)")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--minibatches", type=int, default=None,
                        help="optimizer steps per epoch, each on 1/M of the batch (default: the scale's)")
    parser.add_argument("--groups", type=int, default=None,
                        help="prompts per iteration (× group size 8 episodes; default: the scale's)")
    parser.add_argument("--prompt-pool", type=int, default=None,
                        help="train on a fixed set of P prompts (0: a fresh prompt per group every "
                             "iteration; default: the scale's); held-out scoring is unchanged")
    parser.add_argument("--iterations", type=int, default=None)
    parser.add_argument("--window", type=int, default=None,
                        help="staleness window (0: on-policy; default: the scale's)")
    parser.add_argument("--seeds", type=int, default=None)
    parser.add_argument("--seeds-per-program", type=int, default=None,
                        help="seeds vmapped in one compiled program (default: the scale's)")
    parser.add_argument("--out", default=None, help="output folder (default results/llm_rl_gain[_ci])")
    parser.add_argument("--tables-only", action="store_true",
                        help="run nothing: rewrite the tables from the saved runs")
    add_compilation_cache_flag(parser)
    args = parser.parse_args(argv)
    scale = chosen_preset(parser, args, SCALES)
    rl = dataclasses.replace(scale.rl, **{k: v for k, v in (("learning_rate", args.lr), ("epochs", args.epochs),
                                                            ("minibatches", args.minibatches),
                                                            ("num_groups", args.groups),
                                                            ("prompt_pool", args.prompt_pool)) if v is not None})
    scale = dataclasses.replace(scale, rl=rl, model=args.model or scale.model,
                                tasks=tuple(args.task) if args.task else scale.tasks,
                                **{k: v for k, v in (("iterations", args.iterations), ("seeds", args.seeds),
                                                     ("seeds_per_program", args.seeds_per_program),
                                                     ("staleness_window", args.window))
                                   if v is not None})
    if not scale.model:
        parser.error(f"--scale {args.scale} needs --model PATH (a Hugging Face folder)")
    out = args.out or str(RESULTS / ("llm_rl_gain_ci" if args.scale == "ci" else "llm_rl_gain"))
    # the probe cells' settings (--task, --lr, ..., --seeds) share one folder by design, each saved
    # run fingerprinted on its own: the folder's identity is the scale and --model (None: the scale's)
    start_study(parser, args, {"study": "llm_rl_gain", "scale": scale.label, "model": args.model}, out, argv,
                hint="choose another --out")
    os.makedirs(out, exist_ok=True)
    started = time.perf_counter()
    model_config, params, vocab = load_hf_model(scale.model)
    params_checksum = tree_checksum(params)  # the same initial weights for every run
    records = []
    for task in () if args.tables_only else scale.tasks:
        env = with_vocab(BPE_TASKS[task], vocab)
        before = success_of(scale, env, model_config, params)
        records += run_seeds(scale, task, env, list(range(scale.seeds)), params, params_checksum, model_config,
                             out, before)
    # the tables cover every saved run of the folder (the probe cells and the study alike)
    saved = []
    for name in sorted(os.listdir(os.path.join(out, "runs"))):
        saved.append(load_record(os.path.join(out, "runs", name)))
    saved.sort(key=lambda r: (tuple(str(r[k]) for k in SETTING), r["seed"]))
    rows = summarize(saved)
    write_csv(os.path.join(out, "gain.csv"), rows)
    write_csv(os.path.join(out, "curves.csv"), [
        {**{k: r[k] for k in SETTING}, "seed": r["seed"], "iteration": i,
         **{f"train_{name}": r[f"train_{name}"][i] for name in CURVES if f"train_{name}" in r}}
        for r in saved for i in range(len(r["train_success"]))])
    write_csv(os.path.join(out, "throughput.csv"), [  # steady state: compilation excluded
        {**{k: r[k] for k in SETTING}, "seed": r["seed"], "seeds_in_program": rows_of(r),
         "episodes_per_iteration": r["episodes"] // r["iterations"] * rows_of(r),
         "seconds_per_iteration": r["steady_seconds_per_iteration"],
         "episodes_per_s": r["episodes"] / r["iterations"] * rows_of(r) / r["steady_seconds_per_iteration"],
         "generated_tokens_per_s": (r["generated_tokens_per_episode"] * r["episodes"] / r["iterations"]
                                    * rows_of(r) / r["steady_seconds_per_iteration"])}
        for r in saved if r["steady_seconds_per_iteration"]])
    info = provenance(command=" ".join(["python experiments/llm_rl_gain.py"]
                                       + list(argv if argv is not None else sys.argv[1:])), started=started)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({**info, "scale": scale.label, "model": scale.model, "rl": repr(scale.rl),
                   "iterations": scale.iterations, "seeds": scale.seeds, "eval_episodes": scale.eval_episodes,
                   "tasks": {t: repr(BPE_TASKS[t]) for t in scale.tasks}}, f, indent=1)
    for r in rows:
        print(f"{r['task']} lr {r['learning_rate']:g} epochs {r['epochs']} minibatches {r['minibatches']} groups {r['num_groups']} pool {r['prompt_pool']} W {r['staleness_window']} × {r['iterations']}: held-out {r['before']:.3f} -> {r['after']:.3f}, gain {r['gain']:+.3f} "
              f"[{r['gain_ci_low']:+.3f}, {r['gain_ci_high']:+.3f}] over {r['seeds']} seeds", flush=True)
    return rows, records


if __name__ == "__main__":
    main()
