"""The stages and tables of the control old-logit study (``experiments/old_logits_control.py``;
its settings, scales and grids are :mod:`fresh_rl.control.old_logits_study`).

:func:`run_cell` runs every route of one (task, W) grid as one vmapped program, chunks saved as
they finish; :func:`measure_costs` times every route's program; :func:`tables` turns the results
``{(task, W, route): NamedArrays [threshold, learning_rate, seed, …]}`` into the study's CSV
tables, with the route claims decided per cell (:func:`fresh_rl.eval.route_claims.decide_route_claims`,
Holm-corrected over the cells); :func:`figures` draws ``mechanism.png`` and ``reset.png`` from them.
"""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.old_logits_study import (CLAIMS, EWMA_ROUTES, MAIN_THRESHOLD, ROUTES, Scale, base_route, cell,
                                               reference_rule, route_config, route_coords, route_index, task_text)
from fresh_rl.control.train import train
from fresh_rl.corrections.routes import get_route
from fresh_rl.eval import holm_over_cells, learner_scores, seed_interval
from fresh_rl.eval.route_claims import decide_route_claims
from fresh_rl.report import grouped, save_panel_grid
from fresh_rl.results import NamedArrays
from fresh_rl.sweep import RunCheckpointer, run_sharded
from fresh_rl.sweep.keys import seed_keys
from fresh_rl.validation import checked_result, checkify_if_checked

KEEP = ("eval/return_deterministic", "eval/valid", "episode_return", "loss/active_token_fraction",
        "loss/clip_fraction", "loss/log_rd_abs", "old_logits/log_rd_abs_true",
        "old_logits/staleness_log_ratio_abs", "old_logits/forwards", "old_logits/reset",
        "lag/version_gap_mean")
"""The metrics a run keeps."""


def _train_kept(config, key, hp):
    out = train(config, key, hp)
    return {k: out.metrics[k] for k in KEEP}


def run_cell(scale: Scale, task, window: int, out_dir: Path, seed: int, log=print,
             slow_reference: bool = False) -> dict:
    """Every route of one (task, W) from one compiled program: ``{route: NamedArrays [threshold,
    learning_rate, seed, …]}`` (:func:`fresh_rl.control.old_logits_study.route_coords`: the route's rows
    of the cell, threshold slowest, seed fastest, the order ``NamedArrays.from_grid`` reads), chunks of
    seeds × lrs saved as they finish (:func:`fresh_rl.control.old_logits_study.cell` names their folder).
    ``slow_reference``: only the EWMA routes, with β from ``SLOW_REFERENCE_RULE``."""
    c = cell(scale, task, window, out_dir, seed, slow_reference)
    timing = c.folder.with_name(c.folder.name + ".seconds")
    started = time.perf_counter()
    out = run_sharded(functools.partial(_train_kept, c.config), seed_keys([r["seed"] for r in c.rows]),
                      c.hparams, chunk_size=scale.num_seeds * len(scale.learning_rates),
                      checkpointer=RunCheckpointer(c.folder, fingerprint=c.fingerprint))
    if not timing.exists():
        timing.write_text(f"{time.perf_counter() - started:.1f}\n")
    log(f"{task.env_name} W={window}{'-slowref' if slow_reference else ''}: {len(c.rows)} runs, "
        f"{float(timing.read_text()):.0f} s")
    row_routes = np.asarray([r["route"] for r in c.rows])
    return {route: NamedArrays.from_grid({k: np.asarray(v)[row_routes == route] for k, v in out.items()},
                                         route_coords(scale, route, seed)) for route in c.routes}


def measure_costs(scale: Scale, out_dir: Path, seed: int, log=print) -> list[dict]:
    """Compile and run seconds of every route's program (``num_seeds`` vmapped runs of
    ``cost_iterations`` iterations) on the first task at each W of ``cost_windows``, the route an
    unbatched argument (a real branch: each call pays only its own route), with the forwards per
    iteration and the parameter copies; saved to ``costs.json`` (reused while its key matches)."""
    path, task = out_dir / "costs.json", scale.tasks[0]
    key = f"{task_text(task)} {list(scale.cost_windows)} {scale.num_seeds} {scale.cost_iterations}"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return saved["rows"]
    rows = []
    keys = seed_keys(list(range(seed, seed + scale.num_seeds)))
    for window in scale.cost_windows:
        config = route_config(task, window, scale.cost_iterations)
        hp = HyperParams.from_grid(config, {}, size=scale.num_seeds)
        axes = jax.tree.map(lambda _: 0, hp).replace(route=None)
        body, checkified = checkify_if_checked(
            jax.vmap(lambda c, k, h: train(c, k, h).metrics, (None, 0, axes)))  # --checked
        fn = jax.jit(body, static_argnums=0)
        started = time.perf_counter()
        compiled = fn.lower(config, keys, hp.replace(route=hp.route[0])).compile()
        compile_s = time.perf_counter() - started
        for route in ROUTES:
            route_hp = hp.replace(route=jnp.asarray(route_index(config, route), jnp.int32))
            jax.block_until_ready(compiled(keys, route_hp))  # warm-up
            started = time.perf_counter()
            out = checked_result(jax.block_until_ready(compiled(keys, route_hp)), checkified)
            run_s = time.perf_counter() - started
            spec = get_route(route)
            rows.append({"task": task.env_name, "window": window, "route": route, "exact": spec.exact,
                         "param_copies": spec.param_copies(window, task.num_actor_groups),
                         "forwards_per_iteration": float(np.mean(out["old_logits/forwards"])),
                         "compile_seconds_all_routes": round(compile_s, 2),
                         "ms_per_run_iteration": round(1e3 * run_s / (scale.num_seeds * scale.cost_iterations), 3)})
            log(f"cost {task.env_name} W={window} {route}: {rows[-1]['ms_per_run_iteration']} ms per run-iteration")
    path.write_text(json.dumps({"key": key, "rows": rows}, indent=1))
    return rows


