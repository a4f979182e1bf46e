"""Benchmark: compiled memory and compile time of the LLM programs at paper batch sizes.

For the Qwen2.5-0.5B preset and the Qwen2.5-1.5B shapes (:data:`fresh_rl.llm.presets.QWEN2_5_1_5B`)
(parameters abstract: nothing is allocated, every number is XLA's own memory analysis of the
compiled program on this backend; on a mesh, the memory of one device) it compiles

* ``update``: value and gradient of a policy-gradient loss through the fp32 training forward
  (``token_logprobs_and_entropy``) on one paper minibatch, 128 sequences × 142 tokens, and
  ``update_remat`` the same with every layer rematerialised (revisions that have it);
* ``old_logprobs``: the fp32 forward alone on a paper batch, 512 × 142;
* ``sampler``: the bf16 KV-cache sampler on 512 prompts of 64 tokens, 78 new tokens;
* ``update_L{n}``: the update on 8 × 142 with the 0.5B layer shapes and n layers, for compile
  time against depth;
* ``iteration``: one whole RL iteration (:func:`fresh_rl.llm.trainer.iteration`: collect 512
  episodes of the paper task, old log-probs, 4 AdamW minibatch steps) of the old-logits
  paper scale (``OLD_LOGITS_SCALES["paper"]``) with ``remat=True``, the state donated, i.e.
  the optimizer state and the bf16 sampler copy included (revisions with
  :mod:`fresh_rl.llm.sharding`);
* for the 1.5B shapes, ``update``, ``update_remat``, ``old_logprobs``, ``sampler`` and
  ``iteration`` as above (revisions with ``QWEN2_5_1_5B``).

and reports lower (trace + StableHLO) and XLA compile seconds and the compiled program's
argument, output and temporary bytes (peak ≈ arguments + outputs + temporaries − aliased).
``--devices N`` (N > 1) measures in a child process with N simulated CPU devices
(``--xla_force_host_platform_device_count``) over a ``--mesh DATA FSDP TENSOR`` mesh
(:mod:`fresh_rl.llm.sharding`; default 2 × 2 × 2): the parameters (and the iteration's whole
state) laid out by :func:`~fresh_rl.llm.sharding.param_specs`, token batches by
:func:`~fresh_rl.llm.sharding.batch_spec`, the rest propagated by XLA; the depth rows are
skipped there. ``--revision REV`` measures the package as it was at git revision REV (``git
archive`` into a temporary folder, measured in a child process), so before and after come
from one script on one machine. The persistent compilation cache is off. Each invocation
replaces its ``--label`` rows in ``results/bench/llm_scale.csv`` and rewrites
``llm_scale.md``:

    python benchmarks/llm_scale.py --label before --revision b63934c
    python benchmarks/llm_scale.py --label after --revision HEAD
    python benchmarks/llm_scale.py --label after_8dev --revision HEAD --devices 8
"""
from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import os
import platform
import subprocess
import sys
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
DEFAULT_MESH = (2, 2, 2)


