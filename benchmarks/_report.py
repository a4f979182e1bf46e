"""Shared output helpers of the benchmark scripts: the CSV table and the commit stamp."""
from __future__ import annotations

import csv
import subprocess
from pathlib import Path


def write_csv(path: Path, rows: list[dict]) -> None:
    """One row per dict, columns in the first row's key order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def git_commit() -> str:
    """Short hash of HEAD (the working tree may hold uncommitted edits), or "unknown"."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent)
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"
