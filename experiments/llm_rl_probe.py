"""Does RL raise the tiny LM's arithmetic success over its warm start? A learning-rate probe.

  .venv/bin/python experiments/llm_rl_probe.py --checkpoint results/llm_warm_start_arithmetic/checkpoint \
      --lr 3e-5 --iterations 30 [--epochs 1 --minibatches 1] [--out results/old_logits/rl_probe.csv]

Runs the ci scale of experiments/old_logits.py (``fresh_rl.llm.presets.OLD_LOGITS_SCALES``;
GRPO, ``--num-groups`` prompts × 8 rollouts, the snapshot route at staleness window 1) from ``--checkpoint`` with the given learning rate,
updates per batch and prompt source (fresh prompts, or a fixed ``--prompt-pool``), then
scores the warm start and the final policy on the same held-out prompts (bf16 sampler,
temperature 1; the ci scale's 1024 episodes unless ``--eval-episodes``), and with a pool also
on the pool's prompts. Appends one row to ``--out``.

``--model PATH`` (a Hugging Face folder with its tokenizer, instead of ``--checkpoint``)
starts from that model, the task speaking its tokenizer and chat template; e.g. the
stand-in at the smallest scale:

  .venv/bin/python experiments/llm_rl_probe.py --model tests/fixtures/qwen2_bpe_tiny \
      --lr 1e-4 --iterations 2 --num-groups 2 --eval-episodes 16
"""
from __future__ import annotations

import argparse
import dataclasses
import time

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm.checkpoint import add_model_flag, load_hf_model
from fresh_rl.llm.evaluation import evaluate_policies
from fresh_rl.llm.model import preset
from fresh_rl.llm.presets import OLD_LOGITS_SCALES, WARM_START
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.llm.warm_start import restore_params
from fresh_rl.provenance import read_csv, write_csv
from fresh_rl.sweep.study_cli import NO_CHECKED, start_study


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=NO_CHECKED)
    parser.add_argument("--checkpoint", default=WARM_START,
                        help="orbax parameters of the tiny preset (ignored with --model)")
    add_model_flag(parser)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--num-groups", type=int, default=8, help="prompts per batch (× 8 rollouts)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--minibatches", type=int, default=1)
    parser.add_argument("--prompt-pool", type=int, default=0,
                        help="train on a fixed set of this many prompts (0: fresh prompts)")
    parser.add_argument("--eval-episodes", type=int, default=None,
                        help="episodes per evaluation (default: the ci scale's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="CSV to append the result row to")
    add_compilation_cache_flag(parser)
    args = parser.parse_args(argv)
    start_study(parser, args, None, None, argv)  # --out is a CSV that gathers every probe's row: no claim
    base = OLD_LOGITS_SCALES["ci"]
    scale = dataclasses.replace(base, rl=dataclasses.replace(
        base.rl, learning_rate=args.lr, num_groups=args.num_groups, epochs=args.epochs,
        minibatches=args.minibatches, prompt_pool=args.prompt_pool),
        eval_episodes=args.eval_episodes or base.eval_episodes)
    if args.model:
        model_config, params, vocab = load_hf_model(args.model)
        scale = dataclasses.replace(scale, env=with_vocab(scale.env, vocab))
    else:
        model_config = preset("tiny")
        params = restore_params(args.checkpoint, model_config)
    start = time.time()
    state, history = ap.train_loop(scale.rl, scale.async_config("snapshot"),
                                   args.seed, args.iterations, params=params,
                                   env=scale.env, model_config=model_config, window=1)
    row = {"checkpoint": args.model or args.checkpoint, "learning_rate": args.lr,
           "num_groups": args.num_groups, "iterations": args.iterations, "epochs": args.epochs,
           "minibatches": args.minibatches, "prompt_pool": args.prompt_pool, "seed": args.seed,
           "eval_episodes": scale.eval_episodes}
    scores = {(r["prompts"], r["policy"]): r["success"] for r in evaluate_policies(
        scale, model_config, {"before": params, "after": state.train.params})}
    for prompts, column in (("held_out", "heldout"), ("training", "pool")):
        for policy in ("before", "after"):
            if (prompts, policy) in scores:
                row[f"{column}_success_{policy}"] = scores[prompts, policy]
    third = args.iterations // 3 or 1
    row.update(train_success_first_third=float(history["success_rate"][:third].mean()),
               train_success_last_third=float(history["success_rate"][-third:].mean()),
               seconds=time.time() - start)
    print(row, flush=True)
    if args.out:  # append; the header grows to the union of the columns
        write_csv(args.out, read_csv(args.out, missing_ok=True) + [row])
    return row


if __name__ == "__main__":
    main()
