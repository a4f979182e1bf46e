"""Held-out evaluation of LLM policies: the success of several policies on the same episodes.

:data:`EVAL_SEED` fixes the evaluation episodes (prompts and sampling keys) shared by every
policy, by ``experiments/old_logits.py`` and by ``experiments/llm_rl_probe.py``, so two
policies' success rates are a paired comparison.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from fresh_rl.llm.tasks.vocab import check_model_vocab
from fresh_rl.llm.trainer import collect
from fresh_rl.sweep.keys import seed_key

EVAL_SEED = 10_000


@dataclasses.dataclass(frozen=True)
class EvalTask:
    """What the evaluators read: a trainer config (``rl``: temperature, prompt pool), a task and
    the number of evaluation episodes (hashable: every evaluation of the task reuses one
    compiled program)."""

    rl: object
    env: object
    eval_episodes: int


def make_evaluator(scale, model_config, on_training_prompts: bool = False):
    """Jitted ``(params, key) -> successes [E]`` of the bf16 sampler at the RL temperature
    (``scale``: anything hashable with ``rl``, ``env`` and ``eval_episodes`` = E, e.g.
    :class:`fresh_rl.llm.presets.OldLogitsScale`); the same key gives the same prompts.
    ``on_training_prompts``: the ``rl.prompt_pool`` training prompts, each
    ``E / prompt_pool`` times; else E fresh (held-out) prompts. Cached on the evaluation's own
    settings: every evaluation of a scale (e.g. one per run) reuses one compiled program, and
    so do the held-out evaluations of scales that differ only in their training prompt pool."""
    check_model_vocab(scale.env, model_config)
    pool = scale.rl.prompt_pool if on_training_prompts else 0
    config = dataclasses.replace(scale.rl, num_groups=pool or scale.eval_episodes,
                                 group_size=scale.eval_episodes // pool if pool else 1,
                                 estimator="reinforce_pp", prompt_pool=pool)
    return _compiled_evaluator(config, scale.env, model_config)


@functools.lru_cache(maxsize=16)
def _compiled_evaluator(config, env, model_config):
    return jax.jit(lambda p, k: collect(p, k, config=config, env=env, model_config=model_config).success)


def evaluate_policies(scale, model_config, policies: dict) -> list[dict]:
    """Success of every policy (name → params) on the same episodes (key
    ``seed_key(EVAL_SEED)``: same prompts and sampling keys): on held-out prompts and, with a
    prompt pool, on the training prompts. Rows: policy, prompts, episodes, success."""
    key = seed_key(EVAL_SEED)
    rows = []
    for prompts in (("training", "held_out") if scale.rl.prompt_pool else ("held_out",)):
        evaluate = make_evaluator(scale, model_config, prompts == "training")
        for name, params in policies.items():
            success = evaluate(params, key)
            rows.append({"policy": name, "prompts": prompts, "episodes": int(success.shape[0]),
                         "success": float(jnp.mean(success.astype(jnp.float32)))})
    return rows


__all__ = ["EVAL_SEED", "EvalTask", "evaluate_policies", "make_evaluator"]
