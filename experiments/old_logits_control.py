"""Old-logit routes in control: does the mask collapse cost reward, and which repair recovers it?

The control analogue of arXiv 2605.12070, run by the control trainer
(:func:`fresh_rl.control.train.train` with ``method="decoupled_ppo"``; the study's settings,
routes and scales are :mod:`fresh_rl.control.old_logits_study`): PPO with the decoupled loss
(MIS mask on r_d = π_old/π_infer, clip on r_s = π_θ/π_old), an inference engine whose log-probs
differ from the trainer's by a fixed mean |log r_d| (0.02, ``inference_discrepancy``), and
random staleness: every actor group acts with a version U{0, …, W} iterations old, redrawn every
iteration. Every route of ``ROUTES``
(recompute_current, snapshot, old_logit_model, linear and log-linear proxies, EWMA with and
without auto-reset) runs at every W and at every learning rate of the grid, on the same seeds
(paired); the EWMA with reset also at every reset threshold.
Scores are learner evaluation episodes (deterministic), the last one and the mean over all
evaluations of the run.

Per (task, W): one vmapped program over every route × lr × seed (× reset threshold for
``ewma``; the route is the traced ``HyperParams.route``, an index into ``ROUTES``), run by
``fresh_rl.sweep.run_sharded`` in chunks saved as they finish (a rerun skips them, and finds the
committed runs: ``old_logits_study.config_text``). A slow-reference stage reruns the two EWMA
routes with β = W/(W + 1) (a reference older than most of the batch, where a reset has something
to fix) on the same program and seeds. Then a cost stage times every route on the first task at each
W of the scale's ``cost_windows``, from one program per W whose route is an unbatched argument
(a real branch: each call runs only its own route).

Outputs (``results/old_logits_control/``): ``runs.csv`` (one row per run), ``summary.csv`` (per
task, W, route, threshold, lr: scores with 95% intervals, ρ_active, |log r̂_d|, staleness, clip
fraction, resets; 95% Student-t intervals over seeds), ``active_fraction.csv`` (ρ_active per iteration), ``reset.csv``,
``reset_over_time.csv`` and ``reset.png`` (EWMA ρ_active and cumulative resets per iteration at
every threshold), ``costs.csv`` (parameter copies, forwards per iteration, compile and run
seconds), ``verdicts.csv`` (per cell, Holm-corrected per claim over the cells; each claim is
decided over its cells by experiments/verdicts.py into results/VERDICTS.md), ``mechanism.png``
(ρ_active, the route's |log r̂_d|, the clip fraction and the learner return against W, per
route) and ``README.md`` with the measurements.

    python experiments/old_logits_control.py --scale ci     # the tests
    python experiments/old_logits_control.py --scale quick  # the quickstart: W = 1 and 16, ~1.5 min
    python experiments/old_logits_control.py --scale quick-ci  # the quickstart's test version
    python experiments/old_logits_control.py --scale cpu    # CartPole + Acrobot, 10 seeds
    python experiments/old_logits_control.py --scale paper  # + Breakout-MinAtar, 30 seeds
"""
from __future__ import annotations

import functools
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.control.config import TrainConfig
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.old_logits_study import (CLAIMS, EWMA_ROUTES, MAIN_THRESHOLD, ROUTES, SCALES, SLOW,
                                               SLOW_REFERENCE_RULE, Scale, base_route, cell, reference_rule,
                                               route_config, route_index, route_thresholds, task_text)
from fresh_rl.control.train import train
from fresh_rl.corrections.routes import get_route
from fresh_rl.eval import holm_over_cells, seed_interval
from fresh_rl.eval.route_claims import MIN_MASKED_FRACTION, decide_route_claims
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_csv
from fresh_rl.sweep import RunCheckpointer, output_lock, run_sharded
from fresh_rl.sweep.keys import seed_keys
from fresh_rl.sweep.study_cli import study_main
from fresh_rl.validation import checked_result, checkify_if_checked

