"""Which half of an old-logit route costs the reward (mask × clip), and an EWMA reset calibrated first.

Control trainer, decoupled PPO (MIS token mask on r_d = π_old/π_infer, PPO clip on r_s =
π_θ/π_clip), engine mean |log r_d| 0.02. The 2 × 2 factorial takes the mask's old log-probs and
the clip centre each from ``snapshot`` (exact) or ``recompute_current`` (the current weights):
arms ``snapshot``, ``mask_snapshot_clip_current``, ``mask_current_clip_snapshot``,
``recompute_current`` (:data:`fresh_rl.corrections.routes.FACTORIAL_ROUTES`). Staleness settings:
fixed lag 4, fixed lag 16, uniform U{0..16} redrawn per iteration. Per (task, setting), three resumable
stages (:func:`fresh_rl.control.old_logits_factorial_study.run_cell`), all routes traced in one program
(claims: experiments/claims/old_logits_factorial.toml):

1. *tuning* (seeds 0–4): the four arms and ``ewma_no_reset`` × the learning-rate grid;
2. *calibration* (seeds 0–4): ``ewma`` at every reset threshold, at ``ewma_no_reset``'s tuned
   rate; the threshold whose reset rate is nearest :data:`fresh_rl.eval.route_claims.TARGET_RESET_RATE`
   is kept;
3. *scoring* (seeds 5–14): each arm at its tuned rate; ``ewma`` (calibrated threshold) and
   ``ewma_no_reset`` at ``ewma_no_reset``'s rate.

Outputs (``results/old_logits_factorial/``): ``runs.csv``, ``tuning.csv``, ``calibration.csv``, ``effects.csv``
(per cell: the total gap, the mask and clip main effects and their interaction, seed-paired 95% intervals),
``effects.png``, ``mechanism.png`` (ρ_active, clip fraction per arm and setting), ``config.json``, ``README.md``.

    python experiments/old_logits_factorial.py --scale ci   # the tests
    python experiments/old_logits_factorial.py --scale cpu  # CartPole-v1 + Acrobot-v1, 5 + 10 seeds
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from fresh_rl.control.old_logits_factorial_study import ROUTES, Scale, effects, factorial_task, run_cell
from fresh_rl.eval.route_claims import FACTORIAL_CONTRASTS, TARGET_RESET_RATE, reset_rates
from fresh_rl.presets import named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, write_atomic, write_csv
from fresh_rl.report import grouped, interval, interval_text, markdown_table, save_panels, write_readme
from fresh_rl.sweep import output_lock
from fresh_rl.sweep.study_cli import study_main

RESULTS = REPOSITORY_ROOT / "results" / "old_logits_factorial"
SCALES = named({
    "ci": Scale((factorial_task("CartPole-v1", 4, 16, 12, 6, 2),), ("fixed4",), (1e-3, 3e-3), (0.5, 0.9), 1, 2, 4),
    "cpu": Scale(tuple(factorial_task(env, 8, 64, 250, 25, 8) for env in ("CartPole-v1", "Acrobot-v1")),
                 ("fixed4", "fixed16", "uniform16"), (3e-4, 1e-3, 3e-3), (0.4, 0.5, 0.6, 0.7, 0.8, 0.9), 5, 10, 15),
})


def figures(t: dict, out_dir: Path) -> None:
    """effects.png: the factorial's contrasts in mean learner return per cell; mechanism.png:
    ρ_active and the clip fraction per arm and cell (scoring seeds)."""
    cells = list(grouped(t["runs"], ("task", "setting")))
    ticks = (range(len(cells)), [f"{a}\n{b}" for a, b in cells])
    effect = {(e["task"], e["setting"], e["contrast"]): e for e in t["effects"] if e["metric"] == "mean_return"}

    def contrasts(ax, _):
        for i, name in enumerate(FACTORIAL_CONTRASTS):
            rows = [effect[(*c, name)] for c in cells]
            ax.errorbar(np.arange(len(cells)) + (i - 1.5) * 0.2, [r["difference"] for r in rows],
                        yerr=[[r["difference"] - r["low"] for r in rows], [r["high"] - r["difference"] for r in rows]],
                        fmt="o", capsize=3, label=name)
        ax.axhline(0, color="grey", lw=0.6)
        ax.set_xticks(*ticks, fontsize=7)
        ax.set(ylabel="Δ mean learner return (95% t, paired)")
    save_panels(out_dir / "effects.png", ["mask × clip contrasts"], contrasts, width=9)
    arms = grouped(t["runs"], ("task", "setting", "arm"))

    def mechanism(ax, key):
        for arm in ROUTES:
            ax.plot(ticks[0], [np.mean([r[key] for r in arms[(*c, arm)]]) for c in cells], "o-", label=arm)
        ax.set(ylabel=key.replace("_", " ") + " (scoring seeds)")
        ax.set_xticks(*ticks, fontsize=7)
    save_panels(out_dir / "mechanism.png", ["active_fraction", "clip_fraction"], mechanism)


def readme_lines(scale: Scale, results: list[dict], t: dict, seed: int) -> list[str]:
    c0, s0 = scale.tasks[0], seed + scale.tuning_seeds
    arms = [[*key, f"{rows[0]['learning_rate']:g}", interval_text(*interval([r["mean_return"] for r in rows])),
             *(f"{np.mean([r[k] for r in rows]):.3f}" for k in ("active_fraction", "clip_fraction")),
             f"{np.mean([r['version_gap'] for r in rows]):.1f}",
             f"{rows[0]['threshold']:g}: {100 * np.mean([r['reset_rate'] for r in rows]):.0f}%"
             if key[2] == "ewma" else ""]
            for key, rows in grouped(t["runs"], ("task", "setting", "arm")).items()]
    returns = [e for e in t["effects"] if e["metric"] == "mean_return"]
    effect = {(e["task"], e["setting"], e["contrast"]): e for e in returns}
    reading = [f"- {task} {setting}: gap {g['difference']:.0f}, of which the mask "
               f"{m['difference']:.0f} ({100 * m['difference'] / g['difference']:.0f}%) and the clip "
               f"{c['difference']:.0f} ({100 * c['difference'] / g['difference']:.0f}%)."
               for (task, setting, name), g in effect.items() if name.startswith("total gap") and g["low"] > 0
               for m, c in [[effect[task, setting, n] for n in ("mask main effect", "clip main effect")]]]
    calibration = [[res["calibration"][0]["task"], res["calibration"][0]["setting"],
                    f"{res['calibration'][0]['learning_rate']:g}",
                    *(f"{100 * rate:.0f}%" for rate in reset_rates(res["calibration"], scale.thresholds).values()),
                    f"{res['threshold']:g}"] for res in results]
    stages = ", ".join(f"{r['runs'][0]['task']} {r['runs'][0]['setting']} {r['seconds']:.0f} s" for r in results)
    return [
        f"Stage wall times per cell (compilation included): {stages}.", "",
        f"Setup: decoupled PPO (MIS token mask exp(±0.1) on r_d, clip 0.2 on r_s), engine mean |log r_d| 0.02, "
        f"{c0.num_envs} envs × T = {c0.rollout_length}, {c0.num_iterations} iterations (one version each), "
        f"{c0.num_epochs} epochs × {c0.num_minibatches} minibatches, learner evaluation every {c0.eval_every} "
        f"iterations ({c0.eval_episodes} deterministic episodes). EWMA β = ā/(ā + 1) (the library's one rule, ā "
        f"the mean lag). Learning rate per arm and cell from {list(scale.learning_rates)} on tuning seeds {seed}–"
        f"{s0 - 1}; reset threshold calibrated on the same seeds (of {list(scale.thresholds)}, the one firing "
        f"nearest {TARGET_RESET_RATE:.0%} of iterations); scored on seeds {s0}–{s0 + scale.scoring_seeds - 1}.", "",
        "## Arms (scoring seeds; 95% Student-t intervals)", "",
        *markdown_table(("task", "setting", "arm", "tuned lr", "mean learner return", "ρ_active", "clip fraction",
                         "mean version gap", "reset threshold: measured reset rate"), arms), "",
        "## Effects (seed-paired, mean learner return)", "",
        "Mask main effect = mean(SS, SC) − mean(CS, CC); clip main effect = mean(SS, CS) − mean(SC, CC); "
        "interaction (half contrast) = mean(SS, CC) − mean(SC, CS); (mask, clip) sources S = snapshot, "
        "C = current weights. The total gap SS − CC is the sum of the two main effects. `effects.csv` also has "
        "the same contrasts in ρ_active; `effects.png`, `mechanism.png`.", "",
        *markdown_table(("task", "setting", "contrast", "difference"), (
            (e["task"], e["setting"], e["contrast"], interval_text(e["difference"], e["low"], e["high"]))
            for e in returns)), "",
        "Where the total gap's interval lies above 0, the share of each half (main effects; they add up to the gap):",
        "", *(reading or ["- no cell's gap is above 0."]), "",
        "## Reset calibration (tuning seeds, `calibration.csv`)", "",
        *markdown_table(("task", "setting", "lr (ewma_no_reset's)", *(f"{t:g}" for t in scale.thresholds), "kept"),
                        calibration), "",
        "Reset rate = fraction of iterations whose ρ_active fell below the threshold (θ_ref ← θ). The scored "
        "rate is in the arms table; the reset claims are testable only where it lies in 5–50%.", "",
        "## Verdicts", "", "Decided in [results/VERDICTS.md](../VERDICTS.md#old_logits_factorial) by `python "
        "experiments/verdicts.py` from `runs.csv` and experiments/claims/old_logits_factorial.toml: one pooled "
        "Student-t test per claim over its cells, Holm-corrected; a reset cell outside 5–50% resets is not testable."]


def run(scale: Scale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started, out_dir = time.perf_counter(), Path(out_dir)
    with output_lock(out_dir):
        results = [run_cell(task, setting, scale, out_dir, seed) for task in scale.tasks for setting in scale.settings]
        t = {name: [r for res in results for r in res[name]] for name in ("runs", "tuning", "calibration")}
        t["effects"] = effects(t["runs"])
        for name, rows in t.items():
            write_csv(out_dir / f"{name}.csv", rows)
        figures(t, out_dir)
        header = {**provenance(started=started), "seed": seed}
        write_atomic(out_dir / "config.json", json.dumps(
            {"scale": scale.label, "scale_config": repr(scale), **header}, indent=1) + "\n")
        return write_readme(out_dir, "Old-logit routes in control: mask × clip factorial and a calibrated EWMA reset",
                            header, readme_lines(scale, results, t, seed))


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
