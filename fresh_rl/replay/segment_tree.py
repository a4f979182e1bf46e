"""Flat K-ary segment trees, jittable; several reductions side by side.

Layout: ``SegmentTree.columns`` holds one flat ``[R]`` array per reduction (e.g. ``("sum",
"min")``: the buffer keeps its sampling sum tree and its importance-weight min tree together,
so one write walks the tree once for both). Separate arrays, not one ``[R, C]`` array, so a
descent reads only the column it walks: on CPU a gather costs about the same per element
whether or not the elements are adjacent (``benchmarks/replay_columns.py``), so a descent over
interleaved columns paid for every column. The levels are stored root first, one after the
other. Node ``j`` of level ``d`` has the children ``K j … K j + K − 1`` of level ``d + 1``,
which form one contiguous row of the ``[R/K, K]`` view: a descent reads a node's children with
one row gather. Level ``d + 1`` holds ``K · m_d`` nodes, ``m_d`` the real nodes of level ``d``
(``m_L = capacity``, ``m_{d−1} = ⌈m_d/K⌉``, ``m_0 = 1``), so each level is padded to a multiple
of K only (R ≈ N·K/(K−1)), not the tree to a power of K; the root's level is padded to K nodes
too, so every level starts on a row. Padding holds each column's identity (0 for sum, +inf for
min). Depth is ``max(1, ⌈log_K N⌉)`` levels below the root: 20 for N = 2^20 at K = 2, 5 at
K = 16, 3 at K = 128.

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

import functools
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
      columns: one ``[R]`` array per reduction, every level, root first.
      capacity: number of leaves.
      fanout: K, children per node.
      reductions: the C column reductions, "sum" or "min".
    """

    columns: tuple[jax.Array, ...]
    capacity: int = struct.field(pytree_node=False)
    fanout: int = struct.field(pytree_node=False)
    reductions: tuple[Reduction, ...] = struct.field(pytree_node=False)

    @property
    def nodes(self) -> jax.Array:
        """``[R, C]``: every node of every column (a copy; for tests and diagnostics)."""
        return jnp.stack(self.columns, axis=1)

    @property
    def level_offsets(self) -> tuple[int, ...]:
        """First row of each level in a column, root first, and the total R at the end."""
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


def _check_reductions(reductions: Sequence[Reduction]) -> None:
    for r in reductions:
        if r not in _IDENTITY:
            raise ValueError(f"reductions must be 'sum' or 'min', got {r!r}")


def _reduce_siblings(rows: jax.Array, reduction: Reduction) -> jax.Array:
    """``[..., K] → [...]``: K siblings reduced in adjacent pairs, ``log2 K`` rounds."""
    combine = jnp.add if reduction == "sum" else jnp.minimum
    while rows.shape[-1] > 1:
        rows = combine(rows[..., 0::2], rows[..., 1::2])
    return rows[..., 0]


def init(capacity: int, reductions: Sequence[Reduction], fanout: int = DEFAULT_FANOUT,
         dtype=jnp.float32) -> SegmentTree:
    """An empty tree: every node holds its column's identity."""
    _check_reductions(reductions)
    rows = sum(level_sizes(capacity, fanout))
    columns = tuple(jnp.full((rows,), _IDENTITY[r], dtype) for r in reductions)
    return SegmentTree(columns, capacity, fanout, tuple(reductions))


def leaves(tree: SegmentTree) -> jax.Array:
    """The ``[capacity, C]`` leaf values."""
    start = tree.level_offsets[-2]
    return jnp.stack([c[start : start + tree.capacity] for c in tree.columns], axis=1)


def leaf_values(tree: SegmentTree, indices: jax.Array) -> jax.Array:
    """``[B, C]`` values of the leaves ``indices``."""
    rows = tree.level_offsets[-2] + indices
    return jnp.stack([c[rows] for c in tree.columns], axis=-1)


def total(tree: SegmentTree) -> jax.Array:
    """The root ``[C]``: each column's reduction over all leaves."""
    return jnp.stack([c[0] for c in tree.columns])