RESULTS = REPOSITORY_ROOT / "results" / "old_logits_control"
KEEP = ("eval/return_deterministic", "eval/valid", "episode_return", "loss/active_token_fraction",
        "loss/clip_fraction", "loss/log_rd_abs", "old_logits/log_rd_abs_true",
        "old_logits/staleness_log_ratio_abs", "old_logits/forwards", "old_logits/reset",
        "lag/version_gap_mean")


def _train_kept(config, key, hp):
    out = train(config, key, hp)
    return {k: out.metrics[k] for k in KEEP}


def run_cell(scale: Scale, task: TrainConfig, window: int, out_dir: Path, seed: int, log=print,
             slow_reference: bool = False) -> dict:
    """Every route of one (task, W) from one compiled program: ``{route: arrays [thresholds, lrs,
    seeds, …]}``, chunks of seeds × lrs saved as they finish. ``slow_reference``: only the EWMA
    routes, with β from ``SLOW_REFERENCE_RULE`` (the reset stage; the same compiled program)."""
    c = cell(scale, task, window, out_dir, seed, slow_reference)
    stage = "-slowref" if slow_reference else ""
    timing = c.folder.with_name(c.folder.name + ".seconds")
    started = time.perf_counter()
    out = run_sharded(functools.partial(_train_kept, c.config), seed_keys([r["seed"] for r in c.rows]),
                      c.hparams, chunk_size=scale.num_seeds * len(scale.learning_rates),
                      checkpointer=RunCheckpointer(c.folder, fingerprint=c.fingerprint))
    if not timing.exists():
        timing.write_text(f"{time.perf_counter() - started:.1f}\n")
    log(f"{task.env_name} W={window}{stage}: {len(c.rows)} runs, {float(timing.read_text()):.0f} s")
    out = {k: np.asarray(v) for k, v in out.items()}
    cells, start = {}, 0
    for route in c.routes:
        shape = (len(route_thresholds(scale, route)), len(scale.learning_rates), scale.num_seeds)
        size = int(np.prod(shape))
        cells[route] = {k: v[start:start + size].reshape(*shape, *v.shape[1:]) for k, v in out.items()}
        start += size
    return cells


def scores(data: dict) -> tuple[np.ndarray, np.ndarray]:
    """Final learner score (the last evaluation's deterministic return) and the mean over every
    evaluation of the run, shaped like the leading axes of ``data``."""
    ret, valid = data["eval/return_deterministic"], data["eval/valid"].astype(bool)
    return ret[..., -1], np.where(valid, ret, 0).sum(-1) / np.maximum(valid.sum(-1), 1)


def measure_costs(scale: Scale, out_dir: Path, seed: int, log=print) -> list[dict]:
    """Compile and run seconds of every route's program (``num_seeds`` vmapped runs of
    ``cost_iterations`` iterations) on the first task at each W of ``cost_windows``, with the
    forwards per iteration and the parameter copies; saved to ``costs.json`` (reused)."""
    path = out_dir / "costs.json"
    task = scale.tasks[0]
    windows = list(scale.cost_windows)
    key = f"{task_text(task)} {windows} {scale.num_seeds} {scale.cost_iterations}"
    if path.exists():
        saved = json.loads(path.read_text())
        if saved.get("key") == key:
            return saved["rows"]
    rows = []
    keys = seed_keys(list(range(seed, seed + scale.num_seeds)))
    for window in windows:
        config = route_config(task, window, scale.cost_iterations)
        hp = HyperParams.from_grid(config, {}, size=scale.num_seeds)
        # the route leaf unbatched: a real branch, so each call pays only its own route
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


