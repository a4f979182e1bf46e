"""Trajectory replay buffer: uniform, prioritized (PER) and age-decayed prioritized (FreshPER).

Pure functions over a pytree ``ReplayState``; ``make_trajectory_buffer(config)`` returns them.
Everything works under ``jit``, ``vmap`` (one buffer per seed) and ``donate_argnums``.

Sampling probabilities (FreshPER, arXiv 2604.16918; PER, Schaul et al. 2016)::

    p_i(t) = p_i^base · exp(−(t − t_i)/τ)            age-decayed priority
    P(i)   = p_i(t)^α / Σ_k p_k(t)^α                 sampling probability
    w_i    = (N·P(i))^(−β) / max_j (N·P(j))^(−β)     importance weight

**Exact decay at O(log N).** ``exp(−α t/τ)`` is common to every item and cancels in ``P(i)``, in
stratified sampling and in the normalised weights. The tree therefore stores the
time-invariant key ``u_i = (p_i^base)^α · exp(α (t_i − t_ref)/τ)``, written once when an item
is inserted or its priority changes: no per-step refresh of all N leaves (the authors'
implementation rescans the buffer every step). ``t_ref`` is rebased (one O(N) pass that
recomputes every key from its stored base priority and version) before the exponent
``α (t − t_ref)/τ`` can exceed ``config.rebase_exponent``. Standard PER is the same buffer with
τ = ∞.

**Age unit.** ``t`` is the policy version (number of learner updates that produced the
behaviour policy), the unit of the lag simulator; τ is in the same unit. FreshPER's code counts
outer pipeline iterations; rescale τ if your version clock ticks differently.

**Importance-weight normaliser.** ``"buffer"`` (default; Schaul et al., and the authors' code
via a min-tree) divides by the largest weight over all sampleable items, tracked by a second
tree column holding the min of ``log u_i`` (log space, so decayed keys never underflow to 0
there); ``"batch"`` divides by the largest weight in the sampled batch and keeps only the sum
column (about half the memory traffic per write, see ``benchmarks/replay_bench.py``). Items of zero priority cannot be sampled and are
left out of the min. β may be passed per call (e.g. ``optax.linear_schedule(0.4, 1.0, n)``
for the annealing the FreshPER README mentions; the authors' code keeps β constant).

**Floor on the decayed priority** (``min_decayed_priority`` = f, default 1e-8, the authors'
value; 0 turns it off). An item of positive base priority is sampled with
``q_i(t) = max(p_i^base · exp(−(t − t_i)/τ), f)`` in place of the decayed priority, so one very old
item cannot set the buffer-wide weight normaliser near 0 and zero every sampled weight (without
it, one item of age 1e5 at τ = 100 makes ``exp(−β(log u_i − log u_min))`` underflow to 0 for
every sampled item). The floor is evaluated at the buffer's clock ``t = latest_version`` (the
newest inserted version), the "now" of every key. In key space it is the common threshold
``F(t) = f^α · exp(α (t − t_ref)/τ)``, so ``max(u_i, F(t))`` is exact at O(log N): the *floored*
items (key below F(t)) leave the tree (their sum and min leaves hold the identities) and join a
:class:`~fresh_rl.replay.slot_set.SlotSet`. The sampling mass is ``S + F(t)·n_f`` (S the tree's
sum, n_f the floored count); a stratified target below S descends the tree, one above it picks
floored member ``⌊(target − S)/F(t)⌋`` with one gather, so each floored item has mass F(t) and
the tree keeps two columns (a per-node count of floored items would be a third that every
write and every descent moves). The normaliser's log-min is ``log F(t)`` when any item is
floored. F(t) only grows with t while a stored key never changes until it is rewritten,
so an item crosses the threshold at most once per write: after every ``add`` the items whose key
fell below F(t) are moved to the floored set one by one, each found by a min-tree descent
(O(log N) per crossing, no O(N) scan); ``set_priorities`` and rebases classify the
items they write directly. (Clamping only at rebase time would be O(N) and inexact between
rebases; rewriting every leaf each step, as the authors' code does, is O(N) per step.) Zero base
priority still means "never sampled" (our choice: the floor applies to positive priorities).

**New items** get the running maximum base priority (decayed like every other item from
their insertion version), the standard PER rule; ``new_item_priority="given"`` uses the
priorities passed to ``add`` instead (e.g. ``|reward| + ε``).

**Bad input.** Configuration errors raise ``ValueError`` at construction. Data errors (NaN or
negative priority, index out of range or of an empty slot, sample batch larger than the valid
items, no item of positive priority, τ outside (0, ∞], β outside [0, 1], negative versions)
raise ``ValueError`` when called eagerly, and under ``jit`` either become ``checkify`` errors
(``jit_checks=True`` or :func:`fresh_rl.checked`) or fall back safely: invalid priority writes
and τ values are skipped and counted in ``state.num_rejected_writes``; an unsatisfiable sample
(including one from a buffer whose priorities are all 0) returns ``mask=False`` and finite
zero probabilities and weights for every row, so a loss weighted by them is a no-op; negative
versions and β have no fallback (checked only under the switch). An empty ``add`` batch and
non-integer (float) versions or indices raise ``ValueError`` (dtypes and shapes are static,
so also under ``jit``).

**Tree.** The priority tree is K-ary (``ReplayConfig.tree_fanout``, see
:mod:`fresh_rl.replay.segment_tree`): a sample reads one row of K children per level, depth
⌈log_K N⌉.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Literal

import chex
import jax
import jax.numpy as jnp
from flax import struct

from fresh_rl.replay import segment_tree, slot_set
from fresh_rl.validation import (check, check_in_range, is_traced, require_choice, require_in_range,
                                 require_int)

SamplingMode = Literal["uniform", "per", "freshper"]


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    """Static configuration of a trajectory buffer.

    Attributes:
      capacity: number of trajectories stored; FIFO eviction beyond it.
      sample_batch_size: trajectories per ``sample`` call.
      sampling: "uniform", "per" (no decay) or "freshper" (age-decayed priorities).
      priority_exponent: α ∈ [0, 1] (FreshPER uses 0.6).
      importance_exponent: default β ∈ [0, 1] (FreshPER uses 0.4); ``sample`` may override.
      age_decay_tau: τ > 0 in policy versions, used by "freshper" (FreshPER default 500;
        FrozenLake 1000). Half-life of the sampling probability is τ·ln2/α.
      new_item_priority: "max" (running max base priority, standard PER) or "given".
      importance_weight_normalization: "buffer" (max weight over the buffer) or "batch".
      rebase_exponent: rebase t_ref when α(t − t_ref)/τ would exceed this (float32 headroom:
        e^30·N·max p^α must stay below 3.4e38). Our choice; any value in (0, 60] is safe for
        N ≤ 2^24 and priorities ≤ 1e6.
      min_decayed_priority: f ≥ 0, floor on the decayed priority ``p_i·exp(−age/τ)`` of items
        with positive base priority (module docstring); 1e-8 is the authors' value; 0 turns it
        off. Prioritized modes only (standard PER floors ``p_i`` itself).
      jit_checks: traced data checks become ``checkify`` checks instead of the safe fallback.
      tree_fanout: K, children per node of the priority tree (a power of two in
        ``segment_tree.FANOUTS``); depth ⌈log_K N⌉. Changes speed only: every node holds the
        same float for any K, so probabilities and weights are identical (a sampled index
        can differ only for a target within rounding of a boundary). The default is the
        fastest in the K sweep of ``benchmarks/replay_bench.py`` on CPU.
    """

    capacity: int
    sample_batch_size: int
    sampling: SamplingMode = "freshper"
    priority_exponent: float = 0.6
    importance_exponent: float = 0.4
    age_decay_tau: float = 500.0
    new_item_priority: Literal["max", "given"] = "max"
    importance_weight_normalization: Literal["buffer", "batch"] = "buffer"
    rebase_exponent: float = 30.0
    min_decayed_priority: float = 1e-8
    jit_checks: bool = False
    tree_fanout: int = segment_tree.DEFAULT_FANOUT

    def __post_init__(self):
        # NumPy / JAX integers are stored as Python ints (the config is a static jit argument)
        object.__setattr__(self, "capacity", require_int("capacity", self.capacity, 1))
        object.__setattr__(self, "sample_batch_size", require_int(
            "sample_batch_size", self.sample_batch_size, 1, self.capacity))
        require_choice("sampling", self.sampling, ("uniform", "per", "freshper"))
        require_in_range("priority_exponent", self.priority_exponent, 0.0, 1.0)
        require_in_range("importance_exponent", self.importance_exponent, 0.0, 1.0)
        require_in_range("age_decay_tau", self.age_decay_tau, 0.0, math.inf, low_inclusive=False)
        require_in_range("rebase_exponent", self.rebase_exponent, 0.0, 60.0, low_inclusive=False)
        require_in_range("min_decayed_priority", self.min_decayed_priority, 0.0, math.inf,
                         high_inclusive=False)
        require_choice("new_item_priority", self.new_item_priority, ("max", "given"))
        require_choice(
            "importance_weight_normalization", self.importance_weight_normalization,
            ("buffer", "batch"),
        )
        require_choice("tree_fanout", self.tree_fanout, segment_tree.FANOUTS)

    @property
    def prioritized(self) -> bool:
        return self.sampling != "uniform"

    @property
    def decay_rate(self) -> float:
        """α/τ: log-key growth per policy version (0 for uniform and standard PER)."""
        return self.priority_exponent / self.age_decay_tau if self.sampling == "freshper" else 0.0

    @property
    def floored(self) -> bool:
        """Whether the buffer tracks items floored at ``min_decayed_priority`` (``state.floored``)."""
        return self.prioritized and self.min_decayed_priority > 0

    @property
    def decays(self) -> bool:
        """Whether keys carry an age term (FreshPER with a finite τ, set now or later)."""
        return self.sampling == "freshper"


@struct.dataclass
class ReplayState:
    """Buffer contents and priority trees. Leading axis of every per-item field: capacity.

    Attributes:
      experience: pytree of ``[capacity, ...]`` arrays (whole trajectories, e.g. ``[C, T, ...]``).
      insert_version: ``[C]`` int32 policy version t_i that generated each item.
      base_priority: ``[C]`` float32 p_i^base (before decay and exponent).
      valid: ``[C]`` bool, slot holds an item.
      write_position: next FIFO slot.
      num_valid: number of stored items.
      latest_version: largest version inserted so far (the default "now" for ages).
      max_priority: running max of base priorities (priority of new items under "max").
      reference_version: t_ref of the stored keys.
      priority_tree: K-ary segment tree (``config.tree_fanout``); column 0 sums u_i
        (sampling); with "buffer" weight normalisation or a floor, column 1 takes the min of
        log u_i (+inf for empty, zero-priority and floored slots), the normaliser of the
        importance weights.
      floored: the slots floored at ``min_decayed_priority`` (their tree leaves hold 0 and
        +inf; an unused 1-slot set without a floor).
      num_rejected_writes: invalid priority writes (and traced τ) skipped by the jit fallback.
      decay_rate: float32 α/τ of the stored keys (``config.decay_rate`` at init; changed only
        by ``set_age_decay_tau``, which rebuilds the keys).
    """

    experience: Any
    insert_version: jax.Array
    base_priority: jax.Array
    valid: jax.Array
    write_position: jax.Array
    num_valid: jax.Array
    latest_version: jax.Array
    max_priority: jax.Array
    reference_version: jax.Array
    priority_tree: segment_tree.SegmentTree
    floored: slot_set.SlotSet
    num_rejected_writes: jax.Array
    decay_rate: jax.Array


@struct.dataclass
class ReplaySample:
    """A sampled batch of trajectories.

    Attributes:
      indices: ``[B]`` slots (pass to ``set_priorities``).
      experience: pytree of ``[B, ...]``.
      probabilities: ``[B]`` P(i).
      importance_weights: ``[B]`` normalised w_i (1 for uniform sampling; 0 where ``mask`` is False).
      insert_version: ``[B]`` t_i.
      age: ``[B]`` current_version − t_i.
      mask: ``[B]`` bool, False only under the jit fallback for an unsatisfiable request
        (fewer valid items than B, or no item of positive priority).
    """

    indices: jax.Array
    experience: Any
    probabilities: jax.Array
    importance_weights: jax.Array
    insert_version: jax.Array
    age: jax.Array
    mask: jax.Array


@dataclasses.dataclass(frozen=True)
class TrajectoryBuffer:
    """Pure functions of one buffer configuration (see ``make_trajectory_buffer``)."""

    config: ReplayConfig
    init: Callable[..., ReplayState]
    add: Callable[..., ReplayState]
    sample: Callable[..., ReplaySample]
    set_priorities: Callable[..., ReplayState]
    can_sample: Callable[[ReplayState], jax.Array]
    rebase: Callable[..., ReplayState]
    sampling_probabilities: Callable[[ReplayState], jax.Array]
    set_age_decay_tau: Callable[..., ReplayState]


# --------------------------------------------------------------------------------------------
# Keys


def _log_keys(config: ReplayConfig, base_priority, insert_version, reference_version,
              decay_rate):
    """log u_i = α log p_i^base + (α/τ)(t_i − t_ref); −inf for zero priority."""
    log_priority = config.priority_exponent * jnp.log(base_priority)
    if config.priority_exponent == 0.0:
        log_priority = jnp.where(base_priority > 0, 0.0, -jnp.inf)
    age_term = decay_rate * (insert_version - reference_version).astype(jnp.float32)
    return log_priority + age_term


def _tree_columns(config: ReplayConfig) -> tuple[str, ...]:
    """Sum of u_i (sampling), plus min of log u_i for buffer-wide weight normalisation or the
    floor (its trigger: the items whose key fell below F(t) are found by min descents)."""
    if config.floored or config.importance_weight_normalization == "buffer":
        return ("sum", "min")
    return ("sum",)


def _log_floor(config: ReplayConfig, state: ReplayState):
    """log F(t) = α log f + (α/τ)(t − t_ref) at t = ``latest_version``: the floor in key space."""
    return (config.priority_exponent * math.log(config.min_decayed_priority)
            + state.decay_rate * (state.latest_version - state.reference_version).astype(
                jnp.float32))


def _below_floor(log_keys, valid, log_floor):
    """Items of positive key below F(t): they are floored (never zero-priority ones)."""
    return valid & jnp.isfinite(log_keys) & (log_keys < log_floor)


def _tree_leaves_from_log_keys(config: ReplayConfig, log_keys, valid, floored=None):
    """``[..., C]`` leaves: u_i (and log u_i), identities for empty, zero-priority and
    ``floored`` slots."""
    in_tree = valid if floored is None else valid & ~floored
    sum_leaves = jnp.where(in_tree, jnp.exp(log_keys), 0.0)
    if len(_tree_columns(config)) == 1:
        return sum_leaves[..., None]
    min_leaves = jnp.where(in_tree & jnp.isfinite(log_keys), log_keys, jnp.inf)
    return jnp.stack([sum_leaves, min_leaves], axis=-1)


def _apply_floor(config: ReplayConfig, state: ReplayState) -> ReplayState:
    """Moves every item whose key fell below F(latest_version) into the floored set: one
    min-tree descent and one leaf write each (O(log N) per crossing). No O(N) rebuild past
    some number of crossings: under ``vmap`` a ``lax.cond`` computes both branches, so every
    add of a vmapped buffer would pay the rebuild."""
    if not config.floored:
        return state
    return _floor_loop(config, state)


@functools.partial(jax.jit, static_argnums=0)
def _floor_loop(config: ReplayConfig, state: ReplayState) -> ReplayState:
    """The loop of ``_apply_floor``, jitted on the static config: its body closes over this
    call's floor, so an eager ``add`` would otherwise trace and compile a new loop every call
    (under an outer ``jit`` the inner one is inlined)."""
    log_floor = _log_floor(config, state)
    floored_leaf = jnp.asarray([[0.0, jnp.inf]], jnp.float32)
    one = jnp.ones((1,), bool)

    def below(carry):
        return carry[0].columns[1][0] < log_floor

    def move(carry):
        tree, floored = carry
        index = segment_tree.argmin(tree, 1)[None]
        return (segment_tree.write(tree, index, floored_leaf, indices_are_unique=True),
                slot_set.insert(floored, index, one))

    tree, floored = jax.lax.while_loop(below, move, (state.priority_tree, state.floored))
    return state.replace(priority_tree=tree, floored=floored)


# --------------------------------------------------------------------------------------------
# Operations


def _init(config: ReplayConfig, example_trajectory: Any) -> ReplayState:
    """Empty buffer shaped after one trajectory (a pytree without the capacity axis)."""
    capacity = config.capacity
    experience = jax.tree.map(
        lambda x: jnp.zeros((capacity, *jnp.shape(x)), jnp.asarray(x).dtype), example_trajectory
    )
    tree_capacity = capacity if config.prioritized else 1
    return ReplayState(
        experience=experience,
        insert_version=jnp.zeros((capacity,), jnp.int32),
        base_priority=jnp.zeros((capacity,), jnp.float32),
        valid=jnp.zeros((capacity,), bool),
        write_position=jnp.zeros((), jnp.int32),
        num_valid=jnp.zeros((), jnp.int32),
        latest_version=jnp.zeros((), jnp.int32),
        max_priority=jnp.ones((), jnp.float32),
        reference_version=jnp.zeros((), jnp.int32),
        priority_tree=segment_tree.init(tree_capacity, _tree_columns(config),
                                        config.tree_fanout),
        # Without a floor a 1-slot placeholder, as the uniform buffer's 1-leaf tree: array
        # checkpointers cannot save zero-size arrays.
        floored=slot_set.init(capacity if config.floored else 1),
        num_rejected_writes=jnp.zeros((), jnp.int32),
        decay_rate=jnp.asarray(config.decay_rate, jnp.float32),
    )


def _rebase(config: ReplayConfig, state: ReplayState, reference_version) -> ReplayState:
    """Recomputes every key against a new t_ref and rebuilds both trees (O(N)).

    Probabilities and weights are unchanged (the common factor cancels); only the float range
    of the stored keys moves. Keys are recomputed from base priorities, not rescaled, so
    rebasing accumulates no rounding.
    """
    if not config.prioritized:
        return state
    reference_version = jnp.asarray(reference_version, jnp.int32)
    log_keys = _log_keys(config, state.base_priority, state.insert_version, reference_version,
                         state.decay_rate)
    state = state.replace(reference_version=reference_version)
    floored = None
    if config.floored:
        floored = _below_floor(log_keys, state.valid, _log_floor(config, state))
        state = state.replace(floored=slot_set.from_mask(floored))
    return state.replace(
        priority_tree=segment_tree.build(
            _tree_leaves_from_log_keys(config, log_keys, state.valid, floored),
            _tree_columns(config), config.tree_fanout,
        ),
    )


def _write_keys(
    config, state: ReplayState, slots, base_priority, insert_version, write_mask
) -> ReplayState:
    """Writes the keys of items ``slots`` (priority ``base_priority``, version
    ``insert_version``) into the tree. Unmasked ``slots`` must be distinct (callers resolve
    duplicates first)."""
    log_keys = _log_keys(config, base_priority, insert_version, state.reference_version,
                         state.decay_rate)
    floored = None
    if config.floored:
        # Each written item joins or leaves the floored set by its new key.
        # No lax.cond to skip the O(B) set update when no item crosses: XLA copies the set's
        # [N] arrays inside a cond branch, so crossing writes (most adds once the buffer wraps
        # over floored items) would pay O(N).
        floored = _below_floor(log_keys, write_mask, _log_floor(config, state))
        was_floored = slot_set.contains(state.floored, slots)
        members = slot_set.remove(state.floored, slots, write_mask & was_floored & ~floored)
        members = slot_set.insert(members, slots, floored & ~was_floored)
        state = state.replace(floored=members)
    tree_leaves = _tree_leaves_from_log_keys(config, log_keys, jnp.ones_like(write_mask),
                                             floored)
    return state.replace(
        priority_tree=segment_tree.write(
            state.priority_tree, slots, tree_leaves, write_mask, indices_are_unique=True
        )
    )


def _integers(name: str, values) -> jax.Array:
    """``values`` as int32; ``ValueError`` naming ``name`` for a non-integer dtype (static, so
    also under ``jit``: a float is never truncated to a slot or version)."""
    values = jnp.asarray(values)
    if not jnp.issubdtype(values.dtype, jnp.integer):
        raise ValueError(f"{name} must be integers, got dtype {values.dtype}")
    return values.astype(jnp.int32)


def _priorities_ok(priorities):
    return jnp.isfinite(priorities) & (priorities >= 0)


def _add(
    config: ReplayConfig,
    state: ReplayState,
    trajectories: Any,
    versions,
    priorities: jax.Array | None = None,
) -> ReplayState:
    """Inserts a batch of trajectories (leading axis B ≤ capacity) at the FIFO write position.

    Args:
      trajectories: pytree of ``[B, ...]`` arrays shaped like the buffer's example.
      versions: scalar or ``[B]`` int policy version that generated each trajectory.
      priorities: ``[B]`` base priorities; required iff ``new_item_priority == "given"``.
    """
    batch_leaves = jax.tree.leaves(trajectories)
    batch_size = batch_leaves[0].shape[0] if batch_leaves and jnp.ndim(batch_leaves[0]) else 0
    if not 1 <= batch_size <= config.capacity:
        raise ValueError(
            f"add: trajectories must hold a batch of size in [1, capacity={config.capacity}] "
            f"along the leading axis, got {batch_size}"
        )
    chex.assert_trees_all_equal_structs(trajectories, state.experience)
    jax.tree.map(
        lambda x, buf: chex.assert_shape(x, (batch_size, *buf.shape[1:])),
        trajectories,
        state.experience,
    )
    versions = jnp.broadcast_to(_integers("add: versions", versions), (batch_size,))
    check(jnp.all(versions >= 0), "add: versions must be integers >= 0 (got a negative version)",
          config.jit_checks)
    slots = (state.write_position + jnp.arange(batch_size, dtype=jnp.int32)) % config.capacity

    experience = jax.tree.map(lambda buf, x: buf.at[slots].set(x), state.experience, trajectories)
    state = state.replace(
        experience=experience,
        insert_version=state.insert_version.at[slots].set(versions),
        valid=state.valid.at[slots].set(True),
        write_position=(state.write_position + batch_size) % config.capacity,
        num_valid=jnp.minimum(state.num_valid + batch_size, config.capacity),
        latest_version=jnp.maximum(state.latest_version, jnp.max(versions)),
    )
    if not config.prioritized:
        return state

    if config.new_item_priority == "given":
        if priorities is None:
            raise ValueError("add: priorities are required when new_item_priority='given'")
        priorities = jnp.asarray(priorities, jnp.float32)
        chex.assert_shape(priorities, (batch_size,))
        ok = _priorities_ok(priorities)
        check(jnp.all(ok), "add: priorities must be finite and >= 0 (got NaN, inf or < 0)",
              config.jit_checks)
        # Fallback: an invalid priority is replaced by the running max (the PER default).
        new_priority = jnp.where(ok, priorities, state.max_priority)
        state = state.replace(
            max_priority=jnp.maximum(state.max_priority, jnp.max(new_priority)),
            num_rejected_writes=state.num_rejected_writes + jnp.sum(~ok).astype(jnp.int32),
        )
    else:
        new_priority = jnp.broadcast_to(state.max_priority, (batch_size,))
    state = state.replace(base_priority=state.base_priority.at[slots].set(new_priority))

    if config.decays:
        newest = jnp.max(versions)
        overflow = state.decay_rate * (newest - state.reference_version) > config.rebase_exponent
        state = _rebase_if(config, state, overflow, newest)
    state = _write_keys(config, state, slots, new_priority, versions, jnp.ones((batch_size,), bool))
    return _apply_floor(config, state)


@functools.partial(jax.jit, static_argnums=0)
def _rebase_if(config: ReplayConfig, state: ReplayState, overflow, reference_version):
    """``_rebase`` to ``reference_version`` when ``overflow``; jitted on the static config so
    an eager ``add`` reuses one compiled ``cond`` instead of building its branches anew."""
    return jax.lax.cond(overflow, lambda s: _rebase(config, s, reference_version),
                        lambda s: s, state)


def _sampling_probabilities(config: ReplayConfig, state: ReplayState) -> jax.Array:
    """``[C]`` P(i) of every slot (O(N); for tests, diagnostics and plots, not the hot path)."""
    if not config.prioritized:
        return jnp.where(state.valid, 1.0 / jnp.maximum(state.num_valid, 1), 0.0)
    leaves = segment_tree.leaves(state.priority_tree)
    if not config.floored:
        return leaves[:, 0] / segment_tree.total(state.priority_tree)[0]
    floor_key, mass = _floor_key_and_mass(config, state)
    floored = state.floored.position < config.capacity
    return jnp.where(floored, floor_key, leaves[:, 0]) / mass


def _floor_key_and_mass(config: ReplayConfig, state: ReplayState):
    """F(t) and the total sampling mass ``Σ unfloored u_i + F(t) · #floored``."""
    floor_key = jnp.exp(_log_floor(config, state))
    return floor_key, state.priority_tree.columns[0][0] + floor_key * state.floored.size


