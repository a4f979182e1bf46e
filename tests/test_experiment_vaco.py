"""The ``ci`` scale of experiments/vaco_lag_sweep.py runs inside the test suite: PPO-clip and
VACO both learn CartPole, the outputs are written, and a second invocation resumes from the
saved runs instead of recomputing them (and rejects runs of the old key schedule or another delay
mixture); its grid derives the same key per cell as ``fresh-rl sweep``; every scale's variants
validate before compiling; the delay-mixture column; notebook 02 (the ci programs)."""
import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fresh_rl.control.presets import (KEY_SCHEDULE, MIXTURE_LAG, VACO_SCALES, Scale, Task, checked_variant_grid,
                                      mixture_config, run_study_variant, saved_run_matches,
                                      study_variants, variant_config, variant_grid)
from fresh_rl.lag import DelayConfig
from fresh_rl.eval import final_score, initial_score

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "experiments" / "vaco_lag_sweep.py"
VARIANTS = ("ppo_clip", "vaco")


def _run_script(out: Path) -> str:
    """The ci scale as a user runs it (a separate process; the session's compilation cache)."""
    proc = subprocess.run([sys.executable, str(SCRIPT), "--scale", "ci", "--out", str(out), "--bootstrap-reps", "200"],
                          capture_output=True, text=True, timeout=1500, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _saved_runs(out: Path) -> dict:
    return {v: dict(np.load(out / "runs" / f"CartPole-v1__{v}.npz")) for v in VARIANTS}


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vaco_ci")
    _run_script(out)
    return out, _saved_runs(out)


def test_ci_scale_learns_cartpole_for_ppo_clip_and_vaco(ci_run):
    _, results = ci_run
    for variant in VARIANTS:
        returns = results[variant]["episode_return"]  # [lags, deltas, seeds, iters]
        initial = initial_score(returns, results[variant]["episodes_completed"]).mean()
        final = final_score(returns)[0, 0].mean()  # lag 0, seed mean
        print(variant, "initial", initial, "final (lag 0)", final)
        assert initial < 40.0  # random CartPole policy: ~20
        assert final > 100.0 and final > 4 * initial, (variant, initial, final)


def test_ci_scale_writes_outputs_and_acts_with_the_swept_lag(ci_run):
    out, results = ci_run
    for name in ("runs.csv", "curves.csv", "per_task.csv", "summary.md",
                 "curves_CartPole-v1.png", "score_vs_tv.csv", "score_vs_tv.png"):
        assert (out / name).stat().st_size > 0, name
    # one task: per-task intervals, no rliable aggregates (they need MIN_AGGREGATE_TASKS tasks)
    for name in ("aggregates.csv", "aggregates.png", "probability_of_improvement.csv"):
        assert not (out / name).exists(), name
    rows = list(csv.DictReader(open(out / "runs.csv")))
    scale = VACO_SCALES["ci"]
    assert len(rows) == len(scale.methods) * len(scale.lags) * scale.num_seeds  # variants × lags × seeds
    gaps = {(r["variant"], int(r["lag"])): float(r["mean_version_gap"]) for r in rows}
    # fixed lag k: gaps 0, 1, …, k−1, then k for the rest of the run
    iters = results["vaco"]["episode_return"].shape[-1]
    k = 4
    assert gaps[("vaco", 0)] == 0.0
    np.testing.assert_allclose(gaps[("vaco", k)], (sum(range(k)) + k * (iters - k)) / iters)
    summary = (out / "summary.md").read_text()
    assert "results/VERDICTS.md" in summary and "## Per-task normalised scores" in summary
    # score against the measured backward TV: one point per variant and lag; lag 4 drifts more
    tv = {(r["variant"], r["lag"]): float(r["mean_backward_tv"])
          for r in csv.DictReader(open(out / "score_vs_tv.csv"))}
    assert set(tv) == {(v, lag) for v in VARIANTS for lag in ("0", "4")}
    assert all(tv[v, "4"] > tv[v, "0"] for v in VARIANTS), tv
    # per task, variant and lag: the seed mean of the normalised score inside its own interval
    per_task = {(r["variant"], r["lag"]): r for r in csv.DictReader(open(out / "per_task.csv"))
                if r["value"] == "headline"}
    assert set(per_task) == {(v, lag) for v in VARIANTS for lag in ("0", "4")}
    for r in per_task.values():
        assert float(r["ci_low"]) <= float(r["mean"]) <= float(r["ci_high"]), r
    # measured lag metrics: one row per variant and lag, equal to the saved runs' means
    metrics = {(r["variant"], r["lag"]): r for r in csv.DictReader(open(out / "lag_metrics.csv"))}
    assert set(metrics) == {(v, lag) for v in VARIANTS for lag in ("0", "4")}
    for v in VARIANTS:
        np.testing.assert_allclose(float(metrics[v, "4"]["backward_tv"]), tv[v, "4"], rtol=1e-3)
    assert float(metrics["vaco", "0"]["version_gap"]) == 0.0
    # the learning check: CartPole's learner improves in the ci budget, but with 2 seeds the
    # Student-t interval of the gain (t quantile 12.7 at 1 degree of freedom) cannot show it;
    # the flag follows the interval
    (check,) = csv.DictReader(open(out / "learning_check.csv"))
    assert check["task"] == "CartPole-v1" and float(check["final"]) > float(check["initial"])
    assert check["learns"] == str(float(check["gain_ci_low"]) > 0)


def test_second_invocation_resumes_from_saved_runs(ci_run):
    out, results = ci_run
    stamps = {v: (out / "runs" / f"CartPole-v1__{v}.npz").stat().st_mtime_ns for v in VARIANTS}
    log = _run_script(out)
    assert log.count("[resume]") == len(VARIANTS), log
    for variant, data in _saved_runs(out).items():
        assert (out / "runs" / f"CartPole-v1__{variant}.npz").stat().st_mtime_ns == stamps[variant]
        np.testing.assert_array_equal(data["episode_return"], results[variant]["episode_return"])


def test_study_and_cli_sweep_derive_the_same_key_per_grid_cell():
    from fresh_rl import cli
    from fresh_rl.sweep import seed_key

    config = variant_config(VACO_SCALES["ci"].tasks[0], "vaco", {}, ring_size=9)
    study = variant_grid(config, (0, 4, 8), (0.1, 0.2), num_seeds=4, seed=0)
    sweep_cli = cli.sweep_grid(config, 4, 0, cli._parse_grid(["lag=0,4,8", "vaco_delta=0.1,0.2"]))
    cells = []
    for grid, hparams in (study, sweep_cli):
        (i,) = [i for i, r in enumerate(grid.rows) if (r["seed"], r["lag"], r["vaco_delta"]) == (2, 4, 0.2)]
        cells.append((np.asarray(grid.keys[i]), int(hparams.lag[i]), float(hparams.vaco_delta[i])))
    np.testing.assert_array_equal(cells[0][0], cells[1][0])
    np.testing.assert_array_equal(cells[0][0], seed_key(2))
    assert cells[0][1:] == cells[1][1:] == (4, pytest.approx(0.2))
    # the study's [L, D, S] reshape relies on product_grid's order: seed fastest, then δ, then lag
    rows = study[0].rows
    assert [(r["lag"], r["vaco_delta"], r["seed"]) for r in rows[:5]] == [
        (0, 0.1, 0), (0, 0.1, 1), (0, 0.1, 2), (0, 0.1, 3), (0, 0.2, 0)]


def test_saved_runs_of_the_old_key_schedule_are_rejected():
    config = variant_config(VACO_SCALES["ci"].tasks[0], "vaco", {}, ring_size=5)
    data = {"config": np.array(repr(config)), "seed": np.array(0), "lags": np.array([0, 4]),
            "deltas": np.array([0.2]), "episode_return": np.zeros((2, 1, 2, 3))}
    assert not saved_run_matches(data, config, 0, (0, 4), (0.2,), 2)  # no key_schedule: old
    data["key_schedule"] = np.array(KEY_SCHEDULE)
    assert saved_run_matches(data, config, 0, (0, 4), (0.2,), 2)
    assert not saved_run_matches(data, config, 1, (0, 4), (0.2,), 2)


def test_saved_runs_of_another_mixture_are_rejected():
    scale = VACO_SCALES["cpu"]
    config = variant_config(scale.tasks[0], "vaco", {}, scale.ring_size)
    data = {"config": np.array(repr(config)), "seed": np.array(0), "lags": np.array(scale.study_lags),
            "deltas": np.array([0.2]), "episode_return": np.zeros((5, 1, 2, 3)),
            "key_schedule": np.array(KEY_SCHEDULE), "mixture": np.array(repr(scale.mixture))}
    assert saved_run_matches(data, config, 0, scale.study_lags, (0.2,), 2, scale.mixture)
    other = DelayConfig.uniform(0, 64, scale.ring_size)
    assert not saved_run_matches(data, config, 0, scale.study_lags, (0.2,), 2, other)
    assert not saved_run_matches(data, config, 0, scale.lags, (0.2,), 2, None)


def test_a_task_subset_keeps_every_config_so_saved_runs_still_match():
    """``--tasks``: the subset's configs (ring size included) equal the full scale's, so the
    finished tasks of a resumable study are tabulated from their saved runs; bad names fail."""
    full = VACO_SCALES["cpu"]
    sub = full.with_tasks(["Acrobot-v1", "CartPole-v1"])
    assert [t.name for t in sub.tasks] == ["CartPole-v1", "Acrobot-v1"]  # the scale's order
    assert (sub.ring_size, sub.study_lags, sub.num_seeds) == (full.ring_size, full.study_lags, full.num_seeds)
    for task in sub.tasks:
        assert list(study_variants(sub, task)) == list(study_variants(full, task))
        assert variant_config(task, "vaco", {}, sub.ring_size) == variant_config(task, "vaco", {}, full.ring_size)
    with pytest.raises(ValueError, match="tasks must be a non-empty subset.*Breakout-MinAtar"):
        full.with_tasks(["Pong"])
    with pytest.raises(ValueError, match="tasks must be a non-empty subset"):
        full.with_tasks([])


@pytest.mark.parametrize("name", ["ci", "quick", "cpu",
                                  pytest.param("gpu10", marks=pytest.mark.slow),  # builds Brax
                                  pytest.param("paper", marks=pytest.mark.slow)])  # MuJoCo tasks
def test_every_variant_of_a_scale_validates_before_compiling(name):
    """Every (task, variant) config, its fixed-lag grid and its mixture grid pass the range and
    memory checks (one chunk resident) — what a run would hit first, without compiling."""
    scale = VACO_SCALES[name]
    methods = set()
    for task in scale.tasks:
        for variant, method, overrides, deltas in study_variants(scale, task):
            config = variant_config(task, method, overrides, scale.ring_size)
            checked_variant_grid(config, scale.lags, deltas, scale.num_seeds, 0, scale.chunk_size)
            if scale.mixture is not None:
                mixture = mixture_config(scale, config)
                assert mixture.delay == scale.mixture and mixture.num_actor_groups == scale.mixture_actor_groups
                checked_variant_grid(mixture, (0,), deltas, scale.num_seeds, 0, scale.chunk_size)
            methods.add(variant)
    if name == "cpu":  # the study's grid: lags that bind, the mixture, both δ readings, ≥ 10 seeds
        assert scale.study_lags == (0, 8, 32, 64, MIXTURE_LAG) and scale.num_seeds >= 10
        assert {"vaco", "vaco_l1", "ppo_kl_adaptive", "ppo_kl_fixed", "impala", "spo", "ppo_clip"} <= methods
        assert any("MinAtar" in t.name for t in scale.tasks)
        assert all(dict(t.overrides)["eval_every"] > 0 for t in scale.tasks)  # scored on the learner


def test_bad_scale_names_the_field():
    with pytest.raises(ValueError, match="Scale.lags"):
        Scale(tasks=(), lags=(0, -1), num_seeds=1)
    with pytest.raises(ValueError, match=r"Scale.mixture.ring_size must be max\(Scale.lags\) \+ 1 = 5"):
        Scale(tasks=(), lags=(0, 4), num_seeds=1, mixture=DelayConfig.geometric(2.0, 9))


def test_mixture_column_follows_the_fixed_lags():
    """run_study_variant: the lag axis is Scale.study_lags; the fixed lags act exactly k versions
    behind once k versions exist; the mixture column acts with random delays from the geometric
    distribution (version gaps between 0 and K − 1, not constant)."""
    task = Task("CartPole-v1", tuple(sorted(dict(num_envs=4, rollout_length=8, total_env_steps=4 * 8 * 8,
                                                 num_epochs=1, num_minibatches=2, hidden_sizes=(8,)).items())))
    scale = Scale(tasks=(task,), lags=(0, 3), num_seeds=2, methods=("vaco",), ablations=(),
                  deltas=(0.2,), mixture=DelayConfig.geometric(1.5, 4), mixture_actor_groups=2)
    config = variant_config(task, "vaco", {}, scale.ring_size)
    out = run_study_variant(scale, config, (0.2,), seed=0)
    gap = out["metrics"]["lag/version_gap_mean"]
    assert gap.shape == (3, 1, 2, 8)  # [fixed lags + mixture, δ, seeds, iterations]
    np.testing.assert_array_equal(gap[0], 0.0)
    np.testing.assert_array_equal(gap[1, 0], np.broadcast_to([0, 1, 2, 3, 3, 3, 3, 3], (2, 8)))
    mixture = gap[2, 0, :, 4:]  # after warm-up (iterations ≥ K − 1 have every version)
    assert 0.0 < mixture.mean() < 3.0 and mixture.std() > 0.0, mixture
    assert out["env_steps"] == 3 * 2 * 4 * 8 * 8
    assert set(out["metrics"]) >= {"episode_return", "lag/tv", "lag/forward_tv", "lag/ess"}


@pytest.mark.slow  # the notebook reruns the ci study's programs in a kernel of its own
def test_notebook_02_vaco_under_lag(run_notebook, ci_run):
    """The notebook runs the ci scale through the study's ``run_variant`` (after the script: the
    same programs, loaded from the session's compilation cache)."""
    notebook = run_notebook("02_vaco_under_lag")
    printed = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code"
                      for o in c.get("outputs", []))
    assert "ppo_clip" in printed and "vaco" in printed


