"""Supervised warm start: behaviour cloning of each task's expert on freshly generated episodes.

Loss = mean over action tokens of -log pi_theta(token | transcript prefix) (float32 training
forward; observations are context only). Every step draws new expert episodes, so there is no
fixed dataset to overfit. Training cycles through the tasks (one task per step), producing one
model for all tasks (a `cycle` can weight the tasks). Evaluation samples with the bf16
inference engine at temperature 1 (the RL behaviour policy) and reports the task's verifiable
success rate.

Long runs: ``warm_start(..., every=, on_every=)`` calls back periodically (evaluate with a
compiled-once :func:`make_task_metrics`, checkpoint the parameters and ``opt_state`` with
:class:`fresh_rl.sweep.checkpoint.RunCheckpointer`), resumes from them (``opt_state=``,
``start_step=``), and
:func:`select_checkpoint` picks the last periodic checkpoint whose success lies in a band.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
import warnings
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fresh_rl.llm.model import Qwen2Config, init_params, stack_layers, unstack_layers
from fresh_rl.llm.rollout import expert_policy, model_policy, run_episodes
from fresh_rl.llm.sampler import SamplingConfig, token_logprobs_and_entropy
from fresh_rl.llm.tasks.vocab import check_model_vocab
from fresh_rl.provenance import write_atomic


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    steps: int = 400
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    weight_decay: float = 0.01
    eval_episodes: int = 64
    eval_temperature: float = 1.0

    def __post_init__(self):
        for name in ("steps", "batch_size", "eval_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"WarmStartConfig.{name} must be >= 1, "
                                 f"got {getattr(self, name)}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"WarmStartConfig.warmup_steps must be in [0, steps={self.steps}),"
                             f" got {self.warmup_steps}")
        if not self.learning_rate > 0:
            raise ValueError(f"WarmStartConfig.learning_rate must be > 0, "
                             f"got {self.learning_rate}")
        if not self.eval_temperature >= 0:
            raise ValueError(f"WarmStartConfig.eval_temperature must be >= 0, "
                             f"got {self.eval_temperature}")


def make_optimizer(config: WarmStartConfig) -> optax.GradientTransformation:
    """AdamW with linear warmup then cosine decay to 10%, global-norm clip 1."""
    schedule = optax.warmup_cosine_decay_schedule(0.0, config.learning_rate,
                                                  config.warmup_steps, config.steps,
                                                  config.learning_rate * 0.1)
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.adamw(schedule, weight_decay=config.weight_decay))


def sft_loss(params, model_config: Qwen2Config, tokens, mask, loss_mask):
    """Mean NLL of the `loss_mask` tokens; metrics: loss, token accuracy proxy (mean prob)."""
    logp, entropy = token_logprobs_and_entropy(params, model_config, tokens, mask)
    weight = loss_mask.astype(jnp.float32)
    count = jnp.maximum(weight.sum(), 1.0)
    loss = -(logp * weight).sum() / count
    return loss, {"loss": loss, "mean_token_prob": (jnp.exp(logp) * weight).sum() / count,
                  "entropy": (entropy * weight).sum() / count}


def make_train_step(model_config: Qwen2Config, optimizer: optax.GradientTransformation):
    """Jitted `(params, opt_state, tokens, mask, loss_mask) -> (params, opt_state, metrics)`."""

    @jax.jit
    def train_step(params, opt_state, tokens, mask, loss_mask):
        grads, metrics = jax.grad(sft_loss, has_aux=True)(params, model_config, tokens, mask,
                                                           loss_mask)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, metrics

    return train_step


def evaluate(params, model_config: Qwen2Config, env, key, episodes: int,
             temperature: float = 1.0) -> dict[str, float]:
    """Success rate, mean return and format-ok fraction of the LM policy on `env`."""
    return make_task_metrics(model_config, env, episodes, temperature)(params, key)


def make_task_metrics(model_config: Qwen2Config, env, episodes: int, temperature: float = 1.0):
    """`(params, key) -> metrics` of :func:`evaluate`, compiled once for repeated
    evaluations (e.g. periodic ones during training) instead of once per call."""
    sampling = SamplingConfig(max_new_tokens=env.action_len, temperature=temperature,
                              stop_tokens=env.stop_tokens, pad_id=env.pad_id)
    play = jax.jit(lambda p, k: run_episodes(env, model_policy(p, model_config, sampling), k,
                                             episodes))
    score = jax.jit(lambda p, tokens, mask: token_logprobs_and_entropy(
        p, model_config, tokens, mask, temperature=temperature if temperature > 0 else 1.0)[0])
    return lambda params, key: _metrics(play(params, key), score, params)


def _metrics(result, score, params) -> dict[str, float]:
    played = np.asarray(result.turn_mask)
    # Train-inference discrepancy on the sampled action tokens: log r_d = log pi_fp32 - log pi_bf16.
    train_logp = score(params, result.tokens, result.mask)
    acted = np.asarray(result.action_mask)
    log_rd = np.abs(np.asarray(train_logp - result.behaviour_log_probs))[acted]
    return {"success": float(np.mean(result.success)),
            "return": float(np.mean(result.returns)),
            "format_ok": float(np.asarray(result.format_ok)[played].mean()),
            "abs_log_rd_mean": float(log_rd.mean()), "abs_log_rd_max": float(log_rd.max())}


CHECKSUM_FILE = "fresh_rl_checksum.json"


def save_params(directory: str, params) -> None:
    """Orbax checkpoint of the parameter pytree at `directory` (overwritten), refused when
    non-finite, with the SHA-256 of its contents in ``CHECKSUM_FILE`` beside it."""
    import orbax.checkpoint as ocp

    from fresh_rl.sweep.integrity import NonFiniteError, inspect_for_checkpoint
    problem, checksum = inspect_for_checkpoint({"params": params})
    if problem is not None:
        raise NonFiniteError(f"refusing to save non-finite parameters to {directory}: {problem}")
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(os.path.abspath(directory), params, force=True)
    checkpointer.wait_until_finished()
    write_atomic(os.path.join(directory, CHECKSUM_FILE), json.dumps({"sha256": checksum}))


def _recorded_checksum(record: str):
    with open(record) as f:
        return json.load(f).get("sha256")


def restore_params(directory: str, model_config: Qwen2Config):
    """Restores parameters saved by `save_params` for `model_config`; ``CheckpointError``
    naming `directory` if it is missing, unreadable or holds another model's parameters."""
    import orbax.checkpoint as ocp

    from fresh_rl.sweep.checkpoint import CheckpointError
    from fresh_rl.sweep.integrity import tree_checksum
    init = lambda: init_params(model_config, jax.random.PRNGKey(0))  # noqa: E731
    try:
        checkpointer = ocp.StandardCheckpointer()
        path = os.path.abspath(directory)
        stored = checkpointer.metadata(path)
        stored = getattr(stored, "item_metadata", stored)
        # Checkpoints written before the scanned layers hold layers_{i} (stacked below).
        per_layer = "layers_0" in stored
        target = jax.eval_shape(lambda: unstack_layers(init()) if per_layer else init())
        params = checkpointer.restore(path, target)
    except Exception as err:  # orbax raises many types for unreadable files
        raise CheckpointError(f"parameter checkpoint {directory} is unreadable or does not match "
                              f"this model config: {type(err).__name__}: {err}") from err
    record = os.path.join(directory, CHECKSUM_FILE)
    if not os.path.exists(record):
        warnings.warn(f"parameter checkpoint {directory} has no {CHECKSUM_FILE}: restored unverified", stacklevel=2)
    elif _recorded_checksum(record) != tree_checksum({"params": params}):  # the tree save_params hashed
        raise CheckpointError(f"parameter checkpoint {directory} is corrupt: its contents do not match the "
                              f"checksum in {record} recorded when it was written")
    return stack_layers(params) if per_layer else params


