"""Input validation shared by every subpackage.

* Configuration checks run once when a frozen config dataclass is built and raise
  ``ValueError`` naming the field and its allowed range.
* Data checks (``check``) raise ``ValueError`` on concrete values. On traced values (inside
  ``jit``/``vmap``/``scan``) they cannot raise: with ``jit_checks=True`` they become
  ``checkify.check`` (wrap the jitted function in ``jax.experimental.checkify.checkify`` and
  call ``err.throw()``), otherwise they are skipped and the caller applies its documented
  safe fallback. ``check_in_range`` does both for a scalar (or array) argument.
* ``require_output_dir`` checks an output folder before any work is done.
* ``register_entry`` adds a named entry to a registry (control methods, old-logit routes),
  refusing a wrong type or a taken name.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
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
        raise ValueError(f"{name} must be in {_interval(low, high, low_inclusive, high_inclusive)}, "
                         f"got {value!r}")


def _interval(low, high, low_inclusive: bool, high_inclusive: bool) -> str:
    return f"{'[' if low_inclusive else '('}{low}, {high}{']' if high_inclusive else ')'}"


def require_int(name: str, value, low: float, high: float = math.inf) -> None:
    """Raise ``ValueError`` unless ``value`` is a Python ``int`` (not a bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    require_in_range(name, value, low, high)


def require_output_dir(name: str, path) -> Path:
    """Raise ``ValueError`` unless ``path`` can be a writable output folder (creates nothing).

    Rejected: an empty path, an existing file, a path under a file, and a folder (or, if it
    does not exist yet, its nearest existing parent) that is not writable. Returns the path.
    """
    text = os.fspath(path)
    if not text.strip():
        raise ValueError(f"{name} must name an output folder, got {text!r}")
    folder = Path(text).expanduser().absolute()
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing == folder and not folder.is_dir():
        raise ValueError(f"{name} {text!r} is an existing file, not a folder")
    if not existing.is_dir():
        raise ValueError(f"{name} {text!r} lies under the file {str(existing)!r}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {text!r} is not writable (no write permission on {str(existing)!r})")
    return folder


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


def check_in_range(
    name: str,
    value,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
    jit_checks: bool = False,
) -> None:
    """:func:`require_in_range` for a scalar or array that may be traced.

    Concrete values: every element is checked (``ValueError`` naming ``name``, the interval and
    the first bad value). Traced values: a ``checkify.check`` with ``jit_checks``, else nothing.
    """
    if not is_traced(value):
        for item in np.unique(np.asarray(value)):
            require_in_range(name, item.item(), low, high,
                             low_inclusive=low_inclusive, high_inclusive=high_inclusive)
        return
    if jit_checks:
        value = jnp.asarray(value)
        above = value >= low if low_inclusive else value > low
        below = value <= high if high_inclusive else value < high
        check(jnp.all(above & below),
              f"{name} must be in {_interval(low, high, low_inclusive, high_inclusive)}", True)


def register_entry(registry: dict, entry, entry_type: type, kind: str, *, replace: bool = False):
    """Add ``entry`` (an ``entry_type`` with a ``name``) to ``registry`` under its name and
    return it; ``ValueError`` naming the expected type, or the name when it is taken (unless
    ``replace``). ``kind`` says what the registry holds ("method", "old-logit route")."""
    if not isinstance(entry, entry_type):
        raise ValueError(f"the {kind} registry takes a {entry_type.__name__}, got {type(entry).__name__}")
    if entry.name in registry and not replace:
        raise ValueError(f"{kind} {entry.name!r} is already registered")
    registry[entry.name] = entry
    return entry
