"""Checkpoint and resume of a whole run: state, metrics so far and the step counter.

A run is ``init(key_init) → state`` followed by ``num_steps`` applications of
``step(state, key_i) → (state, metrics_i)`` with ``key_init, key_loop = split(key)`` and
``key_i = split(key_loop, num_steps)[i]`` — the same key schedule as
:func:`fresh_rl.control.train.train`, so a resumable run reproduces a plain one. The state is
any pytree (params, optimiser state, replay buffer, version ring, EWMA reference, RNG keys,
counters: whatever the trainer carries). :func:`run_resumable` scans ``every`` steps per
compiled call and saves ``{"state", "metrics", "step"}`` after each chunk with orbax
(synchronous, atomic: orbax writes to a temporary directory and renames it when complete).

On restart it restores the newest checkpoint and continues with the same keys, so the final
state and metrics equal those of an uninterrupted run bit for bit (tested with SIGKILL). A
checkpoint written for another configuration (different ``fingerprint``) or with another
pytree structure, or one that cannot be read, raises :class:`CheckpointError` naming the
directory; the older checkpoints are never deleted by a failed restore (``max_to_keep ≥ 2``
keeps the previous good one) and ``fallback=True`` restores the newest readable one instead.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Optional

import jax
import numpy as np

from fresh_rl.validation import require_int


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (corrupt, incompatible, or for another configuration)."""


class RunCheckpointer:
    """Orbax checkpoints of one run in ``directory`` (steps as sub-directories).

    Args:
      directory: created if missing.
      fingerprint: a string identifying the configuration (e.g. ``repr(config)``); restoring a
        checkpoint saved under another fingerprint raises :class:`CheckpointError`.
      max_to_keep: newest checkpoints kept (≥ 2, so a corrupt newest one leaves a good one).
    """

    def __init__(self, directory, fingerprint: str = "", max_to_keep: int = 2):
        import orbax.checkpoint as ocp

        require_int("max_to_keep", max_to_keep, 2)
        self.directory = Path(directory).resolve()
        self.fingerprint = fingerprint
        self._ocp = ocp
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                                 enable_async_checkpointing=False),
            item_names=("run", "meta"),
        )

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(self, step: int, tree) -> None:
        args = self._ocp.args
        self._manager.save(step, args=args.Composite(
            run=args.StandardSave(tree), meta=args.JsonSave({"fingerprint": self.fingerprint, "step": step})))
        self._manager.wait_until_finished()

    def _restore_step(self, step: int, abstract_tree):
        args = self._ocp.args
        where = self.directory / str(step)
        try:
            meta = self._manager.restore(step, args=args.Composite(meta=args.JsonRestore()))["meta"]
        except Exception as err:  # orbax raises many types for unreadable files
            raise CheckpointError(f"checkpoint {where} is unreadable: {err}") from err
        if meta.get("fingerprint") != self.fingerprint:
            raise CheckpointError(
                f"checkpoint {where} was saved for another configuration:\n  saved:   "
                f"{meta.get('fingerprint')}\n  current: {self.fingerprint}")
        try:
            restored = self._manager.restore(step, args=args.Composite(run=args.StandardRestore(abstract_tree)))
        except Exception as err:
            raise CheckpointError(f"checkpoint {where} does not match this run's state "
                                  f"(corrupt or incompatible pytree): {err}") from err
        return restored["run"]

    def restore_latest(self, abstract_tree, fallback: bool = False) -> Optional[tuple[int, Any]]:
        """``(step, tree)`` of the newest checkpoint, or ``None`` if there is none.

        With ``fallback`` an unusable newest checkpoint is skipped (older ones are tried in
        turn); without it the :class:`CheckpointError` is raised and nothing is deleted.
        """
        errors = []
        for step in reversed(self.steps()):
            try:
                return step, self._restore_step(step, abstract_tree)
            except CheckpointError as err:
                if not fallback:
                    kept = [s for s in self.steps() if s != step]
                    raise CheckpointError(f"{err}\n(previous checkpoints kept: steps {kept}; "
                                          "restore_latest(..., fallback=True) uses the newest readable one)") from err
                errors.append(str(err))
        if errors:
            raise CheckpointError("no readable checkpoint:\n" + "\n".join(errors))
        return None


def run_resumable(
    init: Callable[[jax.Array], Any],
    step: Callable[[Any, jax.Array], tuple[Any, dict]],
    key: jax.Array,
    num_steps: int,
    checkpointer: RunCheckpointer,
    every: int,
    on_checkpoint: Optional[Callable[[int, int, float], None]] = None,
) -> tuple[Any, dict]:
    """Run (or resume) ``num_steps`` steps, checkpointing every ``every`` steps.

    Returns the final state and the ``[num_steps]``-stacked metrics (NumPy).
    ``on_checkpoint(done, num_steps, seconds_per_step)`` is called after each save (progress
    bars, logging; :func:`progress_printer` prints one with an ETA).
    """
    require_int("num_steps", num_steps, 1)
    require_int("every", every, 1)
    key_init, key_loop = jax.random.split(key)
    keys = jax.random.split(key_loop, num_steps)
    abstract_state = jax.eval_shape(init, key_init)
    metric_shapes = jax.eval_shape(step, abstract_state, keys[0])[1]
    abstract_metrics = jax.tree.map(lambda s: jax.ShapeDtypeStruct((num_steps,) + s.shape, s.dtype),
                                    metric_shapes)
    restored = checkpointer.restore_latest(
        {"state": abstract_state, "metrics": abstract_metrics, "step": jax.ShapeDtypeStruct((), np.int64)})
    if restored is None:
        done, state = 0, init(key_init)
        metrics = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), abstract_metrics)
    else:
        done, tree = restored
        state, metrics = tree["state"], jax.tree.map(np.array, tree["metrics"])
    chunk = jax.jit(lambda s, ks: jax.lax.scan(step, s, ks))
    while done < num_steps:
        start_time = time.perf_counter()
        end = min(done + every, num_steps)
        state, chunk_metrics = chunk(state, keys[done:end])
        for full, part in zip(jax.tree.leaves(metrics), jax.tree.leaves(chunk_metrics)):
            full[done:end] = np.asarray(part)
        checkpointer.save(end, {"state": state, "metrics": metrics, "step": np.int64(end)})
        if on_checkpoint is not None:
            on_checkpoint(end, num_steps, (time.perf_counter() - start_time) / (end - done))
        done = end
    return state, metrics


def progress_printer(label: str = "", stream=None) -> Callable[[int, int, float], None]:
    """An ``on_checkpoint`` callback printing ``label done/total (pct) ETA``."""
    import sys

    out = stream or sys.stderr

    def report(done: int, total: int, seconds_per_step: float) -> None:
        eta = seconds_per_step * (total - done)
        out.write(f"\r{label} {done}/{total} ({100 * done / total:.0f}%) ETA {eta:.0f}s")
        if done == total:
            out.write("\n")
        out.flush()

    return report

