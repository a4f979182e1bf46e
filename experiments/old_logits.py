"""Missing old logits in asynchronous LLM RL (arXiv 2605.12070): routes × staleness window.

  .venv/bin/python experiments/old_logits.py --scale cpu      # the committed results
  .venv/bin/python experiments/old_logits.py --scale ci --out /tmp/old_logits_ci
  .venv/bin/python experiments/old_logits.py --scale smoke --out /tmp/old_logits_smoke  # the tests'

From the warm-started tiny LM (results/llm_warm_start/checkpoint; the ci scale starts from
the arithmetic-specialised results/llm_warm_start_arithmetic/checkpoint) on the arithmetic task,
runs the asynchronous simulator (fresh_rl.llm.async_pipeline) for every route of the grid at
every staleness window W, seeds run one after another through the same compiled iteration.
Writes to --out (default results/old_logits for cpu and paper, else results/old_logits_<scale>):

  runs/<route>_W<w>[_partial]_seed<s>.csv  per-iteration metrics of one run
  checkpoints/<run>/  orbax checkpoints of the whole pipeline state every 4 iterations
                  (a killed run resumes there; --resume also skips finished runs)
  curves.csv      mean and 95% Student-t interval over seeds per (route, W, step) of success rate,
                  active-token fraction and mean |log r_d|
  summary.csv     per (route, W): final success (last third of the iterations), mean
                  active-token fraction and |log r_d| once the ring is full (step ≥ W),
                  EWMA resets; 95% intervals over seeds
  overhead.csv/.md  per repair route (``fresh_rl.corrections.routes.REPAIR_ROUTES``) at the
                  overhead W: extra parameter copies (fp32 bytes), fp32
                  forwards spent on old log-probs per step, median seconds per step
  runs/<run>.eval.json  (when the scale evaluates) the final policy's success on the
                  evaluation episodes, written with the run
  eval.csv, eval_summary.csv  the warm start's and every run's success on the same
                  held-out prompts (with a prompt pool, ci, also on the training prompts),
                  and per (route, W) the seed mean with its 95% interval and the gain over
                  the warm start
  verdicts.csv    (when the grid has recompute_current and evaluates) the paper's route
                  claims per W and prompt set, seed-paired on the seeds every route finished
                  (:func:`fresh_rl.llm.old_logits_verdicts.route_verdicts`), Holm-corrected over the windows; each claim is
                  decided over its cells by experiments/verdicts.py (results/VERDICTS.md)
  effects.csv     (when the grid has the four arms of the mask × clip factorial) per W and
                  metric the factorial's contrasts, seed-paired (:func:`factorial_tables`)
  success_vs_step.png, mechanism.png, mechanism_vs_window.png (several windows), reset_ablation.png, config.json
The ``bpe`` scale is the LLM confirmation on the BPE warm start (results/llm_warm_start_bpe/model,
random staleness L ~ U{0..W}, W ∈ {1, 4, 16}, 5 seeds × 60 iterations; ``bpe-ci`` its test
version on the stand-in; ``bpe-factorial`` the mask × clip factorial at W = 16). A grid too long for one run runs in chunks: ``--max-runs N`` makes
at most N new runs and summarises every finished one (largest W first, seed by seed across
routes: :func:`run_order`); ``--resume`` continues.
The ``paper`` scale configures the qwen2.5-0.5b preset (pass --checkpoint, an HF folder) and
larger batches; it is not run here. ``--model PATH`` (any Hugging Face folder with its
tokenizer, e.g. Qwen2.5-0.5B-Instruct) runs a scale from that model with the task speaking
its tokenizer and chat template, e.g. the stand-in at the smoke scale:

  .venv/bin/python experiments/old_logits.py --scale smoke --model tests/fixtures/qwen2_bpe_tiny \
      --out /tmp/old_logits_standin
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import sys
import time

import numpy as np

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.corrections.routes import REPAIR_ROUTES
from fresh_rl.eval import seed_interval
from fresh_rl.eval.route_claims import FACTORIAL_ARMS, factorial_effects
from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm.checkpoint import add_model_flag, load_hf_model
from fresh_rl.llm.evaluation import evaluate_policies
from fresh_rl.llm.old_logits_verdicts import full_ring, route_verdicts
from fresh_rl.llm.presets import OLD_LOGITS_SCALES as SCALES
from fresh_rl.llm.presets import RESULTS, OldLogitsScale, load_params, model_folder
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.provenance import provenance, write_csv
from fresh_rl.sweep.checkpoint import RunCheckpointer
from fresh_rl.sweep.integrity import tree_checksum
from fresh_rl.sweep.keys import seed_key, split_run_key, step_key
from fresh_rl.sweep.study_cli import NO_CHECKED, add_preset_arguments, chosen_preset, start_study

Scale = OldLogitsScale
CURVE_METRICS = ("success_rate", "active_token_fraction", "abs_log_rd_mean")
# Run CSVs written before the metric renames (results/old_logits/runs/*.csv) load under the
# current names.
RENAMED_COLUMNS = {"lag_mean": "lag/version_gap_mean", "lag_max": "lag/version_gap_max"}


def run_name(route: str, window: int, partial: bool, seed: int) -> str:
    return f"{route}_W{window}{'_partial' if partial else ''}_seed{seed}"


def grid_cells(scale: Scale) -> list[tuple[str, int, bool]]:
    """The grid's ``(route, W, partial)`` cells in table order: every grid route at every
    window, then the partial-rollout routes at ``partial_window``."""
    return ([(r, w, False) for r in scale.grid_routes for w in scale.windows]
            + [(r, scale.partial_window, True) for r in scale.partial_routes])


def run_order(scale: Scale) -> list[tuple[str, int, bool, int]]:
    """``(route, W, partial, seed)`` in the order the runs are made: largest window first and,
    within a window, seed by seed across the routes, so that a grid cut short (by
    ``--max-runs``) leaves every route compared at the strongest staleness with the
    same seeds. Each cell's seeds still finish in order (what ``--resume`` counts on)."""
    cells = grid_cells(scale)
    windows = sorted({w for _, w, _ in cells}, reverse=True)
    return [(route, window, partial, seed) for w in windows for seed in range(scale.seeds)
            for route, window, partial in cells if window == w]


