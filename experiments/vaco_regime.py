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

from fresh_rl.control.presets import VACO_SCALES, headline_index, lag_name
from fresh_rl.eval import eval_area_under_curve, eval_final_score
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_atomic, write_csv

RESULTS = REPOSITORY_ROOT / "results" / "vaco"
VARIANTS = ("ppo_clip", "ppo_kl_fixed", "spo", "impala", "vaco")


def regime_rows(data: dict, task: str, variant: str) -> tuple[list[dict], np.ndarray]:
    """The rows of one saved run (arrays ``[lags, values, seeds, iterations]``) at the variant's
    reported swept value, and that value's seed-mean deterministic curves ``[lags, I]``."""
    valid = data["eval__valid"] > 0
    final = eval_final_score(data["eval__return_deterministic"], valid)  # [lags, values, seeds]
    v = headline_index(variant, data["deltas"], final)
    pick = {k: np.asarray(data[k])[:, v] for k in data.files if np.ndim(data[k]) == 4}
    gap = pick["lag__version_gap_mean"].astype(np.float64)  # [lags, seeds, I]
    iterations = gap.shape[-1]
    k = np.arange(iterations)
    acting = np.clip(np.rint(k - gap), 0, iterations - 1).astype(int)  # version the actors used
    entropy = pick["loss__entropy"].astype(np.float64)
    actor_entropy = np.take_along_axis(entropy, acting, axis=-1)
    curve = np.where(valid[:, v], pick["eval__return_deterministic"], np.nan)
    evaluated = valid[:, v].any(axis=1)  # [lags, I]: the iterations with an evaluation
    mean_curve = np.where(evaluated, np.nansum(curve, axis=1) / np.maximum(
        valid[:, v].sum(axis=1), 1), np.nan)  # [lags, I]
    auc = eval_area_under_curve(data["eval__return_deterministic"], valid)[:, v]
    rows = []
    for i, lag in enumerate(np.asarray(data["lags"]).tolist()):
        peak = int(np.nanargmax(mean_curve[i]))
        rows.append({
            "task": task, "variant": variant, "lag": lag_name(lag), "versions": iterations,
            "lag_share_of_run": round(lag / iterations, 3) if lag >= 0 else "",
            "mean_version_age": round(float(gap[i].mean()), 2),
            "theta0_share": round(float((acting[i] == 0).mean()), 3),
            "actor_entropy": round(float(actor_entropy[i].mean()), 3),
            "learner_entropy_end": round(float(entropy[i][:, -1].mean()), 3),
            "final_return": round(float(final[i, v].mean()), 1),
            "peak_return": round(float(mean_curve[i, peak]), 1), "peak_iteration": peak,
            "auc_return": round(float(auc[i].mean()), 1),
            "clip_fraction": (round(float(pick["loss__clip_fraction"][i].mean()), 3)
                              if "loss__clip_fraction" in pick else ""),
        })
    return rows, mean_curve


def plot(curves: dict, rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    tasks = list(dict.fromkeys(t for t, _ in curves))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        mean_curve = curves[task, "ppo_clip"]
        lags = [r["lag"] for r in rows if r["task"] == task and r["variant"] == "ppo_clip"]
        for i, lag in enumerate(lags):
            ok = np.isfinite(mean_curve[i])
            line, = ax.plot(np.flatnonzero(ok), mean_curve[i][ok], label=f"lag {lag}")
            if lag.isdigit() and int(lag) > 0:
                ax.axvspan(0, int(lag), color=line.get_color(), alpha=0.08)
        ax.set(title=f"{task}: PPO-clip learner", xlabel="iteration (= policy version)",
               ylabel="deterministic return (seed mean)")
        ax.legend(fontsize=7)
    fig.suptitle("Shaded: iterations whose data came from θ0 at that fixed lag", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    rows, curves = [], {}
    for task in VACO_SCALES["cpu"].tasks:
        for variant in VARIANTS:
            path = args.out / "runs" / f"{task.name.replace('/', '_')}__{variant}.npz"
            if not path.exists():
                continue
            with np.load(path) as data:
                got, curves[task.name, variant] = regime_rows(data, task.name, variant)
            rows += got
    if not rows:
        raise SystemExit(f"no saved runs of {VARIANTS} under {args.out / 'runs'}")
    write_csv(args.out / "regime.csv", rows)
    plot(curves, rows, args.out / "regime.png")
    columns = [c for c in rows[0] if c != "variant"]
    table = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    table += ["| " + " | ".join(str(r[c]) for c in columns) + " |"
              for r in rows if r["variant"] == "ppo_clip"]
    text = ["# The regime of the committed VACO study, measured", "",
            provenance_line(provenance(started=started)), "",
            "PPO-clip's rows; every variant's are in `regime.csv` (columns: experiments/"
            "vaco_regime.py's docstring). Returns are the learner's deterministic evaluation.", "",
            *table]
    write_atomic(args.out / "regime.md", "\n".join(text) + "\n")
    print("\n".join(table))


if __name__ == "__main__":
    main()
