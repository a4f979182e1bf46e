"""The missing-old-logits study on the control trainer (fresh_rl.control.train, method
``decoupled_ppo`` with an inference engine and the traced route) and its experiment."""
import csv
import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from fresh_rl.control import networks
from fresh_rl.control import old_logits_study as study
from fresh_rl.control.acting import log_probs, make_inference_engine, rollout
from fresh_rl.control.config import DEFAULT_MIS, TrainConfig
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.old_log_probs import ControlRouteSources, select_route
from fresh_rl.control.train import ROW_FIELDS, init_state, train
from fresh_rl.corrections import MISConfig, ewma_beta_from_staleness
from fresh_rl.corrections.routes import (FACTORIAL_ROUTES, ROUTES as ROUTE_REGISTRY, OldLogProbRoute, register_route, route_table,
                                         unregister_route)
from fresh_rl.eval import VERDICTS
from fresh_rl.eval.route_claims import RECOVERY_CLAIMS
from fresh_rl.lag import DelayConfig, version_ring
from fresh_rl.provenance import REPOSITORY_ROOT

WINDOW = 4
ROUTES = ("recompute_current", "snapshot", "old_logit_model", "linear_proxy", "loglinear_proxy", "ewma",
          "ewma_no_reset")  # the study's routes, in its committed order
TINY = TrainConfig(env_name="CartPole-v1", num_envs=4, rollout_length=16, total_env_steps=4 * 16 * 8,
                   num_epochs=2, num_minibatches=2, learning_rate=3e-3, num_actor_groups=4,
                   delay=DelayConfig.uniform(0, WINDOW, WINDOW + 1), method="decoupled_ppo", route="snapshot",
                   routes=ROUTES, inference_discrepancy=0.02, max_logit_noise=1.0, decoupled_mis=DEFAULT_MIS,
                   tis_cap=None, ewma_beta_rule="mean_age", ewma_reset_threshold=0.9)


def _config(**fields):
    return dataclasses.replace(TINY, **fields)


def _index(config, route):
    return config.routes_used.index(route)


@pytest.mark.parametrize("fields, message", [
    ({"route": "nearest"}, "route"),
    ({"inference_discrepancy": -0.01}, "inference_discrepancy"),
    ({"max_logit_noise": 0.0}, "max_logit_noise"),
    ({"ewma_beta_rule": "median"}, "ewma_beta_rule"),
    ({"ewma_reset_threshold": 1.5}, "ewma_reset_threshold"),
    ({"tis_cap": 0.0}, "tis_cap"),
    ({"routes": ("ewma", "recompute_current")}, "must contain the run's route 'snapshot'"),
    ({"method": "impala"}, "method 'impala' cannot use route 'linear_proxy'"),
    ({"env_name": "brax/inverted_pendulum"}, "discrete actions"),
])
def test_bad_config_names_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        _config(**fields)


@pytest.mark.parametrize("leaf, value", [("ewma_beta", 1.5), ("ewma_reset_threshold", -0.1), ("route", 99)])
def test_bad_hyperparameter_names_the_field(leaf, value):
    config = _config()
    hp = HyperParams.from_config(config)
    with pytest.raises(ValueError, match=f"HyperParams.{leaf}"):
        hp.replace(**{leaf: jnp.asarray(value, getattr(hp, leaf).dtype)}).validate(config)


@pytest.mark.parametrize("target", [0.01, 0.02, 0.05])
@pytest.mark.parametrize("num_actions, sharpness", [(2, 0.3), (2, 2.0), (4, 1.0), (6, 2.0)])
def test_engine_discrepancy_matches_the_configured_mean(target, num_actions, sharpness):
    """Mean |log π_train(a) − log π_infer(a)| over actions the engine samples is within 10% of
    ``discrepancy``, for flat and peaked policies and several action counts."""
    n = 40_000
    logits = sharpness * jax.random.normal(jax.random.PRNGKey(100 + num_actions), (n, num_actions))
    policy = networks.PolicyOutput(loc=logits)
    acting = make_inference_engine(target, max_logit_noise=1.0)(policy, jax.random.PRNGKey(1))
    actions = networks.sample(jax.random.PRNGKey(2), acting)
    gap = jnp.abs(networks.log_prob(policy, actions) - networks.log_prob(acting, actions))
    # n = 4·10⁴ half-normal-like |gaps| (CV ≈ 0.76): SE ≈ 0.4% of the mean, so 10% is ≥ 20 SE and
    # bounds the first-order κ's own calibration error; float32 log π (≲ 1e-6) is ≪ 1% of 0.01
    assert abs(float(jnp.mean(gap)) / target - 1.0) < 0.10


