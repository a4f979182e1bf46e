"""fresh_rl.eval's rliable aggregates: stratified-bootstrap intervals against direct NumPy/rliable
computations (the Student-t seed statistics: tests/test_eval_statistics.py)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rliable import metrics as rl_metrics

from fresh_rl.eval import (aggregate_intervals, improvement_intervals, iqm, normalize_scores,
                           optimality_gap, probability_of_improvement)


def test_point_estimates_match_rliable_metrics():
    scores = np.random.default_rng(0).normal(0.5, 0.3, size=(7, 4))
    out = aggregate_intervals({"m": scores}, reps=200)["m"]
    # float64 (u ≈ 1.1e-16): the same sums over 28 scores (the mean pooled vs per task): ≲ 28·u ≈ 3e-15 ≪ rtol 1e-7
    np.testing.assert_allclose(out["median"][0], rl_metrics.aggregate_median(scores))
    np.testing.assert_allclose(out["iqm"][0], rl_metrics.aggregate_iqm(scores))
    np.testing.assert_allclose(out["mean"][0], rl_metrics.aggregate_mean(scores))
    np.testing.assert_allclose(out["optimality_gap"][0], rl_metrics.aggregate_optimality_gap(scores))
    for point, low, high in out.values():  # 1e-12: an end equal to the point up to float64 reordering (≲ 1e-15)
        assert low <= point + 1e-12 and point <= high + 1e-12


def test_intervals_are_reproducible_and_leave_the_global_rng_alone():
    scores = np.random.default_rng(1).random((3, 2))
    np.random.seed(123)
    before = np.random.get_state()[1].copy()
    first = aggregate_intervals({"a": scores, "b": scores + 0.1}, reps=200)
    np.testing.assert_array_equal(np.random.get_state()[1], before)
    np.random.rand(5)  # a different global state must not change the intervals
    assert aggregate_intervals({"a": scores, "b": scores + 0.1}, reps=200) == first  # exact: same code, same seed
    assert aggregate_intervals({"a": scores, "b": scores + 0.1}, reps=200, seed=1) != first


def test_iqm_and_optimality_gap_by_hand():
    x = np.arange(1, 9, dtype=float).reshape(4, 2)  # 1..8: middle half is 3,4,5,6
    assert iqm(x) == pytest.approx(4.5)  # exact: dyadic sums of small integers in float64
    assert optimality_gap(np.array([[0.5, 1.5], [1.0, 0.0]])) == pytest.approx(1 - (0.5 + 1 + 1 + 0) / 4)


def test_stratified_bootstrap_keeps_tasks_apart():
    """Each task's runs are resampled within the task: a constant-per-task matrix has no spread."""
    scores = np.tile(np.array([[0.1, 0.9, 0.4]]), (6, 1))
    out = aggregate_intervals({"m": scores}, reps=300)["m"]
    for metric, (point, low, high) in out.items():  # float64 means of equal values: ≲ 6u ≈ 7e-16 ≪ rel 1e-6
        assert low == pytest.approx(point) and high == pytest.approx(point), metric


def test_aggregate_intervals_rejects_a_score_vector():
    with pytest.raises(ValueError, match="score_dict"):
        aggregate_intervals({"m": np.zeros(3)})


def test_normalize_scores():
    out = normalize_scores(np.array([[10.0, 0.0]]), low=np.array([0.0, -100.0]), high=np.array([20.0, 100.0]))
    np.testing.assert_allclose(out, [[0.5, 0.5]])  # exact: 10/20 and 100/200
    with pytest.raises(ValueError, match="high > low"):
        normalize_scores(np.zeros((1, 1)), np.ones(1), np.ones(1))


def _improvement_by_loops(x, y):
    """P(X > Y) from its definition: per task, every pair of runs scored 1 / ½ / 0."""
    per_task = []
    for m in range(x.shape[1]):
        pairs = [1.0 if a > b else 0.5 if a == b else 0.0 for a in x[:, m] for b in y[:, m]]
        per_task.append(sum(pairs) / len(pairs))
    return sum(per_task) / len(per_task)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(1, 4), st.integers(0, 10_000),
       st.booleans())
def test_probability_of_improvement_matches_its_definition_and_rliable(n_x, n_y, tasks, seed, coarse):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(n_x, tasks)), rng.normal(0.2, size=(n_y, tasks))
    if coarse:  # many ties
        x, y = np.round(x), np.round(y)
    p = probability_of_improvement(x, y)
    # float64 means of ≤ 36 scores in {0, ½, 1} over ≤ 4 tasks: ≲ 40·u ≈ 4e-15 ≪ 1e-12; x vs x is exact (n²/2 / n²)
    assert p == pytest.approx(_improvement_by_loops(x, y), abs=1e-12)
    assert p + probability_of_improvement(y, x) == pytest.approx(1.0, abs=1e-12)
    if not any(np.array_equal(x[:, m], y[:, m]) for m in range(tasks)):  # rliable's special case
        assert p == pytest.approx(rl_metrics.probability_of_improvement(x, y), abs=1e-12)
    assert probability_of_improvement(x, x) == 0.5


def test_improvement_intervals_bracket_the_point_and_separate_clear_winners():
    rng = np.random.default_rng(3)
    good, bad = rng.normal(1.0, 0.1, size=(10, 3)), rng.normal(0.0, 0.1, size=(10, 3))
    close = rng.normal(0.0, 0.1, size=(10, 3))
    out = improvement_intervals({"good vs bad": (good, bad), "bad vs close": (bad, close)}, reps=300)
    assert out["good vs bad"] == (1.0, 1.0, 1.0)  # exact: 10 SD apart, every pair wins, means of 1.0
    point, low, high = out["bad vs close"]
    assert point == pytest.approx(probability_of_improvement(bad, close))  # exact: the same function and input
    # fixed NumPy seeds: draws and bootstrap indices are platform-exact and P counts comparisons (no XLA)
    assert low <= point <= high and low < 0.5 < high
    assert improvement_intervals({"bad vs close": (bad, close)}, reps=300) == {"bad vs close": out["bad vs close"]}
    with pytest.raises(ValueError, match=r"same tasks, got shapes \(10, 3\) and \(10, 2\)"):
        improvement_intervals({"x": (good, bad[:, :2])})
