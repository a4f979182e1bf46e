"""fresh_rl.sweep.study_cli: the shared command line of the study scripts."""
import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from fresh_rl.presets import Preset, named
from fresh_rl.sweep.identity import claim_folder
from fresh_rl.sweep.study_cli import NO_CHECKED, add_preset_arguments, default_preset, start_study, study_main
from fresh_rl.validation import check_in_range, checked_result, checkify_if_checked

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class _Scale(Preset):
    size: int
    rates: tuple[float, ...] = (1e-3,)


SCALES = named({"ci": _Scale(1), "cpu": _Scale(2)})


def test_the_default_preset_is_the_tests_version_and_must_exist():
    assert default_preset(SCALES) == "ci"
    assert default_preset(named({"big": _Scale(1), "big-ci": _Scale(2)})) == "big-ci"
    assert default_preset(named({"big": _Scale(1), "bigger": _Scale(2)})) == "big"
    with pytest.raises(ValueError, match="default 'ci' is not one of the presets"):
        add_preset_arguments(argparse.ArgumentParser(), named({"cpu": _Scale(1)}), default="ci")


def _recorder(calls):
    def run(scale, out, seed, fresh):
        calls.append((scale.label, out, seed, fresh))
        return f"README of {scale.label}"
    return run


def test_flags_reach_run_and_the_readme_is_printed(tmp_path, capsys):
    calls = []
    study_main("a study", SCALES, tmp_path / "default", _recorder(calls),
               ["--scale", "cpu", "--out", str(tmp_path / "x"), "--seed", "7", "--fresh",
                "--no-compilation-cache"])
    assert calls == [("cpu", tmp_path / "x", 7, True)]
    assert capsys.readouterr().out.strip().endswith("README of cpu")


def test_set_overrides_reach_run_and_the_folder_identity(tmp_path, capsys):
    seen = []
    study_main("a study", SCALES, tmp_path / "d", lambda scale, *_: seen.append(scale) or "README",
               ["--scale", "cpu", "--set", "size=5", "--set", "rates=1e-4,3e-4", "--no-compilation-cache"])
    assert (seen[0].size, seen[0].rates, seen[0].label) == (5, (1e-4, 3e-4), "cpu --set size=5 --set rates=1e-4,3e-4")
    assert json.loads((tmp_path / "d" / "run.json").read_text())["identity"]["scale"] == seen[0].label
    with pytest.raises(SystemExit):  # the same folder with other overrides belongs to another run
        study_main("a study", SCALES, tmp_path / "d", _recorder([]), ["--scale", "cpu", "--no-compilation-cache"])
    assert "belongs to another run: scale cpu --set size=5 --set rates=1e-4,3e-4 → cpu" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        study_main("a study", SCALES, tmp_path / "e", _recorder([]), ["--set", "size=big"])
    assert exit_.value.code == 2 and "--set size expects an integer, got 'big'" in capsys.readouterr().err


def test_defaults_are_ci_the_default_folder_seed_0(tmp_path):
    calls = []
    study_main("a study", {"ci": SCALES["ci"]}, tmp_path, _recorder(calls), ["--no-compilation-cache"])
    assert calls == [("ci", tmp_path, 0, False)]


def test_an_unknown_scale_names_the_flag_and_the_choices(tmp_path, capsys):
    with pytest.raises(SystemExit):
        study_main("a study", SCALES, tmp_path, _recorder([]), ["--scale", "huge"])
    err = capsys.readouterr().err
    assert "--scale" in err and "'ci'" in err and "'cpu'" in err


def test_a_folder_of_another_scale_is_refused_unless_fresh(tmp_path, capsys):
    calls = []
    study_main("a study", SCALES, tmp_path / "study", _recorder(calls), ["--no-compilation-cache"])
    with pytest.raises(SystemExit):
        study_main("a study", SCALES, tmp_path / "study", _recorder(calls),
                   ["--scale", "cpu", "--no-compilation-cache"])
    assert "belongs to another run: scale ci → cpu" in capsys.readouterr().err
    study_main("a study", SCALES, tmp_path / "study", _recorder(calls),
               ["--scale", "cpu", "--fresh", "--no-compilation-cache"])
    assert [c[0] for c in calls] == ["ci", "cpu"]


def test_fresh_removes_the_saved_runs_and_checkpoints_before_the_study_runs(tmp_path):
    out = tmp_path / "study"
    seen = []

    def run(scale, folder, seed, fresh):
        seen.append(sorted(p.name for p in folder.iterdir()))
        return "README"
    study_main("a study", {"ci": SCALES["ci"]}, out, run, ["--no-compilation-cache"])
    for name in ("runs", "checkpoints"):
        (out / name / "chunk").mkdir(parents=True)
    (out / "README.md").write_text("kept")
    study_main("a study", {"ci": SCALES["ci"]}, out, run, ["--no-compilation-cache"])  # a rerun keeps them
    study_main("a study", {"ci": SCALES["ci"]}, out, run, ["--fresh", "--no-compilation-cache"])
    assert {"runs", "checkpoints"} <= set(seen[1]) and not {"runs", "checkpoints"} & set(seen[2])
    assert (out / "README.md").read_text() == "kept"


