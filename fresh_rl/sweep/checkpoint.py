"""Orbax checkpoints of a whole run (state, history so far), written by the host loop, verified.

:func:`fresh_rl.sweep.run_loop` saves ``{"state", "history"}`` through a :class:`RunCheckpointer`
(synchronous, atomic: orbax writes to a temporary directory and renames it when complete) and
on restart restores the newest one and continues with the same keys, so the final state and
history equal those of an uninterrupted run bit for bit (tested with SIGKILL). The state is
any pytree (params, optimiser state, replay buffer, version ring, EWMA reference, RNG keys,
counters: whatever the trainer carries).

Verification:

* **When written**, a checkpoint must pass the non-finite guard
  (:func:`~fresh_rl.sweep.integrity.first_nonfinite_leaf`; a NaN state is never saved, so the
  retention policy, which keeps the newest ``max_to_keep``, can only drop older *verified*
  checkpoints) and records the SHA-256 of its contents
  (:func:`~fresh_rl.sweep.integrity.tree_checksum`) beside the run's fingerprint.
* **When restored**, the contents are re-hashed. A checkpoint that is unreadable, does not
  match the state's pytree, or whose checksum differs is skipped with a warning naming it and
  moved aside to ``<step>.corrupt`` (kept for inspection, never deleted); the newest good one
  is restored instead. ``fallback=False`` raises :class:`CheckpointError` instead.
* **Run identity**: the fingerprint is a string naming everything that changes the numbers
  (configuration, seed, …; :func:`fresh_rl.sweep.identity.fingerprint`); a checkpoint saved
  under another one raises :class:`~fresh_rl.sweep.identity.RunIdentityError` naming the
  differing fields, whatever ``fallback`` says.
"""
from __future__ import annotations

import asyncio.base_events
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

from fresh_rl.sweep.identity import RunIdentityError, fingerprint_diff
from fresh_rl.sweep.integrity import NonFiniteError, inspect_for_checkpoint, tree_checksum
from fresh_rl.validation import require_int


class CheckpointError(ValueError):
    """A checkpoint that cannot be used (corrupt, unreadable, incompatible with the state)."""


def _is_closed_loop_callback(unraisable) -> bool:
    """Whether an unraisable exception is tensorstore's late callback into the closed event
    loop of a failed orbax restore: ``RuntimeError('Event loop is closed')``, no owning object,
    every frame in asyncio's ``base_events`` (called from C: no Python caller)."""
    frames = traceback.extract_tb(unraisable.exc_traceback)
    return (unraisable.exc_type is RuntimeError and str(unraisable.exc_value) == "Event loop is closed"
            and unraisable.object is None and bool(frames)
            and all(frame.filename == asyncio.base_events.__file__ for frame in frames))


def _drop_closed_loop_callbacks(hook):
    """``sys.unraisablehook`` wrapper that drops only :func:`_is_closed_loop_callback`
    exceptions: tensorstore reports one per pending read (dozens) when a corrupt checkpoint
    fails to restore; the failure itself is reported once, by :class:`CheckpointError`."""
    def filtered(unraisable):
        if not _is_closed_loop_callback(unraisable):
            hook(unraisable)
    filtered.drops_closed_loop_callbacks = True
    return filtered


