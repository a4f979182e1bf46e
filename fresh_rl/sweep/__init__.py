"""Seeds × hyperparameter sweeps sharded over devices, and checkpoint/resume of whole runs.

* :mod:`.grid` — :func:`product_grid`, :func:`run_sharded` (one vmapped program, grid axis
  sharded over a ``("grid",)`` mesh, chunked), :func:`to_host`, :func:`initialize_distributed`.
* :mod:`.checkpoint` — :class:`RunCheckpointer` (orbax) and :func:`run_resumable`.
"""
from fresh_rl.sweep.checkpoint import CheckpointError, RunCheckpointer, progress_printer, run_resumable
from fresh_rl.sweep.grid import Grid, grid_mesh, initialize_distributed, product_grid, run_sharded, to_host

__all__ = [
    "CheckpointError",
    "Grid",
    "RunCheckpointer",
    "grid_mesh",
    "initialize_distributed",
    "product_grid",
    "progress_printer",
    "run_resumable",
    "run_sharded",
    "to_host",
]