def run_one(scale: Scale, route: str, window: int, partial: bool, seed: int, iterations: int,
            params, model_config, out: str):
    """One run at window ``window``; writes its CSV (and, when the scale evaluates, the final
    policy's held-out success to ``<run>.eval.json``) and returns its history.
    The ring holds max(windows) + 1 versions for every run, so each route compiles once. An
    interrupted run resumes from its newest checkpoint in ``out/checkpoints/<run>``."""
    async_config = scale.async_config(route, partial)
    name = run_name(route, window, partial, seed)
    checkpointer = RunCheckpointer(os.path.join(out, "checkpoints", name),
                                   fingerprint=repr((scale, name, iterations, tree_checksum(params))))
    state, history = ap.train_loop(scale.rl, async_config, seed, iterations,
                                   params=params, env=scale.env, model_config=model_config,
                                   window=window, checkpointer=checkpointer, checkpoint_every=4)
    if scale.eval_episodes and iterations == scale.iterations:  # before the CSV marks it done
        evaluation = evaluate_policies(scale, model_config, {name: state.train.params})
        path = os.path.join(out, "runs", name + ".eval.json")
        with open(path + ".tmp", "w") as f:
            json.dump(evaluation, f)
        os.replace(path + ".tmp", path)
    rows = [{"step": i, **{k: float(v[i]) for k, v in history.items()}}
            for i in range(iterations)]
    write_csv(os.path.join(out, "runs", name + ".csv"), rows)
    return history


