"""Flat power-of-two segment trees (sum and min) as plain arrays, jittable.

Layout: ``nodes`` has ``2 * P`` entries with ``P = next_power_of_two(capacity)``. The root is
``nodes[1]``, the children of node ``n`` are ``2n`` and ``2n + 1``, and leaf ``i`` lives at
``nodes[P + i]``. ``nodes[0]`` is unused padding (kept equal to the identity). Leaves past
``capacity`` hold the identity of the reduction (0 for sum, +inf for min), so they carry no mass
and never win a min.

Writes never accumulate deltas: after the leaves are written, every touched parent is
recomputed from its two children, level by level. A float32 tree built this way holds the
exact pairwise sum of its leaves (up to the rounding of that pairwise sum), so there is no
drift however many updates it sees. When one batch touches a large share of the tree, a
full bottom-up rebuild is cheaper than the path walk and gives the same result.

Duplicate leaf indices within one write resolve deterministically: the last occurrence in the
batch wins (``last_write_wins``).
"""

from __future__ import annotations

from typing import Callable, Literal

import jax
import jax.numpy as jnp
import numpy as np

Reduction = Literal["sum", "min"]

_COMBINE: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "sum": jnp.add,
    "min": jnp.minimum,
}


def next_power_of_two(n: int) -> int:
    """Smallest power of two ``≥ n`` (``n ≥ 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


def tree_depth(capacity: int) -> int:
    """Number of levels below the root: ``log2(next_power_of_two(capacity))``."""
    return next_power_of_two(capacity).bit_length() - 1


def identity(reduction: Reduction) -> float:
    """Neutral element of the reduction: 0 for sum, +inf for min."""
    return 0.0 if reduction == "sum" else float(np.inf)


def init(capacity: int, reduction: Reduction, dtype=jnp.float32) -> jax.Array:
    """An empty tree: every node holds the identity of ``reduction``."""
    if capacity <= 0:
        raise ValueError(f"capacity must be a positive integer, got {capacity}")
    return jnp.full((2 * next_power_of_two(capacity),), identity(reduction), dtype)


def leaves(nodes: jax.Array, capacity: int) -> jax.Array:
    """The ``capacity`` leaf values, ``[capacity]``."""
    num_leaves = nodes.shape[0] // 2
    return nodes[num_leaves : num_leaves + capacity]


def _build_from_leaf_level(leaf_level: jax.Array, reduction: Reduction) -> jax.Array:
    """``[2P]`` tree from a full ``[P]`` leaf level, reducing pairs level by level."""
    combine = _COMBINE[reduction]
    level = leaf_level
    levels = [level]
    while level.shape[0] > 1:
        level = combine(level[0::2], level[1::2])
        levels.append(level)
    pad = jnp.full((1,), identity(reduction), leaf_level.dtype)
    return jnp.concatenate([pad, *reversed(levels)])


def build(leaf_values: jax.Array, reduction: Reduction) -> jax.Array:
    """Builds a whole tree bottom-up from ``[capacity]`` leaf values in O(P)."""
    capacity = leaf_values.shape[0]
    padding = jnp.full(
        (next_power_of_two(capacity) - capacity,), identity(reduction), leaf_values.dtype
    )
    return _build_from_leaf_level(jnp.concatenate([leaf_values, padding]), reduction)


def last_write_wins(indices: jax.Array) -> jax.Array:
    """Mask ``[B]`` that is True at the last occurrence of each distinct index.

    A stable sort groups equal indices in batch order; the last element of each group is the
    write that must survive. O(B log B), independent of the tree size.
    """
    order = jnp.argsort(indices, stable=True)
    sorted_indices = indices[order]
    is_last_sorted = jnp.concatenate(
        [sorted_indices[:-1] != sorted_indices[1:], jnp.ones((1,), bool)]
    )
    return jnp.zeros_like(is_last_sorted).at[order].set(is_last_sorted)


def write(
    nodes: jax.Array,
    leaf_indices: jax.Array,
    values: jax.Array,
    reduction: Reduction,
    write_mask: jax.Array | None = None,
) -> jax.Array:
    """Sets leaves ``leaf_indices`` to ``values`` and recomputes their ancestors.

    Args:
      nodes: ``[2P]`` tree.
      leaf_indices: ``[B]`` int leaf indices in ``[0, capacity)``.
      values: ``[B]`` new leaf values.
      reduction: "sum" or "min".
      write_mask: optional ``[B]`` bool; False entries are not written.

    Duplicate indices: the last (unmasked) occurrence wins. Parents are recomputed from their
    children (never updated by deltas). For large batches relative to the tree the function
    rebuilds all levels instead, which is cheaper and bit-identical.
    """
    num_leaves = nodes.shape[0] // 2
    depth = num_leaves.bit_length() - 1
    batch = leaf_indices.shape[0]
    leaf_indices = leaf_indices.astype(jnp.int32)
    keep = last_write_wins(
        jnp.where(write_mask, leaf_indices, -1 - jnp.arange(batch))
        if write_mask is not None
        else leaf_indices
    )
    if write_mask is not None:
        keep = keep & write_mask
    leaf_nodes = num_leaves + leaf_indices
    # Writes that lose (duplicates, masked) are sent out of range and dropped.
    nodes = nodes.at[jnp.where(keep, leaf_nodes, nodes.shape[0])].set(
        values.astype(nodes.dtype), mode="drop"
    )
    if 2 * batch * depth >= num_leaves:
        # Rebuilding every level costs O(P); the path walk costs O(B log P) scattered updates.
        return _build_from_leaf_level(nodes[num_leaves:], reduction)

    combine = _COMBINE[reduction]
    parents = leaf_nodes  # recomputing the ancestors of an unwritten leaf is harmless
    for _ in range(depth):
        parents = parents >> 1
        nodes = nodes.at[parents].set(combine(nodes[2 * parents], nodes[2 * parents + 1]))
    return nodes


def total(nodes: jax.Array) -> jax.Array:
    """The root: sum (or min) over all leaves."""
    return nodes[1]


def sample(nodes: jax.Array, targets: jax.Array) -> jax.Array:
    """Prefix-sum descent of a sum tree: for each target mass returns a leaf index.

    Leaf ``i`` is returned for targets in ``[S_{i}, S_{i+1})`` with ``S`` the prefix sums of
    the leaves. Targets are clamped into ``[0, total)``. At every level the descent only enters
    a child with positive mass, so a zero-mass (never written, evicted, or zero-priority) leaf is
    never returned, whatever the float rounding, as long as the total is positive.

    Args:
      nodes: ``[2P]`` sum tree.
      targets: ``[B]`` target masses.
    Returns:
      ``[B]`` int32 leaf indices.
    """
    num_leaves = nodes.shape[0] // 2
    depth = num_leaves.bit_length() - 1
    root = total(nodes)
    below_root = jnp.nextafter(root, jnp.zeros_like(root))
    remaining = jnp.clip(targets.astype(nodes.dtype), 0.0, below_root)
    node = jnp.ones(targets.shape, jnp.int32)
    for _ in range(depth):
        left = 2 * node
        left_mass = nodes[left]
        right_mass = nodes[left + 1]
        go_right = ((remaining >= left_mass) & (right_mass > 0)) | (left_mass <= 0)
        remaining = jnp.where(go_right, remaining - left_mass, remaining)
        # Keep the residual inside the chosen child's mass despite rounding.
        chosen_mass = jnp.where(go_right, right_mass, left_mass)
        remaining = jnp.clip(remaining, 0.0, jnp.nextafter(chosen_mass, jnp.zeros_like(chosen_mass)))
        node = left + go_right.astype(jnp.int32)
    return node - num_leaves


def stratified_targets(key: jax.Array, total_mass: jax.Array, batch_size: int) -> jax.Array:
    """One uniform draw in each of ``batch_size`` equal-mass segments of ``[0, total)``."""
    offsets = jax.random.uniform(key, (batch_size,), dtype=jnp.float32)
    return (jnp.arange(batch_size, dtype=jnp.float32) + offsets) * (total_mass / batch_size)