def _interval_fields(prefix: str, values) -> dict:
    mean, low, high = (float(x) for x in seed_interval(np.asarray(values)))
    return {prefix: mean, f"{prefix}_low": low, f"{prefix}_high": high}


def _reset_label(route: str, threshold: float):
    """The ``threshold`` column of the reset tables: the threshold of ``ewma``, ``"none"`` for
    ``ewma_no_reset`` (its runs carry the main threshold, which it never reads)."""
    return threshold if base_route(route) == "ewma" else "none"


def tables(scale: Scale, results: dict) -> dict[str, list[dict]]:
    """The study's tables from ``results[(task, W, route)]`` (:func:`run_cell`'s NamedArrays):
    ``runs`` (one row per run), ``summary`` (per task, W, route, threshold, lr: scores with 95%
    Student-t intervals over seeds and the run means of the measures), ``active_fraction``
    (ρ_active per iteration, first lr, main threshold), ``reset`` (the EWMA routes per threshold),
    ``reset_over_time`` (:func:`reset_curves`) and ``verdicts`` (:func:`verdicts`)."""
    t = {name: [] for name in ("runs", "summary", "active_fraction", "reset")}
    for (env, window, route), data in results.items():
        score = learner_scores(data)
        for threshold in data.coords["threshold"]:
            for lr in data.coords["learning_rate"]:
                point = {"threshold": threshold, "learning_rate": lr}
                runs, runs_score = data.sel(**point), score.sel(**point)
                active_curve = runs.mean("seed")["loss/active_token_fraction"]  # [iteration]
                for s in runs.coords["seed"]:
                    run, run_score = runs.sel(seed=s), runs_score.sel(seed=s)
                    t["runs"].append({"task": env, "window": window, "route": route, "threshold": threshold,
                                      "learning_rate": lr, "seed": s, "final": float(run_score["final"]),
                                      "mean": float(run_score["mean"]),
                                      "active_fraction": float(run["loss/active_token_fraction"].mean()),
                                      "resets": int(run["old_logits/reset"].sum())})
                row = {"task": env, "window": window, "route": route, "threshold": threshold, "learning_rate": lr,
                       **_interval_fields("final", runs_score["final"]),
                       **_interval_fields("mean", runs_score["mean"]),
                       "active_fraction": float(runs["loss/active_token_fraction"].mean()),
                       "log_rd_abs_route": float(runs["loss/log_rd_abs"].mean()),
                       "log_rd_abs_engine": float(runs["old_logits/log_rd_abs_true"].mean()),
                       "staleness_log_ratio_abs": float(runs["old_logits/staleness_log_ratio_abs"].mean()),
                       "clip_fraction": float(runs["loss/clip_fraction"].mean()),
                       "version_gap_mean": float(runs["lag/version_gap_mean"].mean()),
                       "resets_per_run": float(runs["old_logits/reset"].sum(-1).mean())}
                t["summary"].append(row)
                if lr == scale.learning_rates[0] and (route != "ewma" or threshold == MAIN_THRESHOLD):
                    t["active_fraction"] += [{"task": env, "window": window, "route": route, "iteration": k,
                                              "active_fraction": float(a)} for k, a in enumerate(active_curve)]
                if base_route(route) in EWMA_ROUTES:
                    t["reset"].append({"task": env, "window": window, "ewma_beta_rule": reference_rule(route),
                                       "threshold": _reset_label(route, threshold),
                                       "learning_rate": lr, "resets_per_run": row["resets_per_run"],
                                       "active_fraction": row["active_fraction"],
                                       "active_fraction_min": float(active_curve.min()),
                                       "final": row["final"], "mean": row["mean"]})
    return {**t, "reset_over_time": reset_curves(results), "verdicts": verdicts(scale, results)}


