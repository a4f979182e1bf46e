"""VACO against PPO-clip under forward lag in the LLM loop (the paper's GSM8K result in miniature).

The BPE warm start on the arithmetic task with a fixed pool of 64 training prompts (the bed where RL
learns, :data:`fresh_rl.llm.presets.BPE_POOL_RL`: GRPO advantages, 8 × 8 episodes per iteration,
lr 1e-4, 60 iterations), on-policy (each batch from the version it updates). Forward lag is the
learner's drift over the updates it takes on one batch: M ∈ {4, 16, 64} minibatches of one epoch
(the batch fixed, so M = 64 steps on one sequence each; the paper raises forward lag the same way,
docs/vaco.md §5). Methods, both on the same GRPO advantages:

* ``ppo_clip`` — ratio π_θ/π_infer clipped at ε = 0.2 (``RLConfig.loss = "ppo_clip"``);
* ``vaco`` — the advantages realigned once per batch against π_T (``recompute_current``, the
  learner at batch start), then the unclipped IS gradient with the TV filter at the paper's
  δ = 0.2 (``RLConfig.loss = "vaco"``). On-policy, π_T/π_infer ≈ 1, so the realignment is
  nearly the identity here (the README reports the measured mean weight): the slice tests the
  filter against the clip.

Neither method is tuned (the bed's lr was fixed before this study; ε and δ at their papers'
values): the same budget, none. Each (method, M) is one vmapped program over the seeds,
checkpointed every 4 iterations (a rerun resumes; a finished arm loads from ``runs/<method>_M<M>.npz``).
Every final policy is scored on the training prompts and held-out prompts (512 episodes each).

Outputs (``results/vaco_llm_forward_lag/``): ``runs.csv`` (method, M, seed, training and held-out
success, mean over the run's updates of the filter's masked fraction, the filter's TV estimate D̂,
the clip fraction, k3-KL of π_θ to the ratio's reference, the realignment weight),
``success_vs_updates.png``, ``config.json``, ``README.md``. Claims:
experiments/claims/vaco_llm_forward_lag.toml, decided by experiments/verdicts.py.

    python experiments/vaco_llm_forward_lag.py --scale ci    # the tests (random-weight stand-in)
    python experiments/vaco_llm_forward_lag.py --scale bpe   # the committed results (2-core CPU)
"""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import numpy as np

from fresh_rl.llm.checkpoint import load_hf_model
from fresh_rl.llm.presets import OLD_LOGITS_SCALES, RESULTS
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.llm.vaco_forward_lag_study import MEANS, ROUTES, Scale, run_arm
from fresh_rl.presets import named
from fresh_rl.provenance import provenance, write_atomic, write_csv
from fresh_rl.report import (grouped, interval, interval_text, markdown_table, plot_interval_curves, save_panels,
                             write_readme)
from fresh_rl.sweep import output_lock, saved_arrays
from fresh_rl.sweep.study_cli import study_main

SCALES = named({
    "bpe": Scale(OLD_LOGITS_SCALES["bpe"], (4, 16, 64), (0, 1, 2, 3, 4)),
    "ci": Scale(dataclasses.replace(OLD_LOGITS_SCALES["bpe-ci"], eval_episodes=8), (2, 8), (0, 1)),
})


def figure(rows: list[dict], updates: tuple[int, ...], path: Path) -> None:
    """Held-out and training success (95% intervals over seeds) and the masked / clipped fraction against M."""
    cells = grouped(rows, ("method", "updates"))

    def draw(ax, column):
        if column != "fraction of tokens":
            return plot_interval_curves(ax, updates, {m: [[r[column] for r in cells[m, u]] for u in updates]
                                                      for m in ROUTES}, "M (updates per batch)", column)
        for method, measure in (("ppo_clip", "clip_fraction"), ("vaco", "masked_fraction")):
            ax.plot(range(len(updates)), [np.mean([r[measure] for r in cells[method, u]]) for u in updates],
                    marker="o", label=f"{method}: {measure.split('_')[0]}")
        ax.set_xticks(range(len(updates)), [str(u) for u in updates])
        ax.set(xlabel="M (updates per batch)", ylabel=column)
        ax.legend(fontsize=7)  # its own curves: the clipped (PPO-clip) and masked (VACO) fractions
    save_panels(path, ("success_held_out", "success_training", "fraction of tokens"), draw, width=4.3, height=3.8)


def run(scale: Scale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started, out = time.perf_counter(), Path(out_dir)
    if seed != 0:
        raise ValueError("--seed: this study's seeds are the scale's")
    model_config, params, vocab = load_hf_model(scale.bed.model)
    bed = dataclasses.replace(scale.bed, env=with_vocab(scale.bed.env, vocab))
    with output_lock(out):
        arms = {(method, m): saved_arrays(out / "runs" / f"{method}_M{m}.npz",
                                          lambda: run_arm(scale, bed, method, m, params, model_config, out))
                for m in scale.updates for method in ROUTES}
        rows = [{"method": method, "updates": m, "seed": int(s), **{k: float(data[k][i]) for k in
                                                                    ("success_training", "success_held_out", *MEANS)}}
                for (method, m), data in arms.items() for i, s in enumerate(data["seed"])]
        write_csv(out / "runs.csv", rows)
        figure(rows, scale.updates, out / "success_vs_updates.png")
        header = provenance(started=started)
        write_atomic(out / "config.json", json.dumps({"scale": scale.label, "scale_config": repr(scale), **header},
                                                     indent=1, default=str) + "\n")

        def cell(method, m, column, digits=3):
            values = [r[column] for r in rows if r["method"] == method and r["updates"] == m]
            return interval_text(*interval(values), digits=digits) if np.all(np.isfinite(values)) else "—"

        columns = {"success_held_out": 3, "success_training": 3, "masked_fraction": 3, "tv_estimate": 4,
                   "clip_fraction": 3, "kl_k3": 4, "realign_weight": 4}
        return write_readme(out, "VACO vs PPO-clip under forward lag, LLM loop (BPE warm start)", header, [
            "", f"Bed: GRPO on the `{scale.label}` scale's model and task ({bed.rl.num_groups} × {bed.rl.group_size} "
            f"episodes per iteration from {bed.rl.prompt_pool} training prompts, lr {bed.rl.learning_rate:g}, "
            f"{bed.iterations} iterations, on-policy), M minibatches of one epoch per batch; seeds {list(scale.seeds)}; "
            f"success of the final policy on {bed.eval_episodes} episodes of the training and of held-out prompts. "
            "Per run, the columns after success are means over its updates (95% intervals over seeds); wall: "
            "seconds of the invocation that finished the arm (an arm resumed from its checkpoints counts its last "
            "invocation only).", "",
            "![success and filtered / clipped fraction against M](success_vs_updates.png)", "",
            *markdown_table(("method", "M", "held-out success", "training success", "masked by the filter",
                             "filter's D̂", "clipped", "k3-KL to reference", "realignment weight", "wall (s)"),
                            ([method, m, *(cell(method, m, c, d) for c, d in columns.items()),
                              f"{float(arms[method, m]['seconds']):.0f}"]
                             for m in scale.updates for method in ROUTES)), "",
            "Verdicts: [results/VERDICTS.md](../VERDICTS.md#vaco_llm_forward_lag) "
            "(experiments/claims/vaco_llm_forward_lag.toml); the filter claims are not testable in a cell where the "
            "filter masks under 10% of tokens."])


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, RESULTS / "vaco_llm_forward_lag", run, argv)


if __name__ == "__main__":
    main()
