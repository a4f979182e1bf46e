"""The calibrated EWMA reset in the LLM loop (``experiments/old_logits_bpe_reset.py``): its scale,
the stages' runs (:func:`run_rows`, one vmapped program of ``(threshold, seed)`` rows saved as
``runs/<name>.npz``), the committed no-reset runs read in the same layout
(:func:`read_no_reset_rows`) and the measures once the ring is full (:func:`ring_metrics`).
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import jax
import numpy as np

from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm.evaluation import evaluate_policies
from fresh_rl.llm.hparams import LLMHyperParams
from fresh_rl.llm.old_logits_study import read_run_csv, run_name
from fresh_rl.llm.old_logits_verdicts import full_ring
from fresh_rl.presets import Preset
from fresh_rl.sweep import saved_arrays
from fresh_rl.sweep.checkpoint import RunCheckpointer
from fresh_rl.sweep.integrity import tree_checksum


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    bed: object  # the OldLogitsScale whose settings every run uses
    window: int
    thresholds: tuple[float, ...]
    calibration_seeds: tuple[int, ...]
    scoring_seeds: tuple[int, ...]
    no_reset_runs: Path | None = None  # committed single-seed runs of ewma_no_reset on this bed, or run them


def run_rows(scale: Scale, bed, route: str, rows: list[tuple[float, int]], name: str, params, model_config,
             out: Path) -> dict:
    """``(threshold, seed)`` rows of one route, one vmapped program (checkpoints in
    ``checkpoints/<name>``); saved as ``runs/<name>.npz``."""
    def train() -> dict:
        async_config = bed.async_config(route)
        hparams = LLMHyperParams.stack([async_config.default_hparams(window=scale.window, ewma_reset_threshold=t)
                                        for t, _ in rows])
        started = time.perf_counter()
        state, history = ap.train_loop(
            bed.rl, async_config, [s for _, s in rows], bed.iterations, params=params, env=bed.env,
            model_config=model_config, hparams=hparams, checkpoint_every=4,
            checkpointer=RunCheckpointer(out / "checkpoints" / name,
                                         fingerprint=repr((bed, name, rows, tree_checksum(params)))),
            log=lambda i, m: print(f"[{name}] iteration {i + 1}/{bed.iterations}: ρ_active "
                                   f"{np.mean(m['active_token_fraction']):.4f}, {time.perf_counter() - started:.0f} s",
                                   flush=True))
        final = state.train.params
        evaluation = evaluate_policies(bed, model_config,
                                       {i: jax.tree.map(lambda x: x[i], final) for i in range(len(rows))})
        success = {p: np.array([next(r["success"] for r in evaluation if r["policy"] == i and r["prompts"] == p)
                                for i in range(len(rows))]) for p in ("training", "held_out")}
        return {"threshold": np.array([t for t, _ in rows]), "seed": np.array([s for _, s in rows]),
                "success_training": success["training"], "success_held_out": success["held_out"],
                **ring_metrics(scale, history["active_token_fraction"], history["ewma_reset"]),
                "seconds": np.asarray(time.perf_counter() - started)}

    return saved_arrays(out / "runs" / f"{name}.npz", train)


def read_no_reset_rows(scale: Scale, bed) -> dict:
    """The scoring seeds' committed ``ewma_no_reset`` runs (``<dir>/ewma_no_reset_W<W>_seed<s>.csv``,
    read by :func:`fresh_rl.llm.old_logits_study.read_run_csv`, and ``.eval.json``) in :func:`run_rows`' layout."""
    names = [run_name("ewma_no_reset", scale.window, False, s) for s in scale.scoring_seeds]
    missing = [n for n in names if not (scale.no_reset_runs / f"{n}.eval.json").exists()]
    if missing:
        raise FileNotFoundError(f"no_reset_runs: {scale.no_reset_runs} lacks {missing}; run experiments/old_logits.py "
                                f"--scale bpe first")
    columns = [read_run_csv(scale.no_reset_runs / f"{n}.csv") for n in names]
    success = [{e["prompts"]: e["success"] for e in json.loads((scale.no_reset_runs / f"{n}.eval.json").read_text())}
               for n in names]
    return {"threshold": np.full(len(names), bed.async_config("ewma").ewma_reset_threshold),
            "seed": np.array(scale.scoring_seeds),
            "success_training": np.array([s["training"] for s in success]),
            "success_held_out": np.array([s["held_out"] for s in success]),
            **ring_metrics(scale, np.stack([c["active_token_fraction"] for c in columns]),
                           np.stack([c["ewma_reset"] for c in columns]))}


def ring_metrics(scale: Scale, active, resets) -> dict:
    """From per-iteration ρ_active and resets ``[rows, iterations]``: each row's reset rate and mean
    ρ_active over the iterations with a full ring (:func:`fresh_rl.llm.old_logits_verdicts.full_ring`),
    and the two histories."""
    active, resets = np.asarray(active), np.asarray(resets)
    full = full_ring(scale.window, active.shape[1])
    return {"reset_rate": resets[:, full].mean(1), "active_fraction": active[:, full].mean(1),
            "active_history": active, "reset_history": resets}


def agreement_before_reset(reset: dict, no_reset: dict) -> list[tuple[int, int, float]]:
    """Per seed ``(seed, iterations before the first reset, max |Δρ_active| over them)`` between the
    ``ewma`` run and its no-reset pair (identical programs until the first reset)."""
    rows = []
    for i, seed in enumerate(reset["seed"]):
        fired = np.flatnonzero(reset["reset_history"][i] > 0)
        shared = int(fired[0]) if fired.size else reset["reset_history"].shape[1]  # steps before the first reset
        j = list(no_reset["seed"]).index(seed)
        gap = np.abs(reset["active_history"][i, :shared] - no_reset["active_history"][j, :shared]).max()
        rows.append((int(seed), shared, float(gap)))
    return rows


def table(route: str, data: dict) -> list[dict]:
    """One CSV row per run of ``data`` (a stage's arrays), named by ``route``."""
    return [{"route": route, "threshold": float(t), "seed": int(s), "reset_rate": float(z), "active_fraction": float(a),
             "success_training": float(tr), "success_held_out": float(h)}
            for t, s, z, a, tr, h in zip(data["threshold"], data["seed"], data["reset_rate"], data["active_fraction"],
                                         data["success_training"], data["success_held_out"])]


__all__ = ["Scale", "agreement_before_reset", "read_no_reset_rows", "ring_metrics", "run_rows", "table"]