CHECKED_SCRIPTS = ("vaco_lag_sweep", "quickstart")
UNCHECKED_SCRIPTS = ("priority_staleness", "old_logits", "freshper", "llm_rl_gain", "llm_rl_probe", "llm_warm_start")


@pytest.fixture(scope="module")
def script_help():
    """``{stem: finished process}`` of ``python experiments/<stem>.py --help`` for every script
    above, run side by side (each process spends its time importing)."""
    running = {stem: subprocess.Popen([sys.executable, str(ROOT / "experiments" / f"{stem}.py"), "--help"],
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
               for stem in CHECKED_SCRIPTS + UNCHECKED_SCRIPTS}
    finished = {stem: p.communicate(timeout=300) for stem, p in running.items()}
    return {stem: subprocess.CompletedProcess(p.args, p.returncode, *finished[stem]) for stem, p in running.items()}


@pytest.mark.parametrize("stem", CHECKED_SCRIPTS + UNCHECKED_SCRIPTS)
def test_every_experiment_script_offers_checked_or_says_why_not(stem, script_help):
    done = script_help[stem]
    usage, note = " ".join(done.stdout.split()), " ".join(NO_CHECKED.split())
    assert done.returncode == 0, done.stderr[-3000:]
    if stem in CHECKED_SCRIPTS:
        assert "--checked" in usage
    else:
        assert note in usage and "--checked" not in usage.replace(note, "")


def _parser_and_args(argv):
    parser = argparse.ArgumentParser(prog="script.py")
    parser.add_argument("--checked", action="store_true")
    parser.add_argument("--no-compilation-cache", action="store_true")
    return parser, parser.parse_args(["--no-compilation-cache", *argv])


def test_start_study_refuses_another_runs_folder_takes_it_over_when_fresh_and_checks(tmp_path, capsys):
    parser, args = _parser_and_args([])
    with start_study(parser, args, {"study": "s", "scale": "ci", "seed": 0}, tmp_path, []):
        pass
    start_study(parser, args, {"study": "s", "scale": "ci", "seed": 0}, tmp_path, [])  # a resume
    with pytest.raises(SystemExit) as exit_:
        start_study(parser, args, {"study": "s", "scale": "ci", "seed": 5}, tmp_path, [], hint="choose another --out")
    assert exit_.value.code == 2
    assert "script.py: error: --out" in (err := capsys.readouterr().err) and "seed 0 → 5" in err
    assert err.rstrip().endswith("choose another --out")
    start_study(parser, args, {"study": "s", "scale": "ci", "seed": 5}, tmp_path, [], fresh=True)
    assert json.loads((tmp_path / "run.json").read_text())["identity"]["seed"] == 5
    parser, args = _parser_and_args(["--checked"])  # --checked: a traced check fails, naming its field
    with pytest.raises(SystemExit) as exit_:
        with start_study(parser, args, {"study": "s", "scale": "ci", "seed": 5}, tmp_path, []):
            program = checkify_if_checked(lambda x: (check_in_range("beta", x, 0.0, 1.0), x)[1])[0]
            checked_result(jax.jit(program)(2.0), True)
    assert exit_.value.code == 1 and "a traced check failed: beta" in capsys.readouterr().err


def test_scripts_refuse_a_folder_of_another_seed_end_to_end(tmp_path):
    """The quickstart (--report-only: the claim alone) and priority_staleness (its own record
    file) as users run them."""
    def run(script, *flags):
        return subprocess.run([sys.executable, str(ROOT / "experiments" / script), *flags],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)
    out = tmp_path / "quickstart"
    assert run("quickstart.py", "--report-only", "--out", str(out)).returncode == 0
    refused = run("quickstart.py", "--report-only", "--out", str(out), "--seed", "3")
    assert refused.returncode == 2 and "seed 0 → 3" in refused.stderr and "--fresh" in refused.stderr
    assert run("quickstart.py", "--report-only", "--out", str(out), "--seed", "3", "--fresh").returncode == 0
    claim_folder(tmp_path / "staleness", {"study": "priority_staleness", "scale": "ci", "seed": 0},
                 name="priority_staleness.run.json")
    refused = run("priority_staleness.py", "--scale", "ci", "--seed", "1", "--out", str(tmp_path / "staleness"))
    assert refused.returncode == 2 and "seed 0 → 1" in refused.stderr, refused.stderr[-2000:]
