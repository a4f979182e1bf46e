"""Where a result came from: commit, machine, command and wall time, and the one file writer.

Every experiment and benchmark stamps its outputs through these helpers, so a results/
README always names the exact command, the commit, the machine and the wall time. A commit
with uncommitted code edits (``+dirty``) names no code anyone can check out, so
:func:`provenance` refuses to stamp one unless asked: ``allow_dirty=True``, or the environment
variable ``FRESH_RL_ALLOW_DIRTY=1`` (how tests and exploratory runs opt in).
"""
from __future__ import annotations

import csv
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Callable, Iterable, Mapping, Optional, Sequence, Union

REPOSITORY_ROOT = Path(__file__).resolve().parents[1]


def _git(*args: str) -> Optional[str]:
    """Stripped stdout of ``git *args`` in the source checkout; ``None`` if git fails."""
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPOSITORY_ROOT,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


COMMIT_DIGITS = 10
"""Hex digits of a commit as results name it. Fixed, not git's automatic length: that grows
with the object count of the checkout at hand (7 digits in one clone, 8 in another of the same
history), so a table rebuilt elsewhere would read differently. With 16^10 ≈ 1.1e12 prefixes, the
chance that any other of a repository's n objects shares a commit's prefix is ≤ n/1.1e12
(≈ 1e-7 at n = 1e5), so the prefix names one commit."""


def short_commit(revision: str = "HEAD") -> Optional[str]:
    """The first :data:`COMMIT_DIGITS` hex digits of ``revision``'s commit; ``None`` when git
    cannot resolve it."""
    full = _git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    return full[:COMMIT_DIGITS] if full else None


def git_commit() -> str:
    """HEAD of the source checkout (:func:`short_commit`), ``+dirty`` appended when tracked
    files outside ``results/`` differ from it (the tables runs rewrite there are outputs, not
    code); ``"unknown"`` outside a git checkout (e.g. an installed wheel)."""
    head = short_commit()
    if not head:
        return "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
    return head + ("+dirty" if dirty else "")


ALLOW_DIRTY_ENV = "FRESH_RL_ALLOW_DIRTY"
"""Set to ``1`` to let :func:`provenance` stamp a ``+dirty`` commit (tests, exploratory runs)."""


class DirtyCheckoutError(RuntimeError):
    """A result would be stamped with a ``+dirty`` commit and the caller did not allow it."""


def require_clean(commit: str, allow_dirty: bool = False) -> str:
    """``commit`` unchanged, or :class:`DirtyCheckoutError` when it ends in ``+dirty`` and
    neither ``allow_dirty`` nor ``FRESH_RL_ALLOW_DIRTY=1`` allows it."""
    if commit.endswith("+dirty") and not (allow_dirty or os.environ.get(ALLOW_DIRTY_ENV) == "1"):
        raise DirtyCheckoutError(
            f"refusing to stamp results with commit {commit}: the code has uncommitted edits, so the "
            f"commit does not name the code that ran. Commit first, or opt in (allow_dirty=True, "
            f"--allow-dirty where the script has it, or {ALLOW_DIRTY_ENV}=1).")
    return commit


def last_commit(paths: Sequence[str]) -> str:
    """The commit (:func:`short_commit`'s digits) that last changed any of ``paths`` (relative
    to the checkout), with ``+modified`` when the working tree differs from it there;
    ``"uncommitted"`` for paths git does not track yet, ``"unknown"`` outside a git checkout.
    The commit of a result's data."""
    head = _git("log", "-1", "--format=%H", "--", *paths)
    if head is None:
        return "unknown"
    if not head:
        return "uncommitted"
    head = head[:COMMIT_DIGITS]
    changed = _git("status", "--porcelain", "--untracked-files=no", "--", *paths)
    return head + ("+modified" if changed else "")


# The commit of the code this process loaded (read when the first experiment module imports
# this one): a long run stamps the commit it started from, not whatever HEAD is when it ends.
COMMIT_AT_START = git_commit()


def measure_at_revision(script, revision: str, args: Sequence[str] = ()) -> tuple[list[dict], str]:
    """Runs ``python script --measure *args`` in a child process that imports ``fresh_rl`` as
    it was at git ``revision`` (``git archive`` into a temporary folder on ``PYTHONPATH``);
    returns the JSON objects the child printed one per line and the revision's short commit: a
    benchmark's before and after, measured by one script on one machine. ``SystemExit`` with
    the child's stderr on failure."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "archive", revision, "fresh_rl"], cwd=REPOSITORY_ROOT,
                                 capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        child = subprocess.run([sys.executable, str(script), "--measure", *args],
                               capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": tmp}, cwd=tmp)
    if child.returncode:
        raise SystemExit(f"measuring {revision} failed:\n{child.stderr[-3000:]}")
    rows = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    return rows, short_commit(revision) or revision


def replace_label_rows(path, label: str, rows: Sequence[Mapping]) -> list[dict]:
    """The CSV at ``path`` (if any) with its rows of ``label`` replaced by ``rows``, written back
    (:func:`write_csv`) and returned: how a before/after benchmark reruns one label."""
    kept = [r for r in read_csv(path, missing_ok=True) if r["label"] != label]
    rows = kept + [dict(r) for r in rows]
    write_csv(path, rows)
    return rows


def machine_description() -> str:
    """``"x86_64, 2 CPUs, Linux; jax 0.9.2 on 1 cpu device(s)"``."""
    text = f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}"
    if "jax" in sys.modules:
        import jax

        devices = jax.devices()
        text += f"; jax {jax.__version__} on {len(devices)} {devices[0].platform} device(s)"
    return text


def command_line(argv: Optional[Sequence[str]] = None) -> str:
    """The command that is running, as a user would retype it from the repository root."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0]) if argv else Path("python")
    try:
        script = script.resolve().relative_to(REPOSITORY_ROOT)
    except ValueError:
        pass
    return " ".join(["python", str(script), *map(shlex.quote, argv[1:])])


