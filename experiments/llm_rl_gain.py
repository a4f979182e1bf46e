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
import sys
import time

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.llm.checkpoint import add_model_flag, load_hf_model
from fresh_rl.llm.presets import BPE_TASKS, RESULTS, RL_GAIN_SCALES as SCALES
from fresh_rl.llm.rl_gain import run_seeds, saved_records, success_of, write_tables
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.provenance import provenance, write_atomic
from fresh_rl.sweep.integrity import tree_checksum
from fresh_rl.sweep.study_cli import NO_CHECKED, add_preset_arguments, chosen_preset, start_study


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=NO_CHECKED)
    add_preset_arguments(parser, SCALES)
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
    rows = write_tables(out, saved_records(out))  # every saved run of the folder: the probe cells and the study
    info = provenance(command=" ".join(["python experiments/llm_rl_gain.py"]
                                       + list(argv if argv is not None else sys.argv[1:])), started=started)
    write_atomic(os.path.join(out, "config.json"), json.dumps(
        {**info, "scale": scale.label, "model": scale.model, "rl": repr(scale.rl), "iterations": scale.iterations,
         "seeds": scale.seeds, "eval_episodes": scale.eval_episodes,
         "tasks": {t: repr(BPE_TASKS[t]) for t in scale.tasks}}, indent=1))
    for r in rows:
        print(f"{r['task']} lr {r['learning_rate']:g} epochs {r['epochs']} minibatches {r['minibatches']} groups "
              f"{r['num_groups']} pool {r['prompt_pool']} W {r['staleness_window']} × {r['iterations']}: held-out "
              f"{r['before']:.3f} -> {r['after']:.3f}, gain {r['gain']:+.3f} [{r['gain_ci_low']:+.3f}, "
              f"{r['gain_ci_high']:+.3f}] over {r['seeds']} seeds", flush=True)
    return rows, records


if __name__ == "__main__":
    main()
