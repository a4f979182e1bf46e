"""Why the committed VACO study's returns rise with lag: the regime it ran in, measured.

Reads the saved runs of ``experiments/vaco_lag_sweep.py --scale cpu`` (``results/vaco/runs``,
nothing is rerun) and writes, per task, variant (at its reported swept value) and lag level:

* the run's policy versions N (one per iteration) and the lag as a share of them;
* the measured version age of the actors' data (``lag/version_gap_mean``, mean over the run);
* the share of iterations whose data came from the initial parameters θ0: at iteration k the
  actors act with version k − gap_k, so θ0 wherever gap_k = k (exact for a fixed lag; for the
  geometric mixture the per-iteration mean gap over actor groups, so it counts an iteration
  only when every group acted with θ0);
* the acting policy's entropy: the learner's token entropy (``loss/entropy``) at the version the
  actors used, mean over the run, and the learner's own entropy at the end;
* the learner's deterministic evaluation: the final score (mean of the last 10% of
  evaluations, the study's score), the peak of the seed-mean curve and where it was, the area
  under the curve; and PPO's clip fraction.

Writes ``results/vaco/regime.csv``, ``results/vaco/regime.md`` (provenance and the PPO-clip
rows) and ``results/vaco/regime.png`` (learner curves per lag with the θ0 phase shaded):

    python experiments/vaco_regime.py
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from fresh_rl.control.presets import VACO_SCALES, lag_name
from fresh_rl.control.vaco_sweep_study import headline, load_run
from fresh_rl.eval import eval_area_under_curve
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_atomic, write_csv
from fresh_rl.report import markdown_table, save_panels
from fresh_rl.results import NamedArrays

RESULTS = REPOSITORY_ROOT / "results" / "vaco"
VARIANTS = ("ppo_clip", "ppo_kl_fixed", "spo", "impala", "vaco")


def regime_rows(run: NamedArrays, task: str, variant: str) -> tuple[list[dict], np.ndarray]:
    """The rows of one saved run (:func:`fresh_rl.control.vaco_sweep_study.load_run`) at the
    variant's reported swept value, and that value's seed-mean deterministic curves ``[lags, I]``."""
    at = headline(variant, run)  # [lags, seeds, ...]
    valid = at["eval__valid"] > 0  # [lags, seeds, I]
    gap = at["lag__version_gap_mean"].astype(np.float64)
    iterations = gap.shape[-1]
    k = np.arange(iterations)
    acting = np.clip(np.rint(k - gap), 0, iterations - 1).astype(int)  # version the actors used
    entropy = at["loss__entropy"].astype(np.float64)
    actor_entropy = np.take_along_axis(entropy, acting, axis=-1)
    curve = np.where(valid, at["eval__return_deterministic"], np.nan)
    evaluated = valid.any(axis=1)  # [lags, I]: the iterations with an evaluation
    mean_curve = np.where(evaluated, np.nansum(curve, axis=1) / np.maximum(valid.sum(axis=1), 1), np.nan)
    auc = eval_area_under_curve(at["eval__return_deterministic"], valid)
    rows = []
    for i, lag in enumerate(at.coords["lag"]):
        peak = int(np.nanargmax(mean_curve[i]))
        rows.append({
            "task": task, "variant": variant, "lag": lag_name(lag), "versions": iterations,
            "lag_share_of_run": round(lag / iterations, 3) if lag >= 0 else "",
            "mean_version_age": round(float(gap[i].mean()), 2),
            "theta0_share": round(float((acting[i] == 0).mean()), 3),
            "actor_entropy": round(float(actor_entropy[i].mean()), 3),
            "learner_entropy_end": round(float(entropy[i][:, -1].mean()), 3),
            "final_return": round(float(at["final"][i].mean()), 1),
            "peak_return": round(float(mean_curve[i, peak]), 1), "peak_iteration": peak,
            "auc_return": round(float(auc[i].mean()), 1),
            "clip_fraction": (round(float(at["loss__clip_fraction"][i].mean()), 3)
                              if "loss__clip_fraction" in at else ""),
        })
    return rows, mean_curve


def plot(curves: dict, rows: list[dict], path: Path) -> None:
    """PPO-clip's seed-mean learner curve per lag and task, the iterations on θ0 shaded."""
    panels = {f"{task}: PPO-clip learner": task for task, _ in curves}

    def panel(ax, title):
        task = panels[title]
        lags = [r["lag"] for r in rows if r["task"] == task and r["variant"] == "ppo_clip"]
        for i, lag in enumerate(lags):
            ok = np.isfinite(curves[task, "ppo_clip"][i])
            line, = ax.plot(np.flatnonzero(ok), curves[task, "ppo_clip"][i][ok], label=f"lag {lag}")
            if lag.isdigit() and int(lag) > 0:
                ax.axvspan(0, int(lag), color=line.get_color(), alpha=0.08)
        ax.set(xlabel="iteration (= policy version); shaded: data from θ0", ylabel="deterministic return (seed mean)")
    save_panels(path, list(panels), panel, 5.0, 3.6)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows, curves = [], {}
    for task in VACO_SCALES["cpu"].tasks:
        for variant in VARIANTS:
            path = args.out / "runs" / f"{task.name.replace('/', '_')}__{variant}.npz"
            if path.exists():
                got, curves[task.name, variant] = regime_rows(load_run(path), task.name, variant)
                rows += got
    if not rows:
        raise SystemExit(f"no saved runs of {VARIANTS} under {args.out / 'runs'}")
    write_csv(args.out / "regime.csv", rows)
    plot(curves, rows, args.out / "regime.png")
    columns = [c for c in rows[0] if c != "variant"]
    table = markdown_table(columns, ([r[c] for c in columns] for r in rows if r["variant"] == "ppo_clip"))
    text = ["# The regime of the committed VACO study, measured", "",
            provenance_line(provenance(started=started)), "",
            "PPO-clip's rows; every variant's are in `regime.csv` (columns: experiments/"
            "vaco_regime.py's docstring). Returns are the learner's deterministic evaluation.", "",
            *table]
    write_atomic(args.out / "regime.md", "\n".join(text) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