def provenance(command: Optional[str] = None, started: Optional[float] = None,
               allow_dirty: bool = False) -> dict:
    """``{"command", "commit", "machine", "wall_seconds"}`` for a results README or JSON.

    ``commit`` is :data:`COMMIT_AT_START`, the code the process runs; when HEAD (or the working
    tree) changed while it ran, ``"commit_at_end"`` says to what. ``started`` is a
    ``time.perf_counter()`` reading taken when the run began (wall time omitted without it);
    ``command`` defaults to :func:`command_line`. A ``+dirty`` commit raises
    :class:`DirtyCheckoutError` (:func:`require_clean`) unless ``allow_dirty``.
    """
    info = {"command": command or command_line(), "commit": require_clean(COMMIT_AT_START, allow_dirty),
            "machine": machine_description()}
    now = git_commit()
    if now != COMMIT_AT_START:
        info["commit_at_end"] = require_clean(now, allow_dirty)
    if started is not None:
        info["wall_seconds"] = round(time.perf_counter() - started, 1)
    return info


def provenance_line(info: Mapping) -> str:
    """One Markdown sentence naming the command, commit, machine and wall time of ``info``."""
    text = f"Made by `{info['command']}` at commit {info['commit']} on {info['machine']}"
    if "commit_at_end" in info:
        text += f" (HEAD was {info['commit_at_end']} when it ended)"
    if "wall_seconds" in info:
        text += f"; wall time {info['wall_seconds']:.0f} s"
    return text + "."


class OutputWriteError(OSError):
    """A result file that could not be written (the previous version, if any, is kept)."""


def _umask() -> int:
    mask = os.umask(0o022)  # reading the process umask means setting it
    os.umask(mask)
    return mask


def write_atomic(path, content: Union[str, bytes, Callable[[IO], None]], binary: bool = False) -> Path:
    """Write ``content`` to ``path`` all at once: a str, bytes, or a function that writes to the
    open file (text mode, ``newline=""``; ``binary=True`` for bytes, e.g. ``fig.savefig``). It goes
    to a temporary file in the same folder, then ``os.replace``: a failed write leaves the
    previous file (or none) and raises :class:`OutputWriteError` ``could not write PATH: cause``.
    The one writer of every CSV, JSON, figure and model file the package writes."""
    path = Path(path)
    binary = binary or isinstance(content, bytes)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("wb" if binary else "w", dir=path.parent, prefix=f".{path.name}.",
                                         suffix=".tmp", delete=False, **({} if binary else {"newline": ""})) as f:
            tmp = Path(f.name)
            content(f) if callable(content) else f.write(content)
            f.flush()
            os.fsync(f.fileno())
            os.chmod(tmp, 0o666 & ~_umask())  # as open() would create it (the temporary file is 0600)
        os.replace(tmp, path)
    except OSError as err:
        raise OutputWriteError(f"could not write {path}: {err}") from err
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()
    return path


def write_csv(path, rows: Iterable[Mapping]) -> None:
    """One row per mapping; the header is the union of the rows' keys in first-seen order
    (missing cells empty), written by :func:`write_atomic` (a reader never sees half a table)."""
    rows = list(rows)
    if not rows:
        raise ValueError(f"write_csv({path}): no rows to write")
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))

    def write(f) -> None:
        writer = csv.DictWriter(f, fieldnames=list(names), restval="")
        writer.writeheader()
        writer.writerows(rows)

    write_atomic(path, write)


def read_csv(path, missing_ok: bool = False) -> list[dict]:
    """The rows of a CSV written by :func:`write_csv`, as ``{column: text}``; ``[]`` for a missing
    file when ``missing_ok`` (else ``FileNotFoundError``)."""
    if missing_ok and not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


__all__ = ["ALLOW_DIRTY_ENV", "COMMIT_DIGITS", "REPOSITORY_ROOT", "DirtyCheckoutError", "OutputWriteError",
           "command_line", "git_commit", "last_commit",
           "machine_description", "measure_at_revision", "provenance", "provenance_line", "read_csv", "replace_label_rows",
           "require_clean", "short_commit", "write_atomic", "write_csv"]
