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


# --------------------------------------------------------------------------------------------
# Every module of the package is exercised by the default suite


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_fresh_rl_modules(path: Path, package_modules: set[str]) -> set[str]:
    """fresh_rl modules a file imports (``import a.b``, ``from a.b import c`` where ``a.b.c``
    may itself be a module, and relative imports inside the package)."""
    import ast

    tree = ast.parse(path.read_text(), filename=str(path))
    own = _module_name(path) if path.is_relative_to(ROOT / "fresh_rl") else ""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against the importing module's package
                anchor = own.split(".")[: len(own.split(".")) - node.level + (path.name == "__init__.py")]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            # importing a.b.c imports a and a.b as well
            parts = name.split(".")
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & package_modules
    return found


def _default_suite_entry_files() -> list[Path]:
    """Test files with at least one test outside the slow lane, and the scripts they run."""
    files = []
    for test_file in sorted((ROOT / "tests").glob("test_*.py")):
        text = test_file.read_text()
        tests = re.findall(r"^((?:@pytest\.mark\.slow[^\n]*\n)?)def test_", text, flags=re.M)
        module_slow = re.search(r"^pytestmark\s*=.*slow", text, flags=re.M)
        if module_slow or not any(not marker for marker in tests):
            continue
        files.append(test_file)
        for script in re.findall(r"(?:experiments|benchmarks|notebooks)/[\w\-]+\.(?:py|ipynb)", text):
            files.append(ROOT / script)
        for stem in re.findall(r'run_study\("(\w+)"', text):
            files.append(ROOT / "experiments" / f"{stem}.py")
        if re.search(r'"-m",\s*"fresh_rl"|-m fresh_rl\b', text):  # python -m fresh_rl
            files.append(ROOT / "fresh_rl" / "__main__.py")
    return files


def _notebook_source(path: Path) -> str:
    import json

    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def test_every_package_module_is_imported_by_the_default_suite():
    """Following imports from the default suite's test files (and the experiment scripts and
    notebooks they run) through the package reaches every module of fresh_rl."""
    import tempfile

    package = {_module_name(p) for p in (ROOT / "fresh_rl").rglob("*.py")}
    paths = {_module_name(p): p for p in (ROOT / "fresh_rl").rglob("*.py")}
    reached, frontier = set(), []
    with tempfile.TemporaryDirectory() as tmp:
        for entry in _default_suite_entry_files():
            if not entry.exists():
                continue
            if entry.suffix == ".ipynb":
                source = Path(tmp) / f"{entry.stem}.py"
                source.write_text(_notebook_source(entry))
                entry = source
            if entry.is_relative_to(ROOT / "fresh_rl"):
                frontier.append(_module_name(entry))
            frontier += sorted(_imported_fresh_rl_modules(entry, package))
    while frontier:
        module = frontier.pop()
        if module in reached:
            continue
        reached.add(module)
        frontier += sorted(_imported_fresh_rl_modules(paths[module], package) - reached)
    assert package - reached == set(), f"no default-suite test imports {sorted(package - reached)}"


STUDY_SCRIPT_LINES = 150
"""An experiment script is a study definition (presets, grid, claims, figures); what is longer
belongs in a ``fresh_rl`` module that tests and other studies can reach."""


def test_every_experiment_script_is_a_short_study_definition():
    long = {p.name: n for p in (ROOT / "experiments").glob("*.py")
            if (n := len(p.read_text().splitlines())) > STUDY_SCRIPT_LINES}
    assert long == {}, f"over {STUDY_SCRIPT_LINES} lines: {long}"
