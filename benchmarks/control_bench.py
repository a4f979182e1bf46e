"""Control training throughput: our jitted PPO-family trainer vs Brax's PPO trainer, side by side.

Both train on the same Brax task (default ``inverted_pendulum``, spring pipeline) with the
same work per update:

* ``num_envs`` parallel envs, unroll / rollout length T, so one update batch holds
  ``num_envs · T`` transitions (Brax: ``batch_size · num_minibatches = num_envs``,
  ``unroll_length = T``);
* ``num_minibatches`` minibatches × ``epochs`` passes per batch (Brax:
  ``num_updates_per_batch = epochs``), Adam with global-norm clipping 0.5, advantage
  normalisation on, observation normalisation off, episode length 1000, action repeat 1;
* separate policy and value MLPs of ``--hidden`` units with tanh (Brax:
  ``make_ppo_networks(policy_hidden_layer_sizes=…, value_hidden_layer_sizes=…,
  activation=tanh, distribution_type="normal")``, a plain Gaussian like ours).

Remaining differences (Brax's design, not changed here): Brax minibatches whole length-T
sequences and recomputes GAE with the current value net inside every minibatch loss, ours
shuffles single transitions with advantages frozen per batch; Brax's auto-reset reuses each
env's first initial state, ours draws a fresh one (a batched reset every step, selected where
an env is done).

**Timing.** Throughput = environment steps per second *including learning* (rollout +
updates), compile excluded, median over ``--repeats`` (the fastest run is reported too).
Both sides run interleaved in one process, so load changes on a shared machine hit them alike:

* ours: ``run = jax.jit(train, static_argnums=0)``; first, one call per variant (compile +
  run; compile ≈ first call − median call). One call is ``iterations · num_envs · T`` env
  steps (``train`` includes its env reset and net init).
* Brax: then one ``brax.training.agents.ppo.train`` call with ``num_evals = repeats + 3`` and
  ``run_evals=False`` (no evaluation rollouts at all), so training runs as ``repeats + 2``
  equal jitted epochs of ``iterations`` training steps, with a ``progress_fn`` call after
  each. The first two epochs compile (Brax's pmapped epoch is compiled on its first *and*
  second call here) and are dropped. After each later epoch, ``progress_fn`` runs one timed
  round of every variant of ours (and the env-only jobs below), new key each round.
  A Brax epoch's time is the wall time from the end of one ``progress_fn`` call to the start
  of the next (Brax's own ``training/sps``, which times the epoch call alone, is reported
  too). Brax compile (and setup) ≈ first two epochs − 2 × median epoch.

An env-only row (no policy, zero actions) separates simulator + auto-reset cost from learning:
our ``BraxVecEnv.step`` vs Brax's training wrappers (``brax.envs.training.wrap``), each in
one jitted ``lax.scan`` of ``T · iterations`` steps.

Writes ``results/bench/control.csv`` and ``results/bench/control.md``. Run pinned to one core:

    taskset -c 1 python benchmarks/control_bench.py
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import time
from pathlib import Path

import brax
import brax.envs
import flax.linen as nn
import jax
import jax.numpy as jnp
from brax.training.agents.ppo import networks as brax_ppo_networks
from brax.training.agents.ppo import train as brax_ppo

from fresh_rl.provenance import git_commit, write_csv
from fresh_rl.control import BraxVecEnv, TrainConfig, train
from fresh_rl.lag import DelayConfig

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "bench"
LOAD_AT_START = ", ".join(f"{x:.2f}" for x in os.getloadavg())
LAG = 4
# Brax's pmapped training epoch compiles on its first call and again on its second (observed
# with jax 0.9.2 / brax 0.14.2: both take about the compile time); both are warm-up.
BRAX_WARMUP_EPOCHS = 2


def _block(tree):
    jax.tree.map(lambda x: x.block_until_ready(), tree)


def our_variants(args, env):
    """name → TrainConfig; lag-k variants use a ring of K = k + 1 versions."""
    base = dict(
        env_name=f"brax/{env}", brax_backend=args.backend, num_envs=args.num_envs,
        rollout_length=args.unroll, total_env_steps=args.iterations * args.num_envs * args.unroll,
        num_epochs=args.epochs, num_minibatches=args.minibatches, max_grad_norm=0.5,
        hidden_sizes=tuple(args.hidden), activation="tanh",
    )
    lagged = DelayConfig.fixed(LAG, LAG + 1)
    return {
        "ours ppo_clip lag 0": TrainConfig(**base, method="ppo_clip"),
        f"ours ppo_clip lag {LAG}": TrainConfig(**base, method="ppo_clip", delay=lagged),
        "ours vaco lag 0": TrainConfig(**base, method="vaco"),
        f"ours vaco lag {LAG}": TrainConfig(**base, method="vaco", delay=lagged),
    }


def _row(first_s, runs, steps, reported=float("nan")):
    steady = statistics.median(runs)
    return dict(compile_s=first_s - steady, epoch_s=steady, best_s=min(runs), env_steps=steps,
                sps=steps / steady, best_sps=steps / min(runs), brax_reported_sps=reported)


def our_jobs(args, env):
    run = jax.jit(train, static_argnums=0)
    return {name: (lambda key, c=config: run(c, key).metrics, config.num_iterations * config.batch_size)
            for name, config in our_variants(args, env).items()}


def env_only_jobs(args, env):
    """Simulator + auto-reset, zero actions, no policy: ours vs Brax's training wrappers."""
    steps = args.unroll * args.iterations
    ours = BraxVecEnv(env, args.num_envs, backend=args.backend)
    wrapped = brax.envs.training.wrap(brax.envs.get_environment(env, backend=args.backend),
                                      episode_length=1000, action_repeat=1)
    zeros = jnp.zeros((args.num_envs, ours.spec.action_dim))

    def ours_run(key):
        state, _ = ours.reset(key)
        body = lambda s, k: (ours.step(k, s, zeros)[0], None)
        return jax.lax.scan(body, state, jax.random.split(key, steps))[0].env_state.obs

    def brax_run(key):
        state = wrapped.reset(jax.random.split(key, args.num_envs))
        body = lambda s, _: (wrapped.step(s, zeros), None)
        return jax.lax.scan(body, state, None, length=steps)[0].obs  # obs: keeps the physics live

    total = steps * args.num_envs
    return {"ours env only": (jax.jit(ours_run), total), "brax env only": (jax.jit(brax_run), total)}