def test_regime_diagnosis_measures_the_committed_runs(tmp_path):
    """``experiments/vaco_regime.py`` on a copy of the committed CartPole PPO-clip runs: with a
    fixed lag L the actors act with θ0 at iterations 0 … L, so the θ0 share is (L + 1)/N and the
    mean version age Σ_k min(k, L)/N exactly (the saved gaps are integers at a fixed lag)."""
    import shutil
    (tmp_path / "runs").mkdir()
    saved = ROOT / "results" / "vaco" / "runs" / "CartPole-v1__ppo_clip.npz"
    shutil.copy(saved, tmp_path / "runs" / saved.name)
    subprocess.run([sys.executable, str(ROOT / "experiments" / "vaco_regime.py"), "--out", str(tmp_path)],
                   check=True, capture_output=True, text=True, timeout=600,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    with open(tmp_path / "regime.csv") as f:
        rows = {r["lag"]: r for r in csv.DictReader(f)}
    with np.load(saved) as data:
        lags = [int(x) for x in data["lags"] if x >= 0]
        iterations = data["episode_return"].shape[-1]
    assert lags and set(map(str, lags)) <= set(rows) and "mixture" in rows
    for lag in lags:
        row = rows[str(lag)]
        assert int(row["versions"]) == iterations
        assert float(row["theta0_share"]) == round((lag + 1) / iterations, 3)
        expected_age = np.minimum(np.arange(iterations), lag).mean()
        assert float(row["mean_version_age"]) == round(expected_age, 2)
    assert (tmp_path / "regime.png").stat().st_size > 0 and "PPO-clip" in (tmp_path / "regime.md").read_text()
