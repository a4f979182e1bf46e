"""Input checks that raise eagerly, under ``checkify``, or fall back safely under ``jit``.

A check on a concrete value raises ``ValueError`` at once. A check on a traced value (inside
``jit``/``vmap``/``scan``) cannot raise: with ``jit_checks=True`` it becomes a
``checkify.check`` (wrap the jitted function with ``jax.experimental.checkify.checkify`` and
call ``err.throw()``), otherwise it is skipped and the caller applies its documented fallback.
"""

from __future__ import annotations

import jax
from jax.experimental import checkify


def is_traced(value) -> bool:
    """True when ``value`` is an abstract tracer (inside a JAX transformation)."""
    return isinstance(value, jax.core.Tracer)


def check(predicate, message: str, jit_checks: bool) -> None:
    """Raises ``ValueError(message)`` if a concrete ``predicate`` is False.

    For traced predicates: a ``checkify.check`` when ``jit_checks`` else nothing (the caller's
    safe fallback handles the bad input). ``message`` must name the field and its allowed range.
    """
    if is_traced(predicate):
        if jit_checks:
            checkify.check(predicate, message)
        return
    if not bool(predicate):
        raise ValueError(message)


def require_range(name: str, value: float, low: float, high: float, *, low_open: bool = False,
                  high_open: bool = False) -> None:
    """Configuration check: ``value`` in the interval, else ``ValueError`` naming ``name``."""
    above = value > low if low_open else value >= low
    below = value < high if high_open else value <= high
    if not (above and below):
        interval = f"{'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
