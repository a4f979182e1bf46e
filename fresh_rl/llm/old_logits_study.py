"""The machinery of the LLM old-logit study (``experiments/old_logits.py``, arXiv 2605.12070; scales
:data:`fresh_rl.llm.presets.OLD_LOGITS_SCALES`): the grid's cells and run order, one run of the
asynchronous pipeline (:func:`run_one`, its per-iteration CSV and evaluation saved under ``runs/``),
the public reader of those CSVs (:func:`read_run_csv`, also what ``experiments/old_logits_bpe_reset.py``
reads the committed no-reset runs with), and the tables: curves and summary with 95% Student-t
intervals over seeds, evaluation, the mask × clip factorial's effects and the route overheads.
"""
from __future__ import annotations

import json
import os
import time

import numpy as np

from fresh_rl.corrections.routes import REPAIR_ROUTES
from fresh_rl.eval import seed_interval
from fresh_rl.eval.route_claims import FACTORIAL_ARMS, factorial_effects
from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm.evaluation import evaluate_policies
from fresh_rl.llm.old_logits_verdicts import full_ring, route_verdicts
from fresh_rl.llm.presets import OldLogitsScale as Scale
from fresh_rl.provenance import read_csv, write_atomic, write_csv
from fresh_rl.report import markdown_table
from fresh_rl.sweep.checkpoint import RunCheckpointer
from fresh_rl.sweep.integrity import tree_checksum
from fresh_rl.sweep.keys import seed_key, split_run_key, step_key

CURVE_METRICS = ("success_rate", "active_token_fraction", "abs_log_rd_mean")
"""The per-iteration metrics of ``curves.csv`` (mean and 95% interval over seeds)."""
RENAMED_COLUMNS = {"lag_mean": "lag/version_gap_mean", "lag_max": "lag/version_gap_max"}
"""Columns of the run CSVs written before the metric renames (results/old_logits/runs/*.csv) → today's names."""


def run_name(route: str, window: int, partial: bool, seed: int) -> str:
    """The name of one run's files under ``runs/`` and ``checkpoints/``."""
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
    rows = read_csv(path)
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
    """Per timed route (``{route: history}``) at the overhead window: its parameter copies and
    bytes (:func:`fresh_rl.llm.async_pipeline.route_costs`), old-logit forwards per step and the
    median seconds per step (the first step, compilation, dropped when there are more)."""
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


def overhead_markdown(rows: list[dict]) -> str:
    """``overhead.md``: the overhead table in Markdown."""
    return "\n".join(markdown_table(
        ("route", "W", "extra param copies", "extra MiB (fp32)", "old-logit forwards / step", "s / step (median)",
         "vs linear_proxy"),
        ((r["route"], r["window"], r["extra_param_copies"], f"{r['extra_param_mib']:.1f}",
          f"{r['old_logit_forwards_per_step']:.2f}", f"{r['seconds_per_step_median']:.2f}",
          f"{r['time_vs_linear_proxy']:.2f}") for r in rows))) + "\n"


def run_grid(scale: Scale, params, model_config, out: str, resume: bool, max_runs, log) -> tuple[dict, dict]:
    """The grid's runs in :func:`run_order` (with ``resume``, the finished ones loaded from
    ``out/runs``), at most ``max_runs`` new ones (None: all), then, unless cut short, the overhead
    runs of the repair routes the grid lacks. Returns ``(histories, timed)``: ``{(route, W,
    partial): [per-seed history]}`` in :func:`grid_cells` order and ``{route: history}`` at the
    overhead window."""
    histories, timed = load_runs(scale, out) if resume else ({}, {})
    stopped, new_runs = False, 0
    for route, window, partial, seed in run_order(scale):
        if len(histories.get((route, window, partial), [])) > seed:
            continue
        if max_runs is not None and new_runs == max_runs:
            log(f"--max-runs {max_runs} reached before {run_name(route, window, partial, seed)}: "
                f"summarising the finished runs (rerun with --resume to continue)")
            stopped = True
            break
        new_runs += 1
        history = run_one(scale, route, window, partial, seed, scale.iterations, params, model_config, out)
        histories.setdefault((route, window, partial), []).append(history)
        log(f"{run_name(route, window, partial, seed)}: success {history['success_rate'].mean():.3f} active "
            f"{history['active_token_fraction'].mean():.3f} |log r_d| {history['abs_log_rd_mean'].mean():.4f} "
            f"s/step {np.median(history['wall_seconds'][1:]):.2f}")
        if window == scale.overhead_window and not partial and seed == 0:
            timed[route] = history
    histories = {cell: histories[cell] for cell in grid_cells(scale) if cell in histories}
    if scale.overhead_iterations and not stopped:
        for route in REPAIR_ROUTES:
            if route not in timed:
                timed[route] = run_one(scale, route, scale.overhead_window, False, 0, scale.overhead_iterations,
                                       params, model_config, out)
                log(f"overhead run {route}: s/step {np.median(timed[route]['wall_seconds'][1:]):.2f}")
    return histories, timed


def write_overhead(out: str, rows: list[dict]) -> None:
    """``overhead.csv`` and ``overhead.md`` (:func:`overhead_markdown`) of :func:`overhead_rows`."""
    write_csv(os.path.join(out, "overhead.csv"), rows)
    write_atomic(os.path.join(out, "overhead.md"), overhead_markdown(rows))


def write_tables(scale: Scale, histories: dict, timed: dict, params, model_config, out: str, log) -> tuple[list, list]:
    """The grid's tables in ``out``: ``curves.csv`` and ``summary.csv`` (:func:`summarise`), the
    overhead of the timed repair routes, and when the scale evaluates ``eval.csv``,
    ``eval_summary.csv`` (:func:`evaluation_tables`, the warm start evaluated here),
    ``verdicts.csv`` (:func:`fresh_rl.llm.old_logits_verdicts.route_verdicts`) and ``effects.csv``
    (:func:`factorial_tables`), each where it has rows. Returns ``(curves, summary)``."""
    curves, summary = summarise(histories, scale)
    write_csv(os.path.join(out, "curves.csv"), curves)
    write_csv(os.path.join(out, "summary.csv"), summary)
    if timed:
        write_overhead(out, overhead_rows({r: timed[r] for r in REPAIR_ROUTES if r in timed}, scale, params))
    if scale.eval_episodes:
        warm_start = evaluate_policies(scale, model_config, {"warm_start": params})
        rows, eval_summary = evaluation_tables(scale, out, warm_start)
        write_csv(os.path.join(out, "eval.csv"), rows)
        write_csv(os.path.join(out, "eval_summary.csv"), eval_summary)
        log(f"evaluation: {eval_summary}")
        for name, table in (("verdicts", route_verdicts(scale, histories, rows)),
                            ("effects", factorial_tables(scale, histories, rows))):
            if table:
                write_csv(os.path.join(out, f"{name}.csv"), table)
    return curves, summary


__all__ = ["CURVE_METRICS", "RENAMED_COLUMNS", "evaluation_tables", "factorial_tables", "grid_cells", "load_runs",
           "overhead_markdown", "overhead_rows", "read_run_csv", "run_grid", "run_name", "run_one", "run_order",
           "summarise", "time_routes_interleaved", "write_overhead", "write_tables"]
