"""The route verdicts of the LLM old-logit study (``experiments/old_logits.py``; scales
:data:`fresh_rl.llm.presets.OLD_LOGITS_SCALES`): the paper's route claims
(:mod:`fresh_rl.eval.route_claims`) decided per staleness window and prompt set from the runs'
histories and evaluations."""
from __future__ import annotations

import numpy as np

from fresh_rl.eval import holm_over_cells
from fresh_rl.eval.route_claims import decide_route_claims
from fresh_rl.llm.presets import OldLogitsScale


def full_ring(window: int, steps: int) -> slice:
    """The iterations whose ring holds all W + 1 versions (step ≥ W; the last one if none)."""
    return slice(min(window, steps - 1), steps)


def declared_prompts(scale: OldLogitsScale) -> str:
    """The prompt set whose success is the grid's declared reward: the training prompts with a
    prompt pool (RL on this bed learns the prompts it trains on), else held-out prompts."""
    return "training" if scale.rl.prompt_pool else "held_out"


def route_verdicts(scale: OldLogitsScale, histories: dict, eval_rows: list[dict]) -> list[dict]:
    """Per window and prompt set: the paper's route claims (:mod:`fresh_rl.eval.route_claims`)
    decided on the seeds every route of the grid has finished (paired: same keys), with the
    learner's final success on those prompts as the reward ("return") and the run's mean
    active-token fraction once the ring is full (step ≥ W) as "active". ``histories``:
    ``{(route, W, partial): [per-seed {metric: [steps]}]}``; ``eval_rows``: the evaluation rows
    (``route``, ``window``, ``partial``, ``seed``, ``prompts``, ``success``). With a prompt pool
    the declared reward is the training prompts' success (:func:`declared_prompts`) and the
    held-out rows repeat the comparison on unseen prompts; each prompt set's cells are
    Holm-corrected per claim (:func:`fresh_rl.eval.holm_over_cells`). No rows at a
    window without recompute_current, which gates every claim."""
    if "recompute_current" not in scale.grid_routes:
        return []
    prompt_sets = tuple(dict.fromkeys((declared_prompts(scale), "held_out")))
    success = {(r["route"], r["window"], r["seed"], r["prompts"]): r["success"] for r in eval_rows
               if "route" in r and not r["partial"]}
    rows = []
    for window in scale.windows:
        runs = {route: histories.get((route, window, False), []) for route in scale.grid_routes}
        seeds = 0
        while all(len(runs[route]) > seeds
                  and all((route, window, seeds, p) in success for p in prompt_sets)
                  for route in runs):
            seeds += 1
        if not seeds:
            continue
        active = {route: np.array([h["active_token_fraction"][full_ring(window, len(h["active_token_fraction"]))].mean()
                                   for h in histories_of[:seeds]])
                  for route, histories_of in runs.items()}
        masked = 1.0 - float(active["recompute_current"].mean())
        for prompts in prompt_sets:

            def metric_of(route, metric):  # used within this iteration only
                if route not in runs:
                    return None
                if metric == "return":
                    return np.array([success[(route, window, s, prompts)] for s in range(seeds)])
                return active[route]
            rows += [{"window": window, "prompts": prompts, "seeds": seeds,
                      "recompute_current_masked_fraction": masked, **row}
                     for row in decide_route_claims(metric_of, masked)]
    return [r for p in prompt_sets for r in holm_over_cells([r for r in rows if r["prompts"] == p])]
