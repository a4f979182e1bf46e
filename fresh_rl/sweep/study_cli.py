"""The command line shared by the resumable study scripts under ``experiments/``.

``python experiments/<study>.py --scale ci|cpu|paper [--set field=value …] [--out DIR] [--seed S]
[--fresh] [--allow-dirty] [--compilation-cache …] [--checked]`` runs ``run(preset, out_dir, seed,
fresh)`` with the named :class:`fresh_rl.presets.Preset` (``--set`` items applied,
:meth:`~fresh_rl.presets.Preset.overridden`) and prints the README it returns. Saved chunks under ``--out`` are reused unless
``--fresh``, which removes them first (:data:`SAVED_RUN_FOLDERS`). The folder is claimed first (:func:`fresh_rl.sweep.identity.claim_folder`: study,
scale and seed in ``run.json``): a folder holding another scale's or seed's results is refused,
unless ``--fresh`` recomputes it. :func:`start_study` is that start (cache, fd-2 filter, folder
claim, ``--checked``) for every script under ``experiments/``.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from jax.experimental import checkify

from fresh_rl.compilation_cache import add_compilation_cache_flag, enable_from_args, filter_cpu_cache_load_noise
from fresh_rl.presets import Preset, PresetError
from fresh_rl.provenance import ALLOW_DIRTY_ENV, COMMIT_AT_START, command_line
from fresh_rl.sweep.identity import IDENTITY_NAME, RunIdentityError, claim_folder
from fresh_rl.sweep.lock import output_lock
from fresh_rl.validation import CHECKED_HELP, checked, traced_check_message


SAVED_RUN_FOLDERS = ("runs", "checkpoints")
"""The folders of ``--out`` that hold a study's saved chunks and resume checkpoints: what
``--fresh`` removes before the study runs."""


def clear_saved_runs(out) -> None:
    """Remove :data:`SAVED_RUN_FOLDERS` from ``out``, holding its lock (another run using the
    folder is refused, :func:`fresh_rl.sweep.output_lock`)."""
    with output_lock(out):
        for name in SAVED_RUN_FOLDERS:
            shutil.rmtree(Path(out) / name, ignore_errors=True)


def study_main(description: str, scales: Mapping, default_out: Path,
               run: Callable[[Preset, Path, int, bool], str], argv: Optional[Sequence[str]] = None) -> None:
    """Parse the study flags (``--scale`` one of ``scales``, default :func:`default_preset`; ``--set`` items
    applied to it), claim ``--out`` for this study, preset (its label: name and overrides) and
    seed, switch on the compilation cache as asked, run the study and print its README. ``--checked`` runs the study inside :func:`fresh_rl.checked` (a failed
    traced check exits with one line naming the field and its range)."""
    parser = argparse.ArgumentParser(description=description)
    add_preset_arguments(parser, scales)
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fresh", action="store_true", help="ignore saved chunks, recompute all")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="stamp the results even though the code has uncommitted edits (+dirty)")
    add_compilation_cache_flag(parser)
    parser.add_argument("--checked", action="store_true", help=CHECKED_HELP)
    args = parser.parse_args(argv)
    preset = chosen_preset(parser, args, scales)
    identity = {"study": Path(default_out).name, "scale": preset.label, "seed": args.seed}
    if args.allow_dirty:
        os.environ[ALLOW_DIRTY_ENV] = "1"  # read by fresh_rl.provenance.provenance
    with start_study(parser, args, identity, args.out, argv, fresh=args.fresh):
        if args.fresh:
            clear_saved_runs(args.out)
        readme = run(preset, args.out, args.seed, args.fresh)
    print(readme)


def default_preset(presets: Mapping[str, Preset]) -> str:
    """The preset a script runs without ``--scale``: ``ci``, else the first whose name ends in
    ``-ci`` (the tests' version), else the first."""
    return "ci" if "ci" in presets else next((n for n in presets if n.endswith("-ci")), next(iter(presets)))


def add_preset_arguments(parser: argparse.ArgumentParser, presets: Mapping[str, Preset],
                         default: Optional[str] = None) -> None:
    """``--scale NAME`` (one of ``presets``; ``default`` or :func:`default_preset`) and
    ``--set field=value`` (repeatable)."""
    default = default_preset(presets) if default is None else default
    if default not in presets:
        raise ValueError(f"add_preset_arguments: default {default!r} is not one of the presets {list(presets)}")
    parser.add_argument("--scale", choices=tuple(presets), default=default,
                        help="a preset of this study (default %(default)s; fresh-rl presets lists them with "
                             "their fields)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", dest="overrides",
                        help="change one field of the preset (dotted for a nested config: bed.iterations=3; "
                             "on a tuple of configs, every one: tasks.total_env_steps=4096); repeatable")


def chosen_preset(parser: argparse.ArgumentParser, args: argparse.Namespace, presets: Mapping[str, Preset]) -> Preset:
    """The preset ``--scale`` names with the ``--set`` items applied (a bad item exits 2 naming
    the field and what it accepts)."""
    try:
        return presets[args.scale].overridden(args.overrides)
    except PresetError as err:
        parser.error(str(err))


NO_CHECKED = ("no --checked here: this script's programs cannot be checkified (jitted outside "
              "jax.experimental.checkify, or a vmapped while loop, which checkify does not support), so the "
              "traced range checks of fresh_rl.checked would fail at trace time")
"""The ``--help`` epilog of an experiment script without ``--checked``."""


def start_study(parser: argparse.ArgumentParser, args: argparse.Namespace, identity: Optional[Mapping[str, Any]],
                out, argv: Optional[Sequence[str]], fresh: bool = False,
                hint: str = "--fresh recomputes it, or choose another --out", record: str = IDENTITY_NAME,
                in_process: bool = True):
    """The start every experiment script shares: claim ``out`` for ``identity`` (in ``record``,
    ``run.json`` unless two studies share the folder; another run's folder exits 2 naming the
    differing fields and ``hint``; ``fresh`` takes it over; ``identity`` None claims nothing),
    switch on the compilation cache as ``args`` ask, drop XLA:CPU's false cache-load lines
    when run from the command line (``argv`` None), and
    return the context to compute in: :func:`fresh_rl.checked` with ``--checked`` (a failed
    traced check exits 1 with one line naming the field and its range). ``in_process=False``:
    only the claim, for a script whose parts run as scripts of their own (no backend here)."""
    if identity is not None:
        try:
            claim_folder(out, identity, {"commit": COMMIT_AT_START, "command": command_line()}, force=fresh,
                         name=record)
        except RunIdentityError as err:
            parser.exit(2, f"{parser.prog}: error: {err}; {hint}\n")
    if not in_process:
        return contextlib.nullcontext()
    folder = enable_from_args(args)
    if argv is None:  # a command line, not an in-process caller (tests capture fd 2)
        filter_cpu_cache_load_noise(folder)
    return _computing(parser, getattr(args, "checked", False))


@contextlib.contextmanager
def _computing(parser: argparse.ArgumentParser, with_checks: bool) -> Iterator[None]:
    try:
        with checked() if with_checks else contextlib.nullcontext():
            yield
    except checkify.JaxRuntimeError as err:
        parser.exit(1, f"{parser.prog}: {traced_check_message(err)}\n")
