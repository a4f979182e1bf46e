"""The one preset type: ``--set field=value`` overrides, names and labels, the listing."""
from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from fresh_rl.control import TrainConfig
from fresh_rl.control.presets import VACO_SCALES
from fresh_rl.llm.presets import OLD_LOGITS_SCALES
from fresh_rl.presets import Preset, PresetError, named

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Study(Preset):
    tasks: tuple[TrainConfig, ...]
    bed: TrainConfig
    learning_rates: tuple[float, ...] = (1e-3,)
    seeds: int = 2
    label_text: str = "x"
    inner: object = None


def _study(**kw) -> Study:
    base = TrainConfig(env_name="CartPole-v1", num_envs=4, rollout_length=8, total_env_steps=4 * 8 * 4)
    return named({"ci": Study(tasks=(base, dataclasses.replace(base, env_name="Acrobot-v1")), bed=base, **kw)})["ci"]


def test_overrides_parse_by_field_type_and_nest():
    s = _study().overridden(["seeds=5", "learning_rates=1e-4,3e-4", "bed.num_envs=8", "tasks.rollout_length=16",
                             "label_text=hello"])
    assert (s.seeds, s.learning_rates, s.bed.num_envs, s.label_text) == (5, (1e-4, 3e-4), 8, "hello")
    assert [t.rollout_length for t in s.tasks] == [16, 16]  # a dotted name on a tuple sets every config
    assert [t.env_name for t in s.tasks] == ["CartPole-v1", "Acrobot-v1"]
    assert s.label == "ci --set seeds=5 --set learning_rates=1e-4,3e-4 --set bed.num_envs=8 " \
                      "--set tasks.rollout_length=16 --set label_text=hello"


def test_name_and_overrides_stay_out_of_repr_and_equality():
    """Saved-run fingerprints quote a preset's repr: choosing it by name must not change them."""
    s = _study()
    assert repr(s) == repr(dataclasses.replace(s, name="other"))
    assert s == dataclasses.replace(s, overrides=("seeds=2",))
    assert s.overridden(["seeds=2"]) == s and s.overridden(["seeds=2"]).label == "ci --set seeds=2"
    assert repr(VACO_SCALES["ci"]).startswith("Scale(tasks=") and "name='ci'" not in repr(VACO_SCALES["ci"])


@pytest.mark.parametrize("item, words", [
    ("seds=3", ["has no field 'seds'", "tasks, bed, learning_rates, seeds"]),
    ("seeds=three", ["--set seeds expects an integer, got 'three'"]),
    ("learning_rates=a,b", ["--set learning_rates expects comma-separated values, each a number"]),
    ("bed=1", ["a nested config, set one of its fields (bed.FIELD=value)"]),
    ("bed.num_envz=1", ["TrainConfig has no field 'num_envz'"]),
    ("seeds", ["--set expects field=value, got 'seeds'"]),
    ("bed.num_envs=0", ["--set bed.num_envs=0: ", "num_envs"]),  # TrainConfig's own range check
    ("name=x", ["has no field 'name'"]),  # the name is not a setting
])
def test_bad_overrides_name_the_field(item, words):
    with pytest.raises(PresetError) as err:
        _study().overridden([item])
    for word in words:
        assert word in str(err.value)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 10_000), st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=4))
def test_overrides_round_trip_their_text(seeds, rates):
    s = _study().overridden([f"seeds={seeds}", "learning_rates=" + ",".join(repr(r) for r in rates)])
    assert s.seeds == seeds and s.learning_rates == tuple(rates)


def test_package_presets_are_named_and_settable():
    for mapping in (VACO_SCALES, OLD_LOGITS_SCALES):
        for key, preset in mapping.items():
            assert isinstance(preset, Preset) and preset.name == key == preset.label
    bed = OLD_LOGITS_SCALES["bpe-ci"].overridden(["iterations=3", "rl.learning_rate=3e-4"])
    assert (bed.iterations, bed.rl.learning_rate) == (3, 3e-4)


def test_named_refuses_a_value_that_is_not_a_preset():
    with pytest.raises(TypeError, match="'ci' is a TrainConfig, not a fresh_rl.presets.Preset"):
        named({"ci": TrainConfig()})


def _fresh_rl(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fresh_rl", *args], capture_output=True, text=True, cwd=ROOT)


def test_fresh_rl_presets_lists_every_study_and_one_study_s_fields():
    done = _fresh_rl("presets")
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    scripts = sorted(p.stem for p in (ROOT / "experiments").glob("*.py"))
    assert sorted(lines) == scripts
    assert lines["vaco_forward_lag"] == "ci, cpu, minatar"
    assert lines["old_logits"] == ", ".join(OLD_LOGITS_SCALES)
    assert lines["vaco_lag_sweep"] == ", ".join(VACO_SCALES)
    one = _fresh_rl("presets", "vaco_forward_lag")
    assert one.returncode == 0, one.stderr
    assert "vaco_forward_lag --scale cpu  (Scale)" in one.stdout
    assert "    lags = (0, 4, 16)" in one.stdout and "    updates = (4, 16, 64)" in one.stdout
    bad = _fresh_rl("presets", "no_such_study")
    assert bad.returncode != 0 and "unknown experiment 'no_such_study'" in bad.stderr


def test_a_study_script_refuses_a_bad_override_before_any_work(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / "vaco_forward_lag.py"), "--scale", "ci",
                           "--set", "lags=0,two", "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 2
    assert "--set lags expects comma-separated values, each an integer, got '0,two'" in done.stderr
    assert not (tmp_path / "out").exists()  # refused before the folder is claimed


def _scripts_with_presets() -> list[str]:
    """The experiment scripts with a module-level ``SCALES`` (assigned or imported): what
    ``fresh-rl presets`` lists (read from the source, so collecting the tests imports nothing)."""
    found = []
    for path in sorted((ROOT / "experiments").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = ([t.id for t in node.targets if isinstance(t, ast.Name)] if isinstance(node, ast.Assign) else
                     [a.asname or a.name for a in node.names] if isinstance(node, ast.ImportFrom) else [])
            if "SCALES" in names:
                found.append(path.stem)
                break
    return found


FAST_LANE_SCRIPTS = ("freshper_llm", "llm_warm_start", "quickstart")
"""The default suite's cases (~3 s each): a script without a ``ci`` preset, one whose presets are of
two kinds and one whose preset names the parts' presets; the slow lane runs every script."""


@pytest.mark.parametrize("script", [s if s in FAST_LANE_SCRIPTS else pytest.param(s, marks=pytest.mark.slow)
                                    for s in _scripts_with_presets()])
def test_every_study_script_takes_set_and_names_an_unknown_field(script, tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / f"{script}.py"), "--set", "no_such_field=1",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--set no_such_field: " in done.stderr and "has no field 'no_such_field'" in done.stderr
    assert not (tmp_path / "out").exists()
