"""Who owns an output folder: a run's identity, recorded in ``run.json`` before it computes.

A run's *identity* is a flat ``{field: value}`` dict of everything that changes its numbers
(command, configuration fields, grid, seed schedule). :func:`claim_folder` writes it to
``<folder>/run.json`` (with the commit and command line, recorded but not compared) before
any work, and refuses a folder whose ``run.json`` names another identity, listing only the
differing fields (``seed 0 → 5, learning_rate 0.0003 → 0.001``); the same identity (a
resume) is accepted. :func:`fingerprint` is the same identity as the one string a
:class:`~fresh_rl.sweep.RunCheckpointer` stores with each checkpoint, and
:func:`fingerprint_diff` compares two of them the same way. :func:`default_output` names a
fresh folder per run (``runs/<kind>-<timestamp>-<hash>``), never a shared one.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from pathlib import Path
from typing import Any, Mapping, Optional

IDENTITY_NAME = "run.json"
MAX_DIFF_FIELDS = 8


class RunIdentityError(ValueError):
    """An output folder or checkpoint that belongs to another run (its identity differs)."""


def _plain(value):
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def config_fields(config, prefix: str = "") -> dict[str, Any]:
    """``{dotted name: value}`` for every leaf field of a (nested) config dataclass."""
    fields = {}
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields.update(config_fields(value, f"{prefix}{field.name}."))
        else:
            fields[f"{prefix}{field.name}"] = _plain(value)
    return fields


def fingerprint(identity: Mapping[str, Any]) -> str:
    """The identity as one canonical JSON string (what checkpoints store)."""
    return json.dumps(identity, sort_keys=True, default=repr)


def identity_diff(saved: Mapping[str, Any], current: Mapping[str, Any]) -> str:
    """``"seed 0 → 5, learning_rate 0.0003 → 0.001"``: the fields that differ (at most
    ``MAX_DIFF_FIELDS``, then how many more); a field one side lacks shows as ``(none)``."""
    missing = "(none)"
    changed = [f"{name} {json.dumps(saved.get(name, missing))} → {json.dumps(current.get(name, missing))}"
               for name in dict.fromkeys([*saved, *current]) if saved.get(name, missing) != current.get(name, missing)]
    text = ", ".join(changed[:MAX_DIFF_FIELDS]).replace('"', "")
    if len(changed) > MAX_DIFF_FIELDS:
        text += f", and {len(changed) - MAX_DIFF_FIELDS} more"
    return text


def fingerprint_diff(saved: str, current: str) -> str:
    """:func:`identity_diff` of two :func:`fingerprint` strings; older free-form fingerprints
    are shown whole (cut to 200 characters each)."""
    try:
        old, new = json.loads(saved), json.loads(current)
    except (TypeError, json.JSONDecodeError):
        old = new = None
    if isinstance(old, dict) and isinstance(new, dict):
        return identity_diff(old, new)
    return f"saved {str(saved)[:200]!r}, current {str(current)[:200]!r}"


def claim_folder(folder, identity: Mapping[str, Any], record: Optional[Mapping[str, Any]] = None,
                 label: str = "--out", force: bool = False, name: str = IDENTITY_NAME) -> Path:
    """Record ``identity`` (and ``record``: commit, command) in ``folder/run.json``, or raise
    :class:`RunIdentityError` if the folder already belongs to another identity (``force``:
    take it over, for a run that recomputes everything). ``name``: another file, for a study
    that shares its folder with another one. Returns the file's path."""
    from fresh_rl.provenance import write_atomic

    folder = Path(folder)
    path = folder / name
    identity = json.loads(json.dumps(identity, default=repr))  # as saved (tuples → lists), in order
    if path.exists() and not force:
        try:
            saved = json.loads(path.read_text()).get("identity")
        except (OSError, ValueError, AttributeError) as err:
            raise RunIdentityError(f"{label} {folder}: its run record {path} is unreadable ({err}); "
                                   "remove it or choose another folder") from None
        if saved == identity:
            return path
        raise RunIdentityError(f"{label} {folder} belongs to another run: {identity_diff(saved or {}, identity)} "
                               "(resume it with its settings, or choose another folder)")
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps({"identity": identity, **(record or {})}, indent=1) + "\n")
    return path


def default_output(kind: str, identity: Mapping[str, Any], root: str = "runs") -> Path:
    """A fresh folder ``root/<kind>-<YYYYmmdd-HHMMSS>-<6 hex of the identity>``."""
    digest = hashlib.sha256(fingerprint(identity).encode()).hexdigest()[:6]
    return Path(root) / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{digest}"


__all__ = ["IDENTITY_NAME", "RunIdentityError", "claim_folder", "config_fields", "default_output", "fingerprint",
           "fingerprint_diff", "identity_diff"]
