"""The repository stands alone: no pointers to documents outside it, every ``docs/`` link
resolves, and the library never loads code from ``experiments/``."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCANNED_FOLDERS = ("fresh_rl", "experiments", "notebooks", "benchmarks", "tests", "docs")
TEXT_SUFFIXES = (".py", ".md", ".ipynb", ".txt", ".toml", ".cfg", ".yaml", ".yml")

# Built from pieces so that this file does not match its own patterns.
OUTSIDE_POINTERS = {
    "a path into a notes folder": re.compile(r"\bpapers" + "/"),
    "the workspace design notes": re.compile(re.escape("DESIGN" + ".md")),
    "the workspace outside the repository": re.compile(re.escape(".." + "/shared")),
}
# Method pages live in docs/; outside docs/ a bare mention (e.g. of old notes with their own
# section numbers) is a pointer to a document the repository does not have.
METHOD_PAGES = ("vaco", "freshper", "old_logits", "anchors")
BARE_METHOD_PAGE = re.compile(r"(?<![\w/])(" + "|".join(METHOD_PAGES) + r")\.md\b")
DOCS_LINK = re.compile(r"\bdocs/([\w\-]+)\.md\b")
RELATIVE_MD_LINK = re.compile(r"\]\(([\w\-]+\.md)(#[\w\-]*)?\)")


def scanned_files():
    files = [ROOT / "README.md"]
    for folder in SCANNED_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix in TEXT_SUFFIXES and "__pycache__" not in path.parts \
                    and ".ipynb_checkpoints" not in path.parts:
                files.append(path)
    files.extend(sorted((ROOT / "results").rglob("README.md")))
    return [f for f in files if f.exists()]


def text_of(path: Path) -> str:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".ipynb":  # the cells' source, not the JSON escaping around it
        cells = json.loads(text).get("cells", [])
        text = "\n".join("".join(cell.get("source", [])) for cell in cells)
    return text


def hits(pattern, text):
    return [text.count("\n", 0, m.start()) + 1 for m in pattern.finditer(text)]


def test_scanned_files_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in scanned_files()}
    assert "README.md" in names and "docs/README.md" in names
    assert any(n.startswith("fresh_rl/") for n in names)


def test_no_pointer_to_documents_outside_the_repository():
    problems = []
    for path in scanned_files():
        text = text_of(path)
        rel = path.relative_to(ROOT).as_posix()
        for what, pattern in OUTSIDE_POINTERS.items():
            problems += [f"{rel}:{line}: {what}" for line in hits(pattern, text)]
        if not rel.startswith("docs/"):
            problems += [f"{rel}:{line}: bare method page (write docs/<name>.md)"
                         for line in hits(BARE_METHOD_PAGE, text)]
    assert not problems, "\n".join(problems)


def test_docs_links_point_to_existing_pages():
    missing = []
    for path in scanned_files():
        text = text_of(path)
        rel = path.relative_to(ROOT).as_posix()
        for match in DOCS_LINK.finditer(text):
            if not (ROOT / "docs" / f"{match.group(1)}.md").is_file():
                missing.append(f"{rel}: {match.group(0)}")
        if rel.startswith("docs/"):  # links between the pages themselves
            for match in RELATIVE_MD_LINK.finditer(text):
                if not (path.parent / match.group(1)).is_file():
                    missing.append(f"{rel}: {match.group(1)}")
    assert not missing, "\n".join(missing)


def test_docs_index_lists_every_page():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md")
    assert pages, "docs/ has no method pages"
    assert [p for p in pages if f"({p})" not in index] == []


IMPORT_CHECK = """
import importlib, json, pkgutil, sys
import fresh_rl
names = ["fresh_rl", "fresh_rl.control", "fresh_rl.llm", "fresh_rl.sweep"]
names += [m.name for m in pkgutil.walk_packages(fresh_rl.__path__, "fresh_rl.")
          if m.name.rsplit(".", 1)[-1] != "__main__"]
for name in names:
    importlib.import_module(name)
files = {}
for name, module in list(sys.modules.items()):
    paths = [getattr(module, "__file__", None)] + list(getattr(module, "__path__", None) or [])
    files[name] = [p for p in paths if isinstance(p, str)]
print(json.dumps(files))
"""


def test_importing_fresh_rl_loads_nothing_from_experiments():
    env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
    result = subprocess.run([sys.executable, "-c", IMPORT_CHECK], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    modules = json.loads(result.stdout.strip().splitlines()[-1])
    experiments = (ROOT / "experiments").resolve()
    loaded = sorted(
        f"{name} ({path})" for name, paths in modules.items() for path in paths
        if Path(path).resolve().is_relative_to(experiments))
    assert not loaded, "fresh_rl imports experiment scripts:\n" + "\n".join(loaded)
    assert "fresh_rl.control" in modules and "fresh_rl.llm" in modules and "fresh_rl.sweep" in modules
