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

  .venv/bin/python experiments/llm_warm_start.py --scale bpe      # ~45 min on 2 CPU cores

trains the ~5M-parameter ``bpe-5m`` preset from scratch on the tasks speaking the BPE
stand-in's tokenizer (tests/fixtures/qwen2_bpe_tiny; presets.BPE_TASKS, BPE_CYCLE), evaluates
every task on held-out keys at every 1/8 of training and writes results/llm_warm_start_bpe/:
model/ (a Hugging Face Qwen2 folder with its tokenizer: ``--model`` of every experiment; the
checkpoint chosen by fresh_rl.llm.warm_start.select_checkpoint), evals.csv (every periodic evaluation),
success.csv (the chosen one's), history.csv, config.json, README.md. It is resumable: the
periodic checkpoints and the training state (params, optimizer state, step and histories:
a verified, fingerprinted fresh_rl.sweep.checkpoint.RunCheckpointer) live in checkpoints/
(git-ignored), and a rerun of the same command continues from the last one
(``--fresh`` starts over). ``--scale bpe-ci`` is the seconds-long smoke version (a 2-layer,
32-wide model, 4 steps; default --out results/llm_warm_start_bpe_ci).

``--model PATH`` (any Hugging Face folder with its tokenizer, e.g. Qwen2.5-0.5B-Instruct)
fine-tunes that model instead of a fresh tiny one (with --specialize: instead of the
multi-task checkpoint), the tasks speaking its tokenizer and chat template, e.g.:

  .venv/bin/python experiments/llm_warm_start.py --scale ci --model tests/fixtures/qwen2_bpe_tiny \
      --out /tmp/llm_warm_start_standin
"""
from __future__ import annotations

import argparse
import sys

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.llm.checkpoint import add_model_flag
from fresh_rl.llm.model import Qwen2Config
from fresh_rl.llm.presets import RESULTS, SPECIALIZE
from fresh_rl.llm.warm_start import WarmStartConfig
from fresh_rl.llm.bpe_warm_start_study import BpeScale, bpe_warm_start
from fresh_rl.llm.warm_start_study import WarmStartScale, char_warm_start, specialize
from fresh_rl.presets import named
from fresh_rl.sweep.study_cli import NO_CHECKED, add_preset_arguments, chosen_preset, start_study

# Task settings, cycle and specialisation: fresh_rl.llm.presets (shared with the RL experiments).
CHAR_SCALES = named({
    "ci": WarmStartScale(WarmStartConfig(steps=24, batch_size=8, warmup_steps=4, eval_episodes=16)),
    "cpu": WarmStartScale(WarmStartConfig(steps=600, batch_size=16, warmup_steps=20, eval_episodes=128)),
    "paper": WarmStartScale(WarmStartConfig(steps=4000, batch_size=64, warmup_steps=100, eval_episodes=512)),
})
BPE_SCALES = named({
    # Sized by measurement (results/llm_warm_start_bpe/sizing.md): ~1.0 s per step of the
    # BPE_CYCLE mix at batch 16 on the 2 shared cores, ~40-80 s per evaluation of the 5 tasks
    # (lr 2e-3 learned every task more slowly per step than 1e-3 in a partial run).
    "bpe": BpeScale("bpe-5m", WarmStartConfig(steps=1600, batch_size=16, learning_rate=1e-3,
                                              warmup_steps=50, eval_episodes=128)),
    "bpe-ci": BpeScale(Qwen2Config(vocab_size=704, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=1024),
                       WarmStartConfig(steps=4, batch_size=2, warmup_steps=1, eval_episodes=2),
                       evals=2, tasks=("arithmetic",)),  # one task: compiles in seconds
})
SCALES = {**CHAR_SCALES, **BPE_SCALES}  # what --scale chooses from (fresh-rl presets lists them)


def default_out(scale_name: str | None, specialize_task: str | None) -> str:
    """The output folder of a scale, or of ``--specialize`` on a task."""
    if specialize_task:
        return str(RESULTS / f"llm_warm_start_{specialize_task}")
    if scale_name in BPE_SCALES:
        return str(RESULTS / ("llm_warm_start_bpe" if scale_name == "bpe"
                              else f"llm_warm_start_{scale_name.replace('-', '_')}"))
    return str(RESULTS / ("llm_warm_start" if scale_name != "ci" else "llm_warm_start_ci"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=NO_CHECKED)
    add_preset_arguments(parser, SCALES)
    parser.add_argument("--fresh", action="store_true",
                        help="take over an --out made by another run; bpe scales: also ignore (delete) the "
                             "saved training state and start over")
    parser.add_argument("--stop-after", type=int, default=None, metavar="STEPS",
                        help="bpe scales: stop at the first periodic evaluation at or after "
                             "STEPS steps (as an interruption would; rerun to continue)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None,
                        help="output folder (default results/llm_warm_start[_ci])")
    parser.add_argument("--specialize", choices=sorted(SPECIALIZE), default=None,
                        help="continue from results/llm_warm_start/checkpoint on one task")
    add_model_flag(parser)
    add_compilation_cache_flag(parser)
    args = parser.parse_args(argv)
    scale = chosen_preset(parser, args, SCALES)
    if args.scale in BPE_SCALES and args.model and not args.specialize:
        parser.error("--model does not apply to the bpe scales (they train from scratch)")
    out = args.out or default_out(args.scale, args.specialize)
    # --stop-after interrupts the same run; --specialize ignores --scale and --seed (its own)
    identity = ({"study": "llm_warm_start", "specialize": args.specialize, "model": args.model} if args.specialize
                else {"study": "llm_warm_start", "scale": scale.label, "seed": args.seed, "model": args.model})
    start_study(parser, args, identity, out, argv, fresh=args.fresh)
    command = " ".join(["python experiments/llm_warm_start.py"] + list(argv if argv is not None else sys.argv[1:]))
    if args.specialize:
        return specialize(args.specialize, out, command, args.model)
    if args.scale in BPE_SCALES:
        return bpe_warm_start(scale, out, args.seed, args.fresh, command, stop_after=args.stop_after)
    return char_warm_start(scale, out, args.seed, args.model, command)


if __name__ == "__main__":
    main()
