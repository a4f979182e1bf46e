"""Throughput of the full LLM RL iteration on the BPE warm start: the regime the studies run in.

  .venv/bin/python benchmarks/llm_rl_iteration.py                   # results/bench/llm_rl_iteration.*
  .venv/bin/python benchmarks/llm_rl_iteration.py --model PATH --tasks arithmetic --batches 64

Rows, one program per (task, episodes per iteration B = groups × 8, vmapped seeds S):

* ``iteration``: the GRPO iteration of ``experiments/llm_rl_gain.py`` at ``--window`` (bf16
  sampling of B episodes, fp32 scoring, advantages, one epoch of the decoupled loss, AdamW),
  run through :func:`fresh_rl.llm.async_pipeline.train_loop` as the study runs it; median
  seconds per iteration over ``--repeats`` iterations after the first (compilation, reported
  separately); episodes/s and generated (action) tokens/s over all S rows.
* ``generation``: the sampling part alone (:func:`fresh_rl.llm.trainer.collect`, jitted),
  so ``iteration − generation`` is the scoring + training share.
* ``generation_fixed_length`` vs ``hf_generate``: the anchor doing the same work. Both sample
  exactly ``action_len`` new tokens (no stop token) at temperature 1 from the same B
  left-padded first-turn prompts of the task with the same weights: ours (KV cache, bf16,
  jitted) against transformers' ``generate`` on torch (fp32, ``torch.set_num_threads`` = the
  machine's cores). The ratio is ours / theirs in tokens/s.

Cost growth: B ∈ ``--batches`` at S = 1 and S ∈ ``--seeds`` at the study's B = 64.
Writes ``llm_rl_iteration[_<label>].csv`` and ``.md`` to ``--out``, rewritten after every cell.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm.checkpoint import load_hf_model
from fresh_rl.llm.presets import BPE_TASKS, BPE_WARM_START, RL_GAIN_RL, rl_gain_pipeline
from fresh_rl.llm.sampler import SamplingConfig, generate
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.llm.trainer import collect
from fresh_rl.provenance import provenance, provenance_line, write_csv
from timing import timed  # benchmarks/timing.py (scripts run from benchmarks/)



def time_iterations(rl, env, model_config, params, seeds: int, repeats: int, window: int) -> dict:
    """(compile + first iteration s, median steady s per iteration, action tokens per episode)
    of ``repeats + 1`` iterations of the study's loop (S = ``seeds`` vmapped rows, staleness
    window ``window`` with snapshot old logits)."""
    stamps = [time.perf_counter()]
    _, history = ap.train_loop(rl, rl_gain_pipeline(window), seeds if seeds == 1 else list(range(seeds)), repeats + 1,
                               params=params, env=env, model_config=model_config, window=window,
                               log=lambda i, metrics: stamps.append(time.perf_counter()))
    steps = np.diff(stamps)
    return {"compile_s": float(steps[0]), "median_s": float(np.median(steps[1:])),
            "tokens_per_episode": float(np.mean(history["response_tokens"]))}


def first_turn_prompts(episodes, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's transcript before its first action token, left-padded: ``[B, P]`` tokens
    and mask."""
    tokens, action = np.asarray(episodes.tokens), np.asarray(episodes.action_mask)
    starts = action.argmax(axis=1)
    width = int(starts.max())
    out = np.full((tokens.shape[0], width), pad_id, np.int32)
    mask = np.zeros((tokens.shape[0], width), bool)
    for row, start in enumerate(starts):
        out[row, width - start:] = tokens[row, :start]
        mask[row, width - start:] = True
    return out, mask


def hf_generate_seconds(model_dir: str, prompts, mask, new_tokens: int, repeats: int) -> tuple[float, float]:
    """(first call s, median s) of transformers' sampling of exactly ``new_tokens`` tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(os.cpu_count() or 1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids, attention = torch.tensor(prompts, dtype=torch.long), torch.tensor(mask, dtype=torch.long)

    def run():
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=attention, do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  pad_token_id=0, eos_token_id=None)

    first, median, out = timed(run, repeats)  # torch returns finished tensors: nothing to block on
    assert out.shape[1] == prompts.shape[1] + new_tokens
    return first, median


def write_tables(args, rows: list[dict], started: float) -> None:
    """llm_rl_iteration.csv / .md of the rows so far (rewritten after every cell, so a run
    killed part-way, e.g. out of memory, keeps what it measured)."""
    os.makedirs(args.out, exist_ok=True)
    stem = "llm_rl_iteration" + (f"_{args.label}" if args.label else "")
    write_csv(os.path.join(args.out, stem + ".csv"), rows)
    info = provenance(started=started)
    fmt = lambda x, spec: "" if x == "" else format(x, spec)  # noqa: E731
    table = "\n".join(f"| {r['task']} | {r['benchmark']} | {r['shape']} | {r['compile_s']:.1f} | {r['median_s']:.3f} | "
                      f"{fmt(r['episodes_per_s'], '.1f')} | {r['tokens_per_s']:.0f} | {fmt(r['ours_over_hf'], '.2f')} |"
                      for r in rows)
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(f"""# The LLM RL iteration's throughput (model: `{os.path.relpath(args.model)}`)

