"""Flat K-ary segment trees, jittable; several reductions side by side.

Layout: ``SegmentTree.nodes`` is one ``[R, C]`` array, one column per reduction (e.g.
``("sum", "min")``: the buffer keeps its sampling sum tree and its importance-weight min tree
together, so one write walks the tree once for both). The levels are stored root first, one
after the other. Node ``j`` of level ``d`` has the children ``K j … K j + K − 1`` of level
``d + 1``, which form one contiguous row of the ``[R/K, K·C]`` view: a descent reads a node's
children with one row gather. Level ``d + 1`` holds ``K · m_d`` nodes, ``m_d`` the real nodes
of level ``d`` (``m_L = capacity``, ``m_{d−1} = ⌈m_d/K⌉``, ``m_0 = 1``), so each level is padded
to a multiple of K only (R ≈ N·K/(K−1)), not the tree to a power of K; the root's level is
padded to K nodes too, so every level starts on a row. Padding holds each column's identity
(0 for sum, +inf for min). Depth is ``max(1, ⌈log_K N⌉)`` levels below the root: 20 for
N = 2^20 at K = 2, 5 at K = 16, 3 at K = 128.

Writes never accumulate deltas: after the leaves are written, every touched parent is
recomputed from its K children, level by level, the children reduced in adjacent pairs
(``((c_0 ∘ c_1) ∘ (c_2 ∘ c_3)) ∘ …``). Every node therefore holds exactly the pairwise
reduction of its leaves, bit-identical to the binary tree's node over the same leaves for any
K, so no write history can make it drift. A level with no more rows than the batch has writes
is rebuilt whole (contiguous, cheaper than scattered row updates, bit-identical).

Duplicate leaf indices within one write resolve deterministically: the last occurrence in the
batch wins (``last_write_wins``).
"""

from __future__ import annotations

from typing import Literal, Sequence

import jax
import jax.numpy as jnp
from flax import struct

from fresh_rl.validation import require_choice

Reduction = Literal["sum", "min"]
FANOUTS = tuple(2**e for e in range(1, 8))  # 2, 4, …, 128 (128: the TPU lane width)
# Chosen from the K sweep of benchmarks/replay_bench.py (results/bench/replay.md).
DEFAULT_FANOUT = 8
_IDENTITY = {"sum": 0.0, "min": float("inf")}


@struct.dataclass
class SegmentTree:
    """A K-ary tree over ``capacity`` leaves (see the module docstring for the layout).

    Attributes:
      nodes: ``[R, C]`` every level, root first.
      capacity: number of leaves.
      fanout: K, children per node.
      reductions: the C column reductions, "sum" or "min".
    """

    nodes: jax.Array
    capacity: int = struct.field(pytree_node=False)
    fanout: int = struct.field(pytree_node=False)
    reductions: tuple[Reduction, ...] = struct.field(pytree_node=False)

    @property
    def level_offsets(self) -> tuple[int, ...]:
        """First row of each level in ``nodes``, root first, and the total R at the end."""
        offsets = [0]
        for size in level_sizes(self.capacity, self.fanout):
            offsets.append(offsets[-1] + size)
        return tuple(offsets)

    @property
    def depth(self) -> int:
        """Levels below the root."""
        return len(level_sizes(self.capacity, self.fanout)) - 1


