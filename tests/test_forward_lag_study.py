"""fresh_rl.control.forward_lag_study: the VACO regime study's programs, equal tuning and cells,
checked without training (the stage runner is replaced by a scorer of the program's settings)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fresh_rl.control import TrainConfig
from fresh_rl.control import forward_lag_study as study
from fresh_rl.control.forward_lag_report import forward_tv_lines

TASK = TrainConfig(env_name="CartPole-v1", num_envs=8, rollout_length=16, total_env_steps=8 * 16 * 40,
                   num_minibatches=4, num_actor_groups=4, eval_every=10, eval_episodes=2)
SCALE = study.Scale((TASK,), lags=(0, 4, 16), mixture_mean=4.0, updates=(4, 16, 64), warmup=16,
                    learning_rates=(3e-4, 1e-3, 3e-3), tuning_seeds=2, scoring_seeds=3, chunk=9)


@pytest.mark.parametrize("method", [*study.KNOBS, *study.ABLATIONS])
@pytest.mark.parametrize("updates", SCALE.updates)
@pytest.mark.parametrize("delay", ["fixed", study.MIXTURE])
def test_a_program_sets_m_the_delay_the_warmup_and_a_static_knob(method, updates, delay):
    config = study.config_for(TASK, SCALE, method, 0.3, updates, delay)
    assert config.method == method and config.passes_per_batch_used * config.num_minibatches == updates  # IMPALA too
    assert config.num_minibatches == TASK.num_minibatches and config.lag_warmup_versions == SCALE.warmup
    assert config.delay.ring_size == max(SCALE.lags) + 1
    assert config.delay.kind == ("fixed" if delay == "fixed" else "geometric")
    static = {"ppo_clip": (config.ppo_clip.epsilon_low, config.ppo_clip.epsilon_high), "spo": (config.spo.epsilon,),
              "impala": (config.vtrace_rho_bar,), "vaco_filter_only": (config.vaco.delta,)}
    if method in static:
        assert static[method] == (0.3,) * len(static[method])
    else:  # a traced knob (or none): the static config keeps the task's values
        assert (config.ppo_clip, config.spo, config.vtrace_rho_bar, config.vaco) == (
            TASK.ppo_clip, TASK.spo, TASK.vtrace_rho_bar, TASK.vaco)


def _knob(config, hp, i):
    traced = study.KNOBS.get(config.method, (None, None, None))[2]
    if traced:
        return float(np.asarray(getattr(hp, traced))[i])
    return {"ppo_clip": config.ppo_clip.epsilon_low, "spo": config.spo.epsilon, "impala": config.vtrace_rho_bar,
            "vaco_filter_only": config.vaco.delta}.get(config.method, 0.0)


@pytest.fixture
def scored_stages(monkeypatch):
    """Replace the stage runner: a run's return is 1000·lr + knob (so every pick is the largest lr
    and knob), constant over its evaluations; the calls are recorded."""
    calls = []

    def fake_run_stage(fn, keys, hp, *, directory, fingerprint, chunk_size, label):
        config, n = fn.args[0], len(keys)
        calls.append((config, directory.name, n))
        score = [1000 * float(np.asarray(hp.learning_rate)[i]) + _knob(config, hp, i) for i in range(n)]
        evals = 3
        out = {"eval/return_deterministic": np.repeat(np.array(score)[:, None], evals, 1),
               "eval/valid": np.ones((n, evals), bool), "lag/forward_tv": np.array([[0.01, 0.01, 1e14]] * n)}
        if "lag/forward_tv_weighted" in fn.args[1]:
            out["lag/forward_tv_weighted"] = np.array([[0.01, 0.02, 0.03]] * n)
        return out, 0.0
    monkeypatch.setattr(study, "run_stage", fake_run_stage)
    return calls


def test_every_method_gets_the_same_grid_on_tuning_seeds_and_its_pick_is_the_best(scored_stages, tmp_path):
    picks, rows = study.tune(TASK, SCALE, tmp_path, seed=0)
    sizes = {m: sum(r["method"] == m for r in rows) for m, _ in SCALE.knobs}
    assert set(sizes.values()) == {len(SCALE.learning_rates) * 3 * SCALE.tuning_seeds}  # equal budgets
    assert {r["seed"] for r in rows} == set(range(SCALE.tuning_seeds))
    assert {(r["lag"], c.num_epochs * c.num_minibatches) for r in rows for c, _, _ in scored_stages[:1]} == {
        (SCALE.middle[0], SCALE.middle[1])}
    for method, values in SCALE.knobs:
        assert picks[method] == (max(SCALE.learning_rates), max(values))


def test_scoring_covers_every_cell_on_other_seeds_with_ablations_at_the_middle_m(scored_stages, tmp_path):
    picks, _ = study.tune(TASK, SCALE, tmp_path, seed=0)
    runs = study.score(TASK, SCALE, picks, tmp_path, seed=0)
    scoring = set(range(SCALE.tuning_seeds, SCALE.tuning_seeds + SCALE.scoring_seeds))
    assert {r["seed"] for r in runs} == scoring
    backwards = {str(lag) for lag in SCALE.lags} | {study.MIXTURE}
    for method, _ in SCALE.knobs:
        cells = {(r["backward"], r["updates"]) for r in runs if r["method"] == method and r["tuned_knob"]}
        assert cells == {(b, m) for b in backwards for m in SCALE.updates}
    for method in study.ABLATIONS:
        assert {r["updates"] for r in runs if r["method"] == method} == {SCALE.middle[1]}
    curve = {r["knob"] for r in runs if r["method"] == "vaco" and r["updates"] == SCALE.middle[1]}
    assert curve == set(study.DELTA_CURVE) | {picks["vaco"][1]}
    assert {r["versions"] for r in runs} == {TASK.num_iterations}
    assert all(r["forward_tv"] == pytest.approx(0.01) for r in runs)  # the median: one blown-up iteration is ignored


def test_the_forward_tv_reruns_cover_every_cell_at_the_picks_on_the_first_scoring_seeds(scored_stages, tmp_path):
    picks, _ = study.tune(TASK, SCALE, tmp_path, seed=0)
    runs = study.score(TASK, SCALE, picks, tmp_path, seed=0)
    scoring_calls = len(scored_stages)
    measured = study.measure_forward_tv(TASK, SCALE, picks, tmp_path, seed=0)
    assert {r["seed"] for r in measured} == set(range(SCALE.tuning_seeds, SCALE.tuning_seeds + SCALE.forward_tv_seeds))
    cell = ("method", "knob", "learning_rate", "backward", "updates")
    assert {tuple(r[k] for k in cell) for r in measured} == {
        tuple(r[k] for k in cell) for r in runs if r["tuned_knob"] and r["method"] in study.KNOBS}
    assert all(r["forward_tv_weighted"] == pytest.approx(0.02) for r in measured)  # a run's mean over iterations
    assert all("forward_tv" in directory for _, directory, _ in scored_stages[scoring_calls:])
    assert "forward_tv_weighted" not in runs[0]  # the scoring stages keep what they kept
    text = "\n".join(forward_tv_lines({"runs": runs, "forward_tv": measured}, 12.0))
    assert f"{len(measured)} of {len(measured)} reproduce their scoring run's mean return exactly" in text
    measured[0] = {**measured[0], "mean_return": measured[0]["mean_return"] + 0.5}
    text = "\n".join(forward_tv_lines({"runs": runs, "forward_tv": measured}, 12.0))
    assert f"{len(measured) - 1} of {len(measured)} reproduce" in text and "the largest difference is 0.5" in text


def test_a_brax_task_s_stage_folders_stay_under_runs():
    assert study.task_folder("brax/inverted_pendulum-ppo_clip-M=16-tuning") == "brax_inverted_pendulum-ppo_clip-M=16-tuning"
    assert study.task_folder("CartPole-v1") == "CartPole-v1"
    assert dataclasses.replace(SCALE, lags=(0, 2, 8)).middle == (2, 16)


def test_a_diverged_run_scores_its_first_evaluation_from_the_divergence_on():
    """The declared rule: evaluations before the divergence count, later ones score the run's first
    evaluation; measured lags average the iterations before it; finite runs are the plain mean."""
    ret = np.array([[10.0, 50.0, 90.0, 130.0], [20.0, 60.0, 1000.0, 1000.0], [np.nan] * 4])
    out = {"eval/return_deterministic": ret, "eval/valid": np.ones((3, 4), bool),
           "lag/tv": np.array([[0.1] * 4, [0.2, 0.4, np.nan, np.nan], [np.nan] * 4]),
           "loss/clip_fraction": np.array([[0.1] * 4, [0.3, np.inf, 0.5, 0.5], [0.0] * 4])}
    finite, diverged, at_start = study.run_summaries(out)
    assert finite["mean_return"] == pytest.approx(70.0) and finite["final_return"] == 130.0
    assert finite["diverged_at"] == -1 and finite["backward_tv"] == pytest.approx(0.1)
    # ±inf in a loss marks iteration 1 (before lag/tv's NaN at 2): 20 counts, then 20 (its first)
    assert diverged["diverged_at"] == 1 and diverged["mean_return"] == pytest.approx(20.0)
    assert diverged["final_return"] == 20.0 and diverged["backward_tv"] == pytest.approx(0.2)
    assert diverged["clip_fraction"] == pytest.approx(0.3)
    # diverged before its first evaluation: the stage's mean first evaluation, no measured lag
    assert at_start["diverged_at"] == 0 and at_start["mean_return"] == pytest.approx(15.0)
    assert np.isnan(at_start["backward_tv"]) and np.isnan(at_start["forward_tv"])