def summarize(scale: Scale, results: dict, costs: list[dict], out_dir: Path, header: dict) -> str:
    """CSV tables, verdicts, figure and README from ``results[(task, W, route)]``."""
    run_rows, summary_rows, curve_rows, reset_rows, verdict_rows = [], [], [], [], []
    for (env, window, route), data in results.items():
        final, mean = scores(data)
        for t, threshold in enumerate(route_thresholds(scale, route)):
            for l, lr in enumerate(scale.learning_rates):
                d = {k: v[t, l] for k, v in data.items()}
                for s in range(scale.num_seeds):
                    run_rows.append({"task": env, "window": window, "route": route, "threshold": threshold,
                                     "learning_rate": lr, "seed": s, "final": float(final[t, l, s]),
                                     "mean": float(mean[t, l, s]),
                                     "active_fraction": float(d["loss/active_token_fraction"][s].mean()),
                                     "resets": int(d["old_logits/reset"][s].sum())})
                summary_rows.append({
                    "task": env, "window": window, "route": route, "threshold": threshold, "learning_rate": lr,
                    **_interval_fields("final", final[t, l]), **_interval_fields("mean", mean[t, l]),
                    "active_fraction": float(d["loss/active_token_fraction"].mean()),
                    "log_rd_abs_route": float(d["loss/log_rd_abs"].mean()),
                    "log_rd_abs_engine": float(d["old_logits/log_rd_abs_true"].mean()),
                    "staleness_log_ratio_abs": float(d["old_logits/staleness_log_ratio_abs"].mean()),
                    "clip_fraction": float(d["loss/clip_fraction"].mean()),
                    "version_gap_mean": float(d["lag/version_gap_mean"].mean()),
                    "resets_per_run": float(d["old_logits/reset"].sum(-1).mean())})
                if l == 0 and (route != "ewma" or threshold == MAIN_THRESHOLD):
                    active = d["loss/active_token_fraction"].mean(0)
                    curve_rows += [{"task": env, "window": window, "route": route, "iteration": i,
                                    "active_fraction": float(a)} for i, a in enumerate(active)]
                if base_route(route) in EWMA_ROUTES:
                    reset_rows.append({"task": env, "window": window, "ewma_beta_rule": reference_rule(route),
                                       "threshold": threshold if base_route(route) == "ewma" else "none",
                                       "learning_rate": lr, "resets_per_run": summary_rows[-1]["resets_per_run"],
                                       "active_fraction": summary_rows[-1]["active_fraction"],
                                       "active_fraction_min": float(d["loss/active_token_fraction"].mean(0).min()),
                                       "final": summary_rows[-1]["final"], "mean": summary_rows[-1]["mean"]})
    verdict_rows = _verdicts(scale, results)
    reset_curve_rows = reset_curves(scale, results)
    for name, rows in (("runs", run_rows), ("summary", summary_rows), ("active_fraction", curve_rows),
                       ("reset", reset_rows), ("reset_over_time", reset_curve_rows), ("costs", costs),
                       ("verdicts", verdict_rows)):
        if rows:  # a scale without a cost stage (quick-ci) has no cost table
            write_csv(out_dir / f"{name}.csv", rows)
    _figure(scale, summary_rows, out_dir)
    _reset_figure(scale, reset_curve_rows, out_dir)
    return _readme(scale, summary_rows, reset_rows, costs, out_dir, header)


def _pick(data: dict, scale: Scale, route: str, lr_index: int, threshold=MAIN_THRESHOLD) -> np.ndarray:
    t = route_thresholds(scale, route).index(threshold)
    return {k: v[t, lr_index] for k, v in data.items()}


def _metric(data: dict, metric: str) -> np.ndarray:
    return scores(data)[1] if metric == "return" else data["loss/active_token_fraction"].mean(-1)


def _verdicts(scale: Scale, results: dict) -> list[dict]:
    rows = []
    for env in [t.env_name for t in scale.tasks]:
        for window in scale.windows:
            for l, lr in enumerate(scale.learning_rates):
                def get(route):
                    return _pick(results[(env, window, route)], scale, route, l)

                def metric_of(route, metric):  # None: a stage this scale does not run
                    return _metric(get(route), metric) if (env, window, route) in results else None
                collapse = 1.0 - float(get("recompute_current")["loss/active_token_fraction"].mean())
                base = {"task": env, "window": window, "learning_rate": lr,
                        "recompute_current_masked_fraction": collapse}
                rows += [{**base, **row} for row in decide_route_claims(metric_of, collapse, CLAIMS)]
    return holm_over_cells(rows)


