"""Which half of an old-logit route costs the reward (mask × clip), and an EWMA reset calibrated first.

Control trainer, decoupled PPO (MIS token mask on r_d = π_old/π_infer, PPO clip on r_s =
π_θ/π_clip), engine mean |log r_d| 0.02. The 2 × 2 factorial takes the mask's old log-probs and
the clip centre each from ``snapshot`` (exact) or ``recompute_current`` (the current weights):
arms ``snapshot``, ``mask_snapshot_clip_current``, ``mask_current_clip_snapshot``,
``recompute_current`` (:data:`fresh_rl.corrections.routes.FACTORIAL_ROUTES`). Staleness settings:
fixed lag 4, fixed lag 16, uniform U{0..16} redrawn per iteration. Per (task, setting), three
resumable stages (:func:`fresh_rl.sweep.run_stage`), all routes traced in one program:

1. *tuning* (seeds 0–4): the four arms and ``ewma_no_reset`` × the learning-rate grid;
2. *calibration* (seeds 0–4): ``ewma`` at every reset threshold, at ``ewma_no_reset``'s tuned
   rate; the threshold whose reset rate is nearest :data:`TARGET_RESET_RATE` is kept;
3. *scoring* (seeds 5–14): each arm at its tuned rate; ``ewma`` (calibrated threshold) and
   ``ewma_no_reset`` at ``ewma_no_reset``'s rate.

Outputs (``results/old_logits_factorial/``): ``runs.csv``, ``tuning.csv``, ``calibration.csv``,
``effects.csv`` (per cell: the total gap, the mask and clip main effects and the interaction,
seed-paired 95% intervals), ``effects.png``, ``mechanism.png`` (ρ_active, clip fraction per arm
and setting), ``config.json``, ``README.md``. Claims: experiments/claims/old_logits_factorial.toml.

    python experiments/old_logits_factorial.py --scale ci   # the tests
    python experiments/old_logits_factorial.py --scale cpu  # CartPole-v1 + Acrobot-v1, 5 + 10 seeds
"""
from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path

import numpy as np

from fresh_rl.control.config import DEFAULT_MIS, TrainConfig
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.train import train
from fresh_rl.eval import eval_mean_score
from fresh_rl.eval.route_claims import FACTORIAL_ARMS, FACTORIAL_CONTRASTS, factorial_effects
from fresh_rl.lag import DelayConfig
from fresh_rl.presets import Preset, named
from fresh_rl.provenance import REPOSITORY_ROOT, provenance, provenance_line, write_csv
from fresh_rl.report import interval, interval_text
from fresh_rl.sweep import output_lock, run_stage
from fresh_rl.sweep.keys import seed_keys
from fresh_rl.sweep.study_cli import study_main

RESULTS = REPOSITORY_ROOT / "results" / "old_logits_factorial"
ROUTES = FACTORIAL_ARMS + ("ewma", "ewma_no_reset")
TARGET_RESET_RATE = 0.2  # our choice: inside the 5–50% gate, a reset every ~5 iterations
KEEP = ("eval/return_deterministic", "eval/valid", "loss/active_token_fraction", "loss/clip_fraction",
        "old_logits/reset", "lag/version_gap_mean")
SETTINGS = {"fixed4": DelayConfig.fixed(4, 5), "fixed16": DelayConfig.fixed(16, 17),
            "uniform16": DelayConfig.uniform(0, 16, 17)}


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    tasks: tuple[TrainConfig, ...]
    settings: tuple[str, ...]
    learning_rates: tuple[float, ...]
    thresholds: tuple[float, ...]
    tuning_seeds: int
    scoring_seeds: int
    chunk: int  # runs per vmapped chunk, the same in every stage (one compiled program per cell)


def _task(env, envs, steps, iterations, every, episodes) -> TrainConfig:
    return TrainConfig(env_name=env, num_envs=envs, rollout_length=steps, total_env_steps=envs * steps * iterations,
                       num_epochs=4, num_minibatches=4, num_actor_groups=envs, eval_every=every,
                       eval_episodes=episodes, method="decoupled_ppo", data_source="lagged_actors",
                       route="snapshot", routes=ROUTES, inference_discrepancy=0.02, max_logit_noise=1.0,
                       decoupled_mis=DEFAULT_MIS, tis_cap=None, ewma_beta_rule="mean_age")