def verdicts(scale: Scale, results: dict) -> list[dict]:
    """The claims of :data:`fresh_rl.control.old_logits_study.CLAIMS` per (task, W, lr) cell at the
    main threshold ("return": mean learner return over evaluations, "active": the run's mean
    ρ_active), Holm-corrected per claim over the cells."""
    rows = []
    for env in [t.env_name for t in scale.tasks]:
        for window in scale.windows:
            for lr in scale.learning_rates:
                def runs_of(route):  # [seed, …]
                    return results[(env, window, route)].sel(threshold=MAIN_THRESHOLD, learning_rate=lr)

                def metric_of(route, metric):  # None: a stage this scale does not run
                    if (env, window, route) not in results:
                        return None
                    runs = runs_of(route)
                    return learner_scores(runs)["mean"] if metric == "return" else runs["loss/active_token_fraction"].mean(-1)
                collapse = 1.0 - float(runs_of("recompute_current")["loss/active_token_fraction"].mean())
                base = {"task": env, "window": window, "learning_rate": lr,
                        "recompute_current_masked_fraction": collapse}
                rows += [{**base, **row} for row in decide_route_claims(metric_of, collapse, CLAIMS)]
    return holm_over_cells(rows)


def reset_curves(results: dict) -> list[dict]:
    """Seed means per iteration of the ``ewma`` route at every reset threshold, beside
    ``ewma_no_reset``, from ``results`` as in :func:`tables`: ρ_active and the cumulative reset
    count (the reset over time)."""
    rows = []
    for (env, window, route), data in results.items():
        if base_route(route) not in EWMA_ROUTES:
            continue
        for threshold in data.coords["threshold"]:
            for lr in data.coords["learning_rate"]:
                runs = data.sel(threshold=threshold, learning_rate=lr)
                active = runs.mean("seed")["loss/active_token_fraction"]
                resets = np.cumsum(runs["old_logits/reset"], axis=-1).mean(runs.axis("seed"))
                rows += [{"task": env, "window": window, "ewma_beta_rule": reference_rule(route),
                          "learning_rate": lr, "threshold": _reset_label(route, threshold),
                          "iteration": i, "active_fraction": float(a), "cumulative_resets": float(c)}
                         for i, (a, c) in enumerate(zip(active, resets))]
    return rows


MECHANISM = (("active_fraction", "active-token fraction ρ_active"),
             ("log_rd_abs_route", "mean |log r̂_d| of the route (engine: 0.02)"),
             ("clip_fraction", "clip fraction (r̂_s outside 1 ± ε)"), ("mean", "learner return, mean over evaluations"))
"""The rows of ``mechanism.png``: (``summary.csv`` column, axis label)."""


def figures(scale: Scale, t: dict, out_dir: Path) -> None:
    """mechanism.png: each of :data:`MECHANISM` against W per route (first lr, main threshold);
    reset.png: ρ_active and cumulative resets over iterations at the largest W, per threshold."""
    envs, lr, window = [task.env_name for task in scale.tasks], scale.learning_rates[0], max(scale.windows)
    main = grouped([r for r in t["summary"] if r["learning_rate"] == lr and r["threshold"] == MAIN_THRESHOLD],
                   ("task", "route"))

    def mechanism(ax, metric, env):
        key, label = metric
        for route in ROUTES:
            rows = main.get((env, route), [])
            ax.errorbar([r["window"] for r in rows], [r[key] for r in rows], marker="o", capsize=3, label=route,
                        yerr=[[r[key] - r[key + "_low"] for r in rows], [r[key + "_high"] - r[key] for r in rows]]
                        if key == "mean" else None)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="staleness window W (lags U{0..W})", ylabel=label)
        ax.set_title(f"{env}, lr {lr}" if key == "active_fraction" else "")
        if key == "log_rd_abs_route":
            ax.axhline(0.02, color="k", lw=0.8, ls=":")
    save_panel_grid(out_dir / "mechanism.png", MECHANISM, envs, mechanism, height=13 / 4)
    curves = grouped([r for r in t["reset_over_time"] if r["window"] == window and r["learning_rate"] == lr],
                     ("ewma_beta_rule", "task", "threshold"))
    rules = list(dict.fromkeys(r["ewma_beta_rule"] for r in t["reset_over_time"]))

    def reset(ax, panel, env):
        rule, key = panel
        for threshold in (*scale.thresholds, "none"):
            rows = curves.get((rule, env, threshold), [])
            ax.plot([r["iteration"] for r in rows], [r[key] for r in rows],
                    label="no reset" if threshold == "none" else f"reset below {threshold}")
        ax.set(**{"title": f"{env}, W = {window}, lr {lr}: EWMA β rule {rule}", "ylabel": "ρ_active (seed mean)"}
               if key == "active_fraction" else {"ylabel": "resets so far (seed mean)", "xlabel": "iteration"})
    save_panel_grid(out_dir / "reset.png", [(rule, key) for rule in rules
                                            for key in ("active_fraction", "cumulative_resets")], envs, reset)


__all__ = ["KEEP", "MECHANISM", "figures", "measure_costs", "reset_curves", "run_cell", "tables", "verdicts"]