def _programs(depths, mesh_shape=None):
    """``{name: (jitted fn, abstract args)}`` of the package that is imported; ``mesh_shape``:
    the ``(data, fsdp, tensor)`` mesh of the sharded programs (None: one device)."""
    from fresh_rl.llm import sampler
    from fresh_rl.llm.model import init_params, preset

    try:  # the mesh module and the 1.5B shapes exist from the sharding commit on
        from fresh_rl.llm import sharding
        from fresh_rl.llm import trainer
        from fresh_rl.llm.presets import OLD_LOGITS_SCALES, QWEN2_5_1_5B, char_task_for
    except ImportError:
        sharding = None
    if mesh_shape is not None and sharding is None:
        raise SystemExit("--devices > 1 needs fresh_rl.llm.sharding in the measured revision")
    mesh = None
    if mesh_shape is not None:
        mesh_config = sharding.MeshConfig(*mesh_shape)
        mesh = sharding.make_mesh(mesh_config)

    def abstract_params(config):
        return jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0)))

    def tokens(batch, length):
        return (jax.ShapeDtypeStruct((batch, length), jnp.int32),
                jax.ShapeDtypeStruct((batch, length), jnp.bool_))

    def placed(fn, params, *arrays):
        """``(jit(fn), args)``, on a mesh with the params by the rules and token batches split."""
        if mesh is None:
            return jax.jit(fn), (params, *arrays)
        shardings = (sharding.named(sharding.param_specs(params, mesh_config), mesh),
                     *(sharding.named(sharding.batch_spec(a.shape, mesh_config), mesh)
                       for a in arrays))
        return jax.jit(fn, in_shardings=shardings), (params, *arrays)

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

    def step_programs(config, suffix=""):
        params = abstract_params(config)
        programs = {
            "update" + suffix: placed(update(config), params, *tokens(UPDATE_BATCH, SEQUENCE)),
            "old_logprobs" + suffix: placed(forward(config), params,
                                            *tokens(OLD_LOGPROB_BATCH, SEQUENCE)),
            "sampler" + suffix: placed(generate(config), params, *tokens(SAMPLER_BATCH, PROMPT)),
        }
        if "remat" in inspect.signature(sampler.token_logprobs_and_entropy).parameters:
            programs["update_remat" + suffix] = placed(update(config, remat=True), params,
                                                       *tokens(UPDATE_BATCH, SEQUENCE))
        return programs

    def iteration(config):
        scale = OLD_LOGITS_SCALES["paper"]
        rl, env = dataclasses.replace(scale.rl, remat=True), char_task_for(scale.env, config)
        state = jax.eval_shape(lambda p: trainer.TrainState(
            params=p, opt_state=trainer.make_optimizer(rl).init(p),
            step=jnp.zeros((), jnp.int32)), abstract_params(config))
        key = jax.ShapeDtypeStruct((2,), jnp.uint32)
        if mesh is None:
            step = jax.jit(lambda state, key: trainer.iteration(
                state, key, config=rl, env=env, model_config=config), donate_argnums=0)
        else:
            step = sharding.sharded_iteration(rl, env, config, mesh, state)
        return step, (state, key)

    base = preset("qwen2.5-0.5b")
    programs = step_programs(base)
    if sharding is not None:
        programs["iteration"] = iteration(base)
        programs.update(step_programs(QWEN2_5_1_5B, "_1.5b"))
        programs["iteration_1.5b"] = iteration(QWEN2_5_1_5B)
    for depth in depths if mesh is None else ():
        config = dataclasses.replace(base, num_hidden_layers=depth)
        programs[f"update_L{depth}"] = placed(update(config), abstract_params(config),
                                              *tokens(DEPTH_BATCH, SEQUENCE))
    return programs


def measure(depths, mesh_shape=None) -> list[dict]:
    rows = []
    for name, (jitted, args) in _programs(depths, mesh_shape).items():
        jax.clear_caches()
        start = time.perf_counter()
        lowered = jitted.lower(*args)
        lower_s = time.perf_counter() - start
        start = time.perf_counter()
        compiled = lowered.compile()
        compile_s = time.perf_counter() - start
        memory = compiled.memory_analysis()
        row = {"program": name, "devices": jax.device_count(),
               "mesh": "×".join(map(str, mesh_shape)) if mesh_shape else "",
               "lower_s": lower_s, "compile_s": compile_s,
               "argument_gb": memory.argument_size_in_bytes / 1e9,
               "output_gb": memory.output_size_in_bytes / 1e9,
               "temp_gb": memory.temp_size_in_bytes / 1e9,
               "peak_gb": (memory.argument_size_in_bytes + memory.output_size_in_bytes
                           + memory.temp_size_in_bytes - memory.alias_size_in_bytes) / 1e9}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def _on_devices(devices: int, measure_fn):
    """``measure_fn()`` with ``devices`` simulated CPU devices in its child processes."""
    previous = os.environ.get("XLA_FLAGS")
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    try:
        return measure_fn()
    finally:
        if previous is None:
            os.environ.pop("XLA_FLAGS")
        else:
            os.environ["XLA_FLAGS"] = previous