SCALES = named({
    "ci": Scale((_task("CartPole-v1", 4, 16, 12, 6, 2),), ("fixed4",), (1e-3, 3e-3), (0.5, 0.9), 1, 2, 4),
    "cpu": Scale(tuple(_task(env, 8, 64, 250, 25, 8) for env in ("CartPole-v1", "Acrobot-v1")),
                 tuple(SETTINGS), (3e-4, 1e-3, 3e-3), (0.4, 0.5, 0.6, 0.7, 0.8, 0.9), 5, 10, 15),
})


def _train_kept(config, key, hp):
    out = train(config, key, hp)
    return {k: out.metrics[k] for k in KEEP}


def stage(config, scale, rows, out_dir, name):
    """Every row ``{arm, learning_rate, threshold, seed}`` of one stage, one vmapped program."""
    hp = HyperParams.from_grid(config, {"route": [ROUTES.index(r["arm"]) for r in rows],
                                        "learning_rate": [r["learning_rate"] for r in rows],
                                        "ewma_reset_threshold": [r["threshold"] for r in rows]})
    label = f"{config.env_name} {config.delay.kind} lag≤{config.delay.ring_size - 1} {name}"
    out, seconds = run_stage(functools.partial(_train_kept, config), seed_keys([r["seed"] for r in rows]), hp,
                             directory=out_dir / "runs" / f"{label.replace(' ', '-')}",
                             fingerprint=f"{name} {config!r} rows={rows}", chunk_size=scale.chunk, label=label)
    return [{**r, "mean_return": float(m), "final_return": float(f), "active_fraction": float(a.mean()),
             "clip_fraction": float(c.mean()), "reset_rate": float(z.mean()), "version_gap": float(g.mean())}
            for r, m, f, a, c, z, g in zip(rows, eval_mean_score(out["eval/return_deterministic"], out["eval/valid"]),
                                           out["eval/return_deterministic"][:, -1], out["loss/active_token_fraction"],
                                           out["loss/clip_fraction"], out["old_logits/reset"],
                                           out["lag/version_gap_mean"])], seconds


def run_cell(task: TrainConfig, setting: str, scale: Scale, out_dir: Path, seed: int) -> dict:
    config = dataclasses.replace(task, delay=SETTINGS[setting])
    tuning_seeds = range(seed, seed + scale.tuning_seeds)
    rows = [{"arm": a, "learning_rate": lr, "threshold": 0.9, "seed": s}
            for a in FACTORIAL_ARMS + ("ewma_no_reset",) for lr in scale.learning_rates for s in tuning_seeds]
    tuning, t1 = stage(config, scale, rows, out_dir, "tuning")
    means = {(r["arm"], r["learning_rate"]): np.mean([q["mean_return"] for q in tuning if q["arm"] == r["arm"]
                                                      and q["learning_rate"] == r["learning_rate"]]) for r in rows}
    lr = {a: max(scale.learning_rates, key=lambda x: means[a, x]) for a in FACTORIAL_ARMS + ("ewma_no_reset",)}
    lr["ewma"] = lr["ewma_no_reset"]
    rows = [{"arm": "ewma", "learning_rate": lr["ewma"], "threshold": t, "seed": s}
            for t in scale.thresholds for s in tuning_seeds]
    calibration, t2 = stage(config, scale, rows, out_dir, "calibration")
    rate = {t: np.mean([r["reset_rate"] for r in calibration if r["threshold"] == t]) for t in scale.thresholds}
    threshold = min(scale.thresholds, key=lambda t: abs(rate[t] - TARGET_RESET_RATE))
    scoring_seeds = range(seed + scale.tuning_seeds, seed + scale.tuning_seeds + scale.scoring_seeds)
    rows = [{"arm": a, "learning_rate": lr[a], "threshold": threshold, "seed": s} for a in ROUTES for s in scoring_seeds]
    scoring, t3 = stage(config, scale, rows, out_dir, "scoring")
    cell = {"task": task.env_name, "setting": setting}
    return {"tuning": [{**cell, **r} for r in tuning], "calibration": [{**cell, **r} for r in calibration],
            "runs": [{**cell, **r} for r in scoring], "seconds": t1 + t2 + t3, "threshold": threshold}


RESET_CONTRAST = "reset: ewma − ewma_no_reset"