def build(leaf_values: jax.Array, reductions: Sequence[Reduction],
          fanout: int = DEFAULT_FANOUT) -> SegmentTree:
    """Builds a whole tree bottom-up from ``[capacity, C]`` leaf values in O(N)."""
    tree = init(leaf_values.shape[0], reductions, fanout, leaf_values.dtype)
    start = tree.level_offsets[-2]
    columns = tuple(c.at[start : start + tree.capacity].set(leaf_values[:, i])
                    for i, c in enumerate(tree.columns))
    return _rebuild_levels(tree.replace(columns=columns), tree.depth)


def _rebuild_levels(tree: SegmentTree, parent_level: int) -> SegmentTree:
    """Recomputes levels ``parent_level − 1, …, 0`` whole from the level below each."""
    offsets, k = tree.level_offsets, tree.fanout
    columns = []
    for column, reduction in zip(tree.columns, tree.reductions):
        for d in range(parent_level - 1, -1, -1):
            children = column[offsets[d + 1] : offsets[d + 2]].reshape(-1, k)
            column = column.at[offsets[d] : offsets[d] + children.shape[0]].set(
                _reduce_siblings(children, reduction))
        columns.append(column)
    return tree.replace(columns=tuple(columns))


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
    from its K children (never updated by deltas): per level and column one ``[B, K]`` row
    gather and one scatter, O(B K C log_K N) in all; the levels with no more rows than B are
    rebuilt whole instead. Recomputing the ancestors of an unwritten (masked or duplicate)
    leaf is harmless.
    """
    offsets, k = tree.level_offsets, tree.fanout
    batch = leaf_indices.shape[0]
    leaf_indices = leaf_indices.astype(jnp.int32)
    if indices_are_unique:
        keep = jnp.ones((batch,), bool) if write_mask is None else write_mask
    else:
        keep = last_write_wins(leaf_indices, write_mask, index_bound=tree.capacity)
    # Writes that lose (duplicates, masked) are sent out of range and dropped.
    leaf_rows = jnp.where(keep, offsets[-2] + leaf_indices, offsets[-1])
    # Parent levels whose rows outnumber the batch are updated row by row; the rest whole.
    scattered = [d for d in range(tree.depth - 1, -1, -1)
                 if (offsets[d + 2] - offsets[d + 1]) // k > batch]
    columns = []
    for i, (column, reduction) in enumerate(zip(tree.columns, tree.reductions)):
        column = column.at[leaf_rows].set(values[:, i].astype(column.dtype), mode="drop")
        nodes = leaf_indices
        for d in scattered:  # parent level d, deepest first
            nodes = nodes // k
            children = column.reshape(-1, k)[offsets[d + 1] // k + nodes]  # [B, K]
            column = column.at[offsets[d] + nodes].set(_reduce_siblings(children, reduction))
        columns.append(column)
    tree = tree.replace(columns=tuple(columns))
    if len(scattered) < tree.depth:
        tree = _rebuild_levels(tree, tree.depth - len(scattered))
    return tree


# The two walks are jitted on the column so that an eager call reuses one compiled loop (its body
# closes over the tree's rows; a fresh closure per call would miss JAX's loop cache).
@functools.partial(jax.jit, static_argnums=2)
def _descend(tree: SegmentTree, remaining: jax.Array, column: int):
    """Root-to-leaf walk on a sum column that only ever enters children of positive mass.

    Per level: one row gather of the K children ``c_0 … c_{K−1}`` of each current node, then
    the last child ``j`` with positive mass and ``S_j = c_0 + … + c_{j−1} ≤ remaining``, found
    by one running sum over the K columns (elementwise over the batch, one fused loop). Only
    this column is read. Returns ``(leaf, in_tail, tail_offset)``: ``in_tail`` marks the
    targets at or beyond the root's children's total S (at the first level), ``tail_offset``
    their ``target − S``; their leaf is some positive-mass leaf (the walk stays guarded).
    """
    k = tree.fanout
    child_rows = tree.columns[column].reshape(-1, k)
    first_child_row = jnp.asarray([o // k for o in tree.level_offsets[1:-1]], jnp.int32)

    def step_down(d, carry):
        node, remaining, in_tail, tail_offset = carry
        children = child_rows[first_child_row[d] + node]  # [B, K]
        before = jnp.zeros_like(remaining)
        chosen, chosen_before = jnp.zeros_like(node), jnp.zeros_like(remaining)
        for j in range(k):
            mass = children[:, j]
            enter = (before <= remaining) & (mass > 0)
            chosen = jnp.where(enter, j, chosen)
            chosen_before = jnp.where(enter, before, chosen_before)
            before = before + mass
        at_root = d == 0
        in_tail = jnp.where(at_root, remaining >= before, in_tail)
        tail_offset = jnp.where(at_root, remaining - before, tail_offset)
        return k * node + chosen, remaining - chosen_before, in_tail, tail_offset

    # A fori_loop, not an unrolled walk: unrolled, XLA fuses each level's choice into the next
    # level's gather and recomputes it for every one of the K gathered elements. The tail test
    # is carried out of the loop too: computed outside from the root, XLA fuses the root's
    # read into consumers scheduled after a write of the column and copies the whole column.
    start = jnp.zeros(remaining.shape, jnp.int32)
    no_tail = jnp.zeros(remaining.shape, bool)
    node, _, in_tail, tail_offset = jax.lax.fori_loop(
        0, tree.depth, step_down, (start, remaining, no_tail, jnp.zeros_like(remaining)))
    return node, in_tail, tail_offset


def sample(tree: SegmentTree, targets: jax.Array, column: int = 0, tail_mass=None):
    """Prefix-sum descent of a sum column: for each target mass returns a leaf index.

    Leaf ``i`` is returned for targets in ``[S_i, S_{i+1})`` with ``S`` the prefix sums of the
    leaves. Targets are clamped into ``[0, total)`` (NaN → 0). A zero-mass (never written,
    evicted or zero-priority) leaf is never returned as long as the total is positive: float
    rounding can leave a residual at or above a subtree's mass, so at every level the walk
    only enters a child of positive mass (the row of children is read in one gather anyway).

    Args:
      tree: a tree whose ``column`` is a sum.
      targets: ``[B]`` target masses.
      column: the sum column to walk.
      tail_mass: optional scalar mass M ≥ 0 placed after the leaves (traced allowed; the
        buffer's floored items): targets are clamped into ``[0, total + M)`` instead.
    Returns:
      ``[B]`` int32 leaf indices; with ``tail_mass``, ``(leaves, in_tail, tail_offset)``:
      ``in_tail`` [B] bool for the targets in ``[total, total + M)`` (their leaf is
      meaningless) and ``tail_offset`` their position ``target − total`` in the tail.
    """
    root = tree.columns[column][0]
    limit = root if tail_mass is None else root + tail_mass
    below_limit = jnp.nextafter(limit, jnp.zeros_like(limit))
    remaining = jnp.clip(targets.astype(root.dtype), 0.0, below_limit)
    remaining = jnp.where(jnp.isnan(remaining), 0.0, remaining)
    leaves, in_tail, tail_offset = _descend(tree, remaining, column)
    if tail_mass is None:
        return leaves
    return leaves, in_tail, jnp.maximum(tail_offset, 0.0)


@functools.partial(jax.jit, static_argnums=1)
def argmin(tree: SegmentTree, column: int) -> jax.Array:
    """Index of a leaf holding the minimum of a "min" column (the first such leaf in the
    descent): at every level the walk enters the first child whose value equals the parent's.
    O(K log_K N). Meaningless (returns some leaf) when every leaf holds +inf."""
    k = tree.fanout
    child_rows = tree.columns[column].reshape(-1, k)
    first_child_row = jnp.asarray([o // k for o in tree.level_offsets[1:-1]], jnp.int32)
    target = tree.columns[column][0]

    def step_down(d, node):
        children = child_rows[first_child_row[d] + node]
        return k * node + jnp.argmax(children == target).astype(jnp.int32)

    return jax.lax.fori_loop(0, tree.depth, step_down, jnp.zeros((), jnp.int32))


def stratified_targets(key: jax.Array, total_mass: jax.Array, batch_size: int) -> jax.Array:
    """One uniform draw in each of ``batch_size`` equal-mass segments of ``[0, total)``."""
    offsets = jax.random.uniform(key, (batch_size,), dtype=jnp.float32)
    return (jnp.arange(batch_size, dtype=jnp.float32) + offsets) * (total_mass / batch_size)
