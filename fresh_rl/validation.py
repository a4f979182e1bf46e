"""Input validation shared by every subpackage.

* Configuration checks run once when a frozen config dataclass is built and raise
  ``ValueError`` naming the field and its allowed range.
  Numbers may be Python, NumPy or concrete 0-d JAX scalars; bools are refused.
* Data checks (``check``) raise ``ValueError`` on concrete values. On traced values (inside
  ``jit``/``vmap``/``scan``) they cannot raise: with ``jit_checks=True`` or inside
  :func:`checked` they become ``checkify.check`` (wrap the jitted function in
  ``jax.experimental.checkify.checkify`` and call ``err.throw()``), otherwise they are
  skipped and the caller applies its documented safe fallback. ``check_in_range`` does both
  for a scalar (or array) argument.
* ``require_output_dir`` checks an output folder before any work is done.
* ``register_entry`` adds a named entry to a registry (control methods, old-logit routes),
  refusing a wrong type or a taken name.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from pathlib import Path
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify


def _is_real(dtype, integer_only: bool = False) -> bool:
    """Integer (not bool) or, unless ``integer_only``, floating dtype (bfloat16 included)."""
    return bool(jnp.issubdtype(dtype, jnp.integer)
                or (not integer_only and jnp.issubdtype(dtype, jnp.floating)))


def _number(name: str, value, what: str, integer_only: bool = False):
    """``value`` as a Python number when it is a concrete real scalar (Python, NumPy or 0-d
    JAX array; integer when ``integer_only``); ``ValueError`` naming ``name`` otherwise."""
    if not is_traced(value) and not isinstance(value, (str, bytes)):
        try:
            array = np.asarray(value)
        except (TypeError, ValueError):
            array = None
        if array is not None and array.ndim == 0 and _is_real(array.dtype, integer_only):
            return int(array) if jnp.issubdtype(array.dtype, jnp.integer) else float(array)
    raise ValueError(f"{name} must be {what}, got {value!r}")


def require_in_range(
    name: str,
    value: float,
    low: float = -math.inf,
    high: float = math.inf,
    *,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """Raise ``ValueError`` unless ``value`` is a concrete real scalar (Python, NumPy or 0-d
    JAX; not a bool) in the interval ``[low, high]``.

    The interval ends are open or closed as requested; NaN always fails.
    """
    interval = _interval(low, high, low_inclusive, high_inclusive)
    number = _number(name, value, f"a number in {interval}")
    if not _inside(number, low, high, low_inclusive, high_inclusive):  # also catches NaN
        raise ValueError(f"{name} must be in {interval}, got {number!r}")


def _inside(value, low, high, low_inclusive: bool, high_inclusive: bool):
    """``low ≤ value ≤ high`` (ends open or closed as asked) for a number or, elementwise, a
    NumPy or JAX array; False for NaN."""
    above = value >= low if low_inclusive else value > low
    below = value <= high if high_inclusive else value < high
    return above & below


def _interval(low, high, low_inclusive: bool, high_inclusive: bool) -> str:
    return f"{'[' if low_inclusive else '('}{low}, {high}{']' if high_inclusive else ')'}"


def require_int(name: str, value, low: float, high: float = math.inf) -> int:
    """Raise ``ValueError`` unless ``value`` is a concrete integer scalar (Python, NumPy or 0-d
    JAX; not a bool) in ``[low, high]``; returns it as a Python ``int``."""
    number = _number(name, value, f"an integer in [{low}, {high}]", integer_only=True)
    require_in_range(name, number, low, high)
    return number


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


_CHECKED = [0]  # depth of the active ``checked()`` contexts


@contextlib.contextmanager
def _switch(clear_caches: bool):
    """Switch on; with ``clear_caches`` JAX's in-memory traces are dropped on entering and on
    leaving the outermost switch, so no trace made on one side is reused on the other."""
    if clear_caches and not _CHECKED[0]:
        jax.clear_caches()
    _CHECKED[0] += 1
    try:
        yield
    finally:
        _CHECKED[0] -= 1
        if clear_caches and not _CHECKED[0]:
            jax.clear_caches()


def checked(fn=None):
    """Turns on the traced range checks of every building block (as ``jit_checks=True``).

    ``with checked(): ...`` — code traced inside the block emits a ``checkify.check`` for each
    documented range (δ, λ, discounts, β, τ, ESS weights, buffer versions and indices, ...):
    wrap jitted code in ``checkify.checkify`` and call ``err.throw()`` (staging such a check
    without ``checkify`` is an error). The switch is read when a function is traced, so the
    outermost block clears JAX's in-memory trace and compile caches on entry and on exit:
    code traced before is traced again inside, and nothing traced inside is reused outside
    (the price is recompilation; the persistent compilation cache still applies).

    ``checked(fn)`` — returns ``fn`` jitted and checkified, traced with the switch on at its
    first call (no cache clearing), whose calls raise ``checkify.JaxRuntimeError`` naming the
    field on a violation. Pass the plain function: the body of an already-jitted ``fn``
    traced with the switch off would be reused unchecked.

    Concrete values raise ``ValueError`` with or without the switch. Off (the default),
    nothing is emitted: the jaxpr and the compiled program are those without checks.
    """
    if fn is None:
        return _switch(clear_caches=True)
    # a fresh function, so no trace of ``fn`` made with the switch off is reused
    checkified = jax.jit(checkify.checkify(lambda *args, **kwargs: fn(*args, **kwargs)))

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with _switch(clear_caches=False):
            result = checkified(*args, **kwargs)
        return checked_result(result, True)
    return run


def checkify_if_checked(fn):
    """``(fn, False)`` with :func:`checked` off: the program compiled from it is the one
    without checks. On: ``(checkify.checkify(fn), True)`` (user checks only), whose program
    returns ``(error, out)`` for :func:`checked_result`."""
    if not checks_enabled():
        return fn, False
    return checkify.checkify(fn), True


def checked_result(result, checkified: bool):
    """The output of a program built by :func:`checkify_if_checked`; when ``checkified``, first
    raises ``checkify.JaxRuntimeError`` (naming the field and its range) for a failed check."""
    if not checkified:
        return result
    err, out = result
    err.throw()
    return out


CHECKED_HELP = ("debug switch, off by default: compile every program with the building blocks' traced "
                "range checks (fresh_rl.checked) and stop at the first value out of range, naming the "
                "field and its range; costs a recompile and about 1.5x the run time of a step "
                "(results/bench/checkify.md)")
"""Help text of the ``--checked`` flag of ``fresh-rl train``/``sweep`` and the study scripts."""


def traced_check_message(err: checkify.JaxRuntimeError) -> str:
    """One line for a failed traced check: ``a traced check failed: <field> must be in …``."""
    return f"a traced check failed: {(str(err).splitlines() or [''])[0]}"


def checks_enabled(jit_checks: bool = False) -> bool:
    """Whether traced range checks are emitted: ``jit_checks`` or inside :func:`checked`."""
    return jit_checks or _CHECKED[0] > 0


def check(predicate, message: str, jit_checks: bool = False) -> None:
    """Raises ``ValueError(message)`` if a concrete ``predicate`` is False.

    For traced predicates: a ``checkify.check`` when :func:`checks_enabled` else nothing (the
    caller's safe fallback handles the bad input). ``message`` must name the field and its
    allowed range.
    """
    if is_traced(predicate):
        if checks_enabled(jit_checks):
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
    where=None,
) -> None:
    """:func:`require_in_range` for a scalar or array that may be traced.

    Concrete values (Python, NumPy or JAX): every element (where the boolean ``where`` is
    True, default all) is checked (``ValueError`` naming ``name``, the interval and the first
    bad value). Traced values: a ``checkify.check`` when :func:`checks_enabled`, else nothing.
    """
    interval = _interval(low, high, low_inclusive, high_inclusive)
    if not is_traced(value):
        array = np.asarray(value)
        if not _is_real(array.dtype):
            raise ValueError(f"{name} must be a number in {interval}, got dtype {array.dtype}")
        bad = ~_inside(array, low, high, low_inclusive, high_inclusive)
        if where is not None:
            bad &= np.asarray(where)
        if bad.any():
            raise ValueError(f"{name} must be in {interval}, got {_number(name, array[bad].flat[0], '')!r}")
        return
    if checks_enabled(jit_checks):
        ok = _inside(jnp.asarray(value), low, high, low_inclusive, high_inclusive)
        ok = ok if where is None else ok | ~jnp.asarray(where)
        checkify.check(jnp.all(ok), f"{name} must be in {interval}")


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
