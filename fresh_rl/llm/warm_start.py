"""Supervised warm start: behaviour cloning of each task's expert on freshly generated episodes.

Loss = mean over action tokens of -log pi_theta(token | transcript prefix) (float32 training
forward; observations are context only). Every step draws new expert episodes, so there is no
fixed dataset to overfit. Training cycles through the tasks (one task per step), producing one
model for all tasks (a `cycle` can weight the tasks). Evaluation samples with the bf16
inference engine at temperature 1 (the RL behaviour policy) and reports the task's verifiable
success rate.
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
    sampling = SamplingConfig(max_new_tokens=env.action_len, temperature=temperature,
                              stop_tokens=env.stop_tokens, pad_id=env.pad_id)
    result = jax.jit(lambda p, k: run_episodes(env, model_policy(p, model_config, sampling), k,
                                               episodes))(params, key)
    played = np.asarray(result.turn_mask)
    # Train-inference discrepancy on the sampled action tokens: log r_d = log pi_fp32 - log pi_bf16.
    train_logp, _ = jax.jit(token_logprobs_and_entropy, static_argnums=1,
                            static_argnames="temperature")(params, model_config, result.tokens,
                                                           result.mask, temperature=temperature
                                                           if temperature > 0 else 1.0)
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
    with open(os.path.join(directory, CHECKSUM_FILE), "w") as f:
        json.dump({"sha256": checksum}, f)


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


def warm_start(model_config: Qwen2Config, tasks: dict[str, Any], config: WarmStartConfig,
               key, log: Callable[[str], None] = print, params=None,
               cycle: Sequence[str] | None = None):
    """Trains on expert episodes of `tasks`, step i on task `cycle[i % len(cycle)]` (default:
    each task once per cycle, in dict order). Returns (params, history)."""
    names = list(cycle or tasks)
    unknown = sorted(set(names) - set(tasks))
    if unknown:
        raise ValueError(f"warm_start cycle names unknown tasks {unknown}; tasks: {list(tasks)}")
    for env in tasks.values():
        check_model_vocab(env, model_config)
    k_init, k_data = jax.random.split(key)
    params = init_params(model_config, k_init) if params is None else params
    optimizer = make_optimizer(config)
    opt_state = optimizer.init(params)
    train_step = make_train_step(model_config, optimizer)
    demos = {name: jax.jit(lambda k, env=env: run_episodes(env, expert_policy(env), k,
                                                           config.batch_size))
             for name, env in tasks.items()}
    history, start = [], time.time()
    for step in range(config.steps):
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
    return params, history