def time_side_by_side(args, env, names=None):
    """Brax's trainer and our jobs interleaved in one process (see the module docstring);
    ``names``: only these of our jobs (default all)."""
    jobs = {**our_jobs(args, env), **env_only_jobs(args, env)}
    jobs = {name: job for name, job in jobs.items() if names is None or name in names}
    first, runs = {}, {name: [] for name in jobs}
    for name, (fn, _) in jobs.items():
        t0 = time.perf_counter()
        _block(fn(jax.random.PRNGKey(0)))  # compile + one run; raw uint32 keys (Brax's reset needs them)
        first[name] = time.perf_counter() - t0
        print(f"  {env}: compiled {name} in {first[name]:.1f} s", flush=True)

    epochs, reported, last = [], [], [time.perf_counter()]

    def progress(step, metrics):
        epochs.append(time.perf_counter() - last[0])
        reported.append(float(metrics["training/sps"]))
        if len(epochs) > BRAX_WARMUP_EPOCHS:  # after each steady Brax epoch: one round of ours
            for name, (fn, _) in jobs.items():
                t0 = time.perf_counter()
                _block(fn(jax.random.PRNGKey(len(epochs))))
                runs[name].append(time.perf_counter() - t0)
        last[0] = time.perf_counter()

    steps_per_epoch = args.iterations * args.num_envs * args.unroll
    network_factory = functools.partial(
        brax_ppo_networks.make_ppo_networks, policy_hidden_layer_sizes=tuple(args.hidden),
        value_hidden_layer_sizes=tuple(args.hidden), activation=nn.tanh, distribution_type="normal")
    last[0] = time.perf_counter()
    brax_ppo.train(
        environment=brax.envs.get_environment(env, backend=args.backend),
        num_timesteps=steps_per_epoch * (args.repeats + BRAX_WARMUP_EPOCHS),
        num_evals=args.repeats + BRAX_WARMUP_EPOCHS + 1,
        run_evals=False, num_envs=args.num_envs, episode_length=1000, action_repeat=1,
        unroll_length=args.unroll, batch_size=args.num_envs // args.minibatches,
        num_minibatches=args.minibatches, num_updates_per_batch=args.epochs,
        max_grad_norm=0.5, normalize_advantage=True, normalize_observations=False,
        network_factory=network_factory, progress_fn=progress, seed=0,
    )
    steady = epochs[BRAX_WARMUP_EPOCHS:]
    rows = {"brax ppo": _row(
        sum(epochs[:BRAX_WARMUP_EPOCHS]) - (BRAX_WARMUP_EPOCHS - 1) * statistics.median(steady),
        steady, steps_per_epoch, statistics.median(reported[BRAX_WARMUP_EPOCHS:]))}
    rows.update({name: _row(first[name], runs[name], steps) for name, (_, steps) in jobs.items()})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=["inverted_pendulum"], help="Brax task names")
    parser.add_argument("--backend", default="spring")
    parser.add_argument("--num-envs", type=int, default=128)
    parser.add_argument("--unroll", type=int, default=16, help="T: rollout / unroll length")
    parser.add_argument("--minibatches", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4, help="= Brax num_updates_per_batch")
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 64])
    parser.add_argument("--iterations", type=int, default=40, help="updates per timed run / Brax epoch")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    records = []
    wall0 = time.perf_counter()
    for env in args.envs:
        timings = time_side_by_side(args, env)
        for name, t in timings.items():
            print(f"{env:20s} {name}: {t}", flush=True)
            records.append(dict(env=env, backend=args.backend, impl=name, num_envs=args.num_envs,
                                unroll=args.unroll, minibatches=args.minibatches, epochs=args.epochs,
                                hidden="x".join(map(str, args.hidden)), **t))
    write_tables(records, args, time.perf_counter() - wall0)


