"""Benchmark: compiled memory and compile time of the LLM programs at paper batch sizes.

For the Qwen2.5-0.5B preset (parameters abstract: nothing is allocated, every number is XLA's
own memory analysis of the compiled program on this backend) it compiles

* ``update``: value and gradient of a policy-gradient loss through the fp32 training forward
  (``token_logprobs_and_entropy``) on one paper minibatch, 128 sequences × 142 tokens, and
  ``update_remat`` the same with every layer rematerialised (revisions that have it);
* ``old_logprobs``: the fp32 forward alone on a paper batch, 512 × 142;
* ``sampler``: the bf16 KV-cache sampler on 512 prompts of 64 tokens, 78 new tokens;
* ``update_L{n}``: the update on 8 × 142 with the 0.5B layer shapes and n layers, for compile
  time against depth.

and reports lower (trace + StableHLO) and XLA compile seconds and the compiled program's
argument, output and temporary bytes (peak ≈ arguments + outputs + temporaries − aliased).
``--revision REV`` measures the package as it was at git revision REV (``git archive`` into a
temporary folder, measured in a child process), so before and after come from one script on
one machine. The persistent compilation cache is off. Each invocation replaces its
``--label`` rows in ``results/bench/llm_scale.csv`` and rewrites ``llm_scale.md``:

    python benchmarks/llm_scale.py --label before --revision b63934c
    python benchmarks/llm_scale.py --label after
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import platform
import time
from pathlib import Path

os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

import jax  # noqa: E402  (after the environment edit)
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_enable_compilation_cache", False)

OUT = Path(__file__).resolve().parents[1] / "results" / "bench"
UPDATE_BATCH, OLD_LOGPROB_BATCH, SEQUENCE = 128, 512, 142
SAMPLER_BATCH, PROMPT, NEW_TOKENS = 512, 64, 78
DEPTH_BATCH = 8


def _programs(depths):
    """``{name: (fn, abstract args)}`` of the package that is imported."""
    from fresh_rl.llm import sampler
    from fresh_rl.llm.model import init_params, preset

    def abstract_params(config):
        return jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))

    def tokens(batch, length):
        return (jax.ShapeDtypeStruct((batch, length), jnp.int32),
                jax.ShapeDtypeStruct((batch, length), jnp.bool_))

    def update(config, **options):
        def loss(params, tokens, mask):
            logp, _ = sampler.token_logprobs_and_entropy(params, config, tokens, mask, **options)
            return -jnp.sum(logp) / jnp.maximum(jnp.sum(mask), 1)
        return jax.value_and_grad(loss)

    def forward(config):
        return lambda params, tokens, mask: sampler.token_logprobs_and_entropy(
            params, config, tokens, mask)[0]

    def generate(config):
        sampling = sampler.SamplingConfig(max_new_tokens=NEW_TOKENS, temperature=1.0)
        return lambda params, prompt, prompt_mask: sampler.generate(
            params, config, sampling, prompt, prompt_mask, jax.random.PRNGKey(0))

    base = preset("qwen2.5-0.5b")
    params = abstract_params(base)
    programs = {
        "update": (update(base), (params, *tokens(UPDATE_BATCH, SEQUENCE))),
        "old_logprobs": (forward(base), (params, *tokens(OLD_LOGPROB_BATCH, SEQUENCE))),
        "sampler": (generate(base), (params, *tokens(SAMPLER_BATCH, PROMPT))),
    }
    if "remat" in inspect.signature(sampler.token_logprobs_and_entropy).parameters:
        programs["update_remat"] = (update(base, remat=True),
                                    (params, *tokens(UPDATE_BATCH, SEQUENCE)))
    for depth in depths:
        config = dataclasses.replace(base, num_hidden_layers=depth)
        programs[f"update_L{depth}"] = (update(config),
                                        (abstract_params(config), *tokens(DEPTH_BATCH, SEQUENCE)))
    return programs


def measure(depths) -> list[dict]:
    rows = []
    for name, (fn, args) in _programs(depths).items():
        jax.clear_caches()
        start = time.perf_counter()
        lowered = jax.jit(fn).lower(*args)
        lower_s = time.perf_counter() - start
        start = time.perf_counter()
        compiled = lowered.compile()
        compile_s = time.perf_counter() - start
        memory = compiled.memory_analysis()
        row = {"program": name, "lower_s": lower_s, "compile_s": compile_s,
               "argument_gb": memory.argument_size_in_bytes / 1e9,
               "output_gb": memory.output_size_in_bytes / 1e9,
               "temp_gb": memory.temp_size_in_bytes / 1e9,
               "peak_gb": (memory.argument_size_in_bytes + memory.output_size_in_bytes
                           + memory.temp_size_in_bytes - memory.alias_size_in_bytes) / 1e9}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", help="row label, e.g. before / after")
    parser.add_argument("--revision", default=None,
                        help="measure the package at this git revision")
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 4, 24])
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args(argv)
    if args.measure:
        measure(args.depths)
        return
    if not args.label:
        parser.error("--label is required")
    from fresh_rl.provenance import git_commit, measure_at_revision, replace_label_rows

    started = time.perf_counter()
    if args.revision:
        measured, commit = measure_at_revision(__file__, args.revision,
                                               ["--depths", *map(str, args.depths)])
    else:
        measured, commit = measure(args.depths), git_commit()
    wall = time.perf_counter() - started
    rows = replace_label_rows(OUT / "llm_scale.csv", args.label,
                              [{"label": args.label, "commit": commit, "wall_s": f"{wall:.0f}",
                                **row} for row in measured])

    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
               f"jax {jax.__version__} on {jax.default_backend()}")
    lines = [
        "# LLM programs at paper batch sizes: compiled memory and compile time", "",
        f"Command: `python benchmarks/llm_scale.py --label LABEL [--revision REV]`; {machine}; "
        "persistent compilation cache off; abstract parameters (XLA's memory analysis of the "
        "compiled program, nothing allocated). Qwen2.5-0.5B preset: `update` = value and "
        f"gradient through the fp32 training forward on {UPDATE_BATCH} × {SEQUENCE} "
        "(`update_remat`: every layer rematerialised); "
        f"`old_logprobs` = the fp32 forward on {OLD_LOGPROB_BATCH} × {SEQUENCE}; `sampler` = "
        f"the bf16 KV-cache sampler, {SAMPLER_BATCH} prompts × {PROMPT} tokens + {NEW_TOKENS} "
        f"new; `update_L{{n}}` = the update on {DEPTH_BATCH} × {SEQUENCE} with n layers of "
        "the 0.5B shapes. Peak ≈ arguments + outputs + temporaries − aliased.", "",
        "| label | commit | program | lower (s) | compile (s) | arguments (GB) | outputs (GB) "
        "| temporaries (GB) | peak (GB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['label']} | {r['commit']} | {r['program']} | "
                     f"{float(r['lower_s']):.1f} | {float(r['compile_s']):.1f} | "
                     f"{float(r['argument_gb']):.2f} | {float(r['output_gb']):.2f} | "
                     f"{float(r['temp_gb']):.2f} | {float(r['peak_gb']):.2f} |")
    walls = {r["label"]: r["wall_s"] for r in rows}
    lines += ["", "Wall time per label (s): " + ", ".join(f"{k} {v}" for k, v in walls.items())]
    (OUT / "llm_scale.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
