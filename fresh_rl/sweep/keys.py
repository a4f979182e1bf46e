"""The one seed → key schedule of every run, sweep and experiment.

A run with integer seed ``s`` starts from the *run key* ``seed_key(s) = PRNGKey(s)``, whatever
else is in the grid: seed 3 is the same key in ``fresh-rl train --seed 3``, in the fourth row of
``fresh-rl sweep --seed 0 --seeds 8`` and in every experiment's seed 3 (a grid of S seeds
starting at ``b`` runs seeds ``b … b + S − 1``). Inside a run::

    key_init, key_loop = split_run_key(seed_key(s))   # = jax.random.split
    state_0 = init(key_init)                          # parameters, env state, buffers …
    key of step i = step_key(key_loop, i)             # = jax.random.fold_in(key_loop, i)

Step keys are folded in rather than split from a fixed count, so extending a run by more steps
leaves its first steps unchanged, and a resumed run (``fresh_rl.sweep.run_loop``) or a chunked
scan derives exactly the keys of an uninterrupted one. Every function here accepts a batch of
keys (leading axes) and maps over it, so a seed axis needs no special casing.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp


MAX_SEED = 2**31 - 1  # seeds are int32 inside vmapped key construction


def _check_seed(seed, name: str) -> int:
    if isinstance(seed, bool) or not hasattr(seed, "__index__") or not 0 <= int(seed) <= MAX_SEED:
        raise ValueError(f"{name} must be an integer in [0, 2**31), got {seed!r}")
    return int(seed)


def seed_key(seed: int) -> jax.Array:
    """The run key of integer seed ``seed``: ``jax.random.PRNGKey(seed)`` (uint32 ``[2]``)."""
    return jax.random.PRNGKey(_check_seed(seed, "seed"))


def seed_keys(seeds: Sequence[int]) -> jax.Array:
    """``[len(seeds), 2]`` run keys, row ``j`` = ``seed_key(seeds[j])``."""
    seeds = list(seeds)
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    checked = [_check_seed(s, "every entry of seeds") for s in seeds]
    return jax.vmap(jax.random.PRNGKey)(jnp.asarray(checked, jnp.int32))


def _map_keys(fn, keys, *args):
    keys = jnp.asarray(keys)
    if keys.ndim == 1:
        return fn(keys, *args)
    return jax.vmap(lambda k: _map_keys(fn, k, *args))(keys)


def split_run_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(key_init, key_loop) = jax.random.split(key)`` (per row for a batch of keys)."""
    pair = _map_keys(jax.random.split, key)  # [..., 2, 2]
    return pair[..., 0, :], pair[..., 1, :]


def step_key(key_loop: jax.Array, step) -> jax.Array:
    """The key of step ``step`` (int or traced int): ``fold_in(key_loop, step)``."""
    return _map_keys(jax.random.fold_in, key_loop, step)


def step_keys(key_loop: jax.Array, start: int, stop: int) -> jax.Array:
    """Keys of steps ``start … stop − 1``, stacked on a new axis just before the key axis
    (``[stop − start, 2]`` for one run, ``[S, stop − start, 2]`` for S runs)."""
    steps = jnp.arange(start, stop, dtype=jnp.uint32)
    return _map_keys(lambda k: jax.vmap(lambda i: jax.random.fold_in(k, i))(steps), key_loop)


__all__ = ["seed_key", "seed_keys", "split_run_key", "step_key", "step_keys"]