def read_run_csv(path: str) -> dict[str, np.ndarray]:
    """A run CSV as ``{metric: [steps]}`` (old column names mapped by RENAMED_COLUMNS)."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return {RENAMED_COLUMNS.get(k, k): np.array([float(r[k]) for r in rows]) for k in rows[0]}


def load_runs(scale: Scale, out: str) -> tuple[dict, dict]:
    """``(histories, timed)`` rebuilt from the run CSVs already in ``out/runs`` (--resume)."""
    histories, timed = {}, {}
    for route, window, partial in grid_cells(scale):
        for seed in range(scale.seeds):
            path = os.path.join(out, "runs", run_name(route, window, partial, seed) + ".csv")
            if not os.path.exists(path):
                continue
            history = read_run_csv(path)
            history.pop("step", None)
            histories.setdefault((route, window, partial), []).append(history)
            if window == scale.overhead_window and not partial and seed == 0:
                timed[route] = history
    for route in REPAIR_ROUTES:
        path = os.path.join(out, "runs", run_name(route, scale.overhead_window, False, 0) + ".csv")
        if route not in timed and os.path.exists(path):
            timed[route] = read_run_csv(path)
    return histories, timed


def summarise(histories: dict, scale: Scale) -> tuple[list[dict], list[dict]]:
    """``(curves, summary)`` rows with 95% Student-t intervals over seeds."""
    curves, summary = [], []
    for (route, window, partial), runs in histories.items():
        stacked = {k: np.stack([h[k] for h in runs]) for k in runs[0]}  # [seeds, steps]
        for metric in CURVE_METRICS:
            mean, low, high = seed_interval(stacked[metric], axis=0)
            curves += [{"route": route, "window": window, "partial": partial, "metric": metric,
                        "step": i, "mean": mean[i], "low": low[i], "high": high[i]}
                       for i in range(len(mean))]
        n = stacked["success_rate"].shape[1]
        final = stacked["success_rate"][:, n - max(1, n // 3):].mean(axis=1)
        full = full_ring(window, n)
        row = {"route": route, "window": window, "partial": partial, "seeds": len(runs)}
        for name, values in (("final_success", final),
                             ("active_fraction", stacked["active_token_fraction"][:, full].mean(1)),
                             ("abs_log_rd", stacked["abs_log_rd_mean"][:, full].mean(1)),
                             ("clip_fraction", stacked["clip_fraction"][:, full].mean(1)),
                             ("version_gap_mean",
                              stacked["lag/version_gap_mean"][:, full].mean(1)),
                             ("ewma_resets", stacked["ewma_reset_count"][:, -1])):
            mean, low, high = seed_interval(values, axis=0)
            row.update({name: float(mean), f"{name}_low": float(low),
                        f"{name}_high": float(high)})
        summary.append(row)
    return curves, summary


def evaluation_tables(scale: Scale, out: str, warm_start: list[dict]) -> tuple[list[dict], list[dict]]:
    """``(rows, summary)``: the warm start's and every saved run's success on the evaluation
    episodes (``runs/<run>.eval.json``), and per (route, W, partial, prompts) the seed mean
    with its 95% Student-t interval and the mean gain over the warm start."""
    rows, summary = list(warm_start), []
    before = {r["prompts"]: r["success"] for r in warm_start}
    for route, window, partial in grid_cells(scale):
        runs = []
        for seed in range(scale.seeds):
            path = os.path.join(out, "runs", run_name(route, window, partial, seed) + ".eval.json")
            if os.path.exists(path):
                with open(path) as f:
                    runs += [{**r, "route": route, "window": window, "partial": partial, "seed": seed}
                             for r in json.load(f)]
        rows += runs
        for prompts in dict.fromkeys(r["prompts"] for r in runs):
            success = np.array([r["success"] for r in runs if r["prompts"] == prompts])
            mean, low, high = (float(x) for x in seed_interval(success))
            summary.append({"route": route, "window": window, "partial": partial, "prompts": prompts,
                            "seeds": len(success), "success": mean, "success_low": low,
                            "success_high": high, "warm_start": before[prompts],
                            "gain": mean - before[prompts]})
    return rows, summary


def factorial_tables(scale: Scale, histories: dict, eval_rows: list[dict]) -> list[dict]:
    """Per W where the grid ran all four arms of the mask × clip factorial
    (:data:`fresh_rl.eval.route_claims.FACTORIAL_ARMS`): each contrast on the seeds every arm
    finished, for the final success on each prompt set and for ρ_active (steps with a full ring)."""
    arms = FACTORIAL_ARMS
    if not set(arms) <= set(scale.grid_routes):
        return []
    rows = []
    for window in scale.windows:
        success = {(r["route"], r["seed"], r["prompts"]): r["success"] for r in eval_rows
                   if r.get("route") and r["window"] == window and not r["partial"]}
        runs = {a: histories.get((a, window, False), []) for a in arms}
        prompt_sets = sorted({p for _, _, p in success})
        seeds = [s for s in range(scale.seeds) if all(len(runs[a]) > s for a in arms)
                 and all((a, s, p) in success for a in arms for p in prompt_sets)]
        if len(seeds) < 2:
            continue
        metrics = {f"success_{p}": {a: np.array([success[a, s, p] for s in seeds]) for a in arms} for p in prompt_sets}
        metrics["active"] = {a: np.array([runs[a][s]["active_token_fraction"][
            full_ring(window, len(runs[a][s]["active_token_fraction"]))].mean() for s in seeds]) for a in arms}
        rows += [{"window": window, "metric": metric, **r} for metric, values in metrics.items()
                 for r in factorial_effects(values)]
    return rows


def time_routes_interleaved(scale: Scale, params, model_config, rounds: int) -> dict:
    """Per route at the overhead window: compile, fill the ring (``overhead_window``
    iterations), then ``rounds`` rounds of one iteration of every route in turn, so that
    every route sees the same background load (the machine is shared). Returns
    ``{route: {"wall_seconds": [rounds], "old_logit_forwards": [rounds]}}``."""
    runs = {}
    _, key_loop = split_run_key(seed_key(0))
    warmup = scale.overhead_window + 1
    for route in REPAIR_ROUTES:
        async_config = scale.async_config(route)
        step = ap.make_iteration(scale.rl, async_config, scale.env, model_config)
        state = ap.init_state(scale.rl, async_config, params, scale.overhead_window)
        for i in range(warmup):
            state, _ = step(state, step_key(key_loop, i))
        runs[route] = [step, state, {"wall_seconds": [], "old_logit_forwards": []}]
    for r in range(rounds):
        for route, run in runs.items():
            step, state, timing = run
            start = time.perf_counter()
            state, metrics = step(state, step_key(key_loop, warmup + r))
            forwards = float(metrics["old_logit_forwards"])  # blocks on the iteration
            timing["wall_seconds"].append(time.perf_counter() - start)
            timing["old_logit_forwards"].append(forwards)
            run[1] = state
    return {route: {k: np.array(v) for k, v in run[2].items()} for route, run in runs.items()}


def overhead_rows(timed: dict, scale: Scale, params) -> list[dict]:
    rows = []
    for route, history in timed.items():
        costs = ap.route_costs(scale.async_config(route), params, scale.overhead_window)
        seconds = history["wall_seconds"][1:] if len(history["wall_seconds"]) > 1 \
            else history["wall_seconds"]
        rows.append({"route": route, "window": scale.overhead_window, **costs,
                     "extra_param_mib": costs["extra_param_bytes"] / 2 ** 20,
                     "old_logit_forwards_per_step": float(np.mean(history["old_logit_forwards"])),
                     "seconds_per_step_median": float(np.median(seconds)),
                     "timed_steps": len(seconds)})
    base = next((r["seconds_per_step_median"] for r in rows if r["route"] == "linear_proxy"), None)
    for r in rows:
        r["time_vs_linear_proxy"] = r["seconds_per_step_median"] / base if base else float("nan")
    return rows


def plot(curves: list[dict], summary: list[dict], scale: Scale, out: str) -> None:
    """The learning-curve and mechanism figures; with several windows also ``mechanism_vs_window.png``:
    ρ_active and the clip fraction over the iterations with a full ring against W, per route (95%
    intervals over seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(route, window, partial, metric):
        rows = [r for r in curves if (r["route"], r["window"], r["partial"], r["metric"])
                == (route, window, partial, metric)]
        return (np.array([r["step"] for r in rows]), np.array([r["mean"] for r in rows]),
                np.array([r["low"] for r in rows]), np.array([r["high"] for r in rows]))

    def panel_grid(metrics, routes, filename, partial=False, windows=scale.windows):
        fig, axes = plt.subplots(len(metrics), len(windows), squeeze=False,
                                 figsize=(3.6 * len(windows), 2.8 * len(metrics)))
        for i, metric in enumerate(metrics):
            for j, window in enumerate(windows):
                ax = axes[i, j]
                for route in routes:
                    step, mean, low, high = series(route, window, partial, metric)
                    if len(step):
                        ax.plot(step, mean, label=route)
                        ax.fill_between(step, low, high, alpha=0.2)
                ax.set_title(f"W={window}{' partial' if partial else ''}", fontsize=9)
                ax.set_xlabel("iteration")
                ax.set_ylabel(metric, fontsize=8)
                if metric == "abs_log_rd_mean":
                    ax.set_yscale("log")
        axes[0, -1].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, filename), dpi=110)
        plt.close(fig)

    if len(scale.windows) > 1:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
        for ax, metric, label in zip(axes, ("active_fraction", "clip_fraction"), ("ρ_active", "clip fraction")):
            for route in scale.grid_routes:
                rows = sorted((r for r in summary if r["route"] == route and not r["partial"]), key=lambda r: r["window"])
                if rows:
                    mean = np.array([r[metric] for r in rows])
                    ax.errorbar([r["window"] for r in rows], mean, marker="o", capsize=3, label=route,
                                yerr=[mean - [r[f"{metric}_low"] for r in rows], [r[f"{metric}_high"] for r in rows] - mean])
            ax.set(xscale="log", xticks=scale.windows, xticklabels=scale.windows, xlabel="staleness window W",
                   ylabel=label)
        axes[1].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "mechanism_vs_window.png"), dpi=110)
        plt.close(fig)
    panel_grid(("success_rate",), scale.grid_routes, "success_vs_step.png")
    panel_grid(("active_token_fraction", "abs_log_rd_mean"), scale.grid_routes, "mechanism.png")
    ablation = [r for r in ("ewma", "ewma_no_reset", "snapshot") if r in scale.grid_routes]
    if len(ablation) > 1:
        panel_grid(CURVE_METRICS, ablation, "reset_ablation.png")
    if scale.partial_routes:
        panel_grid(("success_rate", "active_token_fraction", "abs_log_rd_mean"),
                   scale.partial_routes, "partial_rollouts.png", partial=True,
                   windows=(scale.partial_window,))


