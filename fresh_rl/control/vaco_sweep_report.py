"""The VACO lag-sweep study's tables (``experiments/vaco_lag_sweep.py``): the CSVs and
``summary.md`` written from the runs and scores of :mod:`fresh_rl.control.vaco_sweep_study`.

Normalised scores per task, their rliable aggregates and probabilities of improvement over the
tasks that learn (only over :data:`MIN_AGGREGATE_TASKS` or more; per-task Student-t intervals
otherwise), the per-run rows, the measured lag metrics, score against measured TV, learning
curves, equal tuning, the δ sweep and the ablations.
"""
from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Optional

import numpy as np

from fresh_rl.control.presets import SWEPT_BASELINES, VACO_VARIANTS, Scale, lag_name
from fresh_rl.control.vaco_sweep_study import (RUN_DIMS, headline, headline_delta, lag_comparison, learning_check,
                                               matrices, score_tables)
from fresh_rl.eval import (AGGREGATE_METRICS, aggregate_intervals, eval_area_under_curve, final_score, initial_score,
                           seed_interval)
from fresh_rl.provenance import write_atomic, write_csv
from fresh_rl.report import interval, interval_text, markdown_table

MIN_AGGREGATE_TASKS = 3
"""rliable aggregates (median, IQM, optimality gap, P(X > Y)) only over at least this many tasks:
over one or two they say nothing the per-task intervals do not (``per_task.csv``)."""
MEASURED = (("version_gap", "mean_version_gap", "lag__version_gap_mean"),
            ("backward_tv", "mean_tv_behaviour", "lag__tv"),
            ("forward_tv_median", "mean_forward_tv", "lag__forward_tv"),
            ("forward_tv_weighted", "mean_forward_tv_weighted", "lag__forward_tv_weighted"),  # not in older saved runs
            ("ess", "mean_ess", "lag__ess"),
            ("filter_on", "mean_filter_on", "loss__filter_on"),
            ("mask_fraction", "mean_mask_fraction", "loss__mask_fraction"),
            ("clip_fraction", "mean_clip_fraction", "loss__clip_fraction"))
"""The measured lag metrics: ``lag_metrics.csv`` column, ``runs.csv`` column, saved variable."""


def _cells(names, values) -> dict:
    """``{name: value with 4 decimals}``: a table's interval or score columns."""
    return {name: f"{x:.4f}" for name, x in zip(names, values)}


def aggregate_rows(agg: dict, improvement: Optional[dict] = None) -> list[dict]:
    """Rows (lag, method, metric, point, ci_low, ci_high) of :func:`lag_comparison`'s aggregates,
    then of its P(VACO variant > baseline) if given, as method ``P(X > Y)``."""
    columns = ("point", "ci_low", "ci_high")
    rows = [{"lag": lag_name(lag), "method": variant, "metric": metric, **_cells(columns, bounds)}
            for lag, table in agg.items() for variant, metrics in table.items() for metric, bounds in metrics.items()]
    return rows + [{"lag": lag_name(lag), "method": f"P({vaco} > {base})", "metric": "probability_of_improvement",
                    **_cells(columns, p)} for lag, table in (improvement or {}).items()
                   for (vaco, base), p in table.items()]


def run_rows(results: dict) -> list[dict]:
    """``runs.csv``: one row per run (task, variant, lag, δ, seed): final, initial, normalised
    and training score, evaluation AUC, and the run means of the :data:`MEASURED` metrics."""
    rows = []
    for (task_name, variant), d in sorted(results.items()):
        d = d.assign(initial=initial_score(d["episode_return"], d["episodes_completed"]),
                     training=final_score(d["episode_return"]),
                     **({"auc": eval_area_under_curve(d["eval__return_deterministic"], d["eval__valid"] > 0)}
                        if "eval__return_deterministic" in d else {}))
        for lag, delta, seed in itertools.product(*(d.coords[dim] for dim in RUN_DIMS)):
            cell = d.sel(lag=lag, delta=delta, seed=seed)
            rows.append({"task": task_name, "variant": variant, "lag": lag_name(lag), "delta": delta, "seed": seed,
                         "final_return": f"{cell['final']:.3f}", "initial_return": f"{cell['initial']:.3f}",
                         "normalized_score": f"{cell['normalized']:.4f}",
                         "final_training_return": f"{cell['training']:.3f}",
                         "eval_auc": f"{cell['auc']:.3f}" if "auc" in cell else "",
                         **{column: float(cell[key].mean()) if key in cell else "" for _, column, key in MEASURED}})
    return rows


