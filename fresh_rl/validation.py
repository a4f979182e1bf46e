"""Input validation shared by every subpackage.

* Configuration checks run once when a frozen config dataclass is built and raise
  ``ValueError`` naming the field and its allowed range.
* Data checks (``check``) raise ``ValueError`` on concrete values. On traced values (inside
  ``jit``/``vmap``/``scan``) they cannot raise: with ``jit_checks=True`` they become
  ``checkify.check`` (wrap the jitted function in ``jax.experimental.checkify.checkify`` and
  call ``err.throw()``), otherwise they are skipped and the caller applies its documented
  safe fallback.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import jax
from jax.experimental import checkify


def require_in_range(
    name: str,
    value: float,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """Raise ``ValueError`` unless ``value`` lies in the interval ``[low, high]``.

    The interval ends are open or closed as requested; NaN always fails.
    """
    above = value >= low if low_inclusive else value > low
    below = value <= high if high_inclusive else value < high
    if not (above and below):  # also catches NaN
        left = "[" if low_inclusive else "("
        right = "]" if high_inclusive else ")"
        raise ValueError(f"{name} must be in {left}{low}, {high}{right}, got {value!r}")


def require_int(name: str, value, low: float, high: float = math.inf) -> None:
    """Raise ``ValueError`` unless ``value`` is a Python ``int`` (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    require_in_range(name, value, low, high)


def require_choice(name: str, value: str, choices: Sequence[str]) -> None:
    """Raise ``ValueError`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")


def require_bounds(name: str, bounds: Optional[tuple[float, float]]) -> None:
    """Check an optional ``(low, high)`` ratio interval: ``0 <= low <= high``."""
    if bounds is None:
        return
    if len(bounds) != 2:
        raise ValueError(f"{name} must be a (low, high) pair, got {bounds!r}")
    low, high = bounds
    require_in_range(f"{name}[0] (low)", low, 0.0, math.inf)
    require_in_range(f"{name}[1] (high)", high, low, math.inf)


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
