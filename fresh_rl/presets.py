"""One preset type for every study: a frozen dataclass extended per study, chosen by name and
adjusted field by field from the command line.

A study's scales (``ci``, ``cpu``, ``bpe``, …) are instances of one frozen dataclass that
extends :class:`Preset` with the study's own fields (its tasks, grids, seeds). :func:`named`
stamps each with its name; :meth:`Preset.overridden` applies ``--set field=value`` items::

    python experiments/vaco_forward_lag.py --scale cpu --set learning_rates=1e-3 --set chunk=30
    python experiments/old_logits_bpe_reset.py --scale ci --set bed.iterations=3
    fresh-rl presets                      # every study's presets and their fields
    fresh-rl presets vaco_forward_lag     # one study's

A dotted name sets a field of a nested config (``bed.iterations``); on a tuple of configs it sets
that field in every one of them (``tasks.total_env_steps=4096``). Values are parsed by the field's
type (:mod:`fresh_rl.fields`); an unknown field or a value of the wrong type raises
:class:`PresetError` naming the field and what it accepts. The name and the overrides are not
part of the preset's ``repr`` or equality, so fingerprints of saved runs that quote a preset's
settings do not change when a preset is chosen by name; a study records ``label`` (name plus
overrides) in its ``config.json``.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Mapping, Sequence, TypeVar

from fresh_rl.fields import field_type, parse_value

P = TypeVar("P", bound="Preset")


class PresetError(ValueError):
    """A ``--set`` item that names no field, or gives a value the field cannot take."""


@dataclasses.dataclass(frozen=True)
class Preset:
    """What every study's scale shares: its name and the ``--set`` items applied to it (both
    keyword-only, outside ``repr`` and equality). A study extends it with its own fields:
    ``@dataclasses.dataclass(frozen=True) class Scale(Preset): tasks: …``."""

    name: str = dataclasses.field(default="", kw_only=True, repr=False, compare=False)
    overrides: tuple[str, ...] = dataclasses.field(default=(), kw_only=True, repr=False, compare=False)

    @property
    def label(self) -> str:
        """``name`` followed by the overrides, e.g. ``"ci --set chunk=4"``: what a report names."""
        return " ".join([self.name, *(f"--set {item}" for item in self.overrides)])

    def overridden(self: P, items: Sequence[str]) -> P:
        """This preset with each ``field=value`` of ``items`` applied in order (``PresetError``
        naming the field on an unknown name or a bad value)."""
        preset = self
        for item in items:
            path, sep, text = item.partition("=")
            if not sep or not path:
                raise PresetError(f"--set expects field=value, got {item!r}")
            preset = _set(preset, path.split("."), text, path)
        return dataclasses.replace(preset, overrides=self.overrides + tuple(items))

    def describe(self) -> list[tuple[str, str]]:
        """(field, value as text) for every field of the study's extension, in declaration order."""
        return [(f.name, _short(getattr(self, f.name))) for f in dataclasses.fields(self) if f.repr]


def named(presets: Mapping[str, P]) -> dict[str, P]:
    """``presets`` with each value's ``name`` set to its key (a study's ``SCALES``)."""
    for key, value in presets.items():
        if not isinstance(value, Preset):
            raise TypeError(f"preset {key!r} is a {type(value).__name__}, not a fresh_rl.presets.Preset")
    return {key: dataclasses.replace(value, name=key) for key, value in presets.items()}


def _settable(obj) -> list[str]:
    return [f.name for f in dataclasses.fields(obj) if f.init and f.repr]


def _set(obj, path: list[str], text: str, full: str):
    head, rest = path[0], path[1:]
    if not dataclasses.is_dataclass(obj) or head not in _settable(obj):
        allowed = ", ".join(_settable(obj)) if dataclasses.is_dataclass(obj) else "none (not a config)"
        raise PresetError(f"--set {full}: {type(obj).__name__} has no field {head!r}; its fields: {allowed}")
    current = getattr(obj, head)
    if rest:
        if isinstance(current, tuple) and current and all(dataclasses.is_dataclass(c) for c in current):
            value = tuple(_set(c, rest, text, full) for c in current)
        else:
            value = _set(current, rest, text, full)
    else:
        if dataclasses.is_dataclass(current) or (isinstance(current, tuple) and current
                                                  and dataclasses.is_dataclass(current[0])):
            raise PresetError(f"--set {full}: a nested config, set one of its fields ({full}.FIELD=value)")
        kind = field_type(type(obj), next(f for f in dataclasses.fields(obj) if f.name == head))
        if kind is object or kind is typing.Any:
            kind = type(current)
        try:
            value = parse_value(text, kind, current)
        except ValueError as err:
            raise PresetError(f"--set {full} {err}") from None
    try:
        return dataclasses.replace(obj, **{head: value})
    except (ValueError, TypeError) as err:  # the config's own range checks
        raise PresetError(f"--set {full}={text}: {err}") from None


def _short(value) -> str:
    if isinstance(value, tuple) and value and all(dataclasses.is_dataclass(v) for v in value):
        return "(" + ", ".join(_short(v) for v in value) + ")"
    if dataclasses.is_dataclass(value):
        label = getattr(value, "env_name", None) or getattr(value, "name", None) or type(value).__name__
        return f"{type(value).__name__}({label})" if label != type(value).__name__ else label
    return repr(value)
