"""The saved runs of the RL-gain study (``experiments/llm_rl_gain.py``; scales
:data:`fresh_rl.llm.presets.RL_GAIN_SCALES`): a run's file name and fingerprint, loading a saved
record, and the per-setting table of held-out gains."""
from __future__ import annotations

import json

import numpy as np

from fresh_rl.eval import seed_interval
from fresh_rl.llm.presets import RL_GAIN_RL, RLGainScale

SETTING = ("task", "learning_rate", "epochs", "minibatches", "num_groups", "prompt_pool", "staleness_window",
           "iterations")
"""The record fields that name a setting: one row of :func:`summarize` per setting."""


def run_name(scale: RLGainScale, task: str, seed: int) -> str:
    """A run's file name: task, the probed settings (learning rate, epochs; minibatches, prompts
    per iteration and the training prompt pool when not the default :data:`RL_GAIN_RL`'s;
    staleness window, iterations), seed."""
    minibatches = "" if scale.rl.minibatches == RL_GAIN_RL.minibatches else f"_mb{scale.rl.minibatches}"
    groups = "" if scale.rl.num_groups == RL_GAIN_RL.num_groups else f"_g{scale.rl.num_groups}"
    pool = "" if scale.rl.prompt_pool == RL_GAIN_RL.prompt_pool else f"_pool{scale.rl.prompt_pool}"
    return (f"{task}_lr{scale.rl.learning_rate:g}_ep{scale.rl.epochs}{minibatches}{groups}{pool}_W{scale.staleness_window}"
            f"_it{scale.iterations}_seed{seed}")


def fingerprint(scale: RLGainScale, env, seed: int, params_checksum: str) -> str:
    """What a saved run must match to be reused: the RL settings, staleness window, budget,
    evaluation size, task, seed and initial weights (not the scale's other tasks or seed count)."""
    return repr((scale.rl, scale.staleness_window, scale.iterations, scale.eval_episodes, env, seed,
                 params_checksum))


def load_record(path: str) -> dict:
    """A saved run; records written before ``minibatches``, ``num_groups``, ``prompt_pool`` and
    ``staleness_window`` were recorded ran :data:`RL_GAIN_RL`'s one minibatch of 8 fresh prompts
    per iteration at window 1 (one version stale)."""
    with open(path) as f:
        record = json.load(f)
    record.setdefault("minibatches", RL_GAIN_RL.minibatches)
    record.setdefault("prompt_pool", RL_GAIN_RL.prompt_pool)
    record.setdefault("num_groups", RL_GAIN_RL.num_groups)
    record.setdefault("staleness_window", 1)
    return record


def summarize(records: list[dict]) -> list[dict]:
    """Per setting (task, learning rate, epochs, minibatches, prompts, pool, window, iterations): the
    seed-mean held-out success before / after and the gain with its 95% Student-t interval over
    seeds (none with one seed)."""
    rows = []
    for setting in dict.fromkeys(tuple(r[k] for k in SETTING) for r in records):
        runs = [r for r in records if tuple(r[k] for k in SETTING) == setting]
        gain = np.array([r["gain"] for r in runs])
        mean, low, high = (float(x) for x in seed_interval(gain))
        seconds = np.array([r["train_seconds"] for r in runs])
        rows.append({**dict(zip(SETTING, setting)), "seeds": len(runs),
                     "before": np.mean([r["before"] for r in runs]),
                     "after": np.mean([r["after"] for r in runs]), "gain": mean, "gain_ci_low": low,
                     "gain_ci_high": high, "episodes_per_run": runs[0]["episodes"],
                     "train_minutes_per_run": float(np.mean(seconds)) / 60,
                     # success on the fixed training prompts (runs with a prompt pool)
                     **({f"pool_{k}": np.mean([r[f"pool_{k}"] for r in runs]) for k in ("before", "after")}
                        if all("pool_after" in r for r in runs) else {})})
    return rows