def _sample(
    config: ReplayConfig,
    state: ReplayState,
    key: jax.Array,
    importance_exponent=None,
    current_version=None,
) -> ReplaySample:
    """Draws ``config.sample_batch_size`` trajectories.

    Prioritized modes use stratified sampling: one uniform draw in each of B equal-mass
    segments of the sum tree (duplicates possible). Uniform mode draws slots uniformly with
    replacement among the valid ones.

    Args:
      key: PRNG key.
      importance_exponent: β for this call (traced scalar allowed, e.g. an annealed schedule);
        defaults to ``config.importance_exponent``.
      current_version: "now" for the reported ages; defaults to the latest inserted version.
    """
    batch_size = config.sample_batch_size
    satisfiable = state.num_valid >= batch_size
    check(
        satisfiable,
        f"sample: sample_batch_size={batch_size} must be <= the number of valid items "
        f"(got {state.num_valid if not is_traced(state.num_valid) else 'fewer'})",
        config.jit_checks,
    )
    if config.prioritized:
        mass = (_floor_key_and_mass(config, state)[1] if config.floored
                else segment_tree.total(state.priority_tree)[0])
        has_mass = mass > 0
        check(has_mass, "sample: no stored item has a positive priority (every priority is 0), "
              "nothing can be sampled", config.jit_checks)
        satisfiable = satisfiable & has_mass
    beta = config.importance_exponent if importance_exponent is None else importance_exponent
    check_in_range("importance_exponent", beta, 0.0, 1.0, jit_checks=config.jit_checks)
    now = state.latest_version if current_version is None else jnp.asarray(current_version)

    if config.floored:
        roots = segment_tree.total(state.priority_tree)
        log_floor = _log_floor(config, state)
        floor_key, mass = _floor_key_and_mass(config, state)
        targets = segment_tree.stratified_targets(key, mass, batch_size)
        # Targets in [0, S) descend the tree; those in [S, S + F·n_f) pick a floored member.
        num_floored = state.floored.size
        in_tree, in_tail, tail_offset = segment_tree.sample(
            state.priority_tree, targets, tail_mass=floor_key * num_floored)
        floored = in_tail & (num_floored > 0)
        member = jnp.floor(tail_offset / floor_key).astype(jnp.int32)
        indices = jnp.where(floored, slot_set.member(state.floored, member), in_tree)
        sampled_keys = segment_tree.leaf_values(state.priority_tree, indices)
        probabilities = jnp.where(floored, floor_key, sampled_keys[:, 0]) / mass
        log_keys = jnp.where(floored, log_floor, sampled_keys[:, 1])
        if config.importance_weight_normalization == "buffer":
            log_key_floor = jnp.where(num_floored > 0, log_floor, roots[1])
        else:
            log_key_floor = jnp.min(log_keys)
        weights = jnp.exp(-beta * (log_keys - log_key_floor))
    elif config.prioritized:
        roots = segment_tree.total(state.priority_tree)
        targets = segment_tree.stratified_targets(key, roots[0], batch_size)
        indices = segment_tree.sample(state.priority_tree, targets)
        sampled_keys = segment_tree.leaf_values(state.priority_tree, indices)  # u_i (, log u_i)
        probabilities = sampled_keys[:, 0] / roots[0]
        if config.importance_weight_normalization == "buffer":
            log_keys, log_key_floor = sampled_keys[:, 1], roots[1]
        else:
            log_keys = jnp.log(sampled_keys[:, 0])
            log_key_floor = jnp.min(log_keys)
        # w_i / max_j w_j = (P_i / P_min)^(−β) = exp(−β (log u_i − log u_min)).
        weights = jnp.exp(-beta * (log_keys - log_key_floor))
    else:
        indices = jax.random.randint(key, (batch_size,), 0, jnp.maximum(state.num_valid, 1))
        probabilities = jnp.full((batch_size,), 1.0) / jnp.maximum(state.num_valid, 1)
        weights = jnp.ones((batch_size,), jnp.float32)

    mask = jnp.broadcast_to(satisfiable, (batch_size,)) & state.valid[indices]
    insert_version = state.insert_version[indices]
    return ReplaySample(
        indices=indices,
        experience=jax.tree.map(lambda buf: buf[indices], state.experience),
        probabilities=jnp.where(mask, probabilities, 0.0),
        importance_weights=jnp.where(mask, weights, 0.0),
        insert_version=insert_version,
        age=now - insert_version,
        mask=mask,
    )


