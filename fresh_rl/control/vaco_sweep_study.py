"""The VACO lag-sweep study (``experiments/vaco_lag_sweep.py``; VACO, arXiv 2603.01365;
docs/vaco.md): every (task, variant) of a :class:`fresh_rl.control.presets.Scale` run or loaded,
and its scores; the tables and ``summary.md`` are :mod:`fresh_rl.control.vaco_sweep_report`'s.

Every (task, variant) pair is one compiled program: ``train`` vmapped over the
``fresh_rl.sweep.product_grid`` of seeds × lag levels (× δ values for VACO, × β for
ppo_kl_fixed) with :class:`fresh_rl.control.HyperParams`, sharded over all devices by
``fresh_rl.control.presets.run_variant`` (the same grid, keys and program as ``fresh-rl sweep``).
A scale with a delay mixture (``cpu``, ``paper``: lags 0, 8, 32, 64 and geometric actor delays
of mean 8, docs/vaco.md) runs it as a second program per pair, the last column of the lag axis
(``-1``, "mixture" in the tables). Finished pairs are saved to
``<out>/runs/<task>__<variant>.npz`` (a :class:`fresh_rl.results.NamedArrays` over
:data:`RUN_DIMS`, then iterations) as they complete, so an interrupted sweep resumes where it
stopped (``--fresh`` recomputes everything); saved runs of an older key schedule, config or
mixture are recomputed.

**Scores.** A run's final score is the learner's deterministic evaluation averaged over the last
10% of its evaluations when the scale evaluates the learner (``eval_every`` > 0), else the mean
episode return of the actors over the last 10% of iterations; normalised per task as
``(R − R_init)/(R_best − R_init)`` with R_init in the final score's mode: the mean first learner
evaluation over all the task's runs (no evaluation of the untrained learner is saved), else the
mean return of the actors' first completed episodes (the untrained policy); R_best the best final
score of any run on the task (our choice: the paper's normalisation is unknown). A run whose
parameters diverged (NaN returns) scores R_init, i.e. 0, and is counted in the summary.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fresh_rl.control.presets import (KEY_SCHEDULE, VACO_VARIANTS, Scale, best_at_first_lag, headline_index,
                                      run_study_variant, saved_run_matches, study_variants, variant_config)
from fresh_rl.eval import (aggregate_intervals, eval_final_score, eval_first_score, eval_initial_score, final_score,
                           improvement_intervals, initial_score)
from fresh_rl.report import interval
from fresh_rl.results import DIMS_KEY, NamedArrays

RUN_DIMS = ("lag", "delta", "seed")
"""A run's leading axes (``variant_grid``'s; "delta" is β for ``ppo_kl_fixed``); then iterations."""
def run_all(scale: Scale, out_dir: Path, seed: int, fresh: bool, log=print) -> dict:
    """Run (or load) every (task, variant); returns {(task, variant): run} (:func:`named_run`, ``final`` added)."""
    runs_dir = out_dir / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    results = {}
    for task in scale.tasks:
        for variant, method, overrides, deltas in study_variants(scale, task):
            path = runs_dir / f"{task.name.replace('/', '_')}__{variant}.npz"
            config = variant_config(task, method, overrides, scale.ring_size)
            if path.exists() and not fresh:
                data = dict(np.load(path, allow_pickle=False))
                if saved_run_matches(data, config, seed, scale.study_lags, deltas, scale.num_seeds, scale.mixture):
                    log(f"[resume] {task.name} {variant}: loaded {path.name}")
                    results[(task.name, variant)] = with_final_score(named_run(data))
                    continue
            res = run_study_variant(scale, config, deltas, seed)
            data = {k.replace("/", "__"): v for k, v in res["metrics"].items()}
            data.update(config=np.array(repr(config)), seed=np.array(seed), key_schedule=np.array(KEY_SCHEDULE),
                        lags=np.array(scale.study_lags), mixture=np.array(repr(scale.mixture)),
                        deltas=np.array(deltas), compile_s=np.array(res["compile_s"]),
                        run_s=np.array(res["run_s"]), env_steps=np.array(res["env_steps"]),
                        batch_size=np.array(config.batch_size),
                        nonfinite_from_iteration=res["nonfinite_from_iteration"])
            run = named_run(data)
            bad = [tuple(run.coords[dim][i] for dim, i in zip(RUN_DIMS, cell))
                   for cell in np.argwhere(run["nonfinite_from_iteration"] >= 0)]
            if bad:
                log(f"WARNING {task.name} {variant}: {len(bad)} runs went non-finite "
                    f"((lag, delta, seed) {bad}; marked in nonfinite_from_iteration)")
            run.to_npz(path)
            run = results[(task.name, variant)] = with_final_score(run)
            log(f"{task.name} {variant}: compile {res['compile_s']:.0f}s run {res['run_s']:.0f}s "
                f"({res['env_steps'] / res['run_s']:.0f} env steps/s over all runs); final return by lag "
                f"{np.round(headline(variant, run).mean('seed')['final'], 1).tolist()}")
    return results


def named_run(arrays: dict) -> NamedArrays:
    """A run's arrays over :data:`RUN_DIMS`, saved with the axis names or positional (a fresh run's;
    runs saved before the names): the arrays with the three leading axes are its variables, the
    rest its attrs (``lags``, ``deltas`` too: ``saved_run_matches`` reads them)."""
    if DIMS_KEY in arrays:
        return NamedArrays.from_mapping(arrays)
    first_seed, grid = int(arrays["seed"]), {k: v for k, v in arrays.items() if np.ndim(v) >= len(RUN_DIMS)}
    coords = {"lag": arrays["lags"].tolist(), "delta": arrays["deltas"].tolist(),
              "seed": range(first_seed, first_seed + arrays["episode_return"].shape[2])}
    return NamedArrays(RUN_DIMS, coords, grid, {k: v for k, v in arrays.items() if k not in grid})


def load_run(path) -> NamedArrays:
    """A saved run (:func:`named_run`) with its final scores (:func:`with_final_score`)."""
    with np.load(path, allow_pickle=False) as saved:
        return with_final_score(named_run(dict(saved)))


def with_final_score(run: NamedArrays) -> NamedArrays:
    """``run`` with ``final``, its final score per run: the learner's deterministic evaluation
    (mean of the last 10% of evaluations) when the runs evaluated it (``eval_every`` > 0), else
    the training return of the (stale) behaviour policy over the last 10% of iterations."""
    if "eval__return_deterministic" in run:
        return run.assign(final=eval_final_score(run["eval__return_deterministic"], run["eval__valid"] > 0))
    return run.assign(final=final_score(run["episode_return"]))


def headline_delta(variant: str, run: NamedArrays) -> float:
    """The swept value ``variant`` is reported with (``fresh_rl.control.presets.headline_index``)."""
    return run.coords["delta"][headline_index(variant, run.coords["delta"], run["final"])]


def headline(variant: str, run: NamedArrays) -> NamedArrays:
    """``run`` at the swept value ``variant`` is reported with (:func:`headline_delta`)."""
    return run.sel(delta=headline_delta(variant, run))


def learning_check(scale: Scale, results: dict) -> dict:
    """Whether each task shows learning within its budget (a test bed that cannot learn cannot
    rank methods): the main variant with the best seed-mean final score at the first lag, and
    the 95% Student-t interval over seeds of its per-seed gain, final − initial (learner evaluations: the last
    vs the first 10% of them; else the actors' training return). A task *learns* when that
    interval is above 0; only such tasks enter the aggregates (our rule).
    Returns {task: {"variant", "initial", "final", "gain", "low", "high", "learns"}}."""
    check = {}
    for task in scale.tasks:
        best = None
        for variant in scale.methods:
            if (task.name, variant) not in results:
                continue
            d = results[task.name, variant]
            first = headline(variant, d).sel(lag=d.coords["lag"][0])  # [seed]
            final = first["final"]
            initial = (eval_initial_score(first["eval__return_deterministic"], first["eval__valid"] > 0)
                       if "eval__return_deterministic" in first else
                       initial_score(first["episode_return"], first["episodes_completed"]))
            if np.isfinite(final).all() and (best is None or final.mean() > best[1].mean()):
                best = (variant, final, initial)
        if best is not None:
            variant, final, initial = best
            gain, low, high = interval(final - initial)
            check[task.name] = {"variant": variant, "initial": float(initial.mean()), "final": float(final.mean()),
                                "gain": gain, "low": low, "high": high, "learns": low > 0}
    return check


def score_tables(scale: Scale, results: dict):
    """Normalised final scores: {(variant, lag, delta): {task: [seeds]}}, and ``results`` with
    them as ``normalized``, ``(final − R_init)/(R_best − R_init)`` per task (a diverged run scores
    R_init), both in the final score's mode: with learner evaluations R_init is the mean first
    evaluation (:func:`fresh_rl.eval.eval_first_score`) of all the task's runs, else the actors'
    first completed episodes (``initial_score``); R_best the best final score;
    delta ``"headline"`` holds the value each variant is reported with (:func:`headline_delta`),
    ``"tuned"`` the value with the best seed mean at the first lag (``best_at_first_lag``: the
    rule ``ppo_kl_fixed``'s β gets, applied to every variant's swept axis)."""
    scores, normalized_results = {}, {}
    for task in scale.tasks:
        runs = {v: d for (t, v), d in results.items() if t == task.name}
        low = float(np.nanmean([np.nanmean(eval_first_score(d["eval__return_deterministic"], d["eval__valid"] > 0)
                                           if "eval__return_deterministic" in d else
                                           initial_score(d["episode_return"], d["episodes_completed"]))
                                for d in runs.values()]))
        high = float(max(np.nanmax(d["final"]) for d in runs.values()))
        for variant, d in runs.items():
            final = np.nan_to_num(d["final"], nan=low)  # diverged → untrained
            d = normalized_results[task.name, variant] = d.assign(normalized=(final - low) / max(high - low, 1e-8))
            read_at = {**{delta: delta for delta in d.coords["delta"]}, "headline": headline_delta(variant, d),
                       "tuned": d.coords["delta"][best_at_first_lag(final)]}  # value → the δ it reads
            for lag in d.coords["lag"]:
                for value, delta in read_at.items():
                    scores.setdefault((variant, lag, value), {})[task.name] = d.sel(lag=lag, delta=delta)["normalized"]
    return scores, normalized_results


def matrices(scores: dict, keys: dict, tasks) -> dict:
    """{name: normalised scores [seeds, tasks]} of the :func:`score_tables` entries ``keys``
    (name → (variant, lag, value)) over ``tasks``; an entry missing on one of them is left out."""
    return {name: np.stack([scores[key][t] for t in tasks], axis=1) for name, key in keys.items()
            if all(t in scores.get(key, {}) for t in tasks)}


def lag_comparison(scale: Scale, scores: dict, value: str, tasks, reps: int) -> tuple[dict, dict]:
    """Per lag: rliable aggregates of the main methods read at ``value`` (``"headline"`` or
    ``"tuned"``, :func:`score_tables`) over ``tasks``, and P(VACO variant > baseline) for every
    pair of them; methods missing on one of the tasks are left out."""
    agg, improvement = {}, {}
    for lag in scale.study_lags:
        mats = matrices(scores, {v: (v, lag, value) for v in scale.methods}, tasks)
        agg[lag] = aggregate_intervals(mats, reps=reps)
        improvement[lag] = improvement_intervals(
            {(v, b): (mats[v], mats[b]) for v in mats if v in VACO_VARIANTS for b in mats if b not in VACO_VARIANTS},
            reps=reps)
    return agg, improvement
