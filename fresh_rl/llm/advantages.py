"""Critic-free advantages for LLM policy gradients: GRPO and REINFORCE++.

All functions are pure and jittable. Shapes: episode returns ``[B]`` (one scalar outcome per
episode, e.g. ``Episodes.returns``), token arrays ``[B, T]`` with an explicit boolean
``mask`` of the tokens the policy produced (``Episodes.action_mask``). Masked entries never
reach a statistic and come out as exactly 0, whatever they held (NaN included).

GRPO (Shao et al. 2024, DeepSeekMath, arXiv 2402.03300, §4.1.2 "outcome supervision"):
the batch holds ``B / G`` groups of ``G`` rollouts of the same prompt, stored contiguously
(rows ``g·G … g·G + G − 1``). Every token of rollout i in group g gets

    A_i = (R_i − mean_g R) / (std_g R + eps)         (scale_by_std=True)
    A_i =  R_i − mean_g R                             (scale_by_std=False; Dr. GRPO,
                                                       Liu et al. 2025, arXiv 2503.20783)

REINFORCE++ (Hu 2025, arXiv 2501.03262; as used by FreshPER, docs/freshper.md):

1. response-level reward normalisation: ``R̃ = (R − mean R) / (std R + eps)`` over the batch
   (``group_size=None``, REINFORCE++'s "batch" grouping) or within each prompt group
   (ROLL's ``grouping: traj_group_id, method: mean_std``, where a group with zero spread
   gets R̃ = 0 — ``zero_degenerate_groups``);
2. returns: R̃ is placed on the last response token and summed backwards with discount γ
   over response tokens only, ``G_t = Σ_{k ≥ t, k valid} γ^{n(t,k)} r_k`` (γ = 1, the paper's
   setting, gives every token R̃);
3. whitening over all valid response tokens of the batch: ``A = (G − μ) / (σ + eps)``;
4. clip: ``A ← clip(A, −c, c)`` (``advantage_clip``: 2.0 in ROLL's example_reinforce_pp.yaml,
   0.2 in the FreshPER agentic configs).

Choices where the papers are silent (our defaults, all arguments):
* std is the population std (``ddof=0``) by default; ``ddof=1`` gives the sample std of
  ``torch.std``; eps = 1e-6 is added to the std (not under the square root).
* A group whose returns are all equal gets GRPO advantage 0 (numerator 0), so it contributes
  no gradient; with ``scale_by_std`` the eps keeps it finite.
* Whitening statistics are token-weighted (every valid token counts once), as REINFORCE++'s
  global normalisation over response tokens; the std is the population std over tokens.
* Multi-turn episodes: the episode return (sum of turn rewards) is the outcome; observation
  tokens between actions are not response tokens and do not advance the discount.
"""
from __future__ import annotations

from typing import Optional

import chex
import jax.numpy as jnp

from fresh_rl.corrections import reverse_linear_recurrence

DEFAULT_EPS = 1e-6


def _masked_moments(x, mask, ddof: int = 0):
    """(mean, std) of the valid entries of x (over all axes); 0 mean / 0 std if none valid."""
    x = jnp.where(mask, x, 0.0)
    count = jnp.sum(mask)
    mean = jnp.sum(x) / jnp.maximum(count, 1)
    var = jnp.sum(jnp.where(mask, jnp.square(x - mean), 0.0)) / jnp.maximum(count - ddof, 1)
    return mean, jnp.sqrt(var)