def select_checkpoint(evals: list[dict], band: tuple[float, float]) -> tuple[int, float]:
    """(step, distance) of the chosen periodic checkpoint: the last one at which every task's
    success lies within ``band``, else the final one. ``distance`` (0 inside the band): the
    sum over tasks of how far each lies below band[0] or above band[1].

    (Not the checkpoint of least distance: an early checkpoint with several tasks near zero
    can lie closer to the band than a late one with one saturated task.)"""
    steps = sorted({row["step"] for row in evals})
    lo, hi = band

    def distance(step):
        return sum(max(0.0, lo - r["success"]) + max(0.0, r["success"] - hi)
                   for r in evals if r["step"] == step)

    inside = [step for step in steps if distance(step) == 0.0]
    best = inside[-1] if inside else steps[-1]
    return best, distance(best)


def warm_start(model_config: Qwen2Config, tasks: dict[str, Any], config: WarmStartConfig,
               key, log: Callable[[str], None] = print, params=None,
               cycle: Sequence[str] | None = None, *, opt_state=None, start_step: int = 0,
               every: int = 0, on_every: Callable[[int, Any, Any, list], None] | None = None):
    """Trains on expert episodes of `tasks`, step i on task `cycle[i % len(cycle)]` (default:
    each task once per cycle, in dict order). Returns (params, history).

    Resuming: ``start_step`` > 0 continues a run interrupted after that many steps from its
    ``params`` and ``opt_state`` (which holds the schedule's step count); step i's episodes
    depend only on ``key`` and i, so the resumed run trains on the same data as an
    uninterrupted one. ``on_every(steps_done, params, opt_state, history)`` is called after
    every ``every``-th step (e.g. to evaluate and checkpoint); ``history`` holds this call's
    rows."""
    names = list(cycle or tasks)
    unknown = sorted(set(names) - set(tasks))
    if unknown:
        raise ValueError(f"warm_start cycle names unknown tasks {unknown}; tasks: {list(tasks)}")
    for env in tasks.values():
        check_model_vocab(env, model_config)
    k_init, k_data = jax.random.split(key)
    params = init_params(model_config, k_init) if params is None else params
    if not 0 <= start_step <= config.steps:
        raise ValueError(f"warm_start start_step must be in [0, steps={config.steps}], "
                         f"got {start_step}")
    if start_step and opt_state is None:
        raise ValueError("warm_start: resuming (start_step > 0) needs the run's opt_state")
    optimizer = make_optimizer(config)
    opt_state = optimizer.init(params) if opt_state is None else opt_state
    train_step = make_train_step(model_config, optimizer)
    demos = {name: jax.jit(lambda k, env=env: run_episodes(env, expert_policy(env), k,
                                                           config.batch_size))
             for name, env in tasks.items()}
    history, start = [], time.time()
    for step in range(start_step, config.steps):
        name = names[step % len(names)]
        episodes = demos[name](jax.random.fold_in(k_data, step))
        params, opt_state, metrics = train_step(params, opt_state, episodes.tokens,
                                                episodes.mask, episodes.action_mask)
        rounds = step // len(names)
        if rounds % max(1, config.steps // (20 * len(names))) == 0 or step == config.steps - 1:
            row = {"step": step, "task": name, "seconds": time.time() - start,
                   **{k: float(v) for k, v in metrics.items()}}
            history.append(row)
            log(f"step {step:5d} {name:10s} loss {row['loss']:.3f} "
                f"p(token) {row['mean_token_prob']:.3f} t={row['seconds']:.0f}s")
        if on_every is not None and every > 0 and (step + 1) % every == 0:
            on_every(step + 1, params, opt_state, history)
    return params, history