def effects(runs: list[dict]) -> list[dict]:
    """Per cell and metric: the factorial's contrasts
    (:data:`fresh_rl.eval.route_claims.FACTORIAL_CONTRASTS`) and the reset's, seed-paired."""
    out = []
    for cell in dict.fromkeys((r["task"], r["setting"]) for r in runs):
        by = {}
        for r in runs:
            if (r["task"], r["setting"]) == cell:
                by.setdefault(r["arm"], {})[r["seed"]] = r
        seeds = sorted(by["snapshot"])
        per_metric = {}
        for metric in ("mean_return", "active_fraction"):
            values = {arm: np.array([by[arm][s][metric] for s in seeds]) for arm in ROUTES}
            m, lo, hi = interval(values["ewma"] - values["ewma_no_reset"])
            per_metric[metric] = factorial_effects(values) + [
                {"contrast": RESET_CONTRAST, "difference": m, "low": lo, "high": hi, "seeds": len(seeds)}]
        out += [{"task": cell[0], "setting": cell[1], "contrast": r["contrast"], "metric": metric,
                 **{k: r[k] for k in ("difference", "low", "high", "seeds")}}
                for rows in zip(*per_metric.values()) for metric, r in zip(per_metric, rows)]
    return out


def figures(t: dict, out_dir: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = list(dict.fromkeys((r["task"], r["setting"]) for r in t["runs"]))
    fig, ax = plt.subplots(figsize=(9, 4))
    names = list(FACTORIAL_CONTRASTS)
    for i, name in enumerate(names):
        rows = [next(e for e in t["effects"] if (e["task"], e["setting"]) == c and e["contrast"] == name
                     and e["metric"] == "mean_return") for c in cells]
        x = np.arange(len(cells)) + (i - 1.5) * 0.2
        ax.errorbar(x, [r["difference"] for r in rows], yerr=[[r["difference"] - r["low"] for r in rows],
                                                             [r["high"] - r["difference"] for r in rows]],
                    fmt="o", capsize=3, label=name)
    ax.axhline(0, color="grey", lw=0.6)
    ax.set_xticks(range(len(cells)), [f"{a}\n{b}" for a, b in cells], fontsize=7)
    ax.set(ylabel="Δ mean learner return (95% t, paired)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "effects.png", dpi=110)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arm in ROUTES:
        for ax, key in zip(axes, ("active_fraction", "clip_fraction")):
            ax.plot(range(len(cells)), [np.mean([r[key] for r in t["runs"] if (r["task"], r["setting"]) == c
                                                 and r["arm"] == arm]) for c in cells], "o-", label=arm)
            ax.set(ylabel=key.replace("_", " ") + " (scoring seeds)")
            ax.set_xticks(range(len(cells)), [f"{a}\n{b}" for a, b in cells], fontsize=7)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "mechanism.png", dpi=110)
    plt.close("all")


def write_readme(scale: Scale, results: list[dict], t: dict, out_dir: Path, header: dict) -> str:
    c0, seed = scale.tasks[0], header["seed"]
    arm_lines = []
    for res in results:
        cell = [r for r in t["runs"] if r["task"] == res["runs"][0]["task"] and r["setting"] == res["runs"][0]["setting"]]
        for arm in ROUTES:
            rows = [r for r in cell if r["arm"] == arm]
            arm_lines.append(f"| {rows[0]['task']} | {rows[0]['setting']} | {arm} | {rows[0]['learning_rate']:g} | "
                             f"{interval_text(*interval([r['mean_return'] for r in rows]))} | "
                             f"{np.mean([r['active_fraction'] for r in rows]):.3f} | "
                             f"{np.mean([r['clip_fraction'] for r in rows]):.3f} | "
                             f"{np.mean([r['version_gap'] for r in rows]):.1f} | "
                             + (f"{rows[0]['threshold']:g}: {100 * np.mean([r['reset_rate'] for r in rows]):.0f}% |"
                                if arm == "ewma" else " |"))
    effect_lines = [f"| {e['task']} | {e['setting']} | {e['contrast']} | "
                    f"{interval_text(e['difference'], e['low'], e['high'])} |"
                    for e in t["effects"] if e["metric"] == "mean_return"]
    calibration_lines = []
    for res in results:
        cell = res["calibration"]
        rates = {t: np.mean([r["reset_rate"] for r in cell if r["threshold"] == t]) for t in scale.thresholds}
        calibration_lines.append(f"| {cell[0]['task']} | {cell[0]['setting']} | {cell[0]['learning_rate']:g} | "
                                 + " | ".join(f"{100 * rates[t]:.0f}%" for t in scale.thresholds)
                                 + f" | {res['threshold']:g} |")
    gap = {(e["task"], e["setting"]): e for e in t["effects"]
           if e["metric"] == "mean_return" and e["contrast"].startswith("total gap")}
    reading = [f"- {task} {setting}: gap {g['difference']:.0f}, of which the mask "
               f"{m['difference']:.0f} ({100 * m['difference'] / g['difference']:.0f}%) and the clip "
               f"{c['difference']:.0f} ({100 * c['difference'] / g['difference']:.0f}%)."
               for (task, setting), g in gap.items() if g["low"] > 0
               for m, c in [[next(e for e in t["effects"] if (e["task"], e["setting"]) == (task, setting)
                                  and e["metric"] == "mean_return" and e["contrast"] == name)
                             for name in ("mask main effect", "clip main effect")]]]
    stages = ", ".join(f"{r['runs'][0]['task']} {r['runs'][0]['setting']} {r['seconds']:.0f} s" for r in results)
    text = [
        "# Old-logit routes in control: mask × clip factorial and a calibrated EWMA reset", "",
        provenance_line(header), f"Stage wall times per cell (compilation included): {stages}.", "",
        f"Setup: decoupled PPO (MIS token mask exp(±0.1) on r_d, clip 0.2 on r_s), engine mean |log r_d| 0.02, "
        f"{c0.num_envs} envs × T = {c0.rollout_length}, {c0.num_iterations} iterations (one version each), "
        f"{c0.num_epochs} epochs × {c0.num_minibatches} minibatches, learner evaluation every {c0.eval_every} "
        f"iterations ({c0.eval_episodes} deterministic episodes). EWMA β = ā/(ā + 1) (the library's one rule, ā "
        f"the mean lag). Learning rate per arm and cell from {list(scale.learning_rates)} on tuning seeds {seed}–"
        f"{seed + scale.tuning_seeds - 1}; reset threshold calibrated on the same seeds (of {list(scale.thresholds)}, "
        f"the one firing nearest {TARGET_RESET_RATE:.0%} of iterations); scored on seeds {seed + scale.tuning_seeds}–"
        f"{seed + scale.tuning_seeds + scale.scoring_seeds - 1}.", "",
        "## Arms (scoring seeds; 95% Student-t intervals)", "",
        "| task | setting | arm | tuned lr | mean learner return | ρ_active | clip fraction | mean version gap | "
        "reset threshold: measured reset rate |", "|---|---|---|---|---|---|---|---|---|", *arm_lines, "",
        "## Effects (seed-paired, mean learner return)", "",
        "Mask main effect = mean(SS, SC) − mean(CS, CC); clip main effect = mean(SS, CS) − mean(SC, CC); "
        "interaction (half contrast) = mean(SS, CC) − mean(SC, CS); (mask, clip) sources S = snapshot, "
        "C = current weights. The total gap SS − CC is the sum of the two main effects. `effects.csv` also has "
        "the same contrasts in ρ_active; `effects.png`, `mechanism.png`.", "",
        "| task | setting | contrast | difference |", "|---|---|---|---|", *effect_lines, "",
        "Where the total gap's interval lies above 0, the share of each half (main effects; they add up to "
        "the gap):", "", *(reading or ["- no cell's gap is above 0."]), "",
        "## Reset calibration (tuning seeds, `calibration.csv`)", "",
        "| task | setting | lr (ewma_no_reset's) | " + " | ".join(f"{t:g}" for t in scale.thresholds)
        + " | kept |", "|---|---|---|" + "---|" * len(scale.thresholds) + "---|", *calibration_lines, "",
        "Reset rate = fraction of iterations whose ρ_active fell below the threshold (θ_ref ← θ). The scored "
        "rate is in the arms table; the reset claims are testable only where it lies in 5–50%.", "",
        "## Verdicts", "",
        "Decided in [results/VERDICTS.md](../VERDICTS.md#old_logits_factorial) by `python experiments/verdicts.py` "
        "from `runs.csv` and experiments/claims/old_logits_factorial.toml: one pooled Student-t test per claim "
        "over its cells, the cells Holm-corrected; a reset cell outside 5–50% measured resets is not testable.",
    ]
    (out_dir / "README.md").write_text("\n".join(text) + "\n")
    return "\n".join(text)


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
        (out_dir / "config.json").write_text(json.dumps(
            {"scale": scale.label, "scale_config": repr(scale), **header}, indent=1) + "\n")
        return write_readme(scale, results, t, out_dir, header)


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, RESULTS, run, argv)


if __name__ == "__main__":
    main()