def _set_priorities(
    config: ReplayConfig, state: ReplayState, indices: jax.Array, priorities: jax.Array
) -> ReplayState:
    """Sets base priorities ``p_i^base`` of ``indices`` (e.g. new |advantage| + ε).

    Duplicate indices: the last occurrence wins. The decay of an item is always measured from
    its insertion version, so updating a priority never resets its age. Raises (eagerly) on
    NaN/inf/negative priorities and on indices outside ``[0, capacity)`` or of empty slots;
    the jit fallback skips those writes and counts them in ``num_rejected_writes``.
    """
    indices = _integers("set_priorities: indices", indices)
    if not config.prioritized:
        return state
    priorities = jnp.asarray(priorities, jnp.float32)
    chex.assert_rank(indices, 1)
    chex.assert_shape(priorities, indices.shape)
    in_range = (indices >= 0) & (indices < config.capacity)
    safe_indices = jnp.clip(indices, 0, config.capacity - 1)
    index_ok = in_range & state.valid[safe_indices]
    priority_ok = _priorities_ok(priorities)
    check(jnp.all(priority_ok),
          "set_priorities: priorities must be finite and >= 0 (got NaN, inf or < 0)",
          config.jit_checks)
    check(jnp.all(index_ok),
          f"set_priorities: indices must be in [0, capacity={config.capacity}) and point to "
          "stored items", config.jit_checks)
    write_mask = index_ok & priority_ok
    keep = segment_tree.last_write_wins(safe_indices, write_mask, index_bound=config.capacity)
    base_priority = state.base_priority.at[
        jnp.where(keep, safe_indices, config.capacity)
    ].set(priorities, mode="drop")
    state = state.replace(
        base_priority=base_priority,
        max_priority=jnp.maximum(
            state.max_priority, jnp.max(jnp.where(write_mask, priorities, 0.0))
        ),
        num_rejected_writes=state.num_rejected_writes + jnp.sum(~write_mask).astype(jnp.int32),
    )
    return _write_keys(
        config, state, safe_indices, priorities, state.insert_version[safe_indices], keep
    )


