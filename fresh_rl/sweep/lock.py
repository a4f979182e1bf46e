"""One writer per output folder: an exclusive lock file naming its owner.

``with output_lock(folder): ...`` takes ``folder/.fresh_rl.lock`` with ``fcntl.flock`` (the
kernel releases it when the owner exits or dies, so a crashed run never leaves the folder
locked) and writes the owner's pid, host, start time and command into it. A second run on the
folder fails at once with :class:`FolderLockedError` naming that owner. A lock file left by a
process that died without releasing it is taken over with a warning naming the dead owner.
On file systems without ``flock`` (some network mounts) the lock falls back to the pid/host
record: a live owner on this host, or any owner on another host, blocks the folder.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
import warnings
from pathlib import Path

LOCK_NAME = ".fresh_rl.lock"


class FolderLockedError(RuntimeError):
    """Another live run holds the output folder."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _owner(handle) -> dict:
    handle.seek(0)
    text = handle.read()
    try:
        owner = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        owner = {"unparsable": text[:200]}
    return owner if isinstance(owner, dict) else {"unparsable": text[:200]}


def _describe(owner: dict) -> str:
    return (f"pid {owner.get('pid')} on host {owner.get('host')} since {owner.get('started')} "
            f"({owner.get('command', '?')})")


@contextlib.contextmanager
def output_lock(folder):
    """Hold ``folder``'s lock for the ``with`` block (the folder is created if missing)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    handle = open(path, "a+")
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderLockedError(f"output folder {folder} is in use by another run: "
                                    f"{_describe(_owner(handle))}; wait for it or choose another folder "
                                    f"(lock file {path})") from None
        except OSError:  # no flock on this file system: trust the record
            owner = _owner(handle)
            same_host = owner.get("host") == socket.gethostname()
            if owner.get("pid") and (not same_host or _alive(int(owner["pid"]))):
                raise FolderLockedError(f"output folder {folder} is in use by another run: "
                                        f"{_describe(owner)} (lock file {path})") from None
        previous = _owner(handle)
        if previous.get("pid") and previous.get("pid") != os.getpid():
            warnings.warn(f"taking over the stale lock of {folder}: {_describe(previous)} "
                          "ended without releasing it", stacklevel=3)
        record = {"pid": os.getpid(), "host": socket.gethostname(),
                  "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "command": " ".join(sys.argv)[:500]}
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(record))
        handle.flush()
        try:
            yield path
        finally:
            handle.seek(0)
            handle.truncate()  # released cleanly: no owner left to report
            handle.flush()
            with contextlib.suppress(OSError):
                fcntl.flock(handle, fcntl.LOCK_UN)
    finally:
        handle.close()


__all__ = ["FolderLockedError", "LOCK_NAME", "output_lock"]
