"""Flat power-of-two segment trees as plain arrays, jittable; several reductions side by side.

Layout: ``nodes`` is ``[2P, K]`` with ``P = next_power_of_two(capacity)`` and one column per
reduction (e.g. ``("sum", "min")``: the buffer keeps its sampling sum tree and its
importance-weight min tree in one array, so a write walks the tree once for both). The root
is ``nodes[1]``, the children of node ``n`` are ``2n`` and ``2n + 1`` (row ``n`` of the
``[P, 2, K]`` view), and leaf ``i`` is ``nodes[P + i]``. ``nodes[0]`` is unused padding. Leaves
past ``capacity`` hold each column's identity (0 for sum, +inf for min).

Writes never accumulate deltas: after the leaves are written, every touched parent is
recomputed from its two children, level by level. A float32 tree built this way holds the
exact pairwise reduction of its leaves, so there is no drift however many updates it sees.
When one batch touches a large share of the tree, a full bottom-up rebuild is cheaper than
the path walk and gives the same result.

Duplicate leaf indices within one write resolve deterministically: the last occurrence in the
batch wins (``last_write_wins``).
"""

from __future__ import annotations

from typing import Literal, Sequence

import jax
import jax.numpy as jnp

Reduction = Literal["sum", "min"]
_IDENTITY = {"sum": 0.0, "min": float("inf")}


def next_power_of_two(n: int) -> int:
    """Smallest power of two ``≥ n`` (``n ≥ 1``)."""
    return 1 << max(0, int(n) - 1).bit_length()


def tree_depth(capacity: int) -> int:
    """Number of levels below the root: ``log2(next_power_of_two(capacity))``."""
    return next_power_of_two(capacity).bit_length() - 1


def _identities(reductions: Sequence[Reduction], dtype) -> jax.Array:
    for r in reductions:
        if r not in _IDENTITY:
            raise ValueError(f"reductions must be 'sum' or 'min', got {r!r}")
    return jnp.asarray([_IDENTITY[r] for r in reductions], dtype)


def _combine(left: jax.Array, right: jax.Array, reductions: Sequence[Reduction]) -> jax.Array:
    """Column-wise reduction of two ``[..., K]`` arrays."""
    if all(r == "sum" for r in reductions):
        return left + right  # the sum-only tree needs no min and no select
    is_min = jnp.asarray([r == "min" for r in reductions])
    return jnp.where(is_min, jnp.minimum(left, right), left + right)


def init(capacity: int, reductions: Sequence[Reduction], dtype=jnp.float32) -> jax.Array:
    """An empty ``[2P, K]`` tree: every node holds its column's identity."""
    if capacity <= 0:
        raise ValueError(f"capacity must be a positive integer, got {capacity}")
    identities = _identities(reductions, dtype)
    return jnp.broadcast_to(identities, (2 * next_power_of_two(capacity), len(reductions)))


def leaves(nodes: jax.Array, capacity: int) -> jax.Array:
    """The ``[capacity, K]`` leaf values."""
    num_leaves = nodes.shape[0] // 2
    return nodes[num_leaves : num_leaves + capacity]


def total(nodes: jax.Array) -> jax.Array:
    """The root ``[K]``: each column's reduction over all leaves."""
    return nodes[1]


def _build_from_leaf_level(leaf_level: jax.Array, reductions) -> jax.Array:
    """``[2P, K]`` tree from a full ``[P, K]`` leaf level, reducing pairs level by level."""
    level = leaf_level
    levels = [level]
    while level.shape[0] > 1:
        level = _combine(level[0::2], level[1::2], reductions)
        levels.append(level)
    pad = _identities(reductions, leaf_level.dtype)[None]
    return jnp.concatenate([pad, *reversed(levels)])


def build(leaf_values: jax.Array, reductions: Sequence[Reduction]) -> jax.Array:
    """Builds a whole tree bottom-up from ``[capacity, K]`` leaf values in O(P)."""
    capacity = leaf_values.shape[0]
    padding = jnp.broadcast_to(
        _identities(reductions, leaf_values.dtype),
        (next_power_of_two(capacity) - capacity, len(reductions)),
    )
    return _build_from_leaf_level(jnp.concatenate([leaf_values, padding]), reductions)


