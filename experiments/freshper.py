"""FreshPER in the LLM RL loop (arXiv 2604.16918): on-policy vs standard PER vs FreshPER.

  .venv/bin/python experiments/freshper.py --scale cpu      # the committed results
  .venv/bin/python experiments/freshper.py --scale drift    # stronger drift: search_qa, lr 1e-4, K = 4
  .venv/bin/python experiments/freshper.py --scale ci --out /tmp/freshper_ci
  .venv/bin/python experiments/freshper.py --scale bpe-pilot  # ESS time constant on the BPE warm start

From the warm-started tiny LM (results/llm_warm_start/checkpoint), per task, runs the replay
trainer (fresh_rl.llm.replay_trainer: one fresh update plus K replay updates per iteration,
REINFORCE++ as in the paper) for each method, all seeds vmapped in one compiled program per
(task, method) (:mod:`fresh_rl.llm.freshper_study`). The τ ablation runs inside the FreshPER
program: τ is a state leaf of the buffer, so every τ and seed is one row of the same vmapped
run (common seeds across τ).
Writes to --out (default results/freshper for cpu, results/freshper_<scale> otherwise):

  runs/<task>_<method>.npz   per-iteration metrics [rows, iterations] (rows = seeds, or
                             τ × seeds for the ablation); a rerun skips finished runs
  checkpoints/               orbax checkpoints of unfinished runs (resume after a kill)
  curves.csv      mean and 95% Student-t interval over seeds of success and return per step
  final.csv       per (task, method): final success and return (mean of the last third of
                  the iterations), 95% interval, relative change of the return vs on-policy
                  (the paper's table)
  tau_ablation.csv, is_ablation rows in final.csv (method freshper_no_is)
  ess_vs_age.csv  per (task, method, age): token ESS/n and KL(π_old‖π_θ) of the stored
                  trajectories at the end of the run; ess_fit.csv: fitted decay rates
  learning_curves.png, tau_ablation.png, ess_vs_age.png, config.json

``--model PATH`` (any Hugging Face folder with its tokenizer, e.g. Qwen2.5-0.5B-Instruct)
starts from that model, the tasks speaking its tokenizer and chat template, e.g.:

  .venv/bin/python experiments/freshper.py --scale ci --model tests/fixtures/qwen2_bpe_tiny \
      --out /tmp/freshper_standin
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.llm.checkpoint import add_model_flag, load_hf_model
from fresh_rl.llm.freshper_study import plot, run_methods, summarise
from fresh_rl.llm.presets import FRESHPER_SCALES as SCALES
from fresh_rl.llm.presets import BPE_TASKS, RESULTS, load_params, model_folder
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.provenance import provenance, write_atomic, write_csv
from fresh_rl.sweep.study_cli import NO_CHECKED, add_preset_arguments, chosen_preset, start_study


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=NO_CHECKED)
    add_preset_arguments(parser, SCALES)
    parser.add_argument("--out", default=None, help="output folder (default results/freshper[_<scale>])")
    parser.add_argument("--checkpoint", default=None,
                        help="initial parameters (default: the tiny warm start)")
    add_model_flag(parser)
    parser.add_argument("--tasks", default=None,
                        help="comma-separated subset of the scale's tasks")
    parser.add_argument("--methods", default=None,
                        help="comma-separated subset of the scale's methods")
    add_compilation_cache_flag(parser)
    args = parser.parse_args(argv)
    scale = chosen_preset(parser, args, SCALES)
    tasks = scale.tasks if args.tasks is None else tuple(args.tasks.split(","))
    methods = [m for m, _ in scale.methods] if args.methods is None else args.methods.split(",")
    unknown = sorted(set(tasks) - set(BPE_TASKS)) + sorted(set(methods) - dict(scale.methods).keys())
    if unknown:
        raise ValueError(f"unknown --tasks/--methods {unknown}; tasks {list(BPE_TASKS)}, methods "
                         f"{[m for m, _ in scale.methods]}")
    out = args.out or str(RESULTS / ("freshper" if args.scale == "cpu"
                                     else f"freshper_{args.scale.replace('-', '_')}"))
    # --tasks and --methods run parts of the same study: not part of its identity
    identity = {"study": "freshper", "scale": scale.label, "model": args.model, "checkpoint": args.checkpoint}
    start_study(parser, args, identity, out, argv, hint="choose another --out")
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    start, started = time.time(), time.perf_counter()
    log = lambda msg: print(f"[{time.time() - start:7.0f}s] {msg}", flush=True)  # noqa: E731
    envs = BPE_TASKS  # the char-vocabulary tasks (countdown included), or in the folder's tokenizer
    folder = args.model or model_folder(scale.model)  # --model, or a scale's own HF folder
    if folder:
        model_config, params, vocab = load_hf_model(folder)
        scale = dataclasses.replace(scale, model=folder)
        envs = {name: with_vocab(env, vocab) for name, env in BPE_TASKS.items()}
    else:
        model_config, params = load_params(scale.model, args.checkpoint)
    results = run_methods(scale, envs, params, model_config, out, tasks, methods, log)
    if not results:
        raise SystemExit("nothing to summarise")
    curves, final, taus, ess_rows, fits = summarise(results, scale)
    write_csv(os.path.join(out, "curves.csv"), curves)
    write_csv(os.path.join(out, "final.csv"), final)
    for name, rows in (("tau_ablation.csv", taus), ("ess_vs_age.csv", ess_rows),
                       ("ess_fit.csv", fits)):
        if rows:
            write_csv(os.path.join(out, name), rows)
    plot(curves, taus, ess_rows, scale, out)
    info = provenance(command=" ".join(["python experiments/freshper.py"]
                                       + list(argv if argv is not None else sys.argv[1:])),
                      started=started)
    wall = info["wall_seconds"]
    write_atomic(os.path.join(out, "config.json"), json.dumps(
        {"scale": scale.label, **info, "scale_config": dataclasses.asdict(scale), "tasks": {
            k: {"class": type(v).__name__, **dataclasses.asdict(v)} for k, v in envs.items() if k in scale.tasks}},
        indent=1, default=str))
    log(f"wrote {out} in {wall:.0f} s")
    return out


if __name__ == "__main__":
    main()
