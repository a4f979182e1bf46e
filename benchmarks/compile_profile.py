"""Benchmark: trace+lower and XLA compile seconds of one control ``train`` program.

Programs: the sweep benchmark's CartPole PPO-clip run (8 envs × 32 steps × 20 iterations,
(64, 64) network) and the same run with VACO at a fixed lag 4, each as a single-seed
``jax.jit(train, static_argnums=0)``. For each we time ``.lower()`` (Python tracing + StableHLO
emission) and ``.compile()`` (XLA) apart and count the StableHLO ops of the lowered module and
the HLO instructions of the optimised one. The persistent compilation cache is switched off
(``JAX_COMPILATION_CACHE_DIR`` is dropped before JAX is imported) so every number is a cold
compile. ``--parts`` adds the pieces of the PPO-clip program compiled on their own
(``init_state``, one rollout, one batch of updates, one ``train_iteration``) to show where the
ops are. ``--studies`` adds the vmapped programs the studies compile (compiled, not run): one
chunk of ``experiments/vaco_forward_lag.py --scale cpu`` (15 runs of 200 iterations at 8 × 64,
VACO at M = 64 on CartPole-v1 and PPO-clip at M = 16 on Breakout-MinAtar, the settings of that
script's ``cpu`` preset) and one variant of ``experiments/vaco_lag_sweep.py --scale cpu``
(CartPole-v1 VACO, every lag × δ × seed in one program). Each invocation replaces its ``--label`` rows in the CSV and rewrites the table;
``--revision REV`` measures the package as it was at git revision REV (``git archive`` into a
temporary folder, measured in a child process that imports it), so before and after are
measured by one script on one machine:

    python benchmarks/compile_profile.py --label before --revision 35d288e --repeats 3
    python benchmarks/compile_profile.py --label after --repeats 3

``results/bench/README.md`` says what dominated and what changed.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import os
import platform
import json
import re
import statistics
import time
from pathlib import Path

os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)

import jax  # noqa: E402  (after the environment edit)

from fresh_rl.control import TrainConfig, init_state, train, train_iteration  # noqa: E402
from fresh_rl.lag import DelayConfig  # noqa: E402

jax.config.update("jax_enable_compilation_cache", False)
# the module, not the function that ``fresh_rl.control.train`` names after import
train_lib = importlib.import_module("fresh_rl.control.train")

_BASE = dict(env_name="CartPole-v1", num_envs=8, rollout_length=32, total_env_steps=8 * 32 * 20,
             num_epochs=4, num_minibatches=4)
PROGRAMS = {
    "ppo_clip": TrainConfig(**_BASE, method="ppo_clip"),
    "vaco_lag4": TrainConfig(**_BASE, method="vaco", delay=DelayConfig.fixed(4, 5)),
}
OUT = Path(__file__).resolve().parents[1] / "results" / "bench"
_OP = re.compile(r"^\s*(%\S+|ROOT \S+|\S+) = ", re.MULTILINE)


def profile(fn, args, repeats: int, run: bool = True) -> dict:
    """Median lower and compile seconds of ``jit(fn)(*args)`` over ``repeats`` cold compiles,
    op counts, and (``run``) the median run seconds."""
    lower_s, compile_s = [], []
    for _ in range(repeats):
        jax.clear_caches()
        start = time.perf_counter()
        lowered = jax.jit(fn).lower(*args)
        lower_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        compiled = lowered.compile()
        compile_s.append(time.perf_counter() - start)
    if run:
        jax.block_until_ready(compiled(*args))  # warm-up
    run_s = []
    for _ in range(max(repeats, 3) if run else 0):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        run_s.append(time.perf_counter() - start)
    return {"lower_s": statistics.median(lower_s), "compile_s": statistics.median(compile_s),
            "run_s": statistics.median(run_s) if run_s else None,
            "stablehlo_ops": len(_OP.findall(lowered.as_text())),
            "optimized_hlo_ops": len(_OP.findall(compiled.as_text()))}


def _fmt(value) -> str:
    return "–" if value in (None, "") else f"{float(value):.3f}"


def _parts(config: TrainConfig) -> dict:
    """The pieces of one program as separate (fn, args), on concrete example inputs."""
    key = jax.random.PRNGKey(0)
    from fresh_rl.control import HyperParams  # the revisions --parts can profile

    hparams = HyperParams.from_config(config)
    state = init_state(config, key, hparams)
    from fresh_rl.control.acting import rollout

    def act(st, k):
        return rollout(config, st.ring, st.env_state, st.obs, k, hparams.lag)

    batch = act(state, key)[2]
    return {
        "ppo_clip/init_state": (lambda k: init_state(config, k, hparams), (key,)),
        "ppo_clip/rollout": (act, (state, key)),
        "ppo_clip/update": (lambda st, b, k: train_lib.update(config, st, b, k, hparams), (state, batch, key)),
        "ppo_clip/train_iteration": (lambda st, k: train_iteration(config, st, k, hparams), (state, key)),
    }


def _study_programs() -> dict:
    """The studies' vmapped programs as (fn, args): one chunk of the forward-lag study's stages and
    one variant of the lag sweep (``--studies``)."""
    from fresh_rl.control import HyperParams
    from fresh_rl.control.forward_lag_study import KEEP, Scale, config_for, train_kept
    from fresh_rl.control.presets import VACO_SCALES, study_variants, variant_config, variant_grid
    from fresh_rl.sweep.keys import seed_keys

    def task(env, **kw):  # experiments/vaco_forward_lag.py's cpu preset
        return TrainConfig(env_name=env, num_envs=8, rollout_length=64, total_env_steps=8 * 64 * 200, num_minibatches=4,
                           eval_every=20, eval_episodes=8, num_actor_groups=4, **kw)
    scale = Scale((), (0, 4, 16), 4.0, (4, 16, 64), 16, (3e-4, 1e-3, 3e-3), 5, 10, 15)
    chunk = scale.chunk
    programs = {}
    for name, config in {
            "forward_lag/CartPole-v1/vaco/M=64": config_for(task("CartPole-v1", normalize_obs=True), scale, "vaco",
                                                             0.2, 64, "fixed"),
            "forward_lag/Breakout-MinAtar/ppo_clip/M=16": config_for(
                task("Breakout-MinAtar", normalize_obs=False, hidden_sizes=(64,), entropy_coef=0.01), scale,
                "ppo_clip", 0.2, 16, "fixed")}.items():
        grid = {"learning_rate": [1e-3] * chunk, "lag": [4] * chunk}
        programs[f"{name} ({chunk} runs)"] = (jax.vmap(functools.partial(train_kept, config, KEEP)),
                                              (seed_keys(list(range(chunk))), HyperParams.from_grid(config, grid)))
    sweep = VACO_SCALES["cpu"]
    cartpole = next(t for t in sweep.tasks if t.name == "CartPole-v1")
    _, method, overrides, deltas = next(v for v in study_variants(sweep, cartpole) if v[0] == "vaco")
    config = variant_config(cartpole, method, overrides, sweep.ring_size)
    grid, hparams = variant_grid(config, sweep.lags, deltas, sweep.num_seeds, 0)
    programs[f"lag_sweep/CartPole-v1/vaco ({grid.size} runs)"] = (
        jax.vmap(lambda key, hp: train(config, key, hp).metrics), (grid.keys, hparams))
    return programs


def measure(repeats: int, parts: bool, studies: bool = False) -> list[dict]:
    """Profile rows of every program with the ``fresh_rl`` that is imported (study programs
    compiled, not run)."""
    programs = {name: (functools.partial(train, config), (jax.random.PRNGKey(0),))
                for name, config in PROGRAMS.items()}
    if parts:
        programs.update(_parts(PROGRAMS["ppo_clip"]))
    study = _study_programs() if studies else {}
    rows = []
    for name, (fn, fn_args) in {**programs, **study}.items():
        row = {"program": name, **profile(fn, fn_args, repeats, run=name not in study)}
        row["total_s"] = row["lower_s"] + row["compile_s"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--label", help="row label, e.g. before / after")
    parser.add_argument("--revision", default=None, help="measure the package at this git revision")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--parts", action="store_true", help="also profile the pieces of the PPO-clip program")
    parser.add_argument("--studies", action="store_true",
                        help="also compile (not run) the studies' vmapped programs")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # child mode
    args = parser.parse_args(argv)
    if args.measure:
        measure(args.repeats, args.parts, args.studies)
        return
    if not args.label:
        parser.error("--label is required")
    from fresh_rl.provenance import git_commit, measure_at_revision, replace_label_rows  # not in every revision --revision measures

    if args.revision:
        measured, commit = measure_at_revision(
            __file__, args.revision, ["--repeats", str(args.repeats), *(["--parts"] if args.parts else []),
                                      *(["--studies"] if args.studies else [])])
    else:
        measured, commit = measure(args.repeats, args.parts, args.studies), git_commit()
    rows = replace_label_rows(OUT / "compile_profile.csv", args.label,
                              [{"label": args.label, "commit": commit, **row} for row in measured])

    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, jax {jax.__version__} on {jax.default_backend()}"
    lines = [
        "# Compile profile of the control trainer", "",
        f"Command: `python benchmarks/compile_profile.py --label LABEL --repeats {args.repeats}`; {machine}; "
        "persistent compilation cache off; medians over repeats.",
        f"Programs: single-seed `jit(train)` on CartPole-v1, {_BASE['num_envs']} envs × "
        f"{_BASE['rollout_length']} steps × 20 iterations, 4 epochs × 4 minibatches; `vaco_lag4` = VACO "
        "at fixed lag 4. Rows named `forward_lag/…` and `lag_sweep/…` (`--studies`): the studies' vmapped "
        "programs, compiled and not run (the docstring says which).", "",
        "| label | commit | program | lower (s) | compile (s) | total (s) | run (s) | StableHLO ops | optimised HLO ops |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['label']} | {r['commit']} | {r['program']} | {float(r['lower_s']):.2f} | "
                     f"{float(r['compile_s']):.2f} | {float(r['total_s']):.2f} | {_fmt(r.get('run_s'))} | {r['stablehlo_ops']} | "
                     f"{r['optimized_hlo_ops']} |")
    lines += ["", "What dominated and what changed: results/bench/README.md."]
    (OUT / "compile_profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