def write_tables(records, args, wall):
    write_csv(args.out / "control.csv", records)

    cpus = sorted(os.sched_getaffinity(0))
    lines = [
        "# Control training throughput: fresh_rl trainer vs Brax PPO",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, this process pinned to CPU(s) {cpus} "
        f"(`taskset`); jax {jax.__version__}, brax {brax.__version__}; commit {git_commit()} "
        f"(plus the working tree at run time); wall time {wall / 60:.1f} min; load average at start "
        f"{LOAD_AT_START} (the machine is shared with other jobs).",
        f"Command: `taskset -c {','.join(map(str, cpus))} python benchmarks/control_bench.py "
        f"{' '.join(_cli(args))}`.",
        "",
        f"Settings: backend {args.backend}, {args.num_envs} envs, T = {args.unroll}, "
        f"{args.minibatches} minibatches × {args.epochs} epochs per batch of "
        f"{args.num_envs * args.unroll} transitions, policy and value MLPs {tuple(args.hidden)} tanh, "
        f"{args.iterations} updates per timed run (Brax: per epoch), median of {args.repeats} runs. "
        "Env steps/s include learning (rollout + updates); compile excluded and reported apart. "
        "How each side is configured and timed: see the docstring of `benchmarks/control_bench.py`.",
        "",
        "| env | implementation | env steps/s (median) | vs Brax PPO | vs ours lag 0 (same method) "
        "| best run env steps/s | s per run | compile s | Brax-reported sps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for env in dict.fromkeys(r["env"] for r in records):
        rows = {r["impl"]: r for r in records if r["env"] == env}
        ref = rows["brax ppo"]["sps"]
        for name, r in rows.items():
            if name.startswith("ours") and "env only" not in name:
                lag0 = rows[name.rsplit(" lag", 1)[0] + " lag 0"]["sps"]
                vs_lag0 = f"{r['sps'] / lag0:.2f}"
            else:
                vs_lag0 = "–"
            vs_brax = f"{r['sps'] / ref:.2f}x" if "env only" not in name else (
                f"{r['sps'] / rows['brax env only']['sps']:.2f}x (vs brax env only)")
            reported = "–" if r["brax_reported_sps"] != r["brax_reported_sps"] else f"{r['brax_reported_sps']:,.0f}"
            lines.append(f"| {env} | {name} | {r['sps']:,.0f} | {vs_brax} | {vs_lag0} | "
                         f"{r['best_sps']:,.0f} | {r['epoch_s']:.2f} | {r['compile_s']:.1f} | {reported} |")
    lines += ["", "## Reading the table", ""]
    for env in dict.fromkeys(r["env"] for r in records):
        sps = {r["impl"]: r["sps"] for r in records if r["env"] == env}
        ours0, brax_sps = sps["ours ppo_clip lag 0"], sps["brax ppo"]
        verdict = "met" if ours0 >= brax_sps else "NOT met"
        lag_costs = ", ".join(f"{m} {1 - sps[f'ours {m} lag {LAG}'] / sps[f'ours {m} lag 0']:+.0%}"
                              for m in ("ppo_clip", "vaco"))
        env_share = (args.unroll * args.iterations * args.num_envs / sps["ours env only"]) / (
            args.unroll * args.iterations * args.num_envs / ours0)
        lines += [
            f"* **{env}** — target ours ≥ 1.0× Brax PPO at equal settings: PPO-clip lag 0 runs at "
            f"{ours0 / brax_sps:.2f}× ({verdict}). Cost of simulated lag {LAG} (fixed, ring K = {LAG + 1}; "
            f"target ≤ 10%): {lag_costs} (negative = faster, i.e. within noise). VACO vs PPO-clip at "
            f"lag 0: {sps['ours vaco lag 0'] / ours0:.2f}× (V-trace realignment + TV filter).",
            f"* Env only (no policy, zero actions): our adapter runs at "
            f"{sps['ours env only'] / sps['brax env only']:.2f}× Brax's training wrappers; stepping the "
            f"envs is ≈ {env_share:.0%} of our PPO-clip lag-0 run time.",
        ]
    lines += ["* The machine is shared with other jobs (see the load average); Brax and ours are "
              "interleaved so both see the same load, yet separate runs of this script moved the "
              "ratios by tens of percent: compare rows within one run, and treat a few percent as noise."]
    (args.out / "control.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _cli(args):
    return [f"--envs {' '.join(args.envs)}", f"--backend {args.backend}", f"--num-envs {args.num_envs}",
            f"--unroll {args.unroll}", f"--minibatches {args.minibatches}", f"--epochs {args.epochs}",
            f"--hidden {' '.join(map(str, args.hidden))}", f"--iterations {args.iterations}",
            f"--repeats {args.repeats}"]


if __name__ == "__main__":
    main()