def last_write_wins(
    indices: jax.Array, mask: jax.Array | None = None, index_bound: int | None = None
) -> jax.Array:
    """Mask ``[B]`` that is True at the last unmasked occurrence of each distinct index.

    Equal indices are grouped in batch order by one sort; within each group the last entry is
    the write that must survive. Masked-out entries (``mask`` False) are never kept and never
    shadow an earlier write. The sort is of the packed key ``index · B + position`` when all
    indices lie in ``[0, index_bound)`` and ``index_bound · B < 2^32`` (about 4x faster than a
    stable argsort on CPU), else a stable argsort. O(B log B), independent of the tree size.
    No ``lax.cond`` shortcut for already-sorted input: on CPU a cond inside a scan cost more
    than the sort it would skip.
    """
    batch = indices.shape[0]
    positions = jnp.arange(batch, dtype=jnp.int32)
    mask = jnp.ones((batch,), bool) if mask is None else mask
    # Masked entries get distinct keys outside the real range: they then collide with
    # nothing, and a neighbour comparison in sorted order finds each group's last write.
    bound = index_bound
    if bound is None:
        keys = jnp.where(mask, indices, -1 - positions)
    else:
        keys = jnp.where(mask, indices, bound + positions)
        bound += batch
    if bound is not None and bound * batch < 2**32:
        packed = jnp.sort(
            keys.astype(jnp.uint32) * jnp.uint32(batch) + positions.astype(jnp.uint32)
        )
        sorted_keys = packed // jnp.uint32(batch)
        order = (packed % jnp.uint32(batch)).astype(jnp.int32)
    else:
        order = jnp.argsort(keys, stable=True)
        sorted_keys = keys[order]
    is_last = jnp.concatenate([sorted_keys[:-1] != sorted_keys[1:], jnp.ones((1,), bool)])
    return jnp.zeros((batch,), bool).at[order].set(is_last, unique_indices=True) & mask


def write(
    nodes: jax.Array,
    leaf_indices: jax.Array,
    values: jax.Array,
    reductions: Sequence[Reduction],
    write_mask: jax.Array | None = None,
    indices_are_unique: bool = False,
) -> jax.Array:
    """Sets leaves ``leaf_indices`` to ``values`` and recomputes their ancestors.

    Args:
      nodes: ``[2P, K]`` tree.
      leaf_indices: ``[B]`` int leaf indices in ``[0, capacity)``.
      values: ``[B, K]`` new leaf values.
      reductions: the K column reductions.
      write_mask: optional ``[B]`` bool; False entries are not written.
      indices_are_unique: the caller guarantees that the unmasked indices are distinct, so the
        O(B log B) duplicate resolution is skipped.

    Duplicate indices: the last (unmasked) occurrence wins. Parents are recomputed from their
    children (never updated by deltas). For large batches relative to the tree the function
    rebuilds all levels instead, which is cheaper and bit-identical.
    """
    num_leaves = nodes.shape[0] // 2
    depth = num_leaves.bit_length() - 1
    batch = leaf_indices.shape[0]
    leaf_indices = leaf_indices.astype(jnp.int32)
    if indices_are_unique:
        keep = jnp.ones((batch,), bool) if write_mask is None else write_mask
    else:
        keep = last_write_wins(leaf_indices, write_mask, index_bound=num_leaves)
    leaf_nodes = num_leaves + leaf_indices
    # Writes that lose (duplicates, masked) are sent out of range and dropped.
    nodes = nodes.at[jnp.where(keep, leaf_nodes, nodes.shape[0])].set(
        values.astype(nodes.dtype), mode="drop"
    )
    if 2 * batch * depth >= num_leaves:
        # Rebuilding every level costs O(P); the path walk costs O(B log P) scattered updates.
        return _build_from_leaf_level(nodes[num_leaves:], reductions)

    width = nodes.shape[1]

    def recompute_parents(_, carry):
        nodes, children = carry
        parents = children >> 1
        pair = nodes.reshape(-1, 2 * width)[parents]  # row n: nodes 2n and 2n + 1 side by side
        combined = _combine(pair[:, :width], pair[:, width:], reductions)
        return nodes.at[parents].set(combined), parents

    # Walk up only while a level has more nodes than the batch has writes; the levels above
    # (at most 2B nodes in all, contiguous) are cheaper to rebuild whole than to update by
    # B scattered writes each. Recomputing the ancestors of an unwritten (masked or
    # duplicate) leaf is harmless. A fori_loop rather than an unrolled walk, as in
    # ``_descend``.
    rebuilt_levels = min(depth, max(0, batch.bit_length() - 1))
    nodes, _ = jax.lax.fori_loop(
        0, depth - rebuilt_levels, recompute_parents, (nodes, leaf_nodes)
    )
    for level in range(rebuilt_levels - 1, -1, -1):  # rows [2^level, 2^(level+1))
        children = nodes[2 ** (level + 1) : 2 ** (level + 2)]
        nodes = nodes.at[2**level : 2 ** (level + 1)].set(
            _combine(children[0::2], children[1::2], reductions)
        )
    return nodes


