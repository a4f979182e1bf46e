"""Generation and training throughput of the tiny LM, in one run.

  .venv/bin/python benchmarks/llm_bench.py [--batch 4 --prompt 32 --new 256 --repeats 3]

Rows (tokens/s, median over repeats, compile time separate; both sides jitted):
  decode  KV cache (bf16, fp32)  vs  recomputing the full prefix every step (same dtype):
          the no-cache baseline runs the whole fixed-size buffer [B, P+N] through the model
          for each new token (a jitted fixed-shape forward; a growing shape would recompile).
  train   one AdamW step of the fp32 training forward + backward on [B_train, T_train].
Also reports |log r_d| between the bf16 sampler and the fp32 trainer on the sampled tokens.
Writes results/bench/llm.csv and results/bench/llm.md.
"""
from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.llm.model import init_params, preset
from fresh_rl.llm.sampler import (SamplingConfig, generate, join_prompt_and_generation,
                                  token_logprobs_and_entropy)
from fresh_rl.llm.warm_start import WarmStartConfig, make_optimizer, make_train_step
from fresh_rl.provenance import provenance, provenance_line, write_csv
from timing import timed  # benchmarks/timing.py (scripts run from benchmarks/)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--train-batch", type=int, default=16)
    parser.add_argument("--train-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="results/bench")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    config = preset("tiny")
    params = init_params(config, jax.random.PRNGKey(0))
    key = jax.random.PRNGKey(1)
    prompt = jax.random.randint(key, (args.batch, args.prompt), 3, config.vocab_size)
    prompt_mask = jnp.ones_like(prompt, bool)
    rows = []
    new_tokens = args.batch * args.new
    for dtype in ("bfloat16", "float32"):
        sampling = SamplingConfig(max_new_tokens=args.new, temperature=1.0, dtype=dtype)
        results = {}
        for use_cache in (True, False):
            compile_s, run_s, _ = timed(lambda: generate(params, config, sampling, prompt,
                                                      prompt_mask, key, use_cache=use_cache),
                                     args.repeats)
            results[use_cache] = run_s
            rows.append({"benchmark": "decode", "variant": ("kv_cache" if use_cache
                                                            else "full_prefix_recompute"),
                         "dtype": dtype, "shape": f"B={args.batch} P={args.prompt} N={args.new}",
                         "compile_s": compile_s, "median_s": run_s,
                         "tokens_per_s": new_tokens / run_s, "speedup_vs_no_cache": ""})
            print(rows[-1], flush=True)
        rows[-2]["speedup_vs_no_cache"] = results[False] / results[True]

    train_config = WarmStartConfig()
    optimizer = make_optimizer(train_config)
    train_step = make_train_step(config, optimizer)
    opt_state = optimizer.init(params)
    tokens = jax.random.randint(key, (args.train_batch, args.train_len), 3, config.vocab_size)
    mask = jnp.ones_like(tokens, bool)
    compile_s, run_s, _ = timed(lambda: train_step(params, opt_state, tokens, mask, mask),
                             args.repeats)
    rows.append({"benchmark": "train_step", "variant": "fp32 fwd+bwd+AdamW", "dtype": "float32",
                 "shape": f"B={args.train_batch} T={args.train_len}", "compile_s": compile_s,
                 "median_s": run_s, "tokens_per_s": tokens.size / run_s,
                 "speedup_vs_no_cache": ""})
    print(rows[-1], flush=True)

    sampling = SamplingConfig(max_new_tokens=args.new, temperature=1.0, dtype="bfloat16")
    gen = generate(params, config, sampling, prompt, prompt_mask, key)
    seq, seq_mask = join_prompt_and_generation(prompt, prompt_mask, gen)
    train_logp, _ = jax.jit(token_logprobs_and_entropy, static_argnums=1)(params, config, seq,
                                                                         seq_mask)
    log_rd = np.abs(np.asarray(train_logp[:, args.prompt:] - gen.logprobs))[np.asarray(gen.mask)]

    os.makedirs(args.out, exist_ok=True)
    write_csv(os.path.join(args.out, "llm.csv"), rows)
    info = provenance(started=started)
    def speedup(r):
        return f"{r['speedup_vs_no_cache']:.1f}x" if r["speedup_vs_no_cache"] != "" else ""

    table = "\n".join(
        f"| {r['benchmark']} | {r['variant']} | {r['dtype']} | {r['shape']} | "
        f"{r['compile_s']:.1f} | {r['median_s']:.3f} | {r['tokens_per_s']:.0f} | {speedup(r)} |"
        for r in rows)
    with open(os.path.join(args.out, "llm.md"), "w") as f:
        f.write(f"""# Tiny LM throughput (random init, tiny preset)

{provenance_line(info)} Median of {args.repeats} repeats after one
compile+warm-up call (reported separately).

| benchmark | variant | dtype | shape | compile+first call (s) | median (s) | tokens/s | cache speedup |
|---|---|---|---|---|---|---|---|
{table}

The no-cache baseline recomputes the whole fixed-size [B, P+N] buffer for every new token
(jitted, fixed shape), i.e. O(N (P+N)) token-forwards instead of O(P + N).
Train-inference discrepancy of this random-init model on the {int(log_rd.size)} sampled tokens:
mean |log r_d| = {log_rd.mean():.2e}, max |log r_d| = {log_rd.max():.2e}
(bf16 sampler vs fp32 training forward, temperature 1).
""")
    print(open(os.path.join(args.out, "llm.md")).read())


if __name__ == "__main__":
    main()
