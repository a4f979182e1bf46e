"""Missing old logits in asynchronous LLM RL (arXiv 2605.12070): routes × staleness window.

  .venv/bin/python experiments/old_logits.py --scale cpu      # the committed results
  .venv/bin/python experiments/old_logits.py --scale ci --out /tmp/old_logits_ci
  .venv/bin/python experiments/old_logits.py --scale smoke --out /tmp/old_logits_smoke  # the tests'

From a warm-started LM on the arithmetic task (scales: :data:`fresh_rl.llm.presets.OLD_LOGITS_SCALES`),
runs the asynchronous simulator (fresh_rl.llm.async_pipeline) for every route of the grid at every
staleness window W, seeds one after another through the same compiled iteration (the machinery:
:mod:`fresh_rl.llm.old_logits_study`). Writes to --out (default results/old_logits for cpu and
paper, else results/old_logits_<scale>): ``runs/<route>_W<w>[_partial]_seed<s>.csv`` (and
``.eval.json``) per run, ``checkpoints/<run>/`` (a killed run resumes there), ``curves.csv``,
``summary.csv`` (95% Student-t intervals over seeds), ``overhead.csv/.md`` (per repair route at the
overhead W), ``eval.csv``, ``eval_summary.csv``, ``verdicts.csv`` (route claims per W and prompt set,
Holm-corrected; decided over cells by experiments/verdicts.py), ``effects.csv`` (the mask × clip
factorial's contrasts), ``success_vs_step.png``, ``mechanism.png``, ``mechanism_vs_window.png``,
``reset_ablation.png``, ``config.json``. ``bpe`` is the confirmation on the BPE warm start
(``bpe-ci`` its test version, ``bpe-factorial`` the factorial at W = 16). ``--max-runs N`` makes at
most N new runs, largest W first, and summarises every finished one; ``--resume`` continues
(``--resume --max-runs 0`` only rewrites the tables). ``paper`` configures the qwen2.5-0.5b preset
(pass --checkpoint); ``--model PATH`` runs a scale from any Hugging Face folder, e.g.:

  .venv/bin/python experiments/old_logits.py --scale smoke --model tests/fixtures/qwen2_bpe_tiny \
      --out /tmp/old_logits_standin
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

import numpy as np

from fresh_rl.compilation_cache import add_compilation_cache_flag
from fresh_rl.llm.checkpoint import add_model_flag, load_hf_model
from fresh_rl.llm.old_logits_study import (CURVE_METRICS, overhead_rows, run_grid, time_routes_interleaved,
                                           write_overhead, write_tables)
from fresh_rl.llm.presets import OLD_LOGITS_SCALES as SCALES
from fresh_rl.llm.presets import RESULTS, OldLogitsScale, load_params, model_folder
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.provenance import provenance, write_atomic
from fresh_rl.report import grouped, save_panel_grid
from fresh_rl.sweep.study_cli import NO_CHECKED, add_preset_arguments, chosen_preset, start_study


def plot(curves: list[dict], summary: list[dict], scale: OldLogitsScale, out: str) -> None:
    """Learning curves and mechanism per W (mean, 95% interval over seeds); with several windows
    ``mechanism_vs_window.png``: ρ_active and the clip fraction (full ring) against W per route."""
    series = grouped(curves, ("route", "window", "partial", "metric"))

    def panel_grid(metrics, routes, filename, partial=False, windows=scale.windows):
        def draw(ax, metric, window):
            for route in routes:
                rows = series.get((route, window, partial, metric), [])
                if rows:
                    step = [r["step"] for r in rows]
                    ax.plot(step, [r["mean"] for r in rows], label=route)
                    ax.fill_between(step, [r["low"] for r in rows], [r["high"] for r in rows], alpha=0.2)
            ax.set_title(f"W={window}{' partial' if partial else ''}", fontsize=9)
            ax.set(xlabel="iteration", yscale="log" if metric == "abs_log_rd_mean" else "linear")
            ax.set_ylabel(metric, fontsize=8)
        save_panel_grid(os.path.join(out, filename), metrics, windows, draw, width=3.6, height=2.8)

    if len(scale.windows) > 1:
        by_route = grouped(sorted((r for r in summary if not r["partial"]), key=lambda r: r["window"]), ("route",))

        def against_window(ax, _, panel):
            metric, label = panel
            for route in scale.grid_routes:
                rows = by_route.get((route,), [])
                mean, low, high = (np.array([r[metric + end] for r in rows]) for end in ("", "_low", "_high"))
                ax.errorbar([r["window"] for r in rows], mean, yerr=[mean - low, high - mean], marker="o", capsize=3,
                            label=route)
            ax.set(xscale="log", xticks=scale.windows, xticklabels=scale.windows, xlabel="staleness window W",
                   ylabel=label)
        save_panel_grid(os.path.join(out, "mechanism_vs_window.png"), [None],
                        [("active_fraction", "ρ_active"), ("clip_fraction", "clip fraction")], against_window,
                        width=4.5, height=3.4)
    panel_grid(("success_rate",), scale.grid_routes, "success_vs_step.png")
    panel_grid(("active_token_fraction", "abs_log_rd_mean"), scale.grid_routes, "mechanism.png")
    ablation = [r for r in ("ewma", "ewma_no_reset", "snapshot") if r in scale.grid_routes]
    if len(ablation) > 1:
        panel_grid(CURVE_METRICS, ablation, "reset_ablation.png")
    if scale.partial_routes:
        panel_grid(CURVE_METRICS, scale.partial_routes, "partial_rollouts.png", partial=True,
                   windows=(scale.partial_window,))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=NO_CHECKED)
    add_preset_arguments(parser, SCALES)
    parser.add_argument("--out", default=None,
                        help="output folder (default results/old_logits, or results/old_logits_<scale>)")
    parser.add_argument("--checkpoint", default=None, help="initial parameters (default: the tiny warm start)")
    add_model_flag(parser)
    parser.add_argument("--overhead-only", type=int, default=0, metavar="ROUNDS",
                        help="only re-time every route, interleaved, ROUNDS rounds at the "
                             "overhead window (writes overhead.csv/.md)")
    parser.add_argument("--prompt-pool-seed", type=int, default=None,
                        help="another fixed training set (scales with RLConfig.prompt_pool)")
    parser.add_argument("--resume", action="store_true",
                        help="skip the runs whose CSV exists in --out/runs and summarise all")
    parser.add_argument("--max-runs", type=int, default=None, metavar="N",
                        help="make at most N new runs, then summarise every finished run "
                             "(a grid in chunks: continue with --resume; with --resume, 0 only rewrites the tables)")
    add_compilation_cache_flag(parser)
    args = parser.parse_args(argv)
    if args.max_runs is not None and not (args.max_runs >= 1 or (args.max_runs == 0 and args.resume)):
        parser.error(f"--max-runs must be >= 1 (or 0 with --resume: only the tables), got {args.max_runs}")
    scale = chosen_preset(parser, args, SCALES)
    if args.prompt_pool_seed is not None:
        scale = dataclasses.replace(scale, rl=dataclasses.replace(scale.rl, prompt_pool_seed=args.prompt_pool_seed))
    out = args.out or str(RESULTS / ("old_logits" if args.scale in ("cpu", "paper")
                                     else f"old_logits_{args.scale.replace('-', '_')}"))
    # --resume, --max-runs (chunks of one grid) and --overhead-only (re-timing) are not part of it
    identity = {"study": "old_logits", "scale": scale.label, "model": args.model, "checkpoint": args.checkpoint,
                "prompt_pool_seed": args.prompt_pool_seed}
    start_study(parser, args, identity, out, argv, hint="choose another --out")
    os.makedirs(os.path.join(out, "runs"), exist_ok=True)
    start, started = time.time(), time.perf_counter()
    folder = args.model or model_folder(scale.model)  # --model, or a scale's own HF folder
    if folder:
        model_config, params, vocab = load_hf_model(folder)
        scale = dataclasses.replace(scale, model=folder, env=with_vocab(scale.env, vocab))
    else:
        model_config, params = load_params(scale.model, args.checkpoint or scale.warm_start)
    log = lambda msg: print(f"[{time.time() - start:7.0f}s] {msg}", flush=True)  # noqa: E731
    if args.overhead_only:  # the first round is the first call at this argument placement: dropped as warm-up
        write_overhead(out, overhead_rows(time_routes_interleaved(scale, params, model_config, args.overhead_only),
                                          scale, params))
        log(f"wrote {out}/overhead.csv (interleaved, {args.overhead_only} rounds)")
        return out
    histories, timed = run_grid(scale, params, model_config, out, args.resume, args.max_runs, log)
    curves, summary = write_tables(scale, histories, timed, params, model_config, out, log)
    plot(curves, summary, scale, out)
    info = provenance(command=" ".join(["python experiments/old_logits.py"]
                                       + list(argv if argv is not None else sys.argv[1:])), started=started)
    write_atomic(os.path.join(out, "config.json"), json.dumps(
        {"scale": scale.label, **info, **{k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
                                          for k, v in dataclasses.asdict(scale).items()}}, indent=1, default=str))
    log(f"wrote {out} in {info['wall_seconds']:.0f} s")
    return out


if __name__ == "__main__":
    main()
