"""The README's two commands and CI stay in sync; the README is a short user's page; no text
file points at a project tracker or at when a machine was available."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def readme_commands():
    text = (ROOT / "README.md").read_text()
    first_block = text.split("```")[1]
    lines = first_block.splitlines()[1:]  # drop the language tag
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def text_before_first_block():
    return (ROOT / "README.md").read_text().split("```")[0]


def test_readme_opens_with_exactly_two_commands():
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert text_before_first_block().strip().startswith("# fresh_rl")
    assert "pytest" in commands[1]
    assert "experiments/" in commands[0]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = readme_commands()[1]
    # .ci/run may add quiet flags to pip; the command otherwise must be the README's.
    assert test_command.replace("pip install -e", "pip install -q -e") in ci


README_COMMANDS = (
    "python3.11 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/python experiments/quickstart.py",
    "python3.11 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest",
)
README_MAX_LINES = 200


def test_readme_is_a_short_page_opening_with_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"
    opening = "# fresh_rl\n\n```bash\n" + "\n".join(README_COMMANDS) + "\n```\n"
    assert text.startswith(opening), "README.md must open with the title and exactly the two commands"
    assert tuple(readme_commands()) == README_COMMANDS
    # The history lives in the changelog, which the README points to.
    assert (ROOT / "docs" / "CHANGELOG.md").is_file()
    assert "docs/CHANGELOG.md" in text


# Pointers to a project tracker or to when a machine or a working period was available say
# nothing about the software. The patterns are built from pieces so that this file's own
# source does not match them.
_ISSUE = "iss" + "ue"
TRACKER_PATTERNS = {
    "a tracker number": re.compile(r"\b" + _ISSUE + r"s?\s*#?\s*\d+", re.IGNORECASE),
    "a bare #N reference": re.compile(r"(?<![\w/&#])" + "#" + r"\d+\b"),
    "a numbered stop": re.compile(r"\b" + "st" + r"op\s+\d+\b", re.IGNORECASE),
    "a numbered session": re.compile(r"\b" + "sess" + r"ion\s+\d+\b", re.IGNORECASE),
    "a working period": re.compile(r"\b" + "sitt" + r"ings?\b", re.IGNORECASE),
    "a machine being lent": re.compile(r"\b(?:was|were|been|be|not)\s+" + "le" + r"nt\b", re.IGNORECASE),
    "an availability draw": re.compile(r"\b(?:GPU|device|machine|status)\b.{0,40}\bnot\s+" + "dr" + r"awn\b",
                                      re.IGNORECASE),
}
# Data and binary files: tables, run records, checkpoints, figures (not written text).
DATA_SUFFIXES = {".csv", ".json", ".jsonl", ".npz", ".npy", ".png", ".jpg", ".jpeg", ".svg", ".pdf",
                 ".safetensors", ".ocdbt", ".seconds", ".lock", ".log", ".msgpack"}
DATA_FOLDERS = {"checkpoints", "runs"}


def tracked_text_files():
    """(name, text) of every text file git tracks or would track (new files not yet ignored)."""
    try:
        listing = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        listing = None
    if listing is None or listing.returncode != 0:
        pytest.skip("not a git checkout: no tracked files to scan")
    for name in listing.stdout.decode().split("\0"):
        path = Path(name)
        if not name or path.suffix.lower() in DATA_SUFFIXES or DATA_FOLDERS & set(path.parts[:-1]):
            continue
        try:
            data = (ROOT / path).read_bytes()
        except OSError:  # deleted in the working tree
            continue
        if b"\0" in data:
            continue
        try:
            yield name, data.decode("utf-8")
        except UnicodeDecodeError:
            continue


def test_no_tracker_or_machine_availability_references():
    files = dict(tracked_text_files())
    assert "README.md" in files and "docs/CHANGELOG.md" in files
    problems = []
    for name, text in files.items():
        for number, line in enumerate(text.splitlines(), 1):
            problems += [f"{name}:{number}: {what}: {line.strip()[:120]}"
                         for what, pattern in TRACKER_PATTERNS.items() if pattern.search(line)]
    assert not problems, "\n".join(problems)


def test_tracker_patterns_catch_what_they_are_for():
    caught = [_ISSUE + " 19's confirmation", _ISSUE.capitalize() + "s 14, 15", "target (" + _ISSUE + " #" + "20)",
              "its #" + "52", "st" + "op 3", "Sess" + "ion 4: on a", "several sitt" + "ings",
              "No GPU was le" + "nt", "the device tool's `status`: not dr" + "awn"]
    missed = ["a test session", "the pytest session's cache", "items never drawn", "# 3 seeds",
              "stop on its end tokens", "x[#]"]
    def matches(text):
        return any(p.search(text) for p in TRACKER_PATTERNS.values())
    assert [t for t in caught if not matches(t)] == []
    assert [t for t in missed if matches(t)] == []
