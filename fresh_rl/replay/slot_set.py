"""A set of buffer slots with O(1) access to its k-th member and batched insert/remove, jittable.

The replay buffer keeps the items floored at ``min_decayed_priority`` in one of these: each
floored item has the same sampling mass F(t), so a draw that lands in the floored mass
``F(t) · size`` picks member ``⌊(target − S)/F(t)⌋`` directly, and the priority tree needs no
per-node count of floored items (a third column every write and every descent would move).

Layout: ``members[:size]`` lists the slots in the set (in no particular order; entries past
``size`` are stale), ``position[slot]`` is the slot's index in ``members`` or ``capacity`` when
it is not in the set. Batched updates touch O(B) entries (gathers, scatters and prefix sums
over the batch, no sort), never O(N):

* ``insert``: the new members go to ``members[size : size + a]`` in batch order.
* ``remove``: ``r`` members leave; the set shrinks to ``size − r``, and the members still in
  the tail ``members[size − r : size]`` move into the holes the removed members leave below
  it, the k-th hole (in batch order) taking the k-th surviving tail member (in window order).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class SlotSet:
    """Attributes:
      members: ``[capacity]`` int32, the first ``size`` entries are the set's slots.
      position: ``[capacity]`` int32, index of each slot in ``members``, ``capacity`` if absent.
      size: int32 scalar, number of members.
    """

    members: jax.Array
    position: jax.Array
    size: jax.Array

    @property
    def capacity(self) -> int:
        return self.position.shape[0]


def init(capacity: int) -> SlotSet:
    """The empty set over slots ``[0, capacity)``."""
    return SlotSet(members=jnp.zeros((capacity,), jnp.int32),
                   position=jnp.full((capacity,), capacity, jnp.int32),
                   size=jnp.zeros((), jnp.int32))


def from_mask(mask: jax.Array) -> SlotSet:
    """The set of slots where ``mask`` (``[capacity]`` bool) is True, in slot order (O(N))."""
    capacity = mask.shape[0]
    rank = jnp.cumsum(mask, dtype=jnp.int32) - 1
    position = jnp.where(mask, rank, capacity)
    members = jnp.zeros((capacity,), jnp.int32).at[position].set(
        jnp.arange(capacity, dtype=jnp.int32), mode="drop", unique_indices=True)
    return SlotSet(members=members, position=position, size=jnp.sum(mask, dtype=jnp.int32))


def contains(s: SlotSet, slots: jax.Array) -> jax.Array:
    """``[B]`` bool: whether each slot is a member."""
    return s.position[slots] < s.capacity


def member(s: SlotSet, index: jax.Array) -> jax.Array:
    """The slots at positions ``index`` of ``members`` (clamped into ``[0, size)``; meaningless
    for an empty set)."""
    return s.members[jnp.clip(index, 0, jnp.maximum(s.size - 1, 0))]


def insert(s: SlotSet, slots: jax.Array, mask: jax.Array) -> SlotSet:
    """Adds the slots where ``mask`` is True. They must be distinct and not yet members."""
    rank = jnp.cumsum(mask, dtype=jnp.int32) - 1
    position = jnp.where(mask, s.size + rank, s.capacity)
    return SlotSet(
        members=s.members.at[position].set(slots.astype(jnp.int32), mode="drop"),
        position=s.position.at[jnp.where(mask, slots, s.capacity)].set(position, mode="drop"),
        size=s.size + jnp.sum(mask, dtype=jnp.int32))


def remove(s: SlotSet, slots: jax.Array, mask: jax.Array) -> SlotSet:
    """Removes the slots where ``mask`` is True. They must be distinct members.

    With ``r`` removals the set keeps ``members[:size − r]``: every removed member below that
    bound leaves a hole, every surviving member at or above it (the tail window
    ``[size − r, size)``, at most B entries) fills one. Holes and survivors are equally many;
    each list is compacted by a running count and the k-th hole takes the k-th survivor. O(B):
    gathers, scatters and prefix sums over the batch, no sort."""
    batch, capacity = slots.shape[0], s.capacity
    removed_position = jnp.where(mask, s.position[slots], capacity)
    new_size = s.size - jnp.sum(mask, dtype=jnp.int32)
    is_hole = removed_position < new_size
    hole_rank = jnp.cumsum(is_hole, dtype=jnp.int32) - 1
    holes = jnp.full((batch,), capacity, jnp.int32).at[
        jnp.where(is_hole, hole_rank, batch)].set(removed_position, mode="drop")
    # The tail window: positions new_size + j, j < B; a member there survives unless removed.
    window = new_size + jnp.arange(batch, dtype=jnp.int32)
    removed_in_window = jnp.zeros((batch,), bool).at[
        jnp.where(mask & ~is_hole, removed_position - new_size, batch)].set(True, mode="drop")
    survives = (window < s.size) & ~removed_in_window
    survivor_rank = jnp.cumsum(survives, dtype=jnp.int32) - 1
    survivor_slots = jnp.zeros((batch,), jnp.int32).at[
        jnp.where(survives, survivor_rank, batch)].set(
        s.members[jnp.minimum(window, capacity - 1)], mode="drop")
    paired = holes < capacity  # the first (number of holes) ranks, each with a survivor
    position = s.position.at[jnp.where(mask, slots, capacity)].set(capacity, mode="drop")
    position = position.at[jnp.where(paired, survivor_slots, capacity)].set(holes, mode="drop")
    members = s.members.at[holes].set(survivor_slots, mode="drop")
    return SlotSet(members=members, position=position, size=new_size)


__all__ = ["SlotSet", "contains", "from_mask", "init", "insert", "member", "remove"]
