"""fresh_rl.sweep.study_cli: the shared command line of the study scripts."""
import pytest

from fresh_rl.sweep.study_cli import study_main


def _recorder(calls):
    def run(scale, out, seed, fresh):
        calls.append((scale, out, seed, fresh))
        return f"README of {scale}"
    return run


def test_flags_reach_run_and_the_readme_is_printed(tmp_path, capsys):
    calls = []
    study_main("a study", {"ci": 1, "cpu": 2}, tmp_path / "default", _recorder(calls),
               ["--scale", "cpu", "--out", str(tmp_path / "x"), "--seed", "7", "--fresh",
                "--no-compilation-cache"])
    assert calls == [("cpu", tmp_path / "x", 7, True)]
    assert capsys.readouterr().out.strip().endswith("README of cpu")


def test_defaults_are_ci_the_default_folder_seed_0(tmp_path):
    calls = []
    study_main("a study", {"ci": 1}, tmp_path, _recorder(calls), ["--no-compilation-cache"])
    assert calls == [("ci", tmp_path, 0, False)]


def test_an_unknown_scale_names_the_flag_and_the_choices(tmp_path, capsys):
    with pytest.raises(SystemExit):
        study_main("a study", {"ci": 1, "cpu": 2}, tmp_path, _recorder([]), ["--scale", "huge"])
    err = capsys.readouterr().err
    assert "--scale" in err and "'ci'" in err and "'cpu'" in err


def test_a_folder_of_another_scale_is_refused_unless_fresh(tmp_path, capsys):
    calls = []
    study_main("a study", {"ci": 1, "cpu": 2}, tmp_path / "study", _recorder(calls), ["--no-compilation-cache"])
    with pytest.raises(SystemExit):
        study_main("a study", {"ci": 1, "cpu": 2}, tmp_path / "study", _recorder(calls),
                   ["--scale", "cpu", "--no-compilation-cache"])
    assert "belongs to another run: scale ci → cpu" in capsys.readouterr().err
    study_main("a study", {"ci": 1, "cpu": 2}, tmp_path / "study", _recorder(calls),
               ["--scale", "cpu", "--fresh", "--no-compilation-cache"])
    assert [c[0] for c in calls] == ["ci", "cpu"]