class RunCheckpointer:
    """Verified orbax checkpoints of one run in ``directory`` (steps as sub-directories).

    Args:
      directory: created if missing.
      fingerprint: a string identifying the run: every setting that changes its numbers,
        seed included (:func:`fresh_rl.sweep.identity.fingerprint` of the run's identity);
        restoring a checkpoint saved under another fingerprint raises :class:`RunIdentityError`.
      max_to_keep: newest checkpoints kept (≥ 2, so a corrupt newest one leaves a good one).
    """

    def __init__(self, directory, fingerprint: str = "", max_to_keep: int = 2):
        import orbax.checkpoint as ocp

        require_int("max_to_keep", max_to_keep, 2)
        if not getattr(sys.unraisablehook, "drops_closed_loop_callbacks", False):
            sys.unraisablehook = _drop_closed_loop_callbacks(sys.unraisablehook)
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

    def save(self, step: int, tree, extra: Optional[dict] = None, allow_nonfinite: bool = False) -> None:
        """Write ``tree`` as checkpoint ``step``; a tree with NaN (or ±inf parameters) raises
        :class:`~fresh_rl.sweep.integrity.NonFiniteError` and writes nothing. ``extra``: a
        JSON-serialisable dict saved with it (e.g. a run's history of variable length), read
        back by :meth:`extra`. ``allow_nonfinite``: save such a tree anyway; only for the outputs
        of finished runs (:func:`fresh_rl.sweep.run_sharded`'s chunks), where a diverged run is a
        result its caller marks (:func:`~fresh_rl.sweep.integrity.nonfinite_cells`), never for
        a state a run continues from."""
        problem, checksum = inspect_for_checkpoint(tree)
        if problem is not None and not allow_nonfinite:
            raise NonFiniteError(f"refusing to checkpoint step {step} in {self.directory}: {problem}")
        args = self._ocp.args
        meta = {"fingerprint": self.fingerprint, "step": step, "checksum": checksum}
        if extra is not None:
            meta["extra"] = extra
        self._manager.save(step, args=args.Composite(run=args.StandardSave(tree), meta=args.JsonSave(meta)))
        self._manager.wait_until_finished()

    def extra(self, step: int) -> Optional[dict]:
        """The ``extra`` dict saved with checkpoint ``step`` (None if it had none)."""
        return self._meta(step).get("extra")

    def _meta(self, step: int) -> dict:
        where = self.directory / str(step)
        try:
            meta = self._manager.restore(step, args=self._ocp.args.Composite(meta=self._ocp.args.JsonRestore()))["meta"]
        except Exception as err:  # orbax raises many types for unreadable files
            raise CheckpointError(f"checkpoint {where} is unreadable: {err}") from err
        if not isinstance(meta, dict):
            raise CheckpointError(f"checkpoint {where} has malformed metadata: {meta!r}")
        return meta

    def _restore_step(self, step: int, abstract_tree):
        args = self._ocp.args
        where = self.directory / str(step)
        meta = self._meta(step)
        if meta.get("fingerprint") != self.fingerprint:
            diff = fingerprint_diff(meta.get("fingerprint"), self.fingerprint)
            raise RunIdentityError(
                f"checkpoint {where} was saved by another run: {diff} "
                "(resume with the saved settings, or write this run to another folder)")
        try:
            restored = self._manager.restore(step, args=args.Composite(run=args.StandardRestore(abstract_tree)))
        except Exception as err:
            raise CheckpointError(f"checkpoint {where} does not match this run's state "
                                  f"(corrupt or incompatible pytree): {err}") from err
        tree = restored["run"]
        if "checksum" not in meta:
            warnings.warn(f"checkpoint {where} predates checksums: restored unverified", stacklevel=3)
        elif tree_checksum(tree) != meta["checksum"]:
            raise CheckpointError(f"checkpoint {where} is corrupt: its contents do not match the "
                                  "checksum recorded when it was written")
        return tree

    def _move_aside(self, bad: list, good_step: int) -> None:
        """Rename failed checkpoints to ``<step>.corrupt`` (process 0 of a multi-process run)."""
        import jax
        from jax.experimental import multihost_utils

        for bad_step, err in bad:
            aside = self.directory / f"{bad_step}.corrupt"
            for copy in range(1, 1000):
                if not aside.exists():
                    break
                aside = self.directory / f"{bad_step}.corrupt{copy}"
            if jax.process_index() == 0:
                (self.directory / str(bad_step)).rename(aside)
            warnings.warn(f"{err}\nskipped it (moved to {aside}); resuming from the newest good "
                          f"checkpoint, step {good_step}", stacklevel=3)
        if jax.process_count() > 1:
            multihost_utils.sync_global_devices("fresh_rl checkpoint fallback")
        self._manager.reload()  # the manager caches its step list

    def restore_latest(self, abstract_tree, fallback: bool = True) -> Optional[tuple[int, Any]]:
        """``(step, tree)`` of the newest good checkpoint, or ``None`` if there is none.

        Newer checkpoints that fail verification are moved aside to ``<step>.corrupt`` with a
        warning naming each (``fallback=False``: the first failure raises and nothing moves).
        A :class:`RunIdentityError` always raises. If no checkpoint is usable, raises
        :class:`CheckpointError` listing why for each and moves nothing.
        """
        bad: list[tuple[int, CheckpointError]] = []
        for step in reversed(self.steps()):
            try:
                tree = self._restore_step(step, abstract_tree)
            except RunIdentityError:
                raise
            except CheckpointError as err:
                if not fallback:
                    kept = [s for s in self.steps() if s != step]
                    raise CheckpointError(f"{err}\n(previous checkpoints kept: steps {kept}; "
                                          "restore_latest(..., fallback=True) uses the newest good one)") from err
                bad.append((step, err))
                continue
            if bad:
                self._move_aside(bad, step)
            return step, tree
        if bad:
            raise CheckpointError(f"no usable checkpoint in {self.directory}:\n"
                                  + "\n".join(str(err) for _, err in bad))
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