def test_engine_is_exact_at_zero_discrepancy():
    policy = networks.PolicyOutput(loc=jax.random.normal(jax.random.PRNGKey(0), (8, 3)))
    acting = make_inference_engine(0.0, 1.0)(policy, jax.random.PRNGKey(1))
    np.testing.assert_array_equal(acting.loc, policy.loc)  # σ = 0 exactly: z + 0·ε = z bit for bit


def _stale_state(config, pushes=WINDOW + 2):
    """A control state whose ring holds ``pushes`` distinct random versions."""
    state = init_state(config, jax.random.PRNGKey(0))
    net = config.network()
    base = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
    for i in range(pushes):  # versions far enough apart that their policies differ
        leaves, tree = jax.tree.flatten(base)
        keys = jax.random.split(jax.random.PRNGKey(10 + i), len(leaves))
        params = tree.unflatten([x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
        state = state.replace(params=params, ring=version_ring.push(state.ring, params))
    return state


@pytest.fixture(scope="module")
def stale_state():
    return jax.jit(_stale_state, static_argnums=0)(_config())  # compiled: ~30% faster than eager here


@jax.jit
def _stale_rollout(state, key):
    """One rollout through the engine (``inference_discrepancy``) from ``state``."""
    config = _config()
    return rollout(config, state.ring, state.env_state, state.obs, key, HyperParams.from_config(config).lag)[2]


@jax.jit
def _route_old_log_probs(state, batch, index):
    """The old log-probs of route ``ROUTES[index]`` on the fresh batch (the trainer's route sources)."""
    config = _config()
    sources = ControlRouteSources(
        config=config, hparams=HyperParams.from_config(config), params=state.params, ring=state.ring,
        ewma_reference=state.ewma, rows={name: getattr(batch, name) for name in ROW_FIELDS},
        learner_log_prob=log_probs(config, state.params, batch.obs, batch.action), fresh=True)
    return select_route(config, sources, index).old


def test_snapshot_and_old_logit_model_equal_the_acting_versions_log_probs(stale_state):
    """Both exact routes give log π_v(a|s) of each sample's own acting version: snapshot by a
    forward of the ring's version, old_logit_model as recorded while acting; both equal a direct
    per-row forward of that version; recompute_current gives π_k instead."""
    config, state = _config(), stale_state
    batch = _stale_rollout(state, jax.random.PRNGKey(3))
    assert len(set(np.asarray(batch.version[:, 0]).tolist())) > 1  # groups act with different versions
    net = config.network()
    direct = []
    for e in range(config.num_envs):
        lag = state.ring.latest_version - batch.version[e, 0]
        policy, _ = net.apply(version_ring.get(state.ring, lag), batch.obs[e])
        direct.append(networks.log_prob(policy, batch.action[e]))
    direct = np.stack(direct)
    snapshot, collected, current = (_route_old_log_probs(state, batch, jnp.int32(_index(config, name)))
                                    for name in ("snapshot", "old_logit_model", "recompute_current"))
    # forwards of other shapes and programs (eager per row, the route's batched one, the rollout's
    # per-step one): (64, 64) float32 layers with |w| ≲ 1.3, |logits| ≲ 2.5 reorder their sums, a few
    # ulp(2.5) ≈ 1e-6 typical (the old atol 1e-6 was at it): atol 1e-5, the versions differ by > 1e-2
    np.testing.assert_allclose(snapshot, direct, rtol=0, atol=1e-5)
    np.testing.assert_allclose(batch.train_log_prob, direct, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(collected, batch.train_log_prob)  # the route reads what was recorded
    policy, _ = net.apply(state.params, batch.obs)
    np.testing.assert_allclose(current, networks.log_prob(policy, batch.action), rtol=0, atol=1e-5)
    assert np.max(np.abs(np.asarray(current) - direct)) > 1e-2  # the versions do differ
    # the behaviour log-probs are the engine's, not the clean ones: |log r_d| near the target (64
    # samples: SE ≈ 0.76/√64 ≈ 10% of the mean, so [0.5, 2]·d is ≥ 5 SE either side)
    d = config.inference_discrepancy
    assert 0.5 * d < float(jnp.mean(jnp.abs(batch.behaviour_log_prob - direct))) < 2 * d


def test_factorial_routes_take_the_mask_from_one_route_and_the_clip_centre_from_the_other(stale_state):
    """The 2 × 2 of mask source × clip centre: ``snapshot`` (both from the acting versions),
    ``recompute_current`` (both from π_k) and the two crossed routes, from one switch."""
    config = _config(routes=("snapshot", "recompute_current") + FACTORIAL_ROUTES)
    batch = _stale_rollout(stale_state, jax.random.PRNGKey(3))
    sources = ControlRouteSources(
        config=config, hparams=HyperParams.from_config(config), params=stale_state.params, ring=stale_state.ring,
        ewma_reference=stale_state.ewma, rows={name: getattr(batch, name) for name in ROW_FIELDS},
        learner_log_prob=log_probs(config, stale_state.params, batch.obs, batch.action), fresh=True)
    got = {r: jax.jit(lambda i: (lambda s: (s.old, s.clip_old))(select_route(config, sources, i)))(
        jnp.int32(_index(config, r))) for r in config.routes_used}
    snapshot, current = got["snapshot"][0], got["recompute_current"][0]
    assert np.max(np.abs(np.asarray(snapshot) - np.asarray(current))) > 1e-2  # the two sources differ
    # the same forwards in other branches of one switch: fusion may reorder a (64, 64) layer's sums,
    # a few ulp of |log π| ≲ 3: atol 1e-5 (the two sources differ by > 1e-2)
    for route, (mask, clip) in {"snapshot": (snapshot, snapshot), "recompute_current": (current, current),
                                "mask_snapshot_clip_current": (snapshot, current),
                                "mask_current_clip_snapshot": (current, snapshot)}.items():
        np.testing.assert_allclose(got[route][0], mask, rtol=0, atol=1e-5, err_msg=route)
        np.testing.assert_allclose(got[route][1], clip, rtol=0, atol=1e-5, err_msg=route)
    with pytest.raises(ValueError, match="mask_snapshot_clip_current"):  # one loss has a mask and a clip apart
        _config(method="ppo_clip", route="mask_snapshot_clip_current", routes=())


def test_random_delays_have_the_configured_distribution(stale_state):
    """Acting lags (latest version − the version a group acts with) are U{0, …, W}: chi-square over
    400 rollouts × 4 groups, once the ring is full."""
    keys = jax.random.split(jax.random.PRNGKey(7), 400)
    batches = jax.jit(jax.vmap(_stale_rollout, (None, 0)))(stale_state, keys)
    lags = np.asarray(stale_state.ring.latest_version - batches.version[:, :, 0]).ravel()
    counts = np.bincount(lags, minlength=WINDOW + 1)
    assert counts.size == WINDOW + 1
    assert stats.chisquare(counts).pvalue > 1e-3  # fixed keys: a 0.1% false alarm for a uniform sampler
    # every step of a row carries its group's version
    assert np.all(np.asarray(batches.version) == np.asarray(batches.version[:, :, :1]))


@pytest.fixture(scope="module")
def route_runs():
    """Every route and two EWMA variants from one compiled program, same key (paired)."""
    config = _config(ewma_reset_threshold=0.9)
    names = list(ROUTES) + ["ewma_no_reset", "ewma"]
    hp = HyperParams.from_grid(config, {"route": [_index(config, n) for n in names],
                                        "ewma_reset_threshold": [0.9] * len(ROUTES) + [0.9, 1.0]})
    # row −2: EWMA without reset at β = 0; row −1: EWMA with a reset threshold of 1 (resets whenever a sample is masked)
    hp = hp.replace(ewma_beta=hp.ewma_beta.at[-2].set(0.0))
    keys = jnp.broadcast_to(jax.random.PRNGKey(5), (len(names), 2))
    out = jax.jit(jax.vmap(train, (None, 0, 0)), static_argnums=0)(config, keys, hp)
    metrics = {k: np.asarray(v) for k, v in out.metrics.items()}
    metrics["ewma_reset_count"] = np.asarray(out.state.ewma.reset_count)
    return names, metrics


def _row(runs, name, occurrence=0):
    names, out = runs
    index = [i for i, n in enumerate(names) if n == name][occurrence]
    return {k: v[index] for k, v in out.items()}


def test_ewma_with_beta_zero_equals_recompute_current(route_runs):
    """β = 0 makes θ_ref the last learner version, i.e. θ_k at every batch start: the run equals
    recompute_current's (same key)."""
    ewma, current = _row(route_runs, "ewma_no_reset", 1), _row(route_runs, "recompute_current")
    # β = 0 makes θ_ref = 1·θ_k + 0·θ_ref = θ_k exactly; the rows differ only by how XLA fuses the two
    # routes' forwards (≲ 1e-6 in log π), carried by Adam's scale-free steps: rtol 1e-5, atol 1e-6
    for k in ("episode_return", "loss/active_token_fraction", "loss/log_rd_abs", "loss/entropy"):
        np.testing.assert_allclose(ewma[k], current[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_exact_routes_keep_the_mask_and_recompute_current_loses_it(route_runs):
    """At W = 4 the engine's |log r_d| is the configured 0.02 for every route; the exact routes see
    it as their |log r̂_d| and keep ≥ 97% of the samples, recompute_current sees the staleness too
    and masks more; the proxies' r̂_d is a power of the mixed ratio, not the engine's."""
    # 8 iterations × 64 samples: SE ≈ 0.76/√512 ≈ 3.4% of the mean, plus the engine's first-order
    # calibration (a few %, test above); the old 10% was < 3 SE of room: 15% = 4 SE + 1.5%
    for name in ROUTES:
        assert abs(_row(route_runs, name)["old_logits/log_rd_abs_true"].mean() / 0.02 - 1) < 0.15, name
    for name in ("snapshot", "old_logit_model"):
        row = _row(route_runs, name)
        assert abs(row["loss/log_rd_abs"].mean() / 0.02 - 1) < 0.15
        # the mask bound |log r| ≤ 0.1 is 4 sd of the engine's |log r_d| (mean 0.02): ≲ 1% masked
        assert row["loss/active_token_fraction"].mean() > 0.97
    current = _row(route_runs, "recompute_current")
    # lags ≤ 4 add a staleness |log r| ≈ 0.1 (5× the engine's 0.02), at the mask bound: ~30% masked,
    # far more than the 0.05 asked
    assert current["loss/active_token_fraction"].mean() < _row(route_runs, "snapshot")["loss/active_token_fraction"].mean() - 0.05
    assert current["old_logits/staleness_log_ratio_abs"].mean() > 0.02


def test_snapshot_and_old_logit_model_give_the_same_numbers(route_runs):
    """The two exact routes compute the same old log-probs (at batch start from the ring, resp.
    recorded while acting): paired runs agree to float rounding, and differ only in cost."""
    snapshot, model = _row(route_runs, "snapshot"), _row(route_runs, "old_logit_model")
    # the same log π_v from two forwards of different shapes (≲ 1e-6, test above), carried through 8
    # iterations of Adam: the same tolerance as the β = 0 equality above
    for k in ("episode_return", "loss/active_token_fraction", "loss/log_rd_abs", "loss/entropy"):
        np.testing.assert_allclose(snapshot[k], model[k], rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_array_equal(snapshot["old_logits/forwards"], model["old_logits/forwards"])


def test_route_costs_and_resets(route_runs):
    """Forwards per iteration: recompute_current and EWMA 1, proxies 0, exact routes the number
    of distinct versions acting (1..G); a reset threshold of 1 resets on most iterations and
    the main EWMA run counts its resets."""
    assert np.all(_row(route_runs, "recompute_current")["old_logits/forwards"] == 1)
    assert np.all(_row(route_runs, "linear_proxy")["old_logits/forwards"] == 0)
    snapshot = _row(route_runs, "snapshot")["old_logits/forwards"]
    assert snapshot.min() >= 1 and snapshot.max() <= TINY.num_actor_groups and snapshot.max() > 1
    always = _row(route_runs, "ewma", 1)
    # threshold 1 resets on any masked sample, and stale batches mask ~30% of 64: nearly every iteration
    assert always["ewma_reset_count"] == always["old_logits/reset"].sum() >= TINY.num_iterations // 2
    assert _row(route_runs, "ewma_no_reset")["ewma_reset_count"] == 0
    table = {r["route"]: r["param_copies"] for r in route_table(WINDOW, TINY.num_actor_groups) if r["route"] in ROUTES}
    assert table == {"recompute_current": 0, "snapshot": WINDOW + 1, "old_logit_model": TINY.num_actor_groups,
                     "linear_proxy": 0, "loglinear_proxy": 0, "ewma": 1, "ewma_no_reset": 1}


def test_a_new_route_is_one_registry_entry():
    """Registering a route (here: the current policy under another name) makes it trainable with
    no other edit, and it runs as the route it copies."""
    toy = register_route(OldLogProbRoute("toy_current", ROUTE_REGISTRY["recompute_current"].fn, extra_forward=True))
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_route(toy)
        config = _config(route="toy_current", routes=("toy_current", "recompute_current"))
        hp = HyperParams.from_grid(config, {"route": [0, 1]})
        out = jax.jit(jax.vmap(train, (None, 0, 0)), static_argnums=0)(
            config, jnp.broadcast_to(jax.random.PRNGKey(1), (2, 2)), hp)
        # both rows run the same route function with the same key in one program; episode returns
        # are integer sums, equal unless a last-ulp difference flips an action
        np.testing.assert_array_equal(out.metrics["episode_return"][0], out.metrics["episode_return"][1])
    finally:
        unregister_route("toy_current")


def test_mask_bounds_default_is_loose_for_the_engine():
    bounds = DEFAULT_MIS.token_bounds
    assert isinstance(DEFAULT_MIS, MISConfig) and TINY.decoupled_mis == TrainConfig().decoupled_mis == DEFAULT_MIS
    # log(exp(±0.1)) in float64: ~1e-17 off, inside approx's rel 1e-6
    assert math.log(bounds[1]) == pytest.approx(0.1) and math.log(bounds[0]) == pytest.approx(-0.1)


# --------------------------------------------------------------------------- the experiment


def test_experiment_runs_the_study_config_and_finds_the_committed_runs():
    """The study's configs (fresh_rl.control.old_logits_study, what the script runs) are this file's
    (decoupled_ppo, the engine, the 7 routes in the committed order), and each (task, W) cell of
    the committed cpu scale names the folder and fingerprint the committed runs were saved under
    (results/old_logits_control/runs), so a rerun reads them instead of recomputing; the same for
    the cost stage's key. No training."""
    assert study.ROUTES == ROUTES
    config = study.route_config(study.SCALES["ci"].tasks[0], WINDOW)
    assert (config.method, config.routes_used, config.route_used, config.inference_discrepancy) == \
        ("decoupled_ppo", ROUTES, "snapshot", 0.02)
    assert (config.delay, config.num_actor_groups) == (TINY.delay, config.num_envs)
    saved = REPOSITORY_ROOT / "results" / "old_logits_control"
    if not (saved / "runs").is_dir():
        pytest.skip("no committed results/old_logits_control/runs in this checkout")
    scale = study.SCALES[json.loads((saved / "config.json").read_text())["scale"]]
    folders = set()
    for task in scale.tasks:
        for window in scale.windows:
            for slow in (False, True):
                cell = study.cell(scale, task, window, saved, 0, slow_reference=slow)
                steps = sorted(int(p.name) for p in cell.folder.iterdir() if p.name.isdigit())
                meta = json.loads((cell.folder / str(steps[-1]) / "meta" / "metadata").read_text())
                assert meta["fingerprint"] == cell.fingerprint, cell.folder.name
                folders.add(cell.folder.name)
    assert folders == {p.name for p in (saved / "runs").iterdir() if p.is_dir()}
    task = scale.tasks[0]
    key = f"{study.task_text(task)} {list(scale.cost_windows)} {scale.num_seeds} {scale.cost_iterations}"
    assert json.loads((saved / "costs.json").read_text())["key"] == key
    # a setting the committed runs' text cannot express still changes the fingerprint
    other = study.cell(scale, dataclasses.replace(task, tis_cap=2.0), scale.windows[0], saved, 0)
    assert other.fingerprint != study.cell(scale, task, scale.windows[0], saved, 0).fingerprint
    assert study.config_text(dataclasses.replace(task, routes=ROUTES + ("interrupt",))) != study.config_text(task)


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, run_study):
    out = tmp_path_factory.mktemp("old_logits_control")
    run_study("old_logits_control", "ci", out)
    return out


def _read(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# experiments/old_logits_control.py end to end at ci (cost and reset stages); the default run keeps
# the script's quick-ci scale (the quickstart runs it) and the trainer's route equalities above
@pytest.mark.slow
def test_experiment_writes_every_route_verdict_and_cost(ci_run):
    out = ci_run
    scale = study.SCALES["ci"]
    summary = _read(out / "summary.csv")
    slow = {r + study.SLOW for r in study.EWMA_ROUTES}
    assert {r["route"] for r in summary} == set(study.ROUTES) | slow
    per_route_set = len(study.ROUTES) - 1 + len(scale.thresholds)
    assert len(summary) == (per_route_set + len(scale.thresholds) + 1) * len(scale.windows)
    runs = _read(out / "runs.csv")
    assert len(runs) == len(summary) * scale.num_seeds * len(scale.learning_rates)
    verdicts = _read(out / "verdicts.csv")
    claims_per_cell = len(study.CLAIMS) + len(RECOVERY_CLAIMS)
    assert len(verdicts) == claims_per_cell * len(scale.windows) * len(scale.learning_rates)
    assert {v["verdict"] for v in verdicts} <= set(VERDICTS)
    for v in verdicts:  # a testable cell carries its Holm-adjusted p (≥ its own p); a gated one why
        assert (v["p_holm"] != "" and float(v["p_holm"]) >= float(v["p_value"])) or \
            (v["verdict"] == "not testable here" and v["gate"])
    assert not (out / "claims.csv").exists()  # a claim over cells is decided by experiments/verdicts.py
    costs = _read(out / "costs.csv")
    assert {c["route"] for c in costs} == set(study.ROUTES)
    assert all(float(c["ms_per_run_iteration"]) > 0 for c in costs)
    engine = [float(r["log_rd_abs_engine"]) for r in summary]
    # 3 seeds × 20 iterations × 256 samples: SE ≈ 0.76/√15360 ≈ 0.6%, so 10% is 16 SE + calibration
    assert all(abs(x / 0.02 - 1) < 0.1 for x in engine)
    resets = _read(out / "reset.csv")
    assert {r["ewma_beta_rule"] for r in resets} == {"mean_age", study.SLOW_REFERENCE_RULE}
    assert all(float(r["resets_per_run"]) == 0 for r in resets if r["threshold"] == "none")
    curves = _read(out / "reset_over_time.csv")
    for rule in ("mean_age", study.SLOW_REFERENCE_RULE):  # cumulative resets never decrease
        for threshold in scale.thresholds:
            c = [float(r["cumulative_resets"]) for r in curves
                 if r["ewma_beta_rule"] == rule and r["threshold"] == str(threshold)]
            assert c and all(b >= a for a, b in zip(c, c[1:]))
    readme = (out / "README.md").read_text()
    assert "results/VERDICTS.md" in readme and "## Costs" in readme
    assert (out / "mechanism.png").exists() and (out / "reset.png").exists()


@pytest.mark.slow
def test_slow_reference_stage_differs_only_in_beta(ci_run):
    """The slow-reference EWMA (no reset) runs the centred one's seeds with a larger β: at
    iteration 0 both references are θ_0 (same ρ_active), after that they part."""
    out = ci_run
    # the centred β at W = 4 is the mean lag's: U{0..4} has mean lag 2
    assert ewma_beta_from_staleness(4, study.SLOW_REFERENCE_RULE) > ewma_beta_from_staleness(4, "mean_age", mean_age=2.0)
    curves = _read(out / "reset_over_time.csv")

    def active(rule):
        return np.array([float(r["active_fraction"]) for r in curves
                         if r["ewma_beta_rule"] == rule and r["threshold"] == "none"])

    centred, slow = active("mean_age"), active(study.SLOW_REFERENCE_RULE)
    # fractions of kept samples (counts): equal unless a log-ratio lies within rounding of the bound
    assert centred.shape == slow.shape and centred[0] == slow[0]
    assert np.any(centred[1:] != slow[1:])


@pytest.mark.slow
def test_experiment_resumes_from_saved_chunks(ci_run, run_study):
    """A rerun loads every saved chunk (no recomputation) and rewrites the same tables."""
    out = ci_run
    before = (out / "summary.csv").read_text()
    again = run_study("old_logits_control", "ci", out)
    assert (out / "summary.csv").read_text() == before
    assert "W=" in again.stdout
