"""Replay methods of the FreshPER studies as traced settings, shared by every test bed.

A *method* says what the K extra optimizer updates after each fresh batch are, and how the
replay buffer is filled and sampled (FreshPER, arXiv 2604.16918 §3; PER, arXiv 1511.05952):

* ``extra``: ``"none"`` (on-policy, one update per batch), ``"epochs"`` (K more updates on the
  fresh batch: the matched-update control, exactly K + 1 updates per batch) or ``"replay"``
  (K updates, each on a batch sampled from the buffer).
* priority: ``"uniform"`` (every base priority 1), ``"given"`` (the bed's base priority, PER
  with τ = ∞), ``"authors"`` (new items at the running max priority and only sampled items
  refreshed, as the FreshPER authors' PER baseline runs), and FreshPER's age decay
  ``p·exp(−age/τ)`` with τ = ``tau_factor`` × the measured ESS time constant τ_fit. For the
  methods with ``tau_factor`` 1 the ``tau_fit`` argument of :func:`replay_hparams` is τ itself,
  in policy versions: a τ grid in absolute versions passes its values there.
* ``freshper_authors`` is FreshPER as its authors run it (§3 and their code's defaults): their
  PER pipeline (``per_authors``) plus the age decay. Its twin ``freshper_authors_no_decay`` is
  that pipeline at τ = ∞, row for row ``per_authors``; the ``"given"``-priority FreshPER entries
  are ablations that swap the authors' priority pipeline for the bed's base priorities.
* ``importance``: PER importance weights with exponent β, or none (β = 0).
* replay optimizer (``REPLAY_OPTIMIZERS``): replay updates share the fresh updates' Adam state
  (``"shared"``, as the authors), use a second Adam state (``"separate"``) or are plain SGD
  (``"sgd"``). Adam carries momentum: with a zero replay gradient a shared-state update still
  moves the parameters by ≈ 0.9× the previous step, so "shared" cannot separate the effect of
  the data replayed from the extra step size; "separate" and "sgd" can.

Every setting is a leaf of :class:`ReplayHParams`, so all methods of a study are rows of one
vmapped, once-compiled program. The beds call :func:`insert`, :func:`refresh` and
:func:`apply_update` with their own base priorities and optimizers.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp
import optax
from flax import struct

from fresh_rl.replay.buffer import ReplayState, TrajectoryBuffer
from fresh_rl.validation import require_choice, require_in_range

EXTRAS = ("none", "epochs", "replay")
REPLAY_OPTIMIZERS = ("shared", "separate", "sgd")
UPDATE_NONE, UPDATE_FRESH, UPDATE_REPLAY = 0, 1, 2


@struct.dataclass
class ReplayHParams:
    """Traced replay settings of one run (scalars; a leading grid axis under ``vmap``).

    Attributes:
      extra: index into ``EXTRAS`` of what the K extra updates are.
      age_decay_tau: FreshPER τ in policy versions (``inf``: no decay, i.e. PER / uniform).
      importance_exponent: β of the PER weights (0: no IS correction).
      uniform_priority: every base priority is 1 (uniform replay through the same tree).
      insert_at_max: new items get the running max priority (the authors' PER rule).
      refresh: sampled items get their priority rewritten after a replay update.
      replay_optimizer: index into ``REPLAY_OPTIMIZERS``.
    """

    extra: jax.Array
    age_decay_tau: jax.Array
    importance_exponent: jax.Array
    uniform_priority: jax.Array
    insert_at_max: jax.Array
    refresh: jax.Array
    replay_optimizer: jax.Array


HPARAM_DTYPES = {"extra": jnp.int32, "age_decay_tau": jnp.float32,
                 "importance_exponent": jnp.float32, "uniform_priority": bool,
                 "insert_at_max": bool, "refresh": bool, "replay_optimizer": jnp.int32}


@dataclasses.dataclass(frozen=True)
class ReplayMethod:
    """One entry of ``REPLAY_METHODS``; ``tau_factor`` multiplies the measured τ_fit."""

    name: str
    extra: str
    priority: Literal["uniform", "given", "authors"] = "given"
    tau_factor: float = math.inf
    importance: bool = True
    description: str = ""


REPLAY_METHODS: dict[str, ReplayMethod] = {m.name: m for m in (
    ReplayMethod("onpolicy", "none", description="1 update per fresh batch"),
    ReplayMethod("onpolicy_epochs", "epochs", description="1 + K epochs on each fresh batch"),
    ReplayMethod("uniform", "replay", "uniform", description="1 fresh + K uniform replay updates"),
    ReplayMethod("per_authors", "replay", "authors",
                 description="PER as the authors run it: new at max priority, sampled refreshed"),
    ReplayMethod("per_given", "replay", "given", description="PER with the given priorities"),
    ReplayMethod("freshper_0.3", "replay", "given", 0.3, description="FreshPER, τ = 0.3 τ_fit"),
    ReplayMethod("freshper_1", "replay", "given", 1.0, description="FreshPER, τ = τ_fit"),
    ReplayMethod("freshper_3", "replay", "given", 3.0, description="FreshPER, τ = 3 τ_fit"),
    ReplayMethod("freshper_1_no_is", "replay", "given", 1.0, importance=False,
                 description="FreshPER, τ = τ_fit, without IS weights"),
    ReplayMethod("freshper_authors", "replay", "authors", 1.0,
                 description="FreshPER as its authors run it: per_authors + age decay, τ = τ_fit"),
    ReplayMethod("freshper_authors_no_decay", "replay", "authors",
                 description="freshper_authors at τ = ∞: the same settings as per_authors"),
)}


def replay_hparams(method: str, tau_fit: float = math.inf, replay_optimizer: str = "shared",
                   importance_exponent: float = 0.4) -> dict:
    """Scalar :class:`ReplayHParams` values of one registry method (field → value)."""
    require_choice("method", method, tuple(REPLAY_METHODS))
    require_choice("replay_optimizer", replay_optimizer, REPLAY_OPTIMIZERS)
    require_in_range("tau_fit", tau_fit, 0.0, math.inf, low_inclusive=False)
    require_in_range("importance_exponent", importance_exponent, 0.0, 1.0)
    m = REPLAY_METHODS[method]
    return {"extra": EXTRAS.index(m.extra), "age_decay_tau": float(m.tau_factor * tau_fit),
            "importance_exponent": float(importance_exponent if m.importance else 0.0),
            "uniform_priority": m.priority == "uniform", "insert_at_max": m.priority == "authors",
            "refresh": m.priority == "authors",
            "replay_optimizer": REPLAY_OPTIMIZERS.index(replay_optimizer)}


def stack_replay_hparams(rows) -> ReplayHParams:
    """``ReplayHParams`` with a leading axis from :func:`replay_hparams` dicts (extra keys ignored)."""
    rows = list(rows)
    return ReplayHParams(**{name: jnp.asarray([r[name] for r in rows], dtype)
                            for name, dtype in HPARAM_DTYPES.items()})


def update_kind(hp: ReplayHParams) -> jax.Array:
    """Kind of the K extra updates: ``UPDATE_NONE``, ``UPDATE_FRESH`` (epochs) or ``UPDATE_REPLAY``."""
    return jnp.where(hp.extra == EXTRAS.index("none"), UPDATE_NONE,
                     jnp.where(hp.extra == EXTRAS.index("replay"), UPDATE_REPLAY, UPDATE_FRESH))


def insert(buffer: TrajectoryBuffer, hp: ReplayHParams, replay: ReplayState, items,
           version, priorities: jax.Array) -> ReplayState:
    """Adds a fresh batch with base ``priorities``; 1 under ``hp.uniform_priority``, the running
    max priority under ``hp.insert_at_max`` (the authors' PER rule)."""
    priorities = jnp.where(hp.uniform_priority, 1.0, priorities)
    priorities = jnp.where(hp.insert_at_max, replay.max_priority, priorities)
    return buffer.add(replay, items, version, priorities)


def refresh(buffer: TrajectoryBuffer, hp: ReplayHParams, replay: ReplayState, indices,
            priorities: jax.Array) -> ReplayState:
    """With ``hp.refresh`` rewrites the priorities of the sampled ``indices`` only; otherwise
    returns ``replay`` unchanged."""
    refreshed = buffer.set_priorities(replay, indices, priorities)
    return jax.tree.map(lambda r, o: jnp.where(hp.refresh, r, o), refreshed, replay)


def apply_update(hp: ReplayHParams, optimizer: optax.GradientTransformation,
                 sgd: optax.GradientTransformation, params, opt_state, replay_opt_state, grads,
                 kind):
    """One optimizer update of ``kind``: ``UPDATE_NONE`` (parameters and states unchanged),
    ``UPDATE_FRESH`` (``optimizer`` with the shared state ``opt_state``) or ``UPDATE_REPLAY``
    (by ``hp.replay_optimizer``: ``optimizer`` with the shared state, with
    ``replay_opt_state``, or the stateless ``sgd``). Returns ``(params, opt_state,
    replay_opt_state)``; only the state that was used changes."""
    which = jnp.where(kind == UPDATE_REPLAY, hp.replay_optimizer, 0)
    use_separate = which == REPLAY_OPTIMIZERS.index("separate")
    use_sgd = which == REPLAY_OPTIMIZERS.index("sgd")
    state = jax.tree.map(lambda r, o: jnp.where(use_separate, r, o), replay_opt_state, opt_state)
    updates, state = optimizer.update(grads, state, params)
    sgd_updates, _ = sgd.update(grads, sgd.init(params), params)
    updates = jax.tree.map(lambda s, a: jnp.where(use_sgd, s, a), sgd_updates, updates)
    new_params = jax.tree.map(lambda p, n: jnp.where(kind == UPDATE_NONE, p, n), params,
                              optax.apply_updates(params, updates))
    keep_shared = (kind == UPDATE_NONE) | use_sgd | use_separate
    opt_state = jax.tree.map(lambda o, a: jnp.where(keep_shared, o, a), opt_state, state)
    replay_opt_state = jax.tree.map(lambda o, a: jnp.where(use_separate, a, o),
                                    replay_opt_state, state)
    return new_params, opt_state, replay_opt_state


__all__ = ["EXTRAS", "HPARAM_DTYPES", "REPLAY_METHODS", "REPLAY_OPTIMIZERS", "ReplayHParams",
           "ReplayMethod", "UPDATE_FRESH", "UPDATE_NONE", "UPDATE_REPLAY", "apply_update",
           "insert", "refresh", "replay_hparams", "stack_replay_hparams", "update_kind"]