def _load() -> str:
    """The 1-minute load average and the CPU count, e.g. ``"load 3.1 on 2 CPUs"``."""
    return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", help="row label, e.g. before / after")
    parser.add_argument("--revision", default=None,
                        help="measure the package at this git revision")
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 4, 24, 28])
    parser.add_argument("--devices", type=int, default=1,
                        help="simulated CPU devices (> 1: measured in a child process)")
    parser.add_argument("--mesh", type=int, nargs=3, default=list(DEFAULT_MESH),
                        metavar=("DATA", "FSDP", "TENSOR"),
                        help="mesh axis sizes with --devices > 1 (product = devices)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args(argv)
    if args.devices < 1:
        parser.error(f"--devices must be >= 1, got {args.devices}")
    if args.devices > 1 and args.mesh[0] * args.mesh[1] * args.mesh[2] != args.devices:
        parser.error(f"--mesh {args.mesh} must multiply to --devices {args.devices}")
    mesh_shape = tuple(args.mesh) if args.devices > 1 else None
    if args.measure:
        measure(args.depths, mesh_shape)
        return
    if not args.label:
        parser.error("--label is required")
    from fresh_rl.provenance import git_commit, measure_at_revision, replace_label_rows

    child_args = ["--depths", *map(str, args.depths), "--devices", str(args.devices),
                  "--mesh", *map(str, args.mesh)]
    load_before, started = _load(), time.perf_counter()
    if args.revision:
        measured, commit = _on_devices(args.devices, lambda: measure_at_revision(
            __file__, args.revision, child_args))
    elif args.devices > 1:
        child = _on_devices(args.devices, lambda: subprocess.run(
            [sys.executable, __file__, "--measure", *child_args], capture_output=True,
            text=True, env=dict(os.environ)))
        if child.returncode:
            raise SystemExit(child.stderr)
        measured = [json.loads(line) for line in child.stdout.splitlines()
                    if line.startswith("{")]
        commit = git_commit()
    else:
        measured, commit = measure(args.depths), git_commit()
    wall = time.perf_counter() - started
    rows = replace_label_rows(OUT / "llm_scale.csv", args.label,
                              [{"label": args.label, "commit": commit, "wall_s": f"{wall:.0f}",
                                "load": f"{load_before} → {_load()}", **row}
                               for row in measured])

    machine = (f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
               f"jax {jax.__version__} on {jax.default_backend()}")
    lines = [
        "# LLM programs at paper batch sizes: compiled memory and compile time", "",
        "Commands: `python benchmarks/llm_scale.py --label before --revision b63934c`, "
        "`--label after --revision HEAD`, `--label after_8dev --revision HEAD --devices 8` "
        f"(mesh data × fsdp × tensor = {' × '.join(map(str, DEFAULT_MESH))}); {machine}; "
        "persistent compilation cache off; abstract parameters (XLA's memory analysis of the "
        "compiled program, nothing allocated; on a mesh, one device's share). Qwen2.5-0.5B "
        "preset (`_1.5b`: the Qwen2.5-1.5B shapes): `update` = value and gradient through the "
        f"fp32 training forward on {UPDATE_BATCH} × {SEQUENCE} (`update_remat`: every layer "
        f"rematerialised); `old_logprobs` = the fp32 forward on {OLD_LOGPROB_BATCH} × "
        f"{SEQUENCE}; `sampler` = the bf16 KV-cache sampler, {SAMPLER_BATCH} prompts × "
        f"{PROMPT} tokens + {NEW_TOKENS} new; `iteration` = one whole RL iteration of the "
        "old-logits paper scale (512 episodes, 4 AdamW minibatch steps, remat) with its state "
        "(weights and AdamW moments) donated; `update_L{n}` = the update on "
        f"{DEPTH_BATCH} × {SEQUENCE} with n layers of the 0.5B shapes. Peak ≈ arguments + "
        "outputs + temporaries − aliased.", "",
        "| label | commit | devices | program | lower (s) | compile (s) | arguments (GB) "
        "| outputs (GB) | temporaries (GB) | peak (GB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        devices = r.get("devices") or "1"
        if r.get("mesh"):
            devices = f"{devices} ({r['mesh']})"
        lines.append(f"| {r['label']} | {r['commit']} | {devices} | {r['program']} | "
                     f"{float(r['lower_s']):.1f} | {float(r['compile_s']):.1f} | "
                     f"{float(r['argument_gb']):.2f} | {float(r['output_gb']):.2f} | "
                     f"{float(r['temp_gb']):.2f} | {float(r['peak_gb']):.2f} |")
    runs = {r["label"]: (r["wall_s"], r.get("load") or "not recorded") for r in rows}
    lines += ["", "Wall time (s) and load (1-minute average at start → end) per label: "
              + "; ".join(f"{k} {wall} s, {load}" for k, (wall, load) in runs.items())]
    lines += ["", "Targets (peak of one device):", *_targets(rows)]
    (OUT / "llm_scale.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# (program, budget GB): the 1.5B iteration on one 80 GB device, every 0.5B step in 40 GB
TARGETS = ((("iteration_1.5b",), 80.0),
           (("sampler", "old_logprobs", "update", "update_remat", "iteration"), 40.0))


def _targets(rows) -> list[str]:
    """One line per measured (label, program) of :data:`TARGETS`: met, or the gap."""
    lines = []
    for programs, budget in TARGETS:
        for r in rows:
            if r["program"] in programs:
                peak = float(r["peak_gb"])
                verdict = "met" if peak <= budget else f"missed by {peak - budget:.1f} GB"
                lines.append(f"* {r['label']} {r['program']}: {peak:.1f} GB vs {budget:.0f} GB: "
                             f"{verdict}")
    return lines


if __name__ == "__main__":
    main()
