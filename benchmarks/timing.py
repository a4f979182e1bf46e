"""The benchmarks' one timer: first call (compilation) apart from the steady-state median."""
from __future__ import annotations

import statistics
import time

import jax


def timed(fn, repeats: int) -> tuple[float, float, object]:
    """(first call s, median of ``repeats`` further calls s, last output) of ``fn``, each call
    blocked until its result is ready."""
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return first, statistics.median(times), out
