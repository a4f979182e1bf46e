"""Typed values of dataclass fields from text: what ``fresh-rl train --field value`` and a study's
``--set field=value`` parse with.

Integers may be written ``1e6``; tuples are comma-separated (``64,64``); booleans are
true/false/1/0; ``None`` (capitalised) unsets an optional field; a nested config given by one
value sets its first field. A value of the wrong type raises ``ValueError`` saying what was
expected (``expects an integer, got 'abc'``).
"""
from __future__ import annotations

import dataclasses
import math
import typing


def field_type(cls, field: dataclasses.Field):
    """The annotated type of ``field`` on ``cls`` (the default's type where unannotated)."""
    hints = typing.get_type_hints(cls)
    return hints.get(field.name, type(field.default))


KIND_NAMES = {int: "an integer", float: "a number", str: "a string"}


def parse_scalar(text: str, kind):
    """``text`` as ``kind`` (int, float or str), else ``ValueError("expects …, got '…'")``.
    Integers may use float notation (``1e6``); NaN is never a valid setting."""
    if kind is str:
        return text
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if kind is int:
        try:
            return int(text)
        except ValueError:
            if math.isfinite(number) and number.is_integer():
                return int(number)
    elif not math.isnan(number):
        return number
    raise ValueError(f"expects {KIND_NAMES[kind]}, got {text!r}")


def parse_value(text: str, kind, default):
    """One ``--field`` value of a config field of type ``kind`` (``ValueError`` saying what
    was expected)."""
    origin = typing.get_origin(kind)
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if text == "None" and (origin is typing.Union or default is None):
        return None
    if origin is typing.Union and args:
        kind = args[0]
        origin = typing.get_origin(kind)
    if dataclasses.is_dataclass(kind):  # Optional[Config] given by its first field
        first = dataclasses.fields(kind)[0]
        return kind(**{first.name: parse_value(text, field_type(kind, first), None)})
    if kind is bool or isinstance(default, bool):
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"expects true or false, got {text!r}")
        return text.lower() in ("true", "1")
    if origin is tuple or isinstance(default, tuple):
        item = (typing.get_args(kind) or (int,))[0]
        item = int if item is Ellipsis else item
        try:
            return tuple(parse_scalar(x, item) for x in text.split(",") if x)
        except ValueError:
            raise ValueError(f"expects comma-separated values, each {KIND_NAMES[item]}, "
                             f"got {text!r}") from None
    if kind not in KIND_NAMES and isinstance(default, (int, float, str)):
        kind = type(default)
    if kind in KIND_NAMES:
        return parse_scalar(text, kind)
    raise ValueError(f"cannot be parsed as {kind}, got {text!r}")


def flat_fields(cls, prefix: str = ""):
    """(dotted name, owning class, field, default) for every leaf field of a config dataclass."""
    instance = cls() if prefix == "" else None
    for field in dataclasses.fields(cls):
        default = field.default if field.default is not dataclasses.MISSING else (
            field.default_factory() if field.default_factory is not dataclasses.MISSING else None)
        if instance is not None:
            default = getattr(instance, field.name)
        if dataclasses.is_dataclass(default):
            yield from flat_fields(type(default), f"{prefix}{field.name}.")
        else:
            yield f"{prefix}{field.name}", cls, field, default