def level_sizes(capacity: int, fanout: int) -> tuple[int, ...]:
    """Stored nodes per level, root first: ``K, K·m_0, K·m_1, …, K·m_{L−1}``."""
    if not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
    require_choice("fanout", fanout, FANOUTS)
    real = [capacity]
    while real[0] > 1 or len(real) == 1:
        real.insert(0, -(-real[0] // fanout))
    return (fanout, *(fanout * m for m in real[:-1]))


def _identities(reductions: Sequence[Reduction], dtype) -> jax.Array:
    for r in reductions:
        if r not in _IDENTITY:
            raise ValueError(f"reductions must be 'sum' or 'min', got {r!r}")
    return jnp.asarray([_IDENTITY[r] for r in reductions], dtype)


def _combine(left: jax.Array, right: jax.Array, reductions: Sequence[Reduction]) -> jax.Array:
    """Column-wise reduction of two ``[..., C]`` arrays."""
    if all(r == "sum" for r in reductions):
        return left + right  # the sum-only tree needs no min and no select
    is_min = jnp.asarray([r == "min" for r in reductions])
    return jnp.where(is_min, jnp.minimum(left, right), left + right)


def _reduce_siblings(rows: jax.Array, reductions: Sequence[Reduction]) -> jax.Array:
    """``[..., K, C] → [..., C]``: K siblings reduced in adjacent pairs, ``log2 K`` rounds."""
    while rows.shape[-2] > 1:
        rows = _combine(rows[..., 0::2, :], rows[..., 1::2, :], reductions)
    return rows[..., 0, :]


def init(capacity: int, reductions: Sequence[Reduction], fanout: int = DEFAULT_FANOUT,
         dtype=jnp.float32) -> SegmentTree:
    """An empty tree: every node holds its column's identity."""
    rows = sum(level_sizes(capacity, fanout))
    nodes = jnp.broadcast_to(_identities(reductions, dtype), (rows, len(reductions)))
    return SegmentTree(nodes, capacity, fanout, tuple(reductions))


def leaves(tree: SegmentTree) -> jax.Array:
    """The ``[capacity, C]`` leaf values."""
    start = tree.level_offsets[-2]
    return tree.nodes[start : start + tree.capacity]


def leaf_values(tree: SegmentTree, indices: jax.Array) -> jax.Array:
    """``[B, C]`` values of the leaves ``indices``."""
    return tree.nodes[tree.level_offsets[-2] + indices]


def total(tree: SegmentTree) -> jax.Array:
    """The root ``[C]``: each column's reduction over all leaves."""
    return tree.nodes[0]


def build(leaf_values: jax.Array, reductions: Sequence[Reduction],
          fanout: int = DEFAULT_FANOUT) -> SegmentTree:
    """Builds a whole tree bottom-up from ``[capacity, C]`` leaf values in O(N)."""
    tree = init(leaf_values.shape[0], reductions, fanout, leaf_values.dtype)
    start = tree.level_offsets[-2]
    nodes = tree.nodes.at[start : start + tree.capacity].set(leaf_values)
    return _rebuild_levels(tree.replace(nodes=nodes), tree.depth)


def _rebuild_levels(tree: SegmentTree, parent_level: int) -> SegmentTree:
    """Recomputes levels ``parent_level − 1, …, 0`` whole from the level below each."""
    offsets, k, nodes = tree.level_offsets, tree.fanout, tree.nodes
    for d in range(parent_level - 1, -1, -1):
        children = nodes[offsets[d + 1] : offsets[d + 2]].reshape(-1, k, nodes.shape[1])
        nodes = nodes.at[offsets[d] : offsets[d] + children.shape[0]].set(
            _reduce_siblings(children, tree.reductions)
        )
    return tree.replace(nodes=nodes)


def last_write_wins(
    indices: jax.Array, mask: jax.Array | None = None, index_bound: int | None = None
) -> jax.Array:
    """Mask ``[B]`` that is True at the last unmasked occurrence of each distinct index.

    Equal indices are grouped in batch order by one sort; within each group the last unmasked
    entry is the write that must survive. Masked-out entries (``mask`` False) are never kept
    and never shadow an earlier write: an entry is kept when the next unmasked entry in sorted
    order (a reverse running min, ``log2 B`` elementwise rounds) has another index. The sort
    is of the packed key ``index · B + position`` when all indices lie in ``[0, index_bound)``
    and ``index_bound · B ≤ 2^32`` (one-operand uint32 sort: 4-6x faster than a stable
    argsort on CPU), else a stable argsort. O(B log B), independent of the tree size. No
    ``lax.cond`` shortcut for already-sorted input: on CPU a cond inside a scan cost more than
    the sort it would skip.
    """
    batch = indices.shape[0]
    positions = jnp.arange(batch, dtype=jnp.int32)
    if index_bound is not None and index_bound * batch <= 2**32:
        packed = jnp.sort(
            indices.astype(jnp.uint32) * jnp.uint32(batch) + positions.astype(jnp.uint32)
        )
        sorted_indices = (packed // jnp.uint32(batch)).astype(jnp.int32)
        order = (packed % jnp.uint32(batch)).astype(jnp.int32)
    else:
        order = jnp.argsort(indices, stable=True)
        sorted_indices = indices[order]
    if mask is None:
        is_last = jnp.append(sorted_indices[:-1] != sorted_indices[1:], True)
    else:
        sorted_mask = mask[order]
        later = jnp.append(jnp.where(sorted_mask, positions, batch)[1:], batch)
        next_unmasked = jax.lax.associative_scan(jnp.minimum, later, reverse=True)
        is_last = sorted_mask & (
            (next_unmasked == batch)
            | (sorted_indices[jnp.minimum(next_unmasked, batch - 1)] != sorted_indices)
        )
    return jnp.zeros((batch,), bool).at[order].set(is_last, unique_indices=True)


def write(
    tree: SegmentTree,
    leaf_indices: jax.Array,
    values: jax.Array,
    write_mask: jax.Array | None = None,
    indices_are_unique: bool = False,
) -> SegmentTree:
    """Sets leaves ``leaf_indices`` to ``values`` and recomputes their ancestors.

    Args:
      tree: the tree.
      leaf_indices: ``[B]`` int leaf indices in ``[0, capacity)``.
      values: ``[B, C]`` new leaf values.
      write_mask: optional ``[B]`` bool; False entries are not written.
      indices_are_unique: the caller guarantees that the unmasked indices are distinct, so the
        O(B log B) duplicate resolution is skipped.

    Duplicate indices: the last (unmasked) occurrence wins. Each touched parent is recomputed
    from its K children (never updated by deltas): per level one ``[B, K, C]`` row gather and
    one scatter, O(B K log_K N) in all; the levels with no more rows than B are rebuilt whole
    instead. Recomputing the ancestors of an unwritten (masked or duplicate) leaf is harmless.
    """
    offsets, k, width = tree.level_offsets, tree.fanout, tree.nodes.shape[1]
    batch = leaf_indices.shape[0]
    nodes = leaf_indices.astype(jnp.int32)
    if indices_are_unique:
        keep = jnp.ones((batch,), bool) if write_mask is None else write_mask
    else:
        keep = last_write_wins(nodes, write_mask, index_bound=tree.capacity)
    # Writes that lose (duplicates, masked) are sent out of range and dropped.
    rows = tree.nodes.at[jnp.where(keep, offsets[-2] + nodes, offsets[-1])].set(
        values.astype(tree.nodes.dtype), mode="drop"
    )
    for d in range(tree.depth - 1, -1, -1):  # parent level d
        if (offsets[d + 2] - offsets[d + 1]) // k <= batch:
            return _rebuild_levels(tree.replace(nodes=rows), d + 1)
        nodes = nodes // k
        children = rows.reshape(-1, k, width)[offsets[d + 1] // k + nodes]  # [B, K, C]
        rows = rows.at[offsets[d] + nodes].set(_reduce_siblings(children, tree.reductions))
    return tree.replace(nodes=rows)


def _descend(tree: SegmentTree, remaining: jax.Array, column: int,
             count_column: int | None = None, count_mass=None) -> jax.Array:
    """Root-to-leaf walk on a sum column that only ever enters children of positive mass.

    Per level: one row gather of the K children ``c_0 … c_{K−1}`` of each current node, then
    the last child ``j`` with positive mass and ``S_j = c_0 + … + c_{j−1} ≤ remaining``, found
    by one running sum over the K columns (elementwise over the batch, one fused loop). With
    ``count_column``, a node's mass is ``sum + count_mass · count`` (see :func:`sample`).
    """
    k, width = tree.fanout, tree.nodes.shape[1]
    child_rows = tree.nodes.reshape(-1, k * width)
    first_child_row = jnp.asarray([o // k for o in tree.level_offsets[1:-1]], jnp.int32)

    def step_down(d, carry):
        node, remaining = carry
        children = child_rows[first_child_row[d] + node]  # [B, K·C]
        before = jnp.zeros_like(remaining)
        chosen, chosen_before = jnp.zeros_like(node), jnp.zeros_like(remaining)
        for j in range(k):
            mass = children[:, j * width + column]
            if count_column is not None:
                mass = mass + count_mass * children[:, j * width + count_column]
            enter = (before <= remaining) & (mass > 0)
            chosen = jnp.where(enter, j, chosen)
            chosen_before = jnp.where(enter, before, chosen_before)
            before = before + mass
        return k * node + chosen, remaining - chosen_before

    # A fori_loop, not an unrolled walk: unrolled, XLA fuses each level's choice into the next
    # level's gather and recomputes it for every one of the K·C gathered elements.
    start = jnp.zeros(remaining.shape, jnp.int32)
    node, _ = jax.lax.fori_loop(0, tree.depth, step_down, (start, remaining))
    return node


def sample(tree: SegmentTree, targets: jax.Array, column: int = 0,
           count_column: int | None = None, count_mass=None) -> jax.Array:
    """Prefix-sum descent of a sum column: for each target mass returns a leaf index.

    Leaf ``i`` is returned for targets in ``[S_i, S_{i+1})`` with ``S`` the prefix sums of the
    leaves. Targets are clamped into ``[0, total)`` (NaN → 0). A zero-mass (never written,
    evicted or zero-priority) leaf is never returned as long as the total is positive: float
    rounding can leave a residual at or above a subtree's mass, so at every level the walk
    only enters a child of positive mass (the row of children is read in one gather anyway).

    Args:
      tree: a tree whose ``column`` is a sum.
      targets: ``[B]`` target masses.
      count_column: optional second sum column (e.g. a 0/1 indicator per leaf); the mass of a
        leaf (and of a subtree) is then ``column + count_mass · count_column``, a scalar
        ``count_mass`` shared by every counted leaf (the buffer's decayed-priority floor).
      count_mass: that shared scalar (traced allowed); required with ``count_column``.
    Returns:
      ``[B]`` int32 leaf indices.
    """
    root = total(tree)[column]
    if count_column is not None:
        root = root + count_mass * total(tree)[count_column]
    below_root = jnp.nextafter(root, jnp.zeros_like(root))
    remaining = jnp.clip(targets.astype(tree.nodes.dtype), 0.0, below_root)
    remaining = jnp.where(jnp.isnan(remaining), 0.0, remaining)
    return _descend(tree, remaining, column, count_column, count_mass)


def argmin(tree: SegmentTree, column: int) -> jax.Array:
    """Index of a leaf holding the minimum of a "min" column (the first such leaf in the
    descent): at every level the walk enters the first child whose value equals the parent's.
    O(K log_K N). Meaningless (returns some leaf) when every leaf holds +inf."""
    k, width = tree.fanout, tree.nodes.shape[1]
    child_rows = tree.nodes.reshape(-1, k * width)
    first_child_row = jnp.asarray([o // k for o in tree.level_offsets[1:-1]], jnp.int32)
    target = total(tree)[column]

    def step_down(d, node):
        children = child_rows[first_child_row[d] + node].reshape(k, width)[:, column]
        return k * node + jnp.argmax(children == target).astype(jnp.int32)

    return jax.lax.fori_loop(0, tree.depth, step_down, jnp.zeros((), jnp.int32))


def stratified_targets(key: jax.Array, total_mass: jax.Array, batch_size: int) -> jax.Array:
    """One uniform draw in each of ``batch_size`` equal-mass segments of ``[0, total)``."""
    offsets = jax.random.uniform(key, (batch_size,), dtype=jnp.float32)
    return (jnp.arange(batch_size, dtype=jnp.float32) + offsets) * (total_mass / batch_size)