def group_normalize(returns: chex.Array, group_size: int, *, scale_by_std: bool = True,
                    eps: float = DEFAULT_EPS, ddof: int = 0,
                    zero_degenerate_groups: bool = False) -> chex.Array:
    """GRPO group normalisation of per-episode scalars ``returns [B]`` → ``[B]``.

    ``(R_i − mean_g R) / (std_g R + eps)`` over each contiguous group of ``group_size`` rows
    (``R_i − mean_g R`` if not ``scale_by_std``). ``zero_degenerate_groups`` returns 0 for a
    group with ``std == 0`` or fewer than 2 members (ROLL ``mean_std``); without it such a
    group already gets 0 since its numerator is 0, so the flag only matters for ``G = 1``.
    """
    chex.assert_rank(returns, 1)
    batch = returns.shape[0]
    if group_size < 1 or batch % group_size:
        raise ValueError(f"group_size must be >= 1 and divide the batch size {batch}, "
                         f"got {group_size}")
    grouped = returns.astype(jnp.float32).reshape(batch // group_size, group_size)
    mean = grouped.mean(axis=1, keepdims=True)
    centred = grouped - mean
    std = jnp.sqrt(jnp.sum(jnp.square(centred), axis=1, keepdims=True)
                   / max(group_size - ddof, 1))
    out = centred / (std + eps) if scale_by_std else centred
    if zero_degenerate_groups:
        out = jnp.where((std > 0) & (group_size >= 2), out, 0.0)
    return out.reshape(batch)


def batch_normalize(returns: chex.Array, *, eps: float = DEFAULT_EPS, ddof: int = 0) -> chex.Array:
    """REINFORCE++ batch normalisation ``(R − mean R) / (std R + eps)`` of ``returns [B]``."""
    chex.assert_rank(returns, 1)
    returns = returns.astype(jnp.float32)
    mean, std = _masked_moments(returns, jnp.ones(returns.shape, bool), ddof)
    return (returns - mean) / (std + eps)


def broadcast_to_tokens(sequence_values: chex.Array, mask: chex.Array) -> chex.Array:
    """Per-episode ``[B]`` values copied onto every valid token of ``mask [B, T]`` (0 elsewhere)."""
    chex.assert_rank([sequence_values, mask], [1, 2])
    return jnp.where(mask, sequence_values[:, None].astype(jnp.float32), 0.0)


def last_token_rewards(sequence_rewards: chex.Array, mask: chex.Array) -> chex.Array:
    """Token rewards ``[B, T]``: ``sequence_rewards[b]`` on row b's last valid token, else 0."""
    chex.assert_rank([sequence_rewards, mask], [1, 2])
    t = jnp.arange(mask.shape[1])
    last = jnp.max(jnp.where(mask, t[None], -1), axis=1)
    return jnp.where((t[None] == last[:, None]) & mask,
                     sequence_rewards[:, None].astype(jnp.float32), 0.0)


def discounted_token_returns(token_rewards: chex.Array, mask: chex.Array,
                             gamma: float = 1.0) -> chex.Array:
    """``G_t = r_t + γ G_{next valid}`` over valid tokens, backwards along axis 1; 0 where masked.

    Masked tokens (observations, padding) are skipped: they neither add reward nor discount.
    """
    chex.assert_rank([token_rewards, mask], 2)
    chex.assert_equal_shape([token_rewards, mask])
    offsets = jnp.where(mask, token_rewards.astype(jnp.float32), 0.0)
    decays = jnp.where(mask, jnp.float32(gamma), 1.0)
    return jnp.where(mask, reverse_linear_recurrence(offsets, decays), 0.0)


def whiten(values: chex.Array, mask: chex.Array, *, eps: float = DEFAULT_EPS,
           shift_mean: bool = True) -> chex.Array:
    """``(x − μ) / (σ + eps)`` with μ, σ (population) over the valid tokens; 0 where masked.

    ``shift_mean=False`` only rescales, ``x / (σ + eps)``.
    """
    chex.assert_equal_shape([values, mask])
    mean, std = _masked_moments(values.astype(jnp.float32), mask)
    x = jnp.where(mask, values.astype(jnp.float32), 0.0)
    out = ((x - mean) if shift_mean else x) / (std + eps)
    return jnp.where(mask, out, 0.0)


def clip_advantages(advantages: chex.Array, mask: chex.Array,
                    clip: Optional[float]) -> chex.Array:
    """``clip(A, −c, c)`` on valid tokens (``None`` or ∞: no clip); 0 where masked."""
    if clip is not None:
        advantages = jnp.clip(advantages, -clip, clip)
    return jnp.where(mask, advantages, 0.0)


def grpo_advantages(returns: chex.Array, mask: chex.Array, group_size: int, *,
                    scale_by_std: bool = True, eps: float = DEFAULT_EPS, ddof: int = 0,
                    whiten_tokens: bool = False,
                    advantage_clip: Optional[float] = None) -> chex.Array:
    """GRPO outcome advantages ``[B, T]``: group-normalised returns on every response token.

    Optional token whitening and clip (ROLL's agentic GRPO examples set
    ``whiten_advantages: true, advantage_clip: 0.2``; plain GRPO uses neither).
    """
    adv = broadcast_to_tokens(group_normalize(returns, group_size, scale_by_std=scale_by_std,
                                              eps=eps, ddof=ddof), mask)
    if whiten_tokens:
        adv = whiten(adv, mask, eps=eps)
    return clip_advantages(adv, mask, advantage_clip)


def reinforce_pp_advantages(returns: chex.Array, mask: chex.Array, *,
                            group_size: Optional[int] = None, eps: float = DEFAULT_EPS,
                            ddof: int = 0, gamma: float = 1.0, whiten_tokens: bool = True,
                            advantage_clip: Optional[float] = 2.0) -> chex.Array:
    """REINFORCE++ advantages ``[B, T]`` (steps 1–4 of the module docstring).

    ``group_size=None`` normalises the returns over the batch; an integer normalises within
    contiguous prompt groups with degenerate groups zeroed (ROLL ``mean_std``).
    """
    if group_size is None:
        normalised = batch_normalize(returns, eps=eps, ddof=ddof)
    else:
        normalised = group_normalize(returns, group_size, eps=eps, ddof=ddof,
                                     zero_degenerate_groups=True)
    adv = discounted_token_returns(last_token_rewards(normalised, mask), mask, gamma)
    if whiten_tokens:
        adv = whiten(adv, mask, eps=eps)
    return clip_advantages(adv, mask, advantage_clip)


def advantage_statistics(advantages: chex.Array, mask: chex.Array) -> dict[str, chex.Array]:
    """Mean, std, min, max and |A| mean of the valid advantages (for logging)."""
    mean, std = _masked_moments(advantages, mask)
    big = jnp.finfo(jnp.float32).max
    return {"adv_mean": mean, "adv_std": std,
            "adv_min": jnp.min(jnp.where(mask, advantages, big)),
            "adv_max": jnp.max(jnp.where(mask, advantages, -big)),
            "adv_abs_mean": _masked_moments(jnp.abs(advantages), mask)[0]}


__all__ = ["DEFAULT_EPS", "advantage_statistics", "batch_normalize", "broadcast_to_tokens",
           "clip_advantages", "discounted_token_returns", "grpo_advantages", "group_normalize",
           "last_token_rewards", "reinforce_pp_advantages", "whiten"]