{provenance_line(info)} Median of {args.repeats} iterations / calls after the first (compilation,
reported separately). B = episodes per iteration (groups × 8), S = seed rows vmapped in one
program. Tokens/s counts generated action tokens (all S rows).

| task | benchmark | shape | compile+first (s) | median (s) | episodes/s | tokens/s | ours / HF |
|---|---|---|---|---|---|---|---|
{table}

`iteration` is the whole GRPO iteration of `experiments/llm_rl_gain.py` (staleness window {args.window});
`generation` its sampling part; `generation_fixed_length` and `hf_generate` sample exactly
N tokens (no stop token) from the same prompts with the same weights, ours in bf16 with a
KV cache under jit, transformers' `generate` in fp32 on torch with every core.
""")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=BPE_WARM_START, help="Hugging Face folder (default: the BPE warm start)")
    parser.add_argument("--tasks", default="arithmetic,sokoban", help="comma-separated BPE_TASKS names")
    parser.add_argument("--batches", default="32,64,128", help="episodes per iteration (multiples of 8)")
    parser.add_argument("--seeds", default="1,4", help="vmapped seed rows at B = 64")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--window", type=int, default=0,
                        help="staleness window (0: on-policy, experiments/llm_rl_gain.py's default)")
    parser.add_argument("--out", default="results/bench")
    parser.add_argument("--no-anchor", action="store_true", help="skip transformers' generate")
    parser.add_argument("--label", default="", help="file stem suffix: llm_rl_iteration_<label>.{csv,md}")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    model_config, params, vocab = load_hf_model(args.model)
    batches = [int(b) for b in args.batches.split(",")]
    seed_counts = [int(s) for s in args.seeds.split(",")]
    rows = []
    for task in args.tasks.split(","):
        env = with_vocab(BPE_TASKS[task], vocab)
        cells = [(b, 1) for b in batches] + [(64, s) for s in seed_counts if s != 1]
        for batch, seeds in cells:
            if batch % RL_GAIN_RL.group_size:
                parser.error(f"--batches: {batch} is not a multiple of the group size {RL_GAIN_RL.group_size}")
            rl = dataclasses.replace(RL_GAIN_RL, num_groups=batch // RL_GAIN_RL.group_size)
            shape = f"B={batch} S={seeds}"
            t = time_iterations(rl, env, model_config, params, seeds, args.repeats, args.window)
            episodes = batch * seeds
            rows.append({"task": task, "benchmark": "iteration", "shape": shape, "compile_s": t["compile_s"],
                         "median_s": t["median_s"], "episodes_per_s": episodes / t["median_s"],
                         "tokens_per_s": episodes * t["tokens_per_episode"] / t["median_s"], "ours_over_hf": ""})
            print(rows[-1], flush=True)
            write_tables(args, rows, started)
            if seeds != 1:
                continue
            gen = jax.jit(lambda p, k, rl=rl, env=env: collect(p, k, config=rl, env=env, model_config=model_config))
            first, median, out = timed(lambda: gen(params, jax.random.PRNGKey(1)), args.repeats)
            generated = float(np.asarray(out.action_mask).sum())
            rows.append({"task": task, "benchmark": "generation", "shape": shape, "compile_s": first,
                         "median_s": median, "episodes_per_s": batch / median,
                         "tokens_per_s": generated / median, "ours_over_hf": ""})
            print(rows[-1], flush=True)
            write_tables(args, rows, started)
            if args.no_anchor:
                continue
            prompts, mask = first_turn_prompts(out, env.pad_id)
            sampling = SamplingConfig(max_new_tokens=env.action_len, temperature=1.0, pad_id=env.pad_id)
            fixed = jax.jit(lambda p, k, sampling=sampling: generate(p, model_config, sampling, jnp.asarray(prompts),
                                                                     jnp.asarray(mask), k).tokens)
            first, ours, _ = timed(lambda: fixed(params, jax.random.PRNGKey(2)), args.repeats)
            hf_first, hf = hf_generate_seconds(args.model, prompts, mask, env.action_len, args.repeats)
            fixed_shape = f"B={batch} P={prompts.shape[1]} N={env.action_len}"
            tokens = batch * env.action_len
            rows.append({"task": task, "benchmark": "generation_fixed_length", "shape": fixed_shape,
                         "compile_s": first, "median_s": ours, "episodes_per_s": "",
                         "tokens_per_s": tokens / ours, "ours_over_hf": hf / ours})
            rows.append({"task": task, "benchmark": "hf_generate", "shape": fixed_shape, "compile_s": hf_first,
                         "median_s": hf, "episodes_per_s": "", "tokens_per_s": tokens / hf, "ours_over_hf": ""})
            print(rows[-2], rows[-1], sep="\n", flush=True)
            write_tables(args, rows, started)
    write_tables(args, rows, started)
    print(open(os.path.join(args.out, "llm_rl_iteration" + (f"_{args.label}" if args.label else "") + ".md")).read())


if __name__ == "__main__":
    main()