def overhead_markdown(rows: list[dict]) -> str:
    lines = ["| route | W | extra param copies | extra MiB (fp32) | old-logit forwards / step "
             "| s / step (median) | vs linear_proxy |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['route']} | {r['window']} | {r['extra_param_copies']} | "
              f"{r['extra_param_mib']:.1f} | {r['old_logit_forwards_per_step']:.2f} | "
              f"{r['seconds_per_step_median']:.2f} | {r['time_vs_linear_proxy']:.2f} |"
              for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=NO_CHECKED)
    add_preset_arguments(parser, SCALES, default="ci")
    parser.add_argument("--out", default=None,
                        help="output folder (default results/old_logits, or results/old_logits_<scale>)")
    parser.add_argument("--checkpoint", default=None,
                        help="initial parameters (default: the tiny warm start)")
    add_model_flag(parser)
    parser.add_argument("--overhead-only", type=int, default=0, metavar="ROUNDS",
                        help="only re-time every route, interleaved, ROUNDS rounds at the "
                             "overhead window (writes overhead.csv/.md)")
    parser.add_argument("--prompt-pool-seed", type=int, default=None,
                        help="another fixed training set (scales with RLConfig.prompt_pool)")
    parser.add_argument("--resume", action="store_true",
                        help="skip the runs whose CSV exists in --out/runs and summarise all")
    parser.add_argument("--max-runs", type=int, default=None, metavar="N",
                        help="make at most N new runs, then summarise every finished run "
                             "(a grid in chunks: continue with --resume; with --resume, "
                             "0 only rewrites the tables)")
    add_compilation_cache_flag(parser)
    args = parser.parse_args(argv)
    if args.max_runs is not None and not (args.max_runs >= 1 or (args.max_runs == 0 and args.resume)):
        parser.error(f"--max-runs must be >= 1 (or 0 with --resume: only the tables), got {args.max_runs}")
    scale = chosen_preset(parser, args, SCALES)
    if args.prompt_pool_seed is not None:
        scale = dataclasses.replace(scale, rl=dataclasses.replace(
            scale.rl, prompt_pool_seed=args.prompt_pool_seed))
    out = args.out or str(RESULTS / ("old_logits" if args.scale in ("cpu", "paper")
                                     else f"old_logits_{args.scale.replace('-', '_')}"))
    # --resume, --max-runs (chunks of one grid) and --overhead-only (re-timing) are not part of it
    identity = {"study": "old_logits", "scale": scale.label, "model": args.model, "checkpoint": args.checkpoint,
                "prompt_pool_seed": args.prompt_pool_seed}
    start_study(parser, args, identity, out, argv, hint="choose another --out")
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    start, started = time.time(), time.perf_counter()
    folder = args.model or model_folder(scale.model)  # --model, or a scale's own HF folder
    if folder:
        model_config, params, vocab = load_hf_model(folder)
        scale = dataclasses.replace(scale, model=folder, env=with_vocab(scale.env, vocab))
    else:
        model_config, params = load_params(scale.model, args.checkpoint or scale.warm_start)
    log = lambda msg: print(f"[{time.time() - start:7.0f}s] {msg}", flush=True)  # noqa: E731
    if args.overhead_only:
        timed = time_routes_interleaved(scale, params, model_config, args.overhead_only)
        # the first round is the first call at this argument placement: dropped as warm-up
        overhead = overhead_rows(timed, scale, params)
        write_csv(os.path.join(out, "overhead.csv"), overhead)
        with open(os.path.join(out, "overhead.md"), "w") as f:
            f.write(overhead_markdown(overhead))
        log(f"wrote {out}/overhead.csv (interleaved, {args.overhead_only} rounds)")
        return out

    histories, timed = load_runs(scale, out) if args.resume else ({}, {})
    stopped, new_runs = False, 0
    for route, window, partial, seed in run_order(scale):
        if len(histories.get((route, window, partial), [])) > seed:
            continue
        if args.max_runs is not None and new_runs == args.max_runs:
            log(f"--max-runs {args.max_runs} reached before {run_name(route, window, partial, seed)}: "
                f"summarising the finished runs (rerun with --resume to continue)")
            stopped = True
            break
        new_runs += 1
        history = run_one(scale, route, window, partial, seed, scale.iterations,
                          params, model_config, out)
        histories.setdefault((route, window, partial), []).append(history)
        log(f"{run_name(route, window, partial, seed)}: success "
            f"{history['success_rate'].mean():.3f} active "
            f"{history['active_token_fraction'].mean():.3f} |log r_d| "
            f"{history['abs_log_rd_mean'].mean():.4f} "
            f"s/step {np.median(history['wall_seconds'][1:]):.2f}")
        if window == scale.overhead_window and not partial and seed == 0:
            timed[route] = history
    histories = {cell: histories[cell] for cell in grid_cells(scale) if cell in histories}
    if scale.overhead_iterations and not stopped:
        for route in REPAIR_ROUTES:
            if route not in timed:
                timed[route] = run_one(scale, route, scale.overhead_window, False, 0,
                                       scale.overhead_iterations, params, model_config, out)
                log(f"overhead run {route}: s/step "
                    f"{np.median(timed[route]['wall_seconds'][1:]):.2f}")

    curves, summary = summarise(histories, scale)
    write_csv(os.path.join(out, "curves.csv"), curves)
    write_csv(os.path.join(out, "summary.csv"), summary)
    if timed:
        overhead = overhead_rows({r: timed[r] for r in REPAIR_ROUTES if r in timed}, scale, params)
        write_csv(os.path.join(out, "overhead.csv"), overhead)
        with open(os.path.join(out, "overhead.md"), "w") as f:
            f.write(overhead_markdown(overhead))
    if scale.eval_episodes:
        rows, eval_summary = evaluation_tables(scale, out, evaluate_policies(
            scale, model_config, {"warm_start": params}))
        write_csv(os.path.join(out, "eval.csv"), rows)
        write_csv(os.path.join(out, "eval_summary.csv"), eval_summary)
        log(f"evaluation: {eval_summary}")
        verdicts = route_verdicts(scale, histories, rows)
        if verdicts:
            write_csv(os.path.join(out, "verdicts.csv"), verdicts)
        effects = factorial_tables(scale, histories, rows)
        if effects:
            write_csv(os.path.join(out, "effects.csv"), effects)
    plot(curves, summary, scale, out)
    info = provenance(command=" ".join(["python experiments/old_logits.py"]
                                       + list(argv if argv is not None else sys.argv[1:])),
                      started=started)
    wall = info["wall_seconds"]
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"scale": scale.label, **info,
                   **{k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
                      for k, v in dataclasses.asdict(scale).items()}},
                  f, indent=1, default=str)
    log(f"wrote {out} in {wall:.0f} s")
    return out


if __name__ == "__main__":
    main()