def lag_metric_rows(scale: Scale, results: dict) -> list[dict]:
    """``lag_metrics.csv``: per task, main variant (at its reported value) and lag, the seed mean
    of each :data:`MEASURED` metric's run mean; forward TV's median over iterations instead
    (½·mean|r − 1| is unbounded when a ratio explodes)."""
    rows = []
    for (task_name, variant), d in sorted(results.items()):
        if variant not in scale.methods:
            continue
        at = headline(variant, d)
        for lag in at.coords["lag"]:
            row = {"task": task_name, "variant": variant, "lag": lag_name(lag)}
            for name, _, key in MEASURED:
                cell = np.asarray(at.sel(lag=lag)[key], np.float64) if key in d else None
                average = np.nanmedian if name == "forward_tv_median" else np.nanmean
                row[name] = "" if cell is None else f"{average(cell):.4f}"
            rows.append(row)
    return rows


def per_task_rows(scores: dict, tasks) -> list[dict]:
    """Per (variant, swept value or ``"headline"``, lag, task): the seed mean of the normalised
    score with its 95% Student-t interval. The ``"tuned"`` reading is left out: its value was
    picked on the seeds it would be scored on."""
    return [{"task": task, "variant": variant, "value": value, "lag": lag_name(lag), "seeds": len(per[task]),
             **_cells(("mean", "ci_low", "ci_high"), interval(per[task]))}
            for (variant, lag, value), per in scores.items() if value != "tuned" for task in tasks if task in per]


def score_vs_tv(scale: Scale, results: dict) -> list[dict]:
    """Per task, main variant (at its reported value) and lag: the run-mean backward TV(π_T, β),
    seed mean, and the seed-mean normalised score: the comparison at equal *measured* drift (a
    fixed lag moves methods by different amounts: PPO's trust region keeps π_T near β)."""
    return [{"task": task_name, "variant": variant, "lag": lag_name(lag),
             "mean_backward_tv": float(np.nanmean(at.sel(lag=lag)["lag__tv"])),
             "normalized_score_seed_mean": float(at.sel(lag=lag)["normalized"].mean())}
            for (task_name, variant), d in sorted(results.items()) if variant in scale.methods and "lag__tv" in d
            for at in [headline(variant, d)] for lag in at.coords["lag"]]


def learning_curves(scale: Scale, results: dict) -> dict:
    """{(task, variant): (env steps [I], {lag: (mean, low, high) [I]})}: the seed-mean training
    return per iteration with its 95% Student-t band, main variants and ablations at their
    reported value."""
    curves = {}
    for task in scale.tasks:
        for variant in (*scale.methods, *scale.ablations):
            if (task.name, variant) in results:
                d = results[task.name, variant]
                at = headline(variant, d)
                steps = (np.arange(d["episode_return"].shape[-1]) + 1) * int(d.attrs["batch_size"])
                curves[task.name, variant] = (steps, {lag: seed_interval(at.sel(lag=lag)["episode_return"])
                                                      for lag in at.coords["lag"]})
    return curves


