"""The control trainer's losses: advantages and value targets, their normalisation, and the
per-minibatch loss ``L = L_π + c_v·½·mean w(V_θ − target)² − c_ent·H``.

**Advantages and value targets** (the method's ``advantages``):

* ``"gae"`` — GAE(λ) and λ-returns on V_T, frozen per batch;
* ``"vtrace"`` — V-trace with log ρ = log π_T − log β on V_T, frozen per batch, in the form
  ``TrainConfig.vaco_advantage``: ``"impala"`` ρ_t(r_t + γ v_{t+1} − V_t) or ``"gae_like"`` v_t − V_t;
* ``"vtrace_per_step"`` — V-trace with log ρ = log π_θ − log β and V_θ, recomputed for every
  minibatch of whole rows, detached (IMPALA, arXiv 1802.01561 §4.2).

Rows replayed from a buffer get V-trace under the parameters of the replay step (log ρ =
log π_θ − log β with the stored β, detached): the method's ``"vtrace"`` form, else v_t − V_θ
(equal to GAE(λ) when ρ ≡ 1). **Normalisation** per minibatch (σ = std Â): ``"standardize"``
(Â − mean)/σ, ``"scale"`` Â/σ, ``"none"``, ``"centered_ratio"`` (Â − c·b)/σ with the unbiased
baseline weight b of :func:`fresh_rl.control.methods.centring_weight` and c = Σ Â·b / Σ b², the
least-squares coefficient (our choice; = mean Â when b ≡ 1). Replayed rows carry their PER
weight w (1 elsewhere), which multiplies the normalised advantages and the value loss (our
choice, as PER weights the whole TD loss). Value loss: no clipping (our choice).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fresh_rl.control import networks
from fresh_rl.control.config import TrainConfig
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.methods import centring_weight
from fresh_rl.corrections import (generalized_advantage_estimation, linear_proximal_log_probs,
                                  loglinear_proximal_log_probs, vtrace)


def sequences(gamma, reward: jax.Array, terminated: jax.Array, truncated: jax.Array) -> dict:
    """``reward``, ``discount`` γ·(1 − terminated) and ``episode_end`` of rows ``[rows, T]``."""
    return {"reward": reward, "discount": gamma * (1.0 - terminated.astype(jnp.float32)),
            "episode_end": terminated | truncated}


def frozen_advantages(config: TrainConfig, seq: dict, learner_log_prob, behaviour_log_prob, values,
                      next_values) -> tuple[jax.Array, jax.Array]:
    """Once-per-batch (advantages, value targets) ``[rows, T]`` on V_T: V-trace (log ρ =
    log π_T − log β) for ``"vtrace"`` methods, else GAE(λ)."""
    if config.method_spec.advantages == "vtrace":
        out = vtrace(values, next_values, seq["reward"], seq["discount"], learner_log_prob - behaviour_log_prob,
                     config=config.vtrace_config, episode_ends=seq["episode_end"])
        adv = out.impala_advantages if config.vaco_advantage == "impala" else out.gae_advantages
        return adv, out.targets
    gae = generalized_advantage_estimation(seq["reward"], values, next_values, seq["discount"],
                                           lambda_=config.gae_lambda, episode_ends=seq["episode_end"])
    return gae.advantages, gae.returns


def replayed_advantages(config: TrainConfig, seq: dict, log_prob, behaviour_log_prob, values,
                        next_values) -> tuple[jax.Array, jax.Array]:
    """(advantages, value targets) of replayed rows: V-trace under the replay step's θ, detached
    (module docstring)."""
    out = vtrace(values, next_values, seq["reward"], seq["discount"], log_prob - behaviour_log_prob,
                 config=config.vtrace_config, episode_ends=seq["episode_end"])
    impala_form = config.method_spec.advantages == "vtrace" and config.vaco_advantage == "impala"
    adv = out.impala_advantages if impala_form else out.gae_advantages
    return jax.lax.stop_gradient(adv), jax.lax.stop_gradient(out.targets)


def per_step_vtrace(config: TrainConfig, params, mb: dict, logp, values) -> dict:
    """IMPALA-style V-trace with the current parameters on whole rows ``mb [rows, T]``:
    log ρ = log π_θ − log β and V_θ, all detached (IMPALA, arXiv 1802.01561 §4.2)."""
    _, next_values = config.network().apply(params, mb["next_obs"])
    out = vtrace(jax.lax.stop_gradient(values), jax.lax.stop_gradient(next_values), mb["reward"],
                 mb["discount"], jax.lax.stop_gradient(logp - mb["behaviour_log_prob"]),
                 config=config.vtrace_config, episode_ends=mb["episode_end"])
    return {"advantage": out.impala_advantages, "target": out.targets}


def normalize_advantages(config: TrainConfig, mb: dict, logp) -> jax.Array:
    """Per-minibatch advantages under ``config.advantage_normalization_used`` (module docstring)."""
    adv, kind = mb["advantage"], config.advantage_normalization_used
    if kind == "none":
        return adv
    std = jnp.std(adv) + 1e-8
    if kind == "scale":
        return adv / std
    if kind == "standardize":
        return (adv - jnp.mean(adv)) / std
    b = centring_weight(config.method_spec, logp, mb["reference_log_prob"], mb["behaviour_log_prob"])
    c = jnp.sum(adv * b) / jnp.maximum(jnp.sum(b * b), 1e-8)
    return (adv - c * b) / std


def make_loss_fn(config: TrainConfig, hparams: HyperParams, loss_hparams: HyperParams,
                 proximal: jax.Array, with_proxies: bool) -> Callable:
    """``loss_fn(params, mb) -> (loss, metrics)`` of one minibatch.

    ``mb`` holds ``obs``, ``action``, ``behaviour_log_prob``, ``learner_log_prob``,
    ``reference_log_prob`` (the route's old log-probs), ``advantage``, ``target`` and optionally
    ``weight`` (PER) and ``alpha`` (proxies); per-step V-trace methods add the row sequences.
    ``proximal`` (traced index into :data:`~fresh_rl.corrections.routes.PROXIMALS`) picks the
    stored old log-probs or an interpolation proxy built from this minibatch's detached π_θ
    (only when ``with_proxies``). ``loss_hparams`` is ``hparams`` with the current PPO-KL β.
    """
    method = config.method_spec
    net = config.network()
    per_step = method.advantages == "vtrace_per_step"

    def loss_fn(params, mb):
        policy, values = net.apply(params, mb["obs"])
        logp = networks.log_prob(policy, mb["action"])
        if per_step:
            mb = {**mb, **per_step_vtrace(config, params, mb, logp, values)}
        if with_proxies:
            mb = {**mb, "reference_log_prob": jax.lax.switch(proximal, (
                lambda: mb["reference_log_prob"],
                lambda: linear_proximal_log_probs(mb["behaviour_log_prob"], logp, mb["alpha"]),
                lambda: loglinear_proximal_log_probs(mb["behaviour_log_prob"], logp, mb["alpha"])))}
            if "clip_log_prob" in mb:  # a proxy route centres its clip on its proxy too
                mb = {**mb, "clip_log_prob": jnp.where(proximal == 0, mb["clip_log_prob"], mb["reference_log_prob"])}
        adv = normalize_advantages(config, mb, logp)
        squared_error = jnp.square(values - mb["target"])
        if "weight" in mb:
            adv = adv * mb["weight"]
            squared_error = mb["weight"] * squared_error
        pg, pm = method.policy_loss(logp, {**mb, "advantage": adv}, loss_hparams, config)
        v_loss = 0.5 * jnp.mean(squared_error)
        ent = jnp.mean(networks.entropy(policy))
        log_rd_abs = jnp.mean(jnp.abs(jax.lax.stop_gradient(mb["reference_log_prob"]) - mb["behaviour_log_prob"]))
        total = pg + hparams.value_coef * v_loss - hparams.entropy_coef * ent
        return total, {**pm, "log_rd_abs": log_rd_abs, "value_loss": v_loss, "entropy": ent}

    return loss_fn


__all__ = ["frozen_advantages", "make_loss_fn", "normalize_advantages", "per_step_vtrace",
           "replayed_advantages", "sequences"]
