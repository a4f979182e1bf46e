"""The traced hyperparameters of the LLM trainers: one pytree per run, held in its state.

:class:`LLMHyperParams` carries every sweepable value that does not fix a shape or the
program's structure, as float32 / int32 leaves:

* ``window`` w ∈ [0, W] — the staleness window of the asynchronous pipeline (the ring holds
  ``AsyncConfig.staleness_window`` + 1 = W + 1 versions, which fixes shapes; w does not);
* ``ewma_beta`` β ∈ [0, 1] — the EWMA decay of θ_ref (EWMA routes; default ``AsyncConfig.beta``:
  ā/(ā + 1) at the data's mean lag ā, w/(w + 1) for a fixed lag);
* ``ewma_reset_threshold`` ∈ (0, 1) — the active-token fraction below which ``ewma`` resets;
* ``age_decay_tau`` τ ∈ (0, ∞] — FreshPER's age decay in iterations (∞ = standard PER; the
  replay trainer writes it into its buffer, which keeps α/τ as its own leaf; every τ the
  trainer logs is read from here).

Configs (:class:`~fresh_rl.llm.async_pipeline.AsyncConfig`,
:class:`~fresh_rl.llm.replay_trainer.LLMReplayConfig`) keep what fixes shapes or the program
plus the *defaults* of these values; :meth:`LLMHyperParams.from_config` builds the pytree
from them, overriding any field, and validates on the host (``ValueError`` naming the field
and its allowed range). A sweep stacks several of them (one per row of a vmapped run) with
:meth:`LLMHyperParams.stack`; one compiled iteration serves every value. The state holds it
as ``state.hparams`` (:class:`~fresh_rl.llm.async_pipeline.AsyncState`; the replay trainer's
state exposes its pipeline's).

The learning rate stays in :class:`~fresh_rl.llm.trainer.RLConfig` (static).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


FIELDS = ("window", "ewma_beta", "ewma_reset_threshold", "age_decay_tau")


@flax.struct.dataclass
class LLMHyperParams:
    """Traced hyperparameters of one run (module docstring); leaves may carry leading
    (seed / sweep) axes."""

    window: jax.Array  # int32
    ewma_beta: jax.Array  # float32
    ewma_reset_threshold: jax.Array  # float32
    age_decay_tau: jax.Array  # float32, inf = no age decay

    @classmethod
    def from_config(cls, async_config, replay_config=None, *, window: Optional[int] = None,
                    ewma_beta: Optional[float] = None,
                    ewma_reset_threshold: Optional[float] = None,
                    age_decay_tau: Optional[float] = None) -> "LLMHyperParams":
        """The hyperparameters of a run: each field from its argument, else the config's
        default — ``window`` = W, ``ewma_beta`` = ``AsyncConfig.beta(window)`` (the config's β, else
        its rule: w/(w + 1) at a fixed lag by default),
        ``ewma_reset_threshold`` = ``AsyncConfig.ewma_reset_threshold``, ``age_decay_tau`` =
        ``LLMReplayConfig.age_decay_tau`` with ``sampling="freshper"``, else ∞ (no decay).
        Raises ``ValueError`` naming the field and its allowed range."""
        limit = async_config.staleness_window
        window = limit if window is None else window
        if isinstance(window, bool) or not isinstance(window, (int, np.integer)) \
                or not 0 <= window <= limit:
            raise ValueError(f"window must be in [0, {limit}] (AsyncConfig.staleness_window), "
                             f"got {window!r}")
        window = int(window)
        if ewma_beta is None:
            ewma_beta = async_config.beta(window)
        if ewma_reset_threshold is None:
            ewma_reset_threshold = async_config.ewma_reset_threshold
        freshper = replay_config is not None and replay_config.sampling == "freshper"
        if age_decay_tau is None:
            age_decay_tau = replay_config.age_decay_tau if freshper else math.inf
        elif not freshper and age_decay_tau != math.inf:
            raise ValueError(f"age_decay_tau needs LLMReplayConfig(sampling='freshper') "
                             f"(standard PER and uniform replay have τ = inf), got "
                             f"{age_decay_tau!r}")
        hparams = cls(window=jnp.asarray(window, jnp.int32),
                      ewma_beta=jnp.asarray(ewma_beta, jnp.float32),
                      ewma_reset_threshold=jnp.asarray(ewma_reset_threshold, jnp.float32),
                      age_decay_tau=jnp.asarray(age_decay_tau, jnp.float32))
        hparams.validate(limit)
        return hparams

    def validate(self, staleness_window: int) -> "LLMHyperParams":
        """Host check of concrete values (any leading axes); returns ``self``."""
        def values(name):
            return np.asarray(jax.device_get(getattr(self, name)))

        window = values("window")
        if not np.all((window >= 0) & (window <= staleness_window)):
            raise ValueError(f"LLMHyperParams.window must be in [0, {staleness_window}], "
                             f"got {window}")
        for name, ok, allowed in (
                ("ewma_beta", lambda v: (v >= 0) & (v <= 1), "[0, 1]"),
                ("ewma_reset_threshold", lambda v: (v > 0) & (v < 1), "(0, 1)"),
                ("age_decay_tau", lambda v: v > 0, "(0, inf]")):
            value = values(name)
            if not np.all(ok(value)):  # NaN fails every comparison
                raise ValueError(f"LLMHyperParams.{name} must be in {allowed}, got {value}")
        return self

    @staticmethod
    def stack(rows: Sequence["LLMHyperParams"]) -> "LLMHyperParams":
        """One pytree with a leading axis of ``len(rows)`` (a sweep's rows)."""
        return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *rows)


__all__ = ["FIELDS", "LLMHyperParams"]
