"""The LLM forward-lag slice of the VACO study (``experiments/vaco_llm_forward_lag.py``, arXiv
2603.01365 §5, the GSM8K result in miniature): the two methods with the old-logit route their ratio
is taken against, the metrics a run keeps, the scale type and one (method, M) arm's run.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import numpy as np

from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm.evaluation import evaluate_policies
from fresh_rl.presets import Preset
from fresh_rl.sweep.checkpoint import RunCheckpointer
from fresh_rl.sweep.integrity import tree_checksum

ROUTES = {"ppo_clip": "behaviour", "vaco": "recompute_current"}  # the ratio's reference: π_infer / π_T
MEANS = {"masked_fraction": "mask_fraction", "tv_estimate": "tv_filter_estimate", "clip_fraction": "clip_fraction",
         "kl_k3": "kl_k3", "realign_weight": "backward_ratio_mean"}  # runs.csv column → the loss's metric


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    bed: object  # the OldLogitsScale whose model, task, RL settings, iterations and evaluation every run uses
    updates: tuple[int, ...]  # M: minibatches per batch, one epoch
    seeds: tuple[int, ...]


def run_arm(scale: Scale, bed, method: str, updates: int, params, model_config, out: Path) -> dict:
    """One (method, M), every seed a row of one vmapped program (checkpoints in ``checkpoints/<method>_M<M>``)."""
    name = f"{method}_M{updates}"
    rl = dataclasses.replace(bed.rl, loss=method, minibatches=updates, epochs=1)
    pipeline = ap.AsyncConfig(staleness_window=0, old_logit_route=ROUTES[method])
    started = time.perf_counter()
    state, history = ap.train_loop(
        rl, pipeline, list(scale.seeds), bed.iterations, params=params, env=bed.env, model_config=model_config,
        checkpoint_every=4, checkpointer=RunCheckpointer(out / "checkpoints" / name,
                                                         fingerprint=repr((bed, rl, scale.seeds, tree_checksum(params)))),
        log=lambda i, m: print(f"[{name}] iteration {i + 1}/{bed.iterations}: success {np.mean(m['success_rate']):.3f}, "
                               f"masked {np.mean(m.get('mask_fraction', 0.0)):.3f}, clipped "
                               f"{np.mean(m['clip_fraction']):.3f}, {time.perf_counter() - started:.0f} s", flush=True))
    final = state.train.params
    evaluation = evaluate_policies(dataclasses.replace(bed, rl=rl), model_config,
                                   {i: jax.tree.map(lambda x: x[i], final) for i in range(len(scale.seeds))})
    data = {f"success_{p}": np.array([next(r["success"] for r in evaluation if r["policy"] == i and r["prompts"] == p)
                                      for i in range(len(scale.seeds))]) for p in ("training", "held_out")}
    for column, metric in MEANS.items():  # a metric the loss does not report is NaN
        data[column] = np.asarray(history[metric]).mean(1) if metric in history else np.full(len(scale.seeds), np.nan)
    return dict(data, seed=np.array(scale.seeds), seconds=np.asarray(time.perf_counter() - started))
