"""The README's two commands and CI stay in sync."""

from pathlib import Path

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
