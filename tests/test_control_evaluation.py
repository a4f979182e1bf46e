"""Learner evaluation (``fresh_rl.control.evaluation``), the trainer's ``eval/…`` and
``lag/forward_tv`` metrics, and the evaluation-curve scores of ``fresh_rl.eval.scores``.

* At fixed lag k = 2 (ring K = 4) the last iteration's ``eval/…`` equals :func:`evaluate` on
  the final learner parameters θ_T with the same key, exactly, and differs from the same
  evaluation of the stale version θ_{T−k} the actors used.
* ``eval/valid`` marks versions that are multiples of ``eval_every`` and the last one; values
  are carried forward; evaluation leaves the training run unchanged.
* :func:`evaluate` against a float64 NumPy Pendulum with a NumPy policy, frozen normalisation
  and mean actions; forward TV and the curve scores against NumPy.

One trainer program compiled once; the comparison with the same run without evaluation
compiles a second one and is marked slow. Parameters of the standalone checks are NumPy draws
or the run's own (no eager initialisation).
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fresh_rl.control import TrainConfig, VecEnv, evaluate, evaluation_key, networks, train
from fresh_rl.control.evaluation import evaluation_metrics
from fresh_rl.control.env_types import RunningStats
from fresh_rl.control.acting import log_probs
from fresh_rl.corrections import tv_estimate
from fresh_rl.eval import eval_area_under_curve, eval_final_score, eval_initial_score, eval_mean_score
from fresh_rl.lag import DelayConfig, version_ring
from fresh_rl.sweep.keys import split_run_key, step_key

SEED = jax.random.PRNGKey(7)
LAG = 2
# 6 iterations, evaluation at versions 4 (a multiple of eval_every) and 6 (the last one)
CONFIG = TrainConfig(
    env_name="CartPole-v1", num_envs=4, rollout_length=16, total_env_steps=4 * 16 * 6, num_epochs=2,
    num_minibatches=2, learning_rate=1e-2, hidden_sizes=(16,), normalize_obs=True,
    delay=DelayConfig.fixed(LAG, 4), eval_every=4, eval_episodes=8,
)
KINDS = ("deterministic", "stochastic")


TRAIN = jax.jit(train, static_argnums=0)


@pytest.fixture(scope="module")
def run():
    return TRAIN(CONFIG, SEED)


@pytest.fixture(scope="module")
def evaluate_jit():
    return jax.jit(evaluate, static_argnums=(0, 4))


def test_last_eval_is_the_learners_not_the_stale_actors(run, evaluate_jit):
    last = CONFIG.num_iterations - 1
    key = evaluation_key(step_key(split_run_key(SEED)[1], last))
    stats = run.state.env_state.obs_stats
    stale = version_ring.get(run.state.ring, LAG)  # the actors' parameters θ_{T−k}
    assert int(version_ring.version_of(run.state.ring, LAG)) == CONFIG.num_iterations - LAG
    learner, actors = [], []
    for kind in KINDS:
        det = kind == "deterministic"
        returns = evaluate_jit(CONFIG, run.params, stats, key, CONFIG.eval_episodes, det)
        assert returns.shape == (CONFIG.eval_episodes,)
        # returns are integer episode lengths and their mean over 8 is exact, so a rounding tolerance
        # would change nothing: the two programs agree unless a last-ulp logit difference flips an
        # action (a logit gap or sampling uniform within ~1e-6 of a boundary, ≲ 1e-5 per step)
        assert float(run.metrics[f"eval/return_{kind}"][last]) == float(jnp.mean(returns)), kind
        learner.append(float(jnp.mean(returns)))
        actors.append(float(jnp.mean(evaluate_jit(CONFIG, stale, stats, key, CONFIG.eval_episodes, det))))
    assert learner != actors, (learner, actors)


def test_eval_marker_carry_forward_and_no_nan_and_forward_tv(run):
    m = run.metrics
    valid = np.asarray(m["eval/valid"])
    np.testing.assert_array_equal(valid, [0, 0, 0, 1, 0, 1])
    for kind in KINDS:
        values = np.asarray(m[f"eval/return_{kind}"])
        assert np.all(np.isfinite(values))
        carried, last = np.zeros_like(values), 0.0
        for i, value in enumerate(values):
            last = value if valid[i] else last
            carried[i] = last
        np.testing.assert_array_equal(values, carried)
        assert np.all(values[valid == 1] >= 1.0)  # a CartPole episode lasts at least one step
    tv = np.asarray(m["lag/forward_tv"])
    assert tv.shape == (CONFIG.num_iterations,)
    # learning rate 1e-2 moves the policy every batch; TV > 1 would need a mean ratio ≳ 3, while 4 Adam
    # steps of ≈ lr move the logits by O(0.1)
    assert np.all((tv > 0) & (tv <= 1)), tv


@pytest.mark.slow
def test_evaluation_leaves_training_unchanged(run):
    """Evaluation has its own key stream and touches only ``last_eval``: the same run without
    it has identical parameters and metrics."""
    without = TRAIN(dataclasses.replace(CONFIG, eval_every=0), SEED)
    # two XLA programs (with and without the evaluation branch) may fuse the training ops differently
    # (FMA contraction): float32 rounding only, and Adam's scale-free step keeps relative noise ≲ 1e-6
    # through these 24 updates (|g| ≫ ε); a leaked key changes the rollouts and θ by ≳ lr = 1e-2
    close = lambda a, b, **kw: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, **kw)
    jax.tree.map(close, run.params, without.params)
    assert set(run.metrics) - set(without.metrics) == {"eval/valid", *(f"eval/return_{k}" for k in KINDS)}
    for name, value in without.metrics.items():
        close(run.metrics[name], value, err_msg=name)
    assert without.state.last_eval == {}


def _numpy_mlp(params, x, name):
    p = params["params"]
    h = np.tanh(x @ np.asarray(p[f"{name}_hidden_0"]["kernel"], np.float64) + np.asarray(p[f"{name}_hidden_0"]["bias"]))
    return h @ np.asarray(p[f"{name}_out"]["kernel"], np.float64) + np.asarray(p[f"{name}_out"]["bias"])


def test_a_diverged_learner_scores_nan_not_the_return_of_its_nan_actions(run):
    key = evaluation_key(step_key(split_run_key(SEED)[1], 0))
    stats = run.state.env_state.obs_stats
    metrics = jax.jit(evaluation_metrics, static_argnums=0)
    finite = metrics(CONFIG, run.params, stats, key)
    assert all(np.isfinite(float(v)) for v in finite.values())
    one_nan = jax.tree.map(lambda x: x.at[(0,) * x.ndim].set(jnp.nan) if x.size else x, run.params)
    assert all(np.isnan(float(v)) for v in metrics(CONFIG, one_nan, stats, key).values())


def test_evaluate_matches_numpy_pendulum_with_frozen_normalisation(evaluate_jit):
    """Mean actions of a one-hidden-layer tanh policy on observations normalised by fixed
    statistics, clipped to ±2, 200 steps (the time limit) of Pendulum in float64."""
    config = TrainConfig(env_name="Pendulum-v1", num_envs=4, rollout_length=8, total_env_steps=32,
                         hidden_sizes=(8,), normalize_obs=True, obs_clip=1.5)
    rng = np.random.default_rng(1)
    layer = lambda n_in, n_out: {"kernel": rng.normal(size=(n_in, n_out)).astype(np.float32),
                                 "bias": rng.normal(size=n_out).astype(np.float32) * 0.1}
    params = {"params": {"actor_hidden_0": layer(3, 8), "actor_out": layer(8, 1), "critic_hidden_0": layer(3, 8),
                         "critic_out": layer(8, 1), "log_std": np.zeros(1, np.float32)}}
    assert jax.tree.structure(params) == jax.tree.structure(
        jax.eval_shape(config.network().init, jax.random.PRNGKey(0), jnp.zeros((1, 3))))
    mean, var = np.array([0.1, -0.2, 0.3]), np.array([0.5, 0.4, 2.0])
    stats = RunningStats(count=jnp.float32(10.0), mean=jnp.asarray(mean, jnp.float32),
                         m2=jnp.asarray(10.0 * var, jnp.float32))
    key, n = jax.random.PRNGKey(3), 3
    returns = np.asarray(evaluate_jit(config, params, stats, key, n, True))

    _, obs = VecEnv("Pendulum-v1", n).reset(jax.random.split(key)[0])
    obs = np.asarray(obs, np.float64)
    th, thdot, total = np.arctan2(obs[:, 1], obs[:, 0]), obs[:, 2], np.zeros(n)
    for _ in range(200):
        o = np.stack([np.cos(th), np.sin(th), thdot], axis=-1)
        z = np.clip((o - mean) / np.sqrt(var + 1e-8), -1.5, 1.5)
        u = np.clip(_numpy_mlp(params, z, "actor")[:, 0], -2.0, 2.0)
        total -= ((th + np.pi) % (2 * np.pi) - np.pi) ** 2 + 0.1 * thdot ** 2 + 0.001 * u ** 2
        thdot = np.clip(thdot + (15.0 * np.sin(th) + 3.0 * u) * 0.05, -8.0, 8.0)
        th = th + thdot * 0.05
    # float32 vs float64 over 200 steps: rounding ≈ u·|state| per step (|θdot| ≤ 8 by the clip), grown
    # ≤ 1.2×/step only near the upright point the swing passes briefly: ≪ 2e-3 ≈ 3·10⁴ u
    np.testing.assert_allclose(returns, total, rtol=2e-3)
    # other statistics ⇒ other inputs ⇒ other returns: the given statistics are what is used
    other = stats.replace(mean=stats.mean + 1.0)
    assert not np.allclose(evaluate_jit(config, params, other, key, n, True), returns)  # O(1) apart, not ulps


def test_forward_tv_matches_numpy(run):
    """θ_T = the run's previous version, θ = θ_T + 30·(θ_final − θ_T) (a large TV), on random
    observations and actions."""
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(3, 5, 4)).astype(np.float32)
    action = rng.integers(0, 2, size=(3, 5)).astype(np.int32)
    old = version_ring.get(run.state.ring, 1)
    new = jax.tree.map(lambda a, b: a + 30.0 * (b - a), old, run.params)

    def probs(params):
        z = _numpy_mlp(params, np.asarray(obs, np.float64), "actor")
        p = np.exp(z - z.max(-1, keepdims=True))
        return np.take_along_axis(p / p.sum(-1, keepdims=True), np.asarray(action)[..., None], -1)[..., 0]

    expected = 0.5 * np.mean(np.abs(probs(new) / probs(old) - 1.0))
    net = CONFIG.network()
    logp_old = jax.jit(lambda p: networks.log_prob(net.apply(p, obs)[0], action))(old)
    # the trainer's lag/forward_tv: tv_estimate(log π_θ − log π_T) on the batch's (s, a)
    forward_tv = jax.jit(lambda config, logp_T, params, _: tv_estimate(log_probs(config, params, obs, action) - logp_T),
                         static_argnums=0)
    assert expected > 0.05  # a float64 function of the run's θ: ≈ 0.37, 7× above
    # float32 log π of |logits| ≲ 3 off by ≲ few ulp ≈ 1e-6, ratios ≤ 2.1: TV off by ≲ 3e-6 relative
    np.testing.assert_allclose(float(forward_tv(CONFIG, logp_old, new, None)), expected, rtol=1e-4)
    # the same forward in two programs (logp_old's jit, _forward_tv's): 0 when bit-equal, and a fusion-
    # dependent ulp in log π (|log π| ≲ 3: ≲ 5e-7) gives TV ≲ 3e-7; the old == 0.0 needed bit-equality
    assert abs(float(forward_tv(CONFIG, logp_old, old, None))) <= 1e-6


def test_bad_evaluation_settings_name_the_field():
    for field, value in (("eval_every", -1), ("eval_episodes", 0), ("eval_every", 1.5)):
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(CONFIG, **{field: value})
    with pytest.raises(ValueError, match="obs_stats"):  # normalize_obs needs the run's statistics
        evaluate(CONFIG, None, None, SEED, 2, True)
    with pytest.raises(ValueError, match="num_episodes"):
        evaluate(CONFIG, None, None, SEED, 0, True)


def test_eval_scores_on_a_hand_computed_curve():
    values = np.array([[5.0, 1.0, 9.0, 3.0, 9.0, 7.0], [0.0, 0.0, 2.0, 2.0, 4.0, 4.0]])
    valid = np.array([0, 1, 0, 1, 0, 1])
    # points (1, 1), (3, 3), (5, 7): trapezoids 2·(1+3)/2 + 2·(3+7)/2 = 14 over 4 iterations; small
    # integers and halves are exact in float64, so the default rtol 1e-7 is slack
    np.testing.assert_allclose(eval_area_under_curve(values, valid), [14 / 4, (2 * 2 / 2 + 2 * 6 / 2) / 4])
    np.testing.assert_allclose(eval_final_score(values, valid), [7.0, 4.0])  # 3 points: the last one
    np.testing.assert_allclose(eval_initial_score(values, valid), [1.0, 0.0])  # and the first one
    np.testing.assert_allclose(eval_mean_score(values, valid), [11 / 3, 6 / 3])  # (1+3+7)/3, (0+2+4)/3
    assert eval_area_under_curve(values[0], [0, 0, 1, 0, 0, 0]) == 9.0
    with pytest.raises(ValueError, match="valid"):
        eval_final_score(values, np.zeros(6))


@given(st.data())
def test_eval_scores_match_numpy(data):
    runs, iters = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 40))
    values = np.array(data.draw(st.lists(st.floats(-1e3, 1e3), min_size=runs * iters, max_size=runs * iters)))
    values = values.reshape(runs, iters)
    valid = np.array(data.draw(st.lists(st.booleans(), min_size=runs * iters, max_size=runs * iters)))
    valid = valid.reshape(runs, iters)
    valid[:, -1] = True
    final, auc = eval_final_score(values, valid), eval_area_under_curve(values, valid)
    initial = eval_initial_score(values, valid)
    assert final.shape == auc.shape == initial.shape == (runs,)
    for r in range(runs):
        x = np.flatnonzero(valid[r])
        y = values[r, x]
        # the same NumPy mean of the same float64 slice: exact
        np.testing.assert_allclose(final[r], np.mean(y[len(y) - max(1, len(y) // 10):]))
        np.testing.assert_allclose(initial[r], np.mean(y[:max(1, len(y) // 10)]))
        expected = y[0] if len(x) == 1 else np.trapezoid(y, x) / (x[-1] - x[0])
        # float64 sums of ≤ 40 trapezoids of |y| ≤ 1e3 in another order: ≲ 40·ε·1e3 ≈ 1e-11 ≪ 1e-9;
        # the area is a weighted mean of y, inside [min, max] up to the same rounding
        np.testing.assert_allclose(auc[r], expected, rtol=1e-9, atol=1e-9)
        assert y.min() - 1e-9 <= auc[r] <= y.max() + 1e-9