def _descend(nodes: jax.Array, remaining: jax.Array, column: int) -> jax.Array:
    """Root-to-leaf walk on a sum column that only ever enters children of positive mass."""
    num_leaves = nodes.shape[0] // 2
    # Row n of the [P, 2K] view holds nodes 2n and 2n + 1 side by side: one row gather per
    # level reads both children (a column slice of the tree would copy it; a [P, 2, K] view
    # gathered slowly on CPU for K = 1).
    width = nodes.shape[1]
    child_pairs = nodes.reshape(-1, 2 * width)

    def step_down(_, carry):
        node, remaining = carry
        children = child_pairs[node]
        left_mass, right_mass = children[:, column], children[:, width + column]
        go_right = ((remaining >= left_mass) & (right_mass > 0)) | (left_mass <= 0)
        remaining = jnp.where(go_right, remaining - left_mass, remaining)
        return 2 * node + go_right.astype(jnp.int32), remaining

    start = jnp.ones(remaining.shape, jnp.int32)
    depth = num_leaves.bit_length() - 1
    # A fori_loop rather than an unrolled walk: on CPU the unrolled walk was 2-3x slower when
    # the tree is a loop-carried buffer (measured in benchmarks/replay_bench.py settings).
    node, _ = jax.lax.fori_loop(0, depth, step_down, (start, remaining))
    return node - num_leaves


def sample(nodes: jax.Array, targets: jax.Array, column: int = 0) -> jax.Array:
    """Prefix-sum descent of a sum column: for each target mass returns a leaf index.

    Leaf ``i`` is returned for targets in ``[S_i, S_{i+1})`` with ``S`` the prefix sums of the
    leaves. Targets are clamped into ``[0, total)`` (NaN → 0). A zero-mass (never written,
    evicted or zero-priority) leaf is never returned as long as the total is positive: float
    rounding can leave a residual at or above a subtree's mass, so at every level the walk
    only enters a child of positive mass (the pair of children is read in one gather anyway,
    so the guard is free; measured against an unguarded walk, no difference beyond noise).

    Args:
      nodes: ``[2P, K]`` tree whose ``column`` is a sum.
      targets: ``[B]`` target masses.
    Returns:
      ``[B]`` int32 leaf indices.
    """
    root = total(nodes)[column]
    below_root = jnp.nextafter(root, jnp.zeros_like(root))
    remaining = jnp.clip(targets.astype(nodes.dtype), 0.0, below_root)
    remaining = jnp.where(jnp.isnan(remaining), 0.0, remaining)
    return _descend(nodes, remaining, column)


def stratified_targets(key: jax.Array, total_mass: jax.Array, batch_size: int) -> jax.Array:
    """One uniform draw in each of ``batch_size`` equal-mass segments of ``[0, total)``."""
    offsets = jax.random.uniform(key, (batch_size,), dtype=jnp.float32)
    return (jnp.arange(batch_size, dtype=jnp.float32) + offsets) * (total_mass / batch_size)
