"""Integrity of a run's numbers: content checksums of pytrees and the non-finite guard.

* :func:`tree_checksum` — SHA-256 over every leaf's path, dtype, shape and bytes (host copy),
  recorded with each checkpoint when it is written and recomputed when it is restored, so a
  flipped byte on disk is detected even where the file format itself decodes it silently.
* :func:`first_nonfinite_metric` / :func:`first_nonfinite_leaf` — the guard of
  :func:`fresh_rl.sweep.run_loop`: one rule for metrics and state leaves alike: NaN anywhere,
  or ±inf in anything named with one of the words ``params``, ``opt`` (``opt_state``),
  ``loss`` or ``grad`` (parameters, optimiser moments, losses, gradient norms; ``hparams`` is
  another word), stops the run with
  :class:`NonFiniteError`. Infinity elsewhere is a legitimate value: a replay tree's empty
  min-nodes, FreshPER's τ = ∞ (no decay) reported as a metric.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

INF_FORBIDDEN_IN = frozenset({"params", "opt", "loss", "grad"})  # opt: opt_state


class NonFiniteError(FloatingPointError):
    """A run produced NaN/±inf: it was stopped at the step named in the message."""


def _host_leaves(tree) -> list[tuple[str, np.ndarray]]:
    leaves = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            from jax.experimental import multihost_utils
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        leaves.append((jax.tree_util.keystr(path), np.asarray(leaf)))
    return leaves


def _checksum(leaves: list[tuple[str, np.ndarray]]) -> str:
    digest = hashlib.sha256()
    for path, leaf in leaves:
        digest.update(f"{path}|{leaf.dtype.str}|{leaf.shape}|".encode())
        digest.update(np.ascontiguousarray(leaf).tobytes())
    return digest.hexdigest()


def tree_checksum(tree) -> str:
    """Hex SHA-256 of a pytree's contents (leaf paths, dtypes, shapes and bytes, in order)."""
    return _checksum(_host_leaves(tree))


def inspect_for_checkpoint(tree) -> tuple[Optional[str], str]:
    """``(first_nonfinite_leaf(tree), tree_checksum(tree))`` from one host copy of the tree."""
    leaves = _host_leaves(tree)
    return _first_bad(leaves), _checksum(leaves)


def _inf_allowed(name: str) -> bool:
    """Whether ±inf may appear under ``name`` (a metric name or a key path): not when one of
    its words (split at anything but letters) is one of ``INF_FORBIDDEN_IN``."""
    return not INF_FORBIDDEN_IN.intersection(re.split("[^a-z]+", name.lower()))


def _bad(values: np.ndarray, name: str) -> np.ndarray:
    return np.isnan(values) if _inf_allowed(name) else ~np.isfinite(values)


def _bad_fraction(leaf: np.ndarray, name: str) -> Optional[str]:
    if not np.issubdtype(leaf.dtype, np.inexact) and leaf.dtype.name != "bfloat16":
        return None
    values = np.asarray(leaf, np.float32) if leaf.dtype.name == "bfloat16" else leaf
    bad = _bad(values, name)
    if not bad.any():
        return None
    kind = "NaN" if np.isnan(values).any() else "inf"
    return f"{int(bad.sum())} of {bad.size} values {kind}"


def first_nonfinite_leaf(tree) -> Optional[str]:
    """``"path: k of n values NaN"`` for the first leaf breaking the guard's rule, else ``None``."""
    return _first_bad(_host_leaves(tree))


def _first_bad(leaves: list[tuple[str, np.ndarray]]) -> Optional[str]:
    for path, leaf in leaves:
        problem = _bad_fraction(leaf, path)
        if problem is not None:
            return f"{path or '<root>'}: {problem}"
    return None


@jax.jit
def tree_is_finite(tree) -> jax.Array:
    """Device-side scalar: ``first_nonfinite_leaf(tree) is None`` without copying the tree."""
    ok = jnp.asarray(True)
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not jnp.issubdtype(leaf.dtype, jnp.inexact):
            continue
        if _inf_allowed(jax.tree_util.keystr(path)):
            ok &= ~jnp.any(jnp.isnan(leaf))
        else:
            ok &= jnp.all(jnp.isfinite(leaf))
    return ok


def first_nonfinite_metric(metrics: Mapping[str, Any], first_step: int,
                           num_seed_axes: int = 0) -> Optional[tuple[int, str, tuple, float]]:
    """``(step, metric, seed_index, value)`` of the earliest value breaking the rule in ``metrics``
    (arrays ``[*seed_axes, n]`` holding steps ``first_step … first_step + n − 1``), or ``None``.
    Ties at one step go to the first metric in ``metrics``' order."""
    found = None
    for name, value in metrics.items():
        value = np.asarray(value)
        bad = _bad(value, name)
        if not bad.any():
            continue
        step = int(np.argmax(bad.reshape(-1, value.shape[-1]).any(0)))
        if found is None or step < found[0] - first_step:
            seed = tuple(int(i) for i in np.argwhere(bad[..., step])[0]) if num_seed_axes else ()
            found = (step + first_step, name, seed, float(value[seed + (step,)]))
    return found


def nonfinite_cells(metrics: Mapping[str, Any]) -> dict[int, tuple[int, str]]:
    """Grid cells whose metric history went non-finite: ``{cell: (first_step, metric)}`` for
    metrics ``[cells, steps]`` (a :func:`fresh_rl.sweep.run_sharded` sweep's output)."""
    cells: dict[int, tuple[int, str]] = {}
    for name, value in metrics.items():
        bad = _bad(np.asarray(value), name)
        bad = bad.reshape(bad.shape[0], -1, bad.shape[-1]).any(1)
        for cell in np.flatnonzero(bad.any(1)):
            step = int(np.argmax(bad[cell]))
            if int(cell) not in cells or step < cells[int(cell)][0]:
                cells[int(cell)] = (step, name)
    return dict(sorted(cells.items()))


__all__ = ["NonFiniteError", "first_nonfinite_leaf", "first_nonfinite_metric", "inspect_for_checkpoint",
           "nonfinite_cells", "tree_checksum", "tree_is_finite"]
