"""The one resumable host loop of every trainer: control runs, LLM pipelines, replay loops.

A run is a state pytree and a step function ``step_fn(state, key) -> (state, metrics)``
applied ``num_steps`` times, step ``i`` receiving ``step_key(key_loop, i)``
(:mod:`fresh_rl.sweep.keys`). :func:`run_loop` drives it from the host:

* **Seeds.** ``key_loop`` may carry leading axes (``[S, 2]`` for S seeds); ``step_fn`` then
  takes and returns a state with the same leading axes (a ``jax.vmap`` of the per-seed step)
  and every step key has them too. With several devices and S divisible by their count the
  state and keys are laid out over the ``("grid",)`` mesh of :func:`fresh_rl.sweep.grid_mesh`,
  so each device runs S/D seeds of the same compiled step.
* **Chunks.** ``steps_per_call = n > 1`` scans ``n`` steps inside one compiled call
  (``jax.lax.scan``; the jitted trainers of ``fresh_rl.control``), ``1`` calls ``step_fn``
  per step (already-jitted LLM iterations that log after every step).
* **History.** ``history[name]`` is float32 ``[*metric_shape, num_steps]`` (the seed axis
  first), plus ``wall_seconds`` ``[*seed_axes, num_steps]`` per step (a chunk's time split
  evenly; the first call's includes compilation).
* **Checkpoints.** With a :class:`~fresh_rl.sweep.checkpoint.RunCheckpointer`, ``{"state",
  "history"}`` is saved every ``checkpoint_every`` steps (chunks never straddle a save) and
  at the end; the newest good checkpoint is restored first and the loop continues after it
  with the same keys, so a resumed run equals an uninterrupted one bit for bit. The
  checkpoint folder is locked for the run (:func:`~fresh_rl.sweep.lock.output_lock`): a
  second run on it fails at once.
* **Non-finite guard.** After every call the metrics (NaN or ±inf) and the state (NaN, or
  ±inf in ``params``/``opt_state``; :mod:`fresh_rl.sweep.integrity`) are checked; the first
  offence raises :class:`~fresh_rl.sweep.integrity.NonFiniteError` naming the step, the
  seed index and the metric (or state leaf). Nothing from that call is saved, so the last
  checkpoint (finite by construction) stays the newest. A seed batch is one run: one
  diverging seed stops it (:func:`fresh_rl.sweep.run_sharded` sweeps mark cells instead).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Optional

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from fresh_rl.sweep.grid import GRID_AXIS, grid_mesh
from fresh_rl.sweep.integrity import NonFiniteError, first_nonfinite_leaf, first_nonfinite_metric, tree_is_finite
from fresh_rl.sweep.keys import step_key, step_keys
from fresh_rl.sweep.lock import output_lock
from fresh_rl.validation import checked_result, checkify_if_checked, require_int

Metrics = dict[str, Any]


def _place_seed_axis(tree, num_seeds: int):
    """Shard the leading (seed) axis of every leaf over all devices when it divides evenly."""
    devices = jax.devices()
    if len(devices) == 1 or num_seeds % len(devices) or jax.process_count() > 1:
        return tree
    sharding = NamedSharding(grid_mesh(devices), PartitionSpec(GRID_AXIS))
    return jax.tree.map(lambda x: jax.device_put(x, sharding), tree)


def run_loop(
    step_fn: Callable[[Any, jax.Array], tuple[Any, Metrics]],
    state: Any,
    key_loop: jax.Array,
    num_steps: int,
    *,
    steps_per_call: int = 1,
    checkpointer=None,
    checkpoint_every: Optional[int] = None,
    log: Optional[Callable[[int, Metrics], None]] = None,
    on_progress: Optional[Callable[[int, int, float], None]] = None,
) -> tuple[Any, dict[str, np.ndarray]]:
    """Run (or resume) ``num_steps`` steps of ``step_fn`` from ``state``; see the module docstring.

    Args:
      step_fn: ``(state, key) -> (state, metrics)``, jitted or not (``steps_per_call > 1``
        compiles the scan of it).
      state: the initial state (ignored when a checkpoint is restored).
      key_loop: ``[*seed_axes, 2]`` loop key(s) (``split_run_key(run_key)[1]``).
      checkpoint_every: steps between checkpoints (default: only at the end).
      log: ``log(i, metrics_i)`` after step ``i`` (NumPy float32 metrics).
      on_progress: ``on_progress(done, num_steps, seconds_per_step)`` after each call
        (:func:`~fresh_rl.sweep.checkpoint.progress_printer`).
    Returns:
      ``(state, history)``.
    """
    require_int("num_steps", num_steps, 1)
    require_int("steps_per_call", steps_per_call, 1)
    if checkpoint_every is not None:
        require_int("checkpoint_every", checkpoint_every, 1)
    key_loop = jax.numpy.asarray(key_loop)
    if key_loop.ndim < 1 or key_loop.shape[-1] != 2:
        raise ValueError(f"key_loop must be a [..., 2] uint32 key array, got shape {key_loop.shape}")
    if checkpointer is None:
        return _run(step_fn, state, key_loop, num_steps, steps_per_call, None, checkpoint_every, log, on_progress)
    with output_lock(checkpointer.directory) if jax.process_index() == 0 else contextlib.nullcontext():
        return _run(step_fn, state, key_loop, num_steps, steps_per_call, checkpointer, checkpoint_every,
                    log, on_progress)


def _restore(checkpointer, step_fn, state, key_loop, num_steps, seed_axes):
    """``(done, state, history)`` from the newest good checkpoint, or ``None``."""
    if checkpointer is None or not checkpointer.steps():
        return None
    abstract_state = jax.eval_shape(lambda: state)
    metric_shapes = jax.eval_shape(step_fn, abstract_state, step_key(key_loop, 0))[1]
    abstract_history = {name: jax.ShapeDtypeStruct(tuple(s.shape) + (num_steps,), np.float32)
                        for name, s in metric_shapes.items()}
    abstract_history["wall_seconds"] = jax.ShapeDtypeStruct(seed_axes + (num_steps,), np.float32)
    restored = checkpointer.restore_latest({"state": abstract_state, "history": abstract_history})
    if restored is None:
        return None
    done, tree = restored
    if done > num_steps:
        raise ValueError(f"the checkpoint holds {done} steps, more than num_steps={num_steps}")
    return done, tree["state"], {name: np.array(value) for name, value in tree["history"].items()}


def _check_finite(metrics, state, first_step, seed_axes, checkpointer) -> None:
    """Raise :class:`NonFiniteError` for the first NaN/±inf metric, else for a bad state leaf."""
    found = first_nonfinite_metric(metrics, first_step, len(seed_axes))
    if found is not None:
        step, name, seed, value = found
        where = f"step {step}" + (f", seed index {seed}" if seed_axes else "")
        problem = f"metric {name!r} is {value}"
    elif not bool(tree_is_finite(state)):
        last = first_step + next(iter(metrics.values())).shape[-1] - 1
        where = f"step {last}" if last == first_step else f"steps {first_step}..{last}"
        problem = f"the state has {first_nonfinite_leaf(state)} (metrics finite)"
    else:
        return
    if checkpointer is None:
        kept = "no checkpointer: nothing was saved"
    else:
        steps = checkpointer.steps()
        kept = (f"the newest checkpoint, step {steps[-1]} in {checkpointer.directory}, is finite and kept"
                if steps else f"no checkpoint was written to {checkpointer.directory}")
    raise NonFiniteError(f"non-finite values at {where}: {problem}; the run stopped there ({kept})")


def _run(step_fn, state, key_loop, num_steps, steps_per_call, checkpointer, checkpoint_every, log,
         on_progress):
    seed_axes = tuple(key_loop.shape[:-1])
    if seed_axes:
        state, key_loop = _place_seed_axis((state, key_loop), seed_axes[0])
    done, history = 0, None  # history is allocated from the first call's metrics
    restored = _restore(checkpointer, step_fn, state, key_loop, num_steps, seed_axes)
    if restored is not None:
        done, state, history = restored
        if seed_axes:
            state = _place_seed_axis(state, seed_axes[0])

    if steps_per_call > 1:
        seed_rank = len(seed_axes)

        def scan_steps(state, keys):  # keys [*seed_axes, n, 2] → scanned over n
            return jax.lax.scan(step_fn, state, jax.numpy.moveaxis(keys, seed_rank, 0))

        program, checkified = checkify_if_checked(scan_steps)
    else:  # an un-jitted step would run op by op
        program, checkified = checkify_if_checked(step_fn)
    # inside fresh_rl.checked() the program is checkified and its error read after every call
    program = program if hasattr(program, "lower") else jax.jit(program)
    every = checkpoint_every or num_steps
    while done < num_steps:
        boundary = min(num_steps, (done // every + 1) * every)
        end = min(done + steps_per_call, boundary)
        started = time.perf_counter()
        if steps_per_call == 1:
            state, metrics = checked_result(program(state, step_key(key_loop, done)), checkified)
            metrics = {name: np.asarray(value, np.float32)[..., None]
                       for name, value in jax.device_get(metrics).items()}
        else:
            state, metrics = checked_result(program(state, step_keys(key_loop, done, end)), checkified)
            metrics = {name: np.moveaxis(np.asarray(value, np.float32), 0, -1)
                       for name, value in jax.device_get(metrics).items()}
        seconds = (time.perf_counter() - started) / (end - done)
        _check_finite(metrics, state, done, seed_axes, checkpointer)
        if history is None:
            history = {name: np.zeros(value.shape[:-1] + (num_steps,), np.float32)
                       for name, value in metrics.items()}
            history["wall_seconds"] = np.zeros(seed_axes + (num_steps,), np.float32)
        for name, value in metrics.items():
            history[name][..., done:end] = value
        history["wall_seconds"][..., done:end] = seconds
        if log is not None:
            for offset in range(end - done):
                log(done + offset, {name: value[..., offset] for name, value in metrics.items()}
                    | {"wall_seconds": np.full(seed_axes, seconds, np.float32)})
        done = end
        if checkpointer is not None and (done % every == 0 or done == num_steps):
            checkpointer.save(done, {"state": state, "history": history})
        if on_progress is not None:
            on_progress(done, num_steps, seconds)
    return state, history


__all__ = ["run_loop"]
