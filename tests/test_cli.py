"""The fresh-rl command line: --help lists every config field with its default, overrides are
typed and validated, ``train`` writes metrics and checkpoints and resumes, ``sweep`` runs a grid."""
import csv
import dataclasses
import json
import re
import subprocess
import sys

import pytest

from fresh_rl import cli
from fresh_rl.control import TrainConfig
from fresh_rl.fields import flat_fields
from fresh_rl.corrections import AdaptiveKLConfig

TINY = ["--env_name", "CartPole-v1", "--num_envs", "4", "--rollout_length", "8", "--num_minibatches", "2",
        "--num_epochs", "1", "--hidden_sizes", "8"]


def test_help_lists_every_field_with_its_default():
    text = cli.build_parser()._subparsers._group_actions[0].choices["train"].format_help()
    for name, _, _, default in flat_fields(TrainConfig):
        assert f"--{name}" in text, name
    assert "(default: 'CartPole-v1')" in text and "--vaco.delta" in text and "(default: 0.2)" in text
    out = subprocess.run([sys.executable, "-m", "fresh_rl", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "train" in out.stdout and "sweep" in out.stdout


def test_overrides_are_typed_nested_and_validated():
    parser = cli.build_parser()
    args = parser.parse_args(["train", "--vaco.delta", "0.1", "--hidden_sizes", "32,16", "--normalize_obs", "true",
                              "--kl_adaptive", "0.02", "--advantage_normalization", "none", "--num_envs", "16"])
    config = cli.build_config(TrainConfig, args)
    assert config.vaco.delta == 0.1 and config.hidden_sizes == (32, 16) and config.normalize_obs is True
    assert config.kl_adaptive == AdaptiveKLConfig(target=0.02) and config.num_envs == 16
    assert config.advantage_normalization == "none"
    assert dataclasses.replace(config, vaco=TrainConfig().vaco).vaco.delta == 0.2
    with pytest.raises(SystemExit, match="method must be one of"):
        cli.main(["train", "--method", "trpo"])
    with pytest.raises(SystemExit):
        cli.main(["train", "--num_envs", "many"])
    with pytest.raises(SystemExit, match="--grid takes .*learning_rate"):
        cli.main(["sweep", "--grid", "clip=0.1"])
    assert cli._parse_grid(["lag=0,4", "learning_rate=1e-3,3e-4", "gamma=0.9"]) == {
        "lag": [0, 4], "learning_rate": [1e-3, 3e-4], "gamma": [0.9]}
    with pytest.raises(SystemExit, match="int"):
        cli._parse_grid(["lag=0.5"])


def test_train_writes_metrics_checkpoints_and_resumes(tmp_path, capsys):
    argv = ["train", *TINY, "--total_env_steps", "160", "--method", "vaco", "--lag", "2",
            "--checkpoint-every", "2", "--out", str(tmp_path)]
    cli.main(argv)
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [int(r["iteration"]) for r in rows] == list(range(5))
    assert float(rows[-1]["lag/version_gap_mean"]) == 2.0
    lines = [json.loads(x) for x in open(tmp_path / "metrics.jsonl")]
    # both files hold repr() of the same Python float: exact, approx's rel 1e-6 is slack
    assert lines[-1]["episode_return"] == pytest.approx(float(rows[-1]["episode_return"]))
    assert sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit()) == [4, 5]
    capsys.readouterr()
    cli.main(argv)  # finished run: restores the final checkpoint, recomputes nothing
    assert "%" not in capsys.readouterr().err  # no progress line: no chunk ran
    assert list(csv.DictReader(open(tmp_path / "metrics.csv"))) == rows


def test_sweep_writes_one_row_per_run_and_iteration(tmp_path):
    cli.main(["sweep", *TINY, "--total_env_steps", "96", "--method", "vaco", "--seeds", "2",
              "--grid", "lag=0,2", "--out", str(tmp_path)])
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert len(rows) == 2 * 2 * 3  # seeds × lags × iterations
    last = {(r["seed"], r["lag"]): float(r["lag/version_gap_mean"]) for r in rows if r["iteration"] == "2"}
    assert last[("0", "0")] == 0.0 and last[("1", "2")] == 2.0


def test_default_output_is_a_fresh_folder_and_ctrl_c_prints_the_resume_command(tmp_path, monkeypatch, capsys):
    import fresh_rl.sweep

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(fresh_rl.sweep, "run_loop", interrupted)
    with pytest.raises(SystemExit) as info:
        cli.main(["train", *TINY, "--seed", "2"])
    assert info.value.code == 130
    (out,) = (tmp_path / "runs").iterdir()  # runs/train-<time>-<hash>, claimed before any work
    assert re.fullmatch(r"train-\d{8}-\d{6}-[0-9a-f]{6}", out.name)
    assert json.loads((out / "run.json").read_text())["identity"]["seed"] == 2
    captured = capsys.readouterr()
    assert f"no --out given: writing to runs/{out.name}" in captured.out
    assert captured.err.strip() == ("fresh-rl: interrupted; resume with: fresh-rl train "
                                    f"{' '.join(TINY)} --seed 2 --out runs/{out.name}")