def _set_age_decay_tau(config: ReplayConfig, state: ReplayState, age_decay_tau) -> ReplayState:
    """Sets FreshPER's τ ∈ (0, ∞] (``inf`` turns the decay off) and rebuilds every key in one
    O(N) pass, rebased to the newest version: afterwards the buffer samples exactly as one
    created with this τ. Used by online τ selection (:mod:`fresh_rl.llm.replay_trainer`);
    requires ``sampling="freshper"``.

    A concrete τ outside (0, ∞] (NaN, ≤ 0) raises ``ValueError``. A traced τ is checked by
    ``checkify`` when ``config.jit_checks`` (wrap the call in ``checkify.checkify``); otherwise
    an invalid τ is skipped (the current τ is kept) and counted in ``num_rejected_writes``.
    """
    if not config.decays:
        raise ValueError(f"set_age_decay_tau needs sampling='freshper', got {config.sampling!r}")
    tau = jnp.asarray(age_decay_tau, jnp.float32)
    if not is_traced(tau):
        require_in_range("age_decay_tau", tau, 0.0, math.inf, low_inclusive=False)
    tau_ok = tau > 0  # False for NaN
    check(tau_ok, "set_age_decay_tau: age_decay_tau must be in (0, inf] (got NaN or <= 0)",
          config.jit_checks)
    state = state.replace(
        decay_rate=jnp.where(tau_ok, config.priority_exponent / tau, state.decay_rate),
        num_rejected_writes=state.num_rejected_writes + (~tau_ok).astype(jnp.int32),
    )
    return _rebase(config, state, state.latest_version)


def _can_sample(config: ReplayConfig, state: ReplayState) -> jax.Array:
    return state.num_valid >= config.sample_batch_size


def make_trajectory_buffer(config: ReplayConfig) -> TrajectoryBuffer:
    """Builds the pure functions of a trajectory buffer for ``config``.

    Example::

        buffer = make_trajectory_buffer(ReplayConfig(capacity=4096, sample_batch_size=64))
        state = buffer.init({"tokens": jnp.zeros((T,), jnp.int32), "reward": jnp.zeros(())})
        state = jax.jit(buffer.add, donate_argnums=0)(state, batch, version, None)
        sample = jax.jit(buffer.sample)(state, key)
        state = buffer.set_priorities(state, sample.indices, new_priorities)
    """
    return TrajectoryBuffer(
        config=config,
        init=functools.partial(_init, config),
        add=functools.partial(_add, config),
        sample=functools.partial(_sample, config),
        set_priorities=functools.partial(_set_priorities, config),
        can_sample=functools.partial(_can_sample, config),
        rebase=functools.partial(_rebase, config),
        sampling_probabilities=functools.partial(_sampling_probabilities, config),
        set_age_decay_tau=functools.partial(_set_age_decay_tau, config),
    )