def write_tables(scale: Scale, results: dict, out_dir: Path, header: dict, reps: int) -> dict:
    """Writes every table of the study (the CSVs and ``summary.md``) from ``results``
    (:func:`run_all`); aggregates, improvement probabilities, δ sweep, ablations and equal tuning
    only over the tasks that learn (all tasks, flagged in the summary, when none does) and only
    over :data:`MIN_AGGREGATE_TASKS` or more. Returns what the figures draw and the summary:
    ``tasks``, ``ablation_tasks``, ``score_vs_tv``, ``curves``, ``aggregates``, ``delta_sweep``
    ({(VACO variant, lag): {str(δ): aggregates}}), ``summary``."""
    scores, results = score_tables(scale, results)
    learning = learning_check(scale, results)
    tasks = [t.name for t in scale.tasks]
    scored = [t for t in tasks if learning.get(t, {}).get("learns")] or tasks
    ablation_tasks = [t.name for t in scale.tasks if t.ablations and t.name in scored]
    swept = len(ablation_tasks) >= MIN_AGGREGATE_TASKS
    t = {"tasks": tasks, "scored": scored, "ablation_tasks": ablation_tasks, "learning": learning,
         "per_task": per_task_rows(scores, tasks), "lag_metrics": lag_metric_rows(scale, results),
         "score_vs_tv": score_vs_tv(scale, results), "curves": learning_curves(scale, results),
         "aggregates": {}, "improvement": {}, "delta_sweep": {}, "ablation": {}, "tuned": ({}, {})}
    tables = {"learning_check": [{"task": task, "best_variant_at_first_lag": c["variant"],
                                  **{k: f"{c[k]:.3f}" for k in ("initial", "final", "gain")},
                                  "gain_ci_low": f"{c['low']:.3f}", "gain_ci_high": f"{c['high']:.3f}",
                                  "learns": c["learns"]} for task, c in learning.items()],
              "per_task": t["per_task"], "runs": run_rows(results), "lag_metrics": t["lag_metrics"],
              "score_vs_tv": [{**r, **_cells(("mean_backward_tv", "normalized_score_seed_mean"), (
                  r["mean_backward_tv"], r["normalized_score_seed_mean"]))} for r in t["score_vs_tv"]],
              "curves": [{"task": task, "variant": variant, "lag": lag, "iteration": i, "env_steps": int(steps[i]),
                          **{k: f"{x[i]:.3f}" for k, x in zip(("mean_return", "ci_low", "ci_high"), band)}}
                         for (task, variant), (steps, bands) in t["curves"].items() for lag, band in bands.items()
                         for i in range(len(steps))]}
    if len(scored) >= MIN_AGGREGATE_TASKS:
        t["aggregates"], t["improvement"] = lag_comparison(scale, scores, "headline", scored, reps)
        tables["aggregates"] = aggregate_rows(t["aggregates"])
        tables["probability_of_improvement"] = [
            {"lag": lag_name(lag), "vaco_variant": vaco, "baseline": base,
             **_cells(("probability", "ci_low", "ci_high"), p)}
            for lag, table in t["improvement"].items() for (vaco, base), p in table.items()]
    iqm_columns = ("iqm", "iqm_ci_low", "iqm_ci_high")
    if swept and len(scale.deltas) > 1:
        for variant in (v for v in VACO_VARIANTS if v in scale.methods):
            for lag in scale.study_lags:
                t["delta_sweep"][variant, lag] = aggregate_intervals(matrices(
                    scores, {str(delta): (variant, lag, float(delta)) for delta in scale.deltas}, ablation_tasks),
                    reps=reps)
        if t["delta_sweep"]:  # a scale without VACO variants has none
            tables["delta_sweep"] = [
                {"variant": variant, "lag": lag_name(lag), "delta": delta, **_cells(iqm_columns, m["iqm"]),
                 "mean": f"{m['mean'][0]:.4f}"} for (variant, lag), sweep in t["delta_sweep"].items()
                for delta, m in sweep.items()]
        # equal tuning: on the tasks with the δ sweep every variant is read at its best swept value
        # at the first lag (VACO's δ, as ppo_kl_fixed's β), then run under lag; the pick is made on
        # the seeds it is scored on (biased towards the tuned arm: experiments/verdicts.py picks on
        # half the seeds and scores on the other half)
        t["tuned"] = lag_comparison(scale, scores, "tuned", ablation_tasks, reps)
        tables["equal_tuning"] = aggregate_rows(*t["tuned"])
    if swept and scale.ablations:
        for lag in scale.study_lags:
            variants = ("vaco", *scale.ablations, *(m for m in scale.methods if m != "vaco"))
            t["ablation"][lag] = aggregate_intervals(matrices(
                scores, {v: (v, lag, "headline") for v in variants}, ablation_tasks), reps=reps)
        tables["ablation"] = [{"lag": lag_name(lag), "variant": variant, **_cells(iqm_columns, m["iqm"]),
                               "mean": f"{m['mean'][0]:.4f}"} for lag, table in t["ablation"].items()
                              for variant, m in table.items()]
    for name, rows in tables.items():
        write_csv(out_dir / f"{name}.csv", rows)
    t["summary"] = summarize(scale, results, t, header)
    write_atomic(out_dir / "summary.md", t["summary"])
    return t


