"""Seeds × hyperparameter sweeps sharded over devices, one key schedule, one resumable host loop.

* :mod:`.keys` — the seed → key schedule of every run (:func:`seed_key`, :func:`split_run_key`,
  :func:`step_key`).
* :mod:`.grid` — :func:`product_grid`, :func:`run_sharded` (one vmapped program, grid axis
  sharded over a ``("grid",)`` mesh, chunked, resumable per chunk), :func:`run_stage` (one
  resumable stage of a study: a folder per fingerprint, progress, wall time), :func:`saved_arrays`
  (a finished stage's arrays, loaded or computed and saved atomically), :func:`to_host`.
* :mod:`.distributed` — :func:`initialize_distributed`, :func:`launch_local`: one grid over
  several processes (one machine, TPU pod slices, SLURM jobs).
* :mod:`.loop` — :func:`run_loop`, the host loop of every trainer (chunked scans or per-step
  calls, seed axis over the devices, checkpoint/resume).
* :mod:`.checkpoint` — :class:`RunCheckpointer` (orbax, verified by checksum) and
  :func:`progress_printer`.
* :mod:`.integrity` — content checksums and the non-finite guard (:class:`NonFiniteError`).
* :mod:`.lock` — :func:`output_lock`, one writer per output folder.
* :mod:`.identity` — :func:`claim_folder`, one owner per output folder (the run's identity in
  ``run.json``, refused to another run with the differing fields named).
* :mod:`.study_cli` — :func:`study_main`, the command line of the resumable study scripts
  (``--scale``, ``--out``, ``--seed``, ``--fresh``, the compilation-cache flags).
"""
from fresh_rl.sweep.checkpoint import CheckpointError, RunCheckpointer, RunIdentityError, progress_printer
from fresh_rl.sweep.distributed import (DistributedSetupError, LaunchError, initialize_distributed, is_primary,
                                        launch_local)
from fresh_rl.sweep.grid import Grid, grid_mesh, product_grid, run_sharded, run_stage, saved_arrays, to_host
from fresh_rl.sweep.identity import claim_folder
from fresh_rl.sweep.integrity import NonFiniteError, nonfinite_cells, tree_checksum
from fresh_rl.sweep.keys import seed_key, seed_keys, split_run_key, step_key, step_keys
from fresh_rl.sweep.lock import FolderLockedError, output_lock
from fresh_rl.sweep.loop import run_loop

__all__ = [
    "CheckpointError",
    "DistributedSetupError",
    "FolderLockedError",
    "Grid",
    "LaunchError",
    "NonFiniteError",
    "RunCheckpointer",
    "RunIdentityError",
    "claim_folder",
    "grid_mesh",
    "initialize_distributed",
    "is_primary",
    "launch_local",
    "nonfinite_cells",
    "output_lock",
    "product_grid",
    "progress_printer",
    "run_loop",
    "run_sharded",
    "run_stage",
    "saved_arrays",
    "seed_key",
    "seed_keys",
    "split_run_key",
    "step_key",
    "step_keys",
    "to_host",
    "tree_checksum",
]
