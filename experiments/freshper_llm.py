"""FreshPER as its authors run it in the LLM RL loop: on-policy vs their PER vs FreshPER at two τ.

From the BPE warm start on the arithmetic task with a fixed pool of 64 training prompts (the bed
where RL learns), REINFORCE++ with one fresh and K = 1 replay update per iteration
(:mod:`fresh_rl.llm.replay_trainer`; the buffer holds the whole run). Arms: ``on_policy``
(K = 0), ``per_authors`` (new trajectories at the running max priority, sampled ones refreshed;
τ = ∞) and ``freshper_authors`` (that pipeline plus p·exp(−age/τ)) at the scale's two τ, rows of
one program with common seeds. All seeds of an arm are one vmapped program
(:mod:`fresh_rl.llm.freshper_authors_study`), checkpointed every 5 iterations (a rerun resumes;
a finished arm is loaded from ``runs/<arm>.npz``). Every final policy is scored on the same
held-out prompts (:data:`fresh_rl.llm.evaluation.EVAL_SEED`).

Outputs (``results/freshper_llm/``): ``runs.csv`` (one row per run: arm, τ, seed, held-out
success, training success over the last third, mean replayed age, seconds per iteration),
``curves.csv``, ``ess_vs_age.csv`` (token and sequence ESS/n of PER's final buffers by age),
``ess_fit.csv``, ``learning_curves.png`` (with the ESS/n-by-age panel), ``config.json``, ``README.md``.
Claims: experiments/claims/freshper_llm.toml, decided by experiments/verdicts.py.

    python experiments/freshper_llm.py --scale bpe-slice-ci   # the tests (random-weight stand-in)
    python experiments/freshper_llm.py --scale bpe-slice      # the committed results (2-core CPU)
    python experiments/freshper_llm.py --scale paper-slice    # Qwen2.5-0.5B, one accelerator
      (needs the Hugging Face folder at fresh_rl.llm.presets.QWEN2_5_0_5B_FOLDER, models/Qwen2.5-0.5B)
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from fresh_rl.llm.checkpoint import load_hf_model
from fresh_rl.llm.freshper_authors_study import plot_curves, readme_lines, run_arm, tables
from fresh_rl.llm.presets import BPE_TASKS, FRESHPER_SCALES, RESULTS, FreshPERScale
from fresh_rl.llm.tasks.vocab import with_vocab
from fresh_rl.provenance import provenance, write_csv
from fresh_rl.report import write_readme
from fresh_rl.sweep import output_lock
from fresh_rl.sweep.study_cli import study_main

SCALES = {name: FRESHPER_SCALES[name] for name in ("bpe-slice", "bpe-slice-ci", "paper-slice")}
TASK = "arithmetic"


def run(scale: FreshPERScale, out_dir: Path, seed: int = 0, fresh: bool = False, log=print) -> str:
    started, out = time.perf_counter(), Path(out_dir)
    if seed != 0:
        raise ValueError("--seed: this study's seeds are the scale's 0 … seeds − 1")
    if not Path(scale.model, "config.json").is_file():
        raise SystemExit(f"--scale {scale.label}: no Hugging Face model folder at {scale.model} (config.json "
                         "missing); put the model there first")
    model_config, params, vocab = load_hf_model(scale.model)
    env = with_vocab(BPE_TASKS[TASK], vocab)
    with output_lock(out):
        arms = {m: run_arm(scale, TASK, m, c, params, model_config, env, out) for m, c in scale.methods}
        t = tables(scale, arms)
        for name, rows in t.items():
            write_csv(out / f"{name}.csv", rows)
        header = provenance(started=started)
        (out / "config.json").write_text(json.dumps({"scale": scale.label, "scale_config": repr(scale), **header},
                                                    indent=1) + "\n")
        plot_curves(out / "learning_curves.png", scale, t)
        return write_readme(out, "FreshPER as its authors run it, in the LLM RL loop (BPE warm start, arithmetic)",
                            header, readme_lines(scale, arms, t))


def main(argv=None) -> None:
    study_main(__doc__.split("\n")[0], SCALES, RESULTS / "freshper_llm", run, argv)


if __name__ == "__main__":
    main()