def reset_curves(scale: Scale, results: dict) -> list[dict]:
    """Seed means per iteration of the ``ewma`` route at every reset threshold, beside
    ``ewma_no_reset``: ρ_active and the cumulative reset count (the reset over time)."""
    rows = []
    for (env, window, route), data in results.items():
        if base_route(route) not in EWMA_ROUTES:
            continue
        for t, threshold in enumerate(route_thresholds(scale, route)):
            for l, lr in enumerate(scale.learning_rates):
                active = data["loss/active_token_fraction"][t, l].mean(0)
                resets = np.cumsum(data["old_logits/reset"][t, l], axis=-1).mean(0)
                label = threshold if base_route(route) == "ewma" else "none"
                rows += [{"task": env, "window": window, "ewma_beta_rule": reference_rule(route),
                          "learning_rate": lr, "threshold": label,
                          "iteration": i, "active_fraction": float(a), "cumulative_resets": float(c)}
                         for i, (a, c) in enumerate(zip(active, resets))]
    return rows


def _reset_figure(scale: Scale, curve_rows: list[dict], out_dir: Path) -> None:
    """reset.png: ρ_active and cumulative resets over iterations, one column per task, at the
    largest W and the first learning rate, one line per threshold (and no reset), a pair of rows
    per EWMA β rule."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    envs, window, lr = [t.env_name for t in scale.tasks], max(scale.windows), scale.learning_rates[0]
    rules = list(dict.fromkeys(r["ewma_beta_rule"] for r in curve_rows))
    fig, axes = plt.subplots(2 * len(rules), len(envs), figsize=(5 * len(envs), 3.5 * 2 * len(rules)),
                             squeeze=False)
    for i, rule in enumerate(rules):
        for j, env in enumerate(envs):
            top, bottom = axes[2 * i, j], axes[2 * i + 1, j]
            for threshold in (*scale.thresholds, "none"):
                rows = [r for r in curve_rows if r["task"] == env and r["window"] == window
                        and r["learning_rate"] == lr and r["threshold"] == threshold
                        and r["ewma_beta_rule"] == rule]
                label = "no reset" if threshold == "none" else f"reset below {threshold}"
                top.plot([r["iteration"] for r in rows], [r["active_fraction"] for r in rows], label=label)
                bottom.plot([r["iteration"] for r in rows], [r["cumulative_resets"] for r in rows], label=label)
            top.set_title(f"{env}, W = {window}, lr {lr}: EWMA β rule {rule}")
            top.set_ylabel("ρ_active (seed mean)")
            bottom.set_ylabel("resets so far (seed mean)")
            bottom.set_xlabel("iteration (policy version)")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "reset.png", dpi=110)
    plt.close(fig)


def _figure(scale: Scale, summary_rows: list[dict], out_dir: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    envs = [t.env_name for t in scale.tasks]
    fig, axes = plt.subplots(4, len(envs), figsize=(5 * len(envs), 13), squeeze=False)
    lr = scale.learning_rates[0]
    for j, env in enumerate(envs):
        for route in ROUTES:
            rows = [r for r in summary_rows if r["task"] == env and r["route"] == route
                    and r["learning_rate"] == lr and r["threshold"] == MAIN_THRESHOLD]
            w = [r["window"] for r in rows]
            axes[0, j].plot(w, [r["active_fraction"] for r in rows], marker="o", label=route)
            axes[1, j].plot(w, [r["log_rd_abs_route"] for r in rows], marker="o", label=route)
            axes[2, j].plot(w, [r["clip_fraction"] for r in rows], marker="o", label=route)
            axes[3, j].errorbar(w, [r["mean"] for r in rows],
                                yerr=[[r["mean"] - r["mean_low"] for r in rows],
                                      [r["mean_high"] - r["mean"] for r in rows]], marker="o", capsize=3,
                                label=route)
        for ax in axes[:, j]:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("staleness window W (lags U{0..W})")
        axes[0, j].set_title(f"{env}, lr {lr}")
        axes[0, j].set_ylabel("active-token fraction ρ_active")
        axes[1, j].axhline(0.02, color="k", lw=0.8, ls=":")
        axes[1, j].set_ylabel("mean |log r̂_d| of the route (engine: 0.02)")
        axes[2, j].set_ylabel("clip fraction (r̂_s outside 1 ± ε)")
        axes[3, j].set_ylabel("learner return, mean over evaluations")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "mechanism.png", dpi=110)
    plt.close(fig)


def _fmt(r: dict, key: str) -> str:
    return f"{r[key]:.1f} [{r[key + '_low']:.1f}, {r[key + '_high']:.1f}]"


def _readme(scale, summary_rows, reset_rows, costs, out_dir: Path, header: dict) -> str:
    seconds = sum(float(p.read_text()) for p in (out_dir / "runs").glob("*.seconds"))
    text = ["# Old-logit routes in control: learner reward under random staleness", "",
            provenance_line(header), "",
            f"Command: `python experiments/old_logits_control.py --scale {header.get('scale', '?')}`. "
            f"Stage compute (sum of the saved cells' wall times): {seconds / 60:.1f} min.", "",
            f"Tasks {', '.join(t.env_name for t in scale.tasks)}; W ∈ {list(scale.windows)} (each actor "
            f"group's lag U{{0..W}}, redrawn per iteration); {scale.num_seeds} seeds; learning rates "
            f"{list(scale.learning_rates)} for every route; engine mean |log r_d| 0.02; MIS token mask "
            "exp(±0.1); PPO clip 0.2 on r_s; EWMA β = W/(W + 2), reset threshold "
            f"{MAIN_THRESHOLD} in the route comparison. Scores: learner evaluation (deterministic), "
            "mean over the run's evaluations and the last one, 95% Student-t intervals over seeds.", "",
            "## Read with the factorial", "",
            "Every route here differs from another in both halves of the decoupled loss at once: its old "
            "log-probs feed the MIS mask on r̂_d and centre the clip on r̂_s, so \"snapshot beats "
            "recompute_current\" below cannot say which half costs the reward, and the reset threshold "
            f"{MAIN_THRESHOLD} makes the reset fire on 95–99% of iterations at W ≥ 16 (`reset.csv`). The "
            "2 × 2 factorial of mask source × clip centre, with learning rates tuned on other seeds, and a "
            "reset threshold calibrated to fire on 5–50% of iterations are in "
            "[results/old_logits_factorial/](../old_logits_factorial/README.md) (fixed lag 4 and 16 and "
            "U{0..16}); its verdicts, not this table's, answer both questions. This study keeps the "
            "mechanism figures (`mechanism.png`: ρ_active, |log r̂_d|, clip fraction and return against W per "
            "route) and the route costs.", "",
            "## Verdicts", "",
            "Every claim of this study is decided in [results/VERDICTS.md](../VERDICTS.md) (generated by "
            "`python experiments/verdicts.py` from `runs.csv` and the declaration "
            "experiments/claims/old_logits_control.toml): one pooled Student-t test over the cells where "
            f"recompute_current masks ≥ {MIN_MASKED_FRACTION:.0%} of the samples, per-cell results "
            "Holm-corrected. `verdicts.csv` has the per-cell paired differences.", "",
            "## Routes by W (first learning rate; `summary.csv` has all)", "",
            "| task | W | route | ρ_active | mean abs log r̂_d | mean abs log π_k/π_v | clip fraction | "
            "return, mean over evals | final return |", "|---|---|---|---|---|---|---|---|---|"]
    lr0 = scale.learning_rates[0]
    text += [f"| {r['task']} | {r['window']} | {r['route']} | {r['active_fraction']:.3f} | "
             f"{r['log_rd_abs_route']:.3f} | {r['staleness_log_ratio_abs']:.3f} | {r['clip_fraction']:.3f} | "
             f"{_fmt(r, 'mean')} | {_fmt(r, 'final')} |"
             for r in summary_rows if r["learning_rate"] == lr0 and r["threshold"] == MAIN_THRESHOLD]
    text += ["", "## Auto-reset thresholds (`reset.csv`; over time: `reset_over_time.csv`, `reset.png`)", "",
             "The EWMA reference at every reset threshold and without reset (`none`), with the route "
             "comparison's β rule `mean_age` (β = W/(W + 2), centred on the mean lag W/2)"
             + (f" and, in the slow-reference stage, `{SLOW_REFERENCE_RULE}` (β = W/(W + 1), centre of "
                "mass W: a reference older than most of the batch)" if scale.slow_reference else "") + ".", "",
             "| task | W | β rule | lr | threshold | resets per run | ρ_active (mean) | ρ_active (lowest iteration) | "
             "return, mean over evals |", "|---|---|---|---|---|---|---|---|---|"]
    text += [f"| {r['task']} | {r['window']} | {r['ewma_beta_rule']} | {r['learning_rate']} | {r['threshold']} | "
             f"{r['resets_per_run']:.1f} | {r['active_fraction']:.3f} | {r['active_fraction_min']:.3f} | "
             f"{r['mean']:.1f} |" for r in reset_rows]
    if costs:  # a scale without a cost stage (quick-ci) has no cost table
        text += ["", "## Costs (`costs.csv`)", "",
                 "Parameter copies besides the learner's own and the engines'; forwards = passes over the batch "
                 "spent on old log-probs per iteration; time per run-iteration from one compiled program "
                 f"(every route shares it, route unbatched so each call runs only its own branch) of "
                 f"{scale.num_seeds} vmapped runs × {scale.cost_iterations} iterations, after a warm-up "
                 f"call, on this machine; compiling that program took "
                 f"{', '.join(sorted({str(r['compile_seconds_all_routes']) for r in costs}))} s.", "",
                 "The reward columns are the same cell's (first learning rate) from the route comparison.", "",
                 "| task | W | route | exact | parameter copies | forwards per iteration | "
                 "ms per run-iteration | ρ_active | return, mean over evals |", "|---|---|---|---|---|---|---|---|---|"]
        reward = {(r["task"], r["window"], r["route"]): r for r in summary_rows
                  if r["learning_rate"] == lr0 and r["threshold"] == MAIN_THRESHOLD}
        for r in costs:
            cell = reward.get((r["task"], r["window"], r["route"]))
            tail = f"{cell['active_fraction']:.3f} | {_fmt(cell, 'mean')}" if cell else "— | —"
            text.append(f"| {r['task']} | {r['window']} | {r['route']} | {r['exact']} | {r['param_copies']} | "
                        f"{r['forwards_per_iteration']:.2f} | {r['ms_per_run_iteration']:.2f} | {tail} |")
    (out_dir / "README.md").write_text("\n".join(text) + "\n")
    return "\n".join(text)


def run(scale: Scale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started = time.perf_counter()
    out_dir = Path(out_dir)
    with output_lock(out_dir):
        results = {}
        for task in scale.tasks:
            for window in scale.windows:
                cells = run_cell(scale, task, window, out_dir, seed, log)
                results.update({(task.env_name, window, route): data for route, data in cells.items()})
                if scale.slow_reference:
                    cells = run_cell(scale, task, window, out_dir, seed, log, slow_reference=True)
                    results.update({(task.env_name, window, route + SLOW): data for route, data in cells.items()})
        costs = measure_costs(scale, out_dir, seed, log)
        header = {"scale": scale.label, **provenance(started=started)}
        (out_dir / "config.json").write_text(json.dumps(
            {"scale": scale.label, "seed": seed, "num_seeds": scale.num_seeds,
             "windows": list(scale.windows), "learning_rates": list(scale.learning_rates),
             "thresholds": list(scale.thresholds),
             "configs": {t.env_name: repr(route_config(t, max(scale.windows))) for t in scale.tasks},
             **header}, indent=1))
        return summarize(scale, results, costs, out_dir, header)


def main(argv=None):
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
