"""Does RL raise the tiny LM's arithmetic success over its warm start? A learning-rate probe.

  .venv/bin/python experiments/llm_rl_probe.py --checkpoint results/llm_warm_start_arithmetic/checkpoint \
      --lr 3e-5 --iterations 30 [--epochs 1 --minibatches 1] [--out results/old_logits/rl_probe.csv]

Runs the ci scale of experiments/old_logits.py (GRPO, 8 prompts × 8 rollouts, the snapshot
route at staleness window 1) from ``--checkpoint`` with the given learning rate and number of
updates per batch, then scores the warm start and the final policy on the same 256 held-out
prompts (bf16 sampler, temperature 1; ``--eval-episodes`` for more). Appends one row to
``--out``.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import old_logits  # noqa: E402
from fresh_rl.llm import async_pipeline as ap  # noqa: E402
from fresh_rl.llm.model import preset  # noqa: E402
from fresh_rl.llm.warm_start import restore_params  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", default=old_logits.WARM_START)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--minibatches", type=int, default=1)
    parser.add_argument("--prompt-pool", type=int, default=0,
                        help="train on a fixed set of this many prompts (0: fresh prompts)")
    parser.add_argument("--eval-episodes", type=int, default=None,
                        help="held-out prompts (default: the ci scale's 256)")
    parser.add_argument("--out", default=None, help="CSV to append the result row to")
    args = parser.parse_args(argv)
    base = old_logits.SCALES["ci"]
    scale = dataclasses.replace(base, rl=dataclasses.replace(
        base.rl, learning_rate=args.lr, epochs=args.epochs, minibatches=args.minibatches,
        prompt_pool=args.prompt_pool),
        eval_episodes=args.eval_episodes or base.eval_episodes)
    model_config = preset("tiny")
    params = restore_params(args.checkpoint, model_config)
    start = time.time()
    state, history = ap.train_loop(scale.rl, old_logits.async_config_for(scale, "snapshot"),
                                   jax.random.PRNGKey(0), args.iterations, params=params,
                                   env=scale.env, model_config=model_config, window=1)
    evaluate = old_logits.make_evaluator(scale, model_config)
    key = jax.random.PRNGKey(10_000)  # the held-out prompts of experiments/old_logits.py
    row = {"checkpoint": args.checkpoint, "learning_rate": args.lr,
           "iterations": args.iterations, "epochs": args.epochs,
           "minibatches": args.minibatches, "eval_episodes": scale.eval_episodes,
           "heldout_success_before": float(jnp.mean(evaluate(params, key))),
           "heldout_success_after": float(jnp.mean(evaluate(state.train.params, key))),
           "train_success_first_third": float(history["success_rate"][:args.iterations // 3
                                                                      or 1].mean()),
           "train_success_last_third": float(history["success_rate"][-(args.iterations // 3
                                                                       or 1):].mean()),
           "seconds": time.time() - start}
    print(row, flush=True)
    if args.out:
        new = not os.path.exists(args.out)
        with open(args.out, "a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow(row)
    return row


if __name__ == "__main__":
    main()