def summarize(scale: Scale, results: dict, t: dict, header: dict) -> str:
    """``summary.md``: provenance ``header``, per-task final returns, the learning check, the
    aggregates (or per-task normalised scores), lag metrics, equal tuning, δ sweep and ablations."""
    lag_columns = [f"lag {lag_name(lag)}" for lag in scale.study_lags]
    lines = ["# VACO lag sweep — summary", "",
             "```", json.dumps(header, indent=1), "```", "",
             "Normalised final score (0 = R_init, the first learner evaluation, 1 = the best run on the "
             f"task). rliable aggregates (stratified-bootstrap CIs over seeds) only over ≥ {MIN_AGGREGATE_TASKS} "
             "tasks; otherwise per-task seed means with 95% Student-t intervals. The claims are decided "
             "in results/VERDICTS.md (experiments/verdicts.py).", "",
             "## Per-task final return (seed mean ± half-width of 95% CI)", ""]
    rows = []
    for (task_name, variant), d in sorted(results.items()):
        at = headline(variant, d)
        cells = []
        for fin in (at.sel(lag=lag)["final"] for lag in at.coords["lag"]):  # [seed] per lag
            ok = np.isfinite(fin)
            m, lo, hi = interval(fin[ok]) if ok.any() else (np.nan,) * 3
            diverged = f" ({int((~ok).sum())} diverged)" if not ok.all() else ""
            cells.append(f"{m:.1f} ± {(hi - lo) / 2:.1f}{diverged}")
        rows.append((task_name, variant, *cells))
    lines += markdown_table(("task", "variant", *lag_columns), rows)
    tuned = [f"{v} on {task}: {headline_delta(v, d):g}"
             for (task, v), d in sorted(results.items()) if v in SWEPT_BASELINES]
    if tuned:
        lines += ["", f"Baselines with their own grid are reported at their best value at lag {scale.lags[0]}: "
                  + ", ".join(tuned) + "."]
    checks, agg_tasks = t["learning"], t["scored"]
    lines += ["", "## Does each task learn within its budget?", "",
              "Best main variant at the first lag; gain = final − initial learner score (last vs first 10% of "
              "evaluations), seed mean and 95% interval. Only tasks that learn enter the aggregates.", "",
              *markdown_table(("task", "best variant", "initial", "final", "gain", "learns"), (
                  (task, c["variant"], f"{c['initial']:.1f}", f"{c['final']:.1f}",
                   f"{c['gain']:+.1f} [{c['low']:+.1f}, {c['high']:+.1f}]", "yes" if c["learns"] else "no")
                  for task, c in checks.items()))]
    if checks and not any(c["learns"] for c in checks.values()):
        lines += ["", "**No task shows learning: the tables below are over all tasks and uninformative.**"]
    if t["aggregates"]:
        lines += ["", f"## Aggregates over {', '.join(agg_tasks) or 'all tasks'} (main methods)", "",
                  *markdown_table(("lag", "method", *AGGREGATE_METRICS), (
                      (lag_name(lag), variant, *(interval_text(*mets[m], digits=3) for m in AGGREGATE_METRICS))
                      for lag in scale.study_lags for variant, mets in t["aggregates"][lag].items())),
                  "", "## Probability of improvement (VACO variant over each baseline)", "",
                  "P(X > Y): the chance a run of X beats a run of Y on a task drawn at random (ties count ½), "
                  "with its 95% stratified-bootstrap CI; a CI entirely above 0.5 says X is better.", "",
                  *markdown_table(("lag", "pair", "P(X > Y)"), (
                      (lag_name(lag), f"{vaco} > {base}", interval_text(*p, digits=3))
                      for lag, table in t["improvement"].items() for (vaco, base), p in table.items()))]
    else:
        cells = {(r["task"], r["variant"], r["lag"]): f"{r['mean']} [{r['ci_low']}, {r['ci_high']}]"
                 for r in t["per_task"] if r["value"] == "headline"}
        lines += ["", f"## Per-task normalised scores ({len(agg_tasks)} learning task(s): fewer than "
                  f"{MIN_AGGREGATE_TASKS}, so no aggregates; `per_task.csv` has every swept value)", "",
                  "Seed mean and 95% Student-t interval, main methods at their reported value.", "",
                  *markdown_table(("task", "method", *lag_columns), (
                      (task, variant, *row) for task in agg_tasks for variant in scale.methods
                      for row in [[cells.get((task, variant, lag_name(lag)), "–") for lag in scale.study_lags]]
                      if any(c != "–" for c in row)))]
    lines += ["", "## Measured lag metrics (main variants at their reported value)", "",
              "Run means over iterations, seed means; forward TV is the median over iterations "
              "(½·mean|r − 1| on β's actions: biased under lag, unbounded when a ratio explodes); forward TV (IS) "
              "is the run mean of ½·mean|π_θ/β − π_T/β|, unbiased at every lag (– for runs saved before it).", "",
              *markdown_table(("task", "variant", "lag", "version gap", "backward TV", "forward TV", "forward TV (IS)",
                               "ESS", "filter on", "masked", "clipped"), (
                  (r["task"], r["variant"], r["lag"], *(r[name] or "–" for name, _, _ in MEASURED))
                  for r in t["lag_metrics"]))]
    tuned_agg, tuned_improvement = t["tuned"]
    if tuned_agg:
        lines += ["", f"## Equal tuning ({', '.join(t['ablation_tasks'])}): every swept value picked at lag "
                  f"{scale.lags[0]}", "",
                  "VACO variants at their best δ at the first lag, as ppo_kl_fixed at its best β; the "
                  "others have no swept value.", "",
                  *markdown_table(("lag", "method", "IQM", "P(VACO variant > method)"), (
                      (lag_name(lag), variant, interval_text(*mets["iqm"], digits=3),
                       "; ".join(f"{v}: {interval_text(*tuned_improvement[lag][v, b], digits=3)}"
                                 for (v, b) in tuned_improvement[lag] if b == variant) or "–")
                      for lag in scale.study_lags for variant, mets in tuned_agg[lag].items()))]
    lines += ["", "## Verdicts", "", "Decided in results/VERDICTS.md by experiments/verdicts.py from the "
              "declared claims (experiments/claims/vaco.toml) and these runs."]
    if t["delta_sweep"] or t["ablation"]:
        lines += ["", "## δ sweep and ablations (IQM)", ""]
    for (variant, lag), sweep in t["delta_sweep"].items():
        iqms = {k: v["iqm"][0] for k, v in sweep.items()}
        lines.append(f"- {variant} δ sweep at lag {lag_name(lag)}: IQM "
                     + ", ".join(f"δ={k}: {v:.3f}" for k, v in iqms.items())
                     + f" (spread {max(iqms.values()) - min(iqms.values()):.3f}).")
    for lag, table in t["ablation"].items():
        lines.append(f"- ablation at lag {lag_name(lag)} (IQM): "
                     + ", ".join(f"{k} {interval_text(*v['iqm'], digits=3)}" for k, v in table.items()))
    lines.append("")
    return "\n".join(lines)
