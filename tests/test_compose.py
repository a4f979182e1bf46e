"""experiments/compose.py run as a user runs it (``--scale ci``; slow lane: five control programs
compile, ≈ 1–2 min on 2 cores): every arm on the same seeds, the composed arm's seams measured,
and a rerun that loads the saved arms. In the default run: each arm's config carries its seams
(fresh_rl.control.compose_study) and the README table shows the gates where they apply."""
from __future__ import annotations

import json

import numpy as np
import pytest

from fresh_rl.control import ReplaySettings, TrainConfig
from fresh_rl.control.compose_study import ARMS, Scale, arm_config, arm_table, readme_table


def test_each_arm_carries_its_seams_and_the_composed_arm_takes_each_parts():
    base = TrainConfig(env_name="CartPole-v1", num_envs=8, rollout_length=16, total_env_steps=8 * 16 * 6,
                       replay=ReplaySettings(extra_updates=2, buffer_iterations=4, age_decay_tau=2.0))
    scale = Scale(base, num_seeds=2, drift_every=3)
    for arm, seams in ARMS.items():
        config = arm_config(scale, arm)
        assert {k: getattr(config, k) for k in seams} == seams
        assert config.replay.drift_every == (0 if seams["data_source"] == "lagged_actors" else 3)
    assert ARMS["composed"] == {"method": ARMS["vaco"]["method"], "data_source": ARMS["freshper"]["data_source"],
                                "route": ARMS["ewma"]["route"]}


def test_readme_table_shows_each_gate_where_it_applies():
    measured = {"seeds": np.array([100, 101]), "final_eval_return": np.array([1.0, 3.0]),
                "lag_tv": np.array([0.04, 0.06]), "ewma_reset_rate": np.array([0.5, 0.7]),
                "forward_tv": np.array([0.1, 0.1])}
    table = arm_table({"ppo_clip": measured, "composed": {**measured, "replayed_ess": np.array([0.5, 0.7])}})
    assert table["composed"]["seeds"] == [100, 101] and "replayed_ess" not in table["ppo_clip"]
    lines = readme_table(table)
    assert lines[2] == "| `ppo_clip` | `ppo_clip` | `lagged_actors` | `behaviour` | 2.0 [-10.7, 14.7] | 0.050 | – | – |"
    assert lines[3].endswith("| 0.60 | 0.600 |")


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, run_study):
    out = tmp_path_factory.mktemp("compose")
    return out, run_study("compose", "ci", out)


@pytest.mark.slow
def test_every_arm_runs_on_the_same_seeds(ci_run):
    out, _ = ci_run
    arms = json.loads((out / "runs.json").read_text())["arms"]
    assert len(arms) >= 2 and len({tuple(a["seeds"]) for a in arms.values()}) == 1
    for arm in arms.values():
        assert len(arm["final_eval_return"]) == len(arm["seeds"])
    assert (out / "learning_curves.png").stat().st_size > 0


@pytest.mark.slow
def test_rerun_loads_the_saved_arms(ci_run, run_study):
    out, _ = ci_run
    saved = {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.npz")}
    again = run_study("compose", "ci", out)
    assert {p.name: p.stat().st_mtime_ns for p in (out / "runs").glob("*.npz")} == saved
    assert "final return" in again.stdout
