"""An EWMA auto-reset calibrated before it is judged, in the LLM loop (BPE warm start, W = 16).

The ``bpe`` old-logit bed (:data:`fresh_rl.llm.presets.OLD_LOGITS_SCALES`: GRPO, decoupled loss,
lr 1e-4, 8 × 8 episodes per iteration from 64 training prompts, 60 iterations, staleness U{0..16},
EWMA β = W/(W + 1)) with the ``ewma`` route. At the default threshold 0.9 its committed runs never
reset (ρ_active stays ≥ 0.98 at W = 16, results/old_logits_bpe). Two resumable stages, each one
vmapped program (:func:`fresh_rl.llm.old_logits_reset_study.run_rows`; a threshold per row):

1. *calibration* (its own seeds): ``ewma`` at every threshold of the grid; the threshold whose
   reset rate (resets per iteration with a full ring, step ≥ W) is nearest
   :data:`fresh_rl.eval.route_claims.TARGET_RESET_RATE` is kept
   (:func:`~fresh_rl.eval.route_claims.nearest_reset_rate`);
2. *scoring* (other seeds): ``ewma`` at that threshold and ``ewma_no_reset``, paired by seed; the
   final learner's success on the training prompts and on held-out prompts
   (:func:`fresh_rl.llm.evaluation.evaluate_policies`), and each run's reset rate and ρ_active.

At the ``bpe`` scale the ``ewma_no_reset`` rows are the bpe grid's committed W = 16 runs of the same
bed and seeds (``results/old_logits_bpe/runs``), read, not rerun: a route that does not reset is the
same program whatever its threshold (the grid's ``ewma`` and ``ewma_no_reset`` runs agree bit for bit),
so the only difference is the vmapped layout. The README states how closely each seed's ``ewma``
run follows its no-reset run before its first reset, which measures that difference.

Outputs (``results/old_logits_bpe_reset/``): ``calibration.csv``, ``runs.csv``, ``config.json``,
``README.md``; claims: experiments/claims/old_logits_bpe_reset.toml.

    python experiments/old_logits_bpe_reset.py --scale ci    # the tests (random-weight stand-in)
    python experiments/old_logits_bpe_reset.py --scale bpe   # the committed results (2-core CPU)
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from fresh_rl.eval.route_claims import TARGET_RESET_RATE, nearest_reset_rate, reset_rates
from fresh_rl.llm.checkpoint import load_hf_model
from fresh_rl.llm.old_logits_reset_study import Scale, agreement_before_reset, read_no_reset_rows, run_rows, table
from fresh_rl.llm.presets import OLD_LOGITS_SCALES, RESULTS
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.presets import named
from fresh_rl.provenance import provenance, write_atomic, write_csv
from fresh_rl.report import grouped, interval, interval_text, markdown_table, write_readme
from fresh_rl.sweep import output_lock
from fresh_rl.sweep.study_cli import study_main

SCALES = named({
    # thresholds around the no-reset ρ_active quantiles of the committed W = 16 runs (5%: 0.982,
    # 20%: 0.989, 50%: 0.994); calibrated on seeds 5–6, scored on the bpe grid's seeds 0–4
    "bpe": Scale(OLD_LOGITS_SCALES["bpe"], 16, (0.985, 0.99, 0.995), (5, 6), (0, 1, 2, 3, 4),
                 no_reset_runs=RESULTS / "old_logits_bpe" / "runs"),
    "ci": Scale(dataclasses.replace(OLD_LOGITS_SCALES["bpe-ci"], eval_episodes=8), 1, (0.5, 0.999), (1,), (0,)),
})


def readme_lines(scale: Scale, bed, runs: list[dict], rate: dict, threshold: float, agreement: list) -> list[str]:
    by = grouped(sorted(runs, key=lambda r: r["seed"]), ("route",))
    return [
        "", f"Bed: the `bpe` old-logit scale ({bed.iterations} iterations, W = {scale.window}, lag "
        f"{bed.lag_kind}, EWMA β rule `{bed.ewma_beta_rule}`). Reset rate = resets per iteration with a "
        f"full ring (step ≥ W). Calibrated on seeds {list(scale.calibration_seeds)}: "
        + ", ".join(f"threshold {t:g} → {100 * rate[t]:.0f}%" for t in scale.thresholds)
        + f"; kept {threshold:g} (nearest {TARGET_RESET_RATE:.0%}). Scored on seeds {list(scale.scoring_seeds)}"
        + (f"; the no-reset rows are the committed runs in `{scale.no_reset_runs.relative_to(RESULTS.parent)}` "
           "(same bed and seeds, one seed per program)" if scale.no_reset_runs else "") + ".", "",
        "Before its first reset an `ewma` run is the no-reset program: per seed, the iterations shared and "
        "the largest |Δρ_active| over them: "
        + "; ".join(f"seed {s}: {n} iterations, {g:.1e}" for s, n, g in agreement) + ".", "",
        *markdown_table(("route", "threshold", "measured reset rate", "ρ_active", "training-prompt success",
                         "held-out success"), (
            (route, f"{rows[0]['threshold']:g}", f"{100 * np.mean([r['reset_rate'] for r in rows]):.0f}%",
             f"{np.mean([r['active_fraction'] for r in rows]):.4f}",
             *(interval_text(*interval([r[k] for r in rows]), digits=3)
               for k in ("success_training", "success_held_out")))
            for (route,), rows in by.items())), "",
        "Verdicts: [results/VERDICTS.md](../VERDICTS.md#old_logits_bpe_reset) "
        "(experiments/claims/old_logits_bpe_reset.toml); a comparison whose measured reset rate lies outside "
        "5–50% is not testable."]


def run(scale: Scale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started, out = time.perf_counter(), Path(out_dir)
    if seed != 0:
        raise ValueError("--seed: this study's seeds are the scale's calibration and scoring seeds")
    model_config, params, vocab = load_hf_model(scale.bed.model)
    bed = dataclasses.replace(scale.bed, env=with_vocab(scale.bed.env, vocab))
    with output_lock(out):
        calibration = table("ewma", run_rows(scale, bed, "ewma", [(t, s) for t in scale.thresholds
                                                                   for s in scale.calibration_seeds],
                                             "calibration", params, model_config, out))
        rate = reset_rates(calibration, scale.thresholds)
        threshold = nearest_reset_rate(rate)
        default = bed.async_config("ewma").ewma_reset_threshold
        scored = {"ewma": run_rows(scale, bed, "ewma", [(threshold, s) for s in scale.scoring_seeds],
                                   f"scoring_ewma_{threshold:g}", params, model_config, out),
                  "ewma_no_reset": read_no_reset_rows(scale, bed) if scale.no_reset_runs else
                  run_rows(scale, bed, "ewma_no_reset", [(default, s) for s in scale.scoring_seeds],
                           f"scoring_ewma_no_reset_{default:g}", params, model_config, out)}
        runs = [r for route, data in scored.items() for r in table(route, data)]
        write_csv(out / "calibration.csv", calibration)
        write_csv(out / "runs.csv", runs)
        header = provenance(started=started)
        write_atomic(out / "config.json", json.dumps({"scale": scale.label, "scale_config": repr(scale),
                                                      "threshold": threshold, **header}, indent=1, default=str) + "\n")
        return write_readme(out, "EWMA auto-reset, calibrated before it is judged (LLM loop, BPE warm start)", header,
                            readme_lines(scale, bed, runs, rate, threshold,
                                         agreement_before_reset(scored["ewma"], scored["ewma_no_reset"])))


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, RESULTS / "old_logits_bpe_reset", run, argv)


if __name__ == "__main__":
    main()
