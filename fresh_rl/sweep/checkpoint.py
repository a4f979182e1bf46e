"""Orbax checkpoints of a whole run (state, history so far), written by the host loop.

:func:`fresh_rl.sweep.run_loop` saves ``{"state", "history"}`` through a :class:`RunCheckpointer`
(synchronous, atomic: orbax writes to a temporary directory and renames it when complete) and
on restart restores the newest one and continues with the same keys, so the final state and
history equal those of an uninterrupted run bit for bit (tested with SIGKILL). The state is
any pytree (params, optimiser state, replay buffer, version ring, EWMA reference, RNG keys,
counters: whatever the trainer carries). A checkpoint written for another configuration (different ``fingerprint``) or with another
pytree structure, or one that cannot be read, raises :class:`CheckpointError` naming the
directory; the older checkpoints are never deleted by a failed restore (``max_to_keep ≥ 2``
keeps the previous good one) and ``fallback=True`` restores the newest readable one instead.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

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

