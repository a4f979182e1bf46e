"""Asynchronous LLM RL simulator and old-logit routes (arXiv 2605.12070): config errors, the
missing-old-logit mechanism on a controlled version ring, exactness of the exact routes,
per-token version tags of partial rollouts, EWMA β = 0 ≡ recompute-with-current, W = 0 ≡
the synchronous trainer, the route registry (a toy route needs no other edit), the traced
hyperparameters, and the ci-scale experiment (reward improves over the warm start)."""
import csv
import dataclasses
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fresh_rl.corrections import routes as registry
from fresh_rl.lag import version_ring
from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm import old_logits as routes
from fresh_rl.llm.hparams import LLMHyperParams
from fresh_rl.llm.policy_losses import LOSSES
from fresh_rl.llm.model import preset
from fresh_rl.llm.old_logits_verdicts import declared_prompts, route_verdicts
from fresh_rl.llm.presets import OLD_LOGITS_SCALES, WARM_START
from fresh_rl.llm.tasks import ArithmeticTask
from fresh_rl.llm.trainer import RLConfig, current_learning_rate
from fresh_rl.llm.trainer import train_loop as sync_train_loop
from fresh_rl.llm.warm_start import restore_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = preset("tiny")
ENV = ArithmeticTask(digits=1, steps=2)  # the warm start's arithmetic setting
CONFIG = RLConfig(estimator="grpo", num_groups=2, group_size=4, learning_rate=3e-3,
                  loss="decoupled")
SEGMENT = 8
RING = 9  # versions 0..8: lags up to W = 8


@pytest.fixture(scope="module")
def params():
    return restore_params(WARM_START, MODEL)


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("kwargs, field", [
    (dict(staleness_window=-1), "AsyncConfig.staleness_window"),
    (dict(staleness_window=1.5), "AsyncConfig.staleness_window"),
    (dict(old_logit_route="current"), "AsyncConfig.old_logit_route"),
    (dict(ewma_reset_threshold=0.0), r"AsyncConfig.ewma_reset_threshold must be in \(0"),
    (dict(ewma_reset_threshold=1.0), "AsyncConfig.ewma_reset_threshold"),
    (dict(ewma_reset_threshold=1.5), "AsyncConfig.ewma_reset_threshold"),
    (dict(ewma_beta=1.1), "AsyncConfig.ewma_beta"),
    (dict(segment_tokens=0), "AsyncConfig.segment_tokens"),
    (dict(extra_mismatch_std=-0.1), "AsyncConfig.extra_mismatch_std"),
    (dict(lag_kind="geometric"), "AsyncConfig.lag_kind"),
])
def test_bad_config_names_the_field_and_range(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ap.AsyncConfig(**kwargs)


def test_config_defaults_and_loss_check():
    config = ap.AsyncConfig(staleness_window=4, old_logit_route="ewma")
    hparams = config.default_hparams()
    # float32 scalars: one rounding (≤ 6e-8 relative) ≪ pytest.approx's default rel 1e-6
    assert config.ring_size == 5 and float(hparams.ewma_beta) == pytest.approx(0.8)
    assert int(hparams.window) == 4 and float(hparams.age_decay_tau) == math.inf
    assert float(hparams.ewma_reset_threshold) == pytest.approx(0.9)
    assert config.route.uses_ewma and not ap.AsyncConfig().route.uses_ewma
    assert float(ap.AsyncConfig(staleness_window=0).default_hparams().ewma_beta) == 0.0
    assert float(ap.AsyncConfig(ewma_beta=0.5).default_hparams(window=0).ewma_beta) == 0.5
    # ppo_clip reads no old log-probs: the snapshot route's forwards would be wasted
    with pytest.raises(ValueError, match="RLConfig.loss='ppo_clip'.*AsyncConfig.old_logit_route='snapshot'"):
        ap.make_iteration(RLConfig(), ap.AsyncConfig(), ENV, MODEL)
    assert ap.chunk_schedule(ap.AsyncConfig(partial_rollouts=True, segment_tokens=8), 26) == (8, 4)
    assert ap.chunk_schedule(ap.AsyncConfig(segment_tokens=8), 26) == (26, 1)


def test_route_costs(params):
    one = routes.param_bytes(params)
    assert one == 4 * sum(x.size for x in jax.tree_util.tree_leaves(params))
    copies = {r: ap.route_costs(ap.AsyncConfig(staleness_window=4, old_logit_route=r),
                                params)["extra_param_copies"] for r in registry.ROUTES}
    assert copies == {"behaviour": 0, "recompute_current": 0, "snapshot": 5, "old_logit_model": 1,
                      "interrupt": 0, "linear_proxy": 0, "loglinear_proxy": 0, "ewma": 1,
                      "ewma_no_reset": 1, "mask_snapshot_clip_current": 5, "mask_current_clip_snapshot": 5}
    snapshot = ap.AsyncConfig(staleness_window=8, old_logit_route="snapshot")
    assert ap.route_costs(snapshot, params, window=2)["extra_param_bytes"] == 3 * one


def test_init_state_window(params):
    config = ap.AsyncConfig(staleness_window=4, old_logit_route="ewma")
    state = ap.init_state(CONFIG, config, params, window=2)
    assert int(state.hparams.window) == 2
    assert float(state.hparams.ewma_beta) == pytest.approx(2 / 3)  # float32: ≤ 6e-8 relative
    assert state.ring.capacity == 5 and state.ewma is not None
    assert ap.init_state(CONFIG, ap.AsyncConfig(), params).ewma is None  # θ_ref iff uses_ewma
    with pytest.raises(ValueError, match=r"window must be in \[0, 4\]"):
        ap.init_state(CONFIG, config, params, window=5)


@pytest.mark.parametrize("overrides, match", [
    (dict(window=-1), r"window must be in \[0, 4\]"),
    (dict(window=1.5), r"window must be in \[0, 4\]"),
    (dict(ewma_beta=1.5), r"LLMHyperParams.ewma_beta must be in \[0, 1\]"),
    (dict(ewma_beta=math.nan), r"LLMHyperParams.ewma_beta must be in \[0, 1\]"),
    (dict(ewma_reset_threshold=1.0), r"LLMHyperParams.ewma_reset_threshold must be in \(0, 1\)"),
    (dict(age_decay_tau=2.0), "age_decay_tau needs LLMReplayConfig"),
])
def test_bad_hyperparameters_name_the_field_and_range(overrides, match):
    with pytest.raises(ValueError, match=match):
        LLMHyperParams.from_config(ap.AsyncConfig(staleness_window=4), **overrides)


# --------------------------------------------------------------------------- mechanism


# fp32 log-probs of the warm start from two programs: √(5300 chained terms)·u ≈ 4e-6 of a logit's
# Σ|terms| ≤ 13 → |Δz| ≈ 6e-5, |Δ log p| ≤ 2|Δz| ≈ 1.2e-4; 2× that (a version step moves ≫ it)
FP32_LOGP_ATOL = 2.5e-4


@pytest.fixture(scope="module")
def drift_ring(params):
    """Ring of 9 versions θ_j = θ_0 + j·δ (δ a fixed random direction, ~1% of each leaf's
    scale): a controlled stand-in for 8 learner updates."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(0), len(leaves))
    delta = jax.tree_util.tree_unflatten(treedef, [
        0.01 * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    ring = version_ring.init(params, RING)
    for j in range(1, RING):
        ring = version_ring.push(ring, jax.tree_util.tree_map(lambda p, d: p + j * d, params,
                                                              delta))
    return ring


@pytest.fixture(scope="module")
def probe(drift_ring):
    """For W in {0, 1, 2, 4, 8}: partial-rollout episodes whose first segment is W versions
    old, with the old log-probs of recompute-with-current, snapshot and the collection-time
    (old-logit-model / interrupt) route."""
    config = dataclasses.replace(CONFIG, num_groups=4, group_size=4)
    async_config = ap.AsyncConfig(staleness_window=RING - 1, partial_rollouts=True,
                                  segment_tokens=SEGMENT, old_logit_route="interrupt")

    @jax.jit
    def run(start_lag, key):
        episodes = ap.collect(drift_ring, start_lag, key, config=config,
                              async_config=async_config, env=ENV, model_config=MODEL)
        action_mask = episodes.action_mask & episodes.mask
        versions = episodes.token_extras["version"]
        snapshot, forwards = routes.snapshot_logprobs(
            drift_ring, episodes.tokens, episodes.mask, versions, action_mask,
            model_config=MODEL, temperature=config.temperature)
        current = routes.fp32_logprobs(version_ring.get(drift_ring, 0), MODEL, episodes.tokens,
                                       episodes.mask, config.temperature)
        return episodes, action_mask, snapshot, current, forwards

    return {w: jax.device_get(run(jnp.int32(w), jax.random.PRNGKey(w))) for w in (0, 1, 2, 4, 8)}


def _abs_log_rd(old, episodes, action_mask):
    return float(np.abs(old - episodes.behaviour_log_probs)[action_mask].mean())


def test_rd_grows_with_staleness_under_recompute_but_not_under_snapshot(probe):
    recompute = [_abs_log_rd(p[3], p[0], p[1]) for p in probe.values()]
    snapshot = [_abs_log_rd(p[2], p[0], p[1]) for p in probe.values()]
    bf16_level = snapshot[0]  # W = 0: the pure bf16-sampler vs fp32-trainer discrepancy
    # bf16 roundings set it (≈ u_bf16·|z| ~ 1e-2, ≫ fp32's 1e-5); a target changes only fp32 sums
    assert 1e-4 < bf16_level < 0.03
    # recompute-with-current: staleness leaks into r_d, growing with W
    assert np.all(np.diff(recompute) > 0), recompute
    assert recompute[-1] > 5 * max(snapshot), (recompute, snapshot)
    # snapshot: r_d stays at the bf16 level whatever W
    assert max(snapshot) < 2 * bf16_level, snapshot
    # W = 0: same version, two programs: the means differ by ≤ mean |Δ log p| ≤ FP32_LOGP_ATOL
    assert recompute[0] == pytest.approx(snapshot[0], rel=1e-4, abs=FP32_LOGP_ATOL)


def test_exact_routes_agree(probe):
    for w, (episodes, action_mask, snapshot, _, forwards) in probe.items():
        collected = episodes.token_extras["old_logprobs"]
        np.testing.assert_allclose(np.where(action_mask, collected, 0.0),
                                   np.where(action_mask, snapshot, 0.0), atol=FP32_LOGP_ATOL,
                                   rtol=0,
                                   err_msg=f"W={w}")
        assert int(forwards) == len(np.unique(episodes.token_extras["version"][action_mask]))


def test_partial_rollout_tokens_carry_their_versions(probe):
    latest = RING - 1
    for w, (episodes, action_mask, *_rest) in probe.items():
        index = np.cumsum(action_mask, axis=1) - 1  # position inside the (single-turn) action
        chunk = index // SEGMENT
        expected = latest - np.maximum(w - chunk, 0)
        versions = episodes.token_extras["version"]
        np.testing.assert_array_equal(versions[action_mask], expected[action_mask])
        np.testing.assert_array_equal(episodes.token_extras["segment"][action_mask],
                                      (chunk + 1)[action_mask])
        assert (versions[~action_mask] == 0).all()
        if w >= 1:  # a trajectory that ran past the first segment spans two versions
            long_rows = action_mask.sum(axis=1) > SEGMENT
            assert long_rows.any()
            row = np.argmax(long_rows)
            assert len(np.unique(versions[row][action_mask[row]])) >= 2


# --------------------------------------------------------------------------- equivalences


ITERATIONS = 2
# One compiled EWMA iteration serves both equivalences (the window is a state leaf).
EWMA_BETA0 = ap.AsyncConfig(staleness_window=2, old_logit_route="ewma", ewma_beta=0.0)


def _run(async_config, params, window=None):
    return ap.train_loop(CONFIG, async_config, 5, ITERATIONS, params=params,
                         env=ENV, model_config=MODEL, window=window)


# Two programs' runs: equal (bitwise, so within any tolerance) while XLA compiles the shared
# sampler and update alike; else bf16 sampling diverges and Adam signs flip, beyond any
# tolerance: a cross-target risk, not a rounding bound.
def _assert_same_run(run_a, run_b, keys, atol=1e-6):
    (state_a, hist_a), (state_b, hist_b) = run_a, run_b
    for key in keys:
        np.testing.assert_allclose(hist_a[key], hist_b[key], atol=atol, rtol=1e-5, err_msg=key)
    for a, b in zip(jax.tree_util.tree_leaves(state_a.params if hasattr(state_a, "params")
                                              else state_a.train.params),
                    jax.tree_util.tree_leaves(state_b.params if hasattr(state_b, "params")
                                              else state_b.train.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=1e-5)


COMPARED = ("success_rate", "loss", "active_token_fraction", "abs_log_rd_mean", "clip_fraction",
            "grad_norm")


# the same identity is tested on the control trainer in the default run
# (test_old_logits_control)
@pytest.mark.slow
def test_ewma_beta_zero_equals_recompute_current(params):
    recompute = _run(ap.AsyncConfig(staleness_window=2, old_logit_route="recompute_current"),
                     params)
    ewma = _run(EWMA_BETA0, params)
    _assert_same_run(recompute, ewma, COMPARED + ("lag/version_gap_mean",))
    # staleness is real here: the learner is ahead of the sampler and r_d shows it
    assert recompute[1]["lag/version_gap_mean"][-1] == 1.0  # iteration 1: only versions 0, 1 exist
    assert recompute[1]["abs_log_rd_mean"][-1] > 0.02  # one lr-3e-3 step's drift, not rounding
    # θ_ref followed θ exactly
    for a, b in zip(jax.tree_util.tree_leaves(ewma[0].ewma.params),
                    jax.tree_util.tree_leaves(ewma[0].train.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_ewma_with_zero_staleness_equals_synchronous_trainer(params):
    # W = 0: the default β = W/(W + 1) is 0 too (EWMA_BETA0 only fixes it for W = 2 above)
    assert ap.AsyncConfig(staleness_window=0, old_logit_route="ewma").beta(0) == 0.0
    ewma = _run(EWMA_BETA0, params, window=0)
    sync = sync_train_loop(CONFIG, 5, ITERATIONS, params=params, env=ENV, model_config=MODEL)
    _assert_same_run(ewma, sync, COMPARED)
    assert np.all(ewma[1]["lag/version_gap_mean"] == 0.0)
    assert np.all(ewma[1]["abs_log_rd_mean"] < 0.03)  # only the bf16 discrepancy (as above)


def test_the_iteration_consumes_its_state_and_never_the_callers_params(params):
    """The async iteration donates its state. θ_ref starts as a copy of θ_0 in buffers of its
    own (donating one buffer twice is an error), and the caller's ``params`` (used by every
    run above) stay readable."""
    step = ap.make_iteration(CONFIG, EWMA_BETA0, ENV, MODEL)  # cached by the runs above
    state = ap.init_state(CONFIG, EWMA_BETA0, params)
    pointers = [{x.unsafe_buffer_pointer() for x in jax.tree_util.tree_leaves(tree)}
                for tree in (params, state.train.params, state.ewma.params, state.ring.params)]
    assert all(not (a & b) for i, a in enumerate(pointers) for b in pointers[i + 1:])
    new_state, _ = step(state, jax.random.PRNGKey(0))
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(state))
    assert int(new_state.ring.latest_version) == 1
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(params))
    for a, b in zip(jax.tree_util.tree_leaves(params),
                    jax.tree_util.tree_leaves(restore_params(WARM_START, MODEL))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# --------------------------------------------------------------------------- registry


def test_a_registered_route_runs_with_no_other_edit(params):
    """A toy route of the shared registry (the sampler's own log-probs as old log-probs: no
    forward, no copy) is one register_route call; config validation, init, collection,
    prepare, the loss and the cost table all read the registry."""
    toy = registry.OldLogProbRoute(
        "behaviour_as_old", lambda sources: registry.RouteOutput(old=sources.stored_behaviour()))
    with pytest.raises(ValueError, match="AsyncConfig.old_logit_route"):
        ap.AsyncConfig(old_logit_route=toy.name)
    registry.register_route(toy)
    try:
        with pytest.raises(ValueError, match="already registered"):
            registry.register_route(toy)
        # W = 2 as the behaviour-route test below: the toy route computes what "behaviour"
        # does, so the two traced programs lower to the same module and the second loads the
        # first's executable from the session's compilation cache (conftest) instead of
        # compiling it again; the toy route is still traced through the registry here
        config = ap.AsyncConfig(staleness_window=2, old_logit_route=toy.name)
        state, history = ap.train_loop(CONFIG, config, 0, 1, params=params, env=ENV,
                                       model_config=MODEL)
        assert state.ewma is None and int(state.train.step) == 1
        assert history["old_logit_forwards"][0] == 0.0
        assert history["abs_log_rd_mean"][0] == 0.0  # old == behaviour: r_d = 1 exactly
        assert ap.route_costs(config, params)["extra_param_copies"] == 0
        assert toy.name in registry.routes_where(exact=False, collection_time=False)
    finally:
        registry.unregister_route(toy.name)
    assert toy.name not in registry.ROUTES


@pytest.mark.parametrize("window", [0, 2])
def test_behaviour_route_is_the_plain_ratio_against_the_sampler(params, window):
    """``behaviour`` (old = stored π_infer): r_d ≡ 1, no forward, no copy, every token kept by
    the MIS mask, with or without staleness."""
    config = ap.AsyncConfig(staleness_window=2, old_logit_route="behaviour")
    state, history = ap.train_loop(CONFIG, config, 0, 3, params=params, env=ENV,
                                   model_config=MODEL, window=window)
    assert state.ewma is None and int(state.train.step) == 3
    np.testing.assert_array_equal(history["old_logit_forwards"], 0.0)
    np.testing.assert_array_equal(history["abs_log_rd_mean"], 0.0)
    np.testing.assert_array_equal(history["active_token_fraction"], 1.0)
    assert history["lag/version_gap_mean"][-1] == window
    assert ap.route_costs(config, params)["extra_param_copies"] == 0


def test_a_learning_rate_sweep_is_rows_of_one_program(params):
    """``learning_rates`` puts one rate per row into the optimizer state of a vmapped run: the
    rows share seed, θ0 and program, so their first batch and gradient are the same and the
    update's size follows the rate (AdamW's first step is lr·g/(|g| + ε) entry by entry: 10×
    the rate moves the weights ≈ 10× as far; we ask for > 3×). 8 groups of 8 episodes: with a
    success rate of ~0.1 every group is all-fail (zero advantages, zero gradient) with
    probability ≈ 0.9^64 ≈ 1e-3 per batch, so the gradient is non-zero on any machine.
    A second grid of three other rates traces nothing: the rate is data, not part of the program."""
    config = ap.AsyncConfig(staleness_window=0, old_logit_route="behaviour")
    rl = dataclasses.replace(CONFIG, num_groups=8, group_size=8)
    rates = (1e-4, 1e-3, 3e-4)
    with pytest.raises(ValueError, match="learning_rates"):
        ap.train_loop(rl, config, [0, 0, 0], 1, params=params, env=ENV, model_config=MODEL,
                      learning_rates=rates[:1])
    with pytest.raises(ValueError, match=r"learning_rate must be in \(0\.0, inf\)"):
        ap.train_loop(rl, config, [0, 0, 0], 1, params=params, env=ENV, model_config=MODEL,
                      learning_rates=(1e-4, -1.0, 1e-3))
    state, history = ap.train_loop(rl, config, [0, 0, 0], 1, params=params, env=ENV,
                                   model_config=MODEL, learning_rates=rates)
    np.testing.assert_array_equal(current_learning_rate(state.train), np.float32(rates))
    for key in ("mean_return", "grad_norm"):
        np.testing.assert_array_equal(history[key][0], history[key][1], err_msg=key)
    assert history["grad_norm"][0, 0] > 0
    moved = [sum(float(np.abs(np.asarray(p[i]) - np.asarray(p0)).sum())
                 for p, p0 in zip(jax.tree_util.tree_leaves(state.train.params),
                                  jax.tree_util.tree_leaves(params))) for i in range(2)]
    assert moved[1] > 3 * moved[0] > 0, moved
    traced = []

    def on_event(event, duration, **kwargs):
        if event == "/jax/core/compile/jaxpr_trace_duration":
            traced.append(event)

    jax.monitoring.register_event_duration_secs_listener(on_event)
    try:
        ap.train_loop(rl, config, [0, 0, 0], 1, params=params, env=ENV, model_config=MODEL,
                      learning_rates=(2e-4, 5e-4, 2e-3))
    finally:
        jax.monitoring.unregister_event_duration_listener(on_event)
    assert traced == []


def test_registry_flags():
    assert registry.routes_where(exact=True) == ("snapshot", "old_logit_model", "interrupt")
    assert registry.routes_where(collection_time=True) == ("old_logit_model", "interrupt")
    assert registry.routes_where(uses_ewma=True) == ("ewma", "ewma_no_reset")
    assert {r: registry.ROUTES[r].proximal for r in registry.routes_where()
            if registry.ROUTES[r].proximal} == {"linear_proxy": "linear",
                                                "loglinear_proxy": "loglinear"}
    with pytest.raises(ValueError, match="OldLogProbRoute.proximal"):
        registry.OldLogProbRoute("bad", lambda sources: None, proximal="cubic")


# --------------------------------------------------------------------------- ci experiment


def _run_experiment(tmp_path_factory, scale):
    out = str(tmp_path_factory.mktemp(scale))
    subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "old_logits.py"),
                    "--scale", scale, "--out", out], check=True, cwd=ROOT)
    return out


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The ci scale's programs for 4 iterations, 64 evaluation episodes per policy."""
    return _run_experiment(tmp_path_factory, "smoke")


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    return _run_experiment(tmp_path_factory, "ci")


def _read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# the LLM old-logit script end to end; the pipeline's routes and verdict code are tested in the
# default run
@pytest.mark.slow
def test_smoke_experiment_writes_results(smoke_run):
    for name in ("curves.csv", "summary.csv", "eval.csv", "config.json", "success_vs_step.png",
                 "mechanism.png", "runs/snapshot_W1_seed0.csv"):
        assert os.path.exists(os.path.join(smoke_run, name)), name
    (summary,) = _read_csv(os.path.join(smoke_run, "summary.csv"))
    assert summary["route"] == "snapshot" and summary["window"] == "1"
    # exact old logits: r_d is the bf16 discrepancy, the MIS mask keeps almost every token
    assert float(summary["abs_log_rd"]) < 0.03  # the bf16 level, as in the mechanism test
    assert float(summary["active_fraction"]) > 0.97  # MIS keeps |log r_d| ≤ ln 2 ≫ bf16's ≲ 0.2
    assert float(summary["version_gap_mean"]) > 0.5  # the data really was stale
    rows = _read_csv(os.path.join(smoke_run, "eval.csv"))
    assert {(r["policy"], r["prompts"], r["episodes"]) for r in rows} == {
        (p, s, "64") for p in ("warm_start", "snapshot_W1_seed0") for s in ("training", "held_out")}


@pytest.mark.slow  # 16 iterations and 4 × 1024 evaluation episodes: ~5 min on 2 cores
def test_ci_experiment_improves_arithmetic_reward_over_the_warm_start(ci_run):
    """Acceptance: the ci run (RL on a fixed set of 32 training prompts) raises the
    arithmetic success of the warm start on those prompts. 1024 episodes per policy on the
    same prompts and keys: a paired difference of 0.04 is about 2 standard errors, and four
    training sets gave +0.09 to +0.16 (results/old_logits_ci, results/old_logits/README.md)."""
    rows = {(r["policy"], r["prompts"]): float(r["success"])
            for r in _read_csv(os.path.join(ci_run, "eval.csv"))}
    assert set(rows) == {(p, s) for p in ("warm_start", "snapshot_W1_seed0")
                         for s in ("training", "held_out")}
    assert rows["snapshot_W1_seed0", "training"] - rows["warm_start", "training"] >= 0.04


# experiments/old_logits.py end to end at bpe-ci; its route verdicts are tested on fixed rows in
# the default run (test_route_claims), the pipeline's routes by the tests above
@pytest.mark.slow
def test_bpe_ci_experiment_random_staleness_and_saved_evaluations(tmp_path):
    """The BPE confirmation's test version (stand-in model folder named by the scale itself,
    random staleness U{0..W}, W ∈ {1, 4}, a fixed training pool as the study's): each run's
    evaluation (training pool and held-out) is written with it; a chunk (--max-runs 1) makes the
    largest W's run, --resume the rest, and --resume --max-runs 0 rebuilds eval.csv /
    eval_summary.csv from the saved runs alone."""
    out = str(tmp_path / "bpe_ci")

    def experiment(*flags):
        return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "old_logits.py"),
                               "--scale", "bpe-ci", "--out", out, *flags],
                              capture_output=True, text=True, cwd=ROOT, timeout=900)

    def finished(*flags):
        done = experiment(*flags)
        assert done.returncode == 0, done.stderr[-3000:]
    for bad in (["--max-runs", "-1"], ["--max-runs", "0"]):  # 0 summarises, so only with --resume
        refused = experiment(*bad)
        assert refused.returncode == 2
        assert "--max-runs must be >= 1 (or 0 with --resume: only the tables)" in refused.stderr
    assert not os.path.exists(out)
    # one chunk of --max-runs: one run, the largest window first
    finished("--max-runs", "1")
    assert sorted(os.listdir(os.path.join(out, "runs"))) == ["ewma_W4_seed0.csv",
                                                            "ewma_W4_seed0.eval.json"]
    assert [r["window"] for r in _read_csv(os.path.join(out, "summary.csv"))] == ["4"]
    finished("--resume")
    assert [r["window"] for r in _read_csv(os.path.join(out, "summary.csv"))] == ["1", "4"]
    assert os.path.getsize(os.path.join(out, "mechanism_vs_window.png")) > 0  # two windows: the figure against W
    # the lag L ~ U{0..w}, clipped to the versions the ring holds at step i (≤ i): never above
    # min(w, i), and (unlike the fixed lag, always min(w, i)) below it at some step
    gaps = [float(r["lag/version_gap_mean"]) for r in _read_csv(os.path.join(out, "runs", "ewma_W4_seed0.csv"))]
    assert all(g <= min(4, i) for i, g in enumerate(gaps))
    assert any(g < min(4, i) for i, g in enumerate(gaps))
    for w in ("1", "4"):
        assert os.path.exists(os.path.join(out, "runs", f"ewma_W{w}_seed0.eval.json"))
    os.remove(os.path.join(out, "eval.csv"))
    finished("--resume", "--max-runs", "0")
    rows = _read_csv(os.path.join(out, "eval.csv"))
    policies = ["warm_start", "ewma_W1_seed0", "ewma_W4_seed0"]
    assert sorted((r["prompts"], r["policy"]) for r in rows) == sorted(
        (prompts, policy) for prompts in ("training", "held_out") for policy in policies)
    summary = _read_csv(os.path.join(out, "eval_summary.csv"))
    assert [(r["window"], r["prompts"], r["seeds"]) for r in summary] == [
        (w, prompts, "1") for w in ("1", "4") for prompts in ("training", "held_out")]
    for r in summary:
        # float64 host arithmetic of the CSV's values: ≤ 1 ulp ≪ approx's default rel 1e-6
        assert float(r["gain"]) == pytest.approx(float(r["success"]) - float(r["warm_start"]))


def test_route_verdicts_pair_the_seeds_every_route_finished():
    """The bpe grid's claims per W and prompt set: on the seeds all its routes finished and
    scored on both sets (here 2, not snapshot's 3), reward from the learner's success on that
    set (training: the declared one), mask from the steps with a full ring; no rows at a W
    whose grid has not started."""
    scale = dataclasses.replace(OLD_LOGITS_SCALES["bpe"], windows=(1, 4),
                                grid_routes=("recompute_current", "snapshot", "linear_proxy"))
    steps = 8

    def history(active):
        return {"active_token_fraction": np.concatenate([np.ones(4), np.full(steps - 4, active)])}
    histories = {("recompute_current", 4, False): [history(0.8), history(0.7)],
                 ("snapshot", 4, False): [history(1.0)] * 3, ("linear_proxy", 4, False): [history(0.9)] * 2}
    success = {"recompute_current": [0.40, 0.42], "snapshot": [0.60, 0.66, 0.10], "linear_proxy": [0.5, 0.5]}
    eval_rows = [{"policy": "warm_start", "prompts": "training", "success": 0.36}]
    eval_rows += [{"route": route, "window": 4, "partial": False, "seed": seed, "prompts": prompts,
                   "success": value if prompts == "training" else 0.0}
                  for route, values in success.items() for seed, value in enumerate(values)
                  for prompts in ("training", "held_out")]
    rows = route_verdicts(scale, histories, eval_rows)  # float64 means: approx's 1e-6
    assert declared_prompts(scale) == "training"
    assert {(r["window"], r["prompts"], r["seeds"]) for r in rows} == {(4, "training", 2),
                                                                       (4, "held_out", 2)}
    assert all(r["recompute_current_masked_fraction"] == pytest.approx(0.25) for r in rows)
    first = rows[0]
    assert (first["prompts"], first["a"], first["b"], first["metric"]) == (
        "training", "snapshot", "recompute_current", "return")
    assert first["difference"] == pytest.approx(0.22) and first["mean_a"] == pytest.approx(0.63)
    held_out = next(r for r in rows if r["prompts"] == "held_out" and r["claim"] == first["claim"])
    assert held_out["mean_a"] == 0.0 and held_out["difference"] == 0.0  # that set's own success
    active = next(r for r in rows if r["metric"] == "active")
    assert (active["a"], active["b"]) == ("linear_proxy", "snapshot")
    assert active["mean_a"] == pytest.approx(0.9) and active["mean_b"] == pytest.approx(1.0)
    # a seed scored on one prompt set only is not paired yet
    rows = route_verdicts(scale, histories, [r for r in eval_rows if not (
        r.get("seed") == 1 and r.get("route") == "linear_proxy" and r["prompts"] == "held_out")])
    assert {r["seeds"] for r in rows} == {1}


def test_factorial_routes_feed_the_mask_and_the_clip_from_two_routes(params, drift_ring):
    """``mask_snapshot_clip_current`` / ``mask_current_clip_snapshot`` on the LLM pipeline: the
    batch's old log-probs (the MIS mask's) are one pure route's and its clip centre the other's,
    from the same episodes (same state and key); the pure routes carry no separate centre. The
    decoupled update reads the centre: the clip fractions of the crossed arms differ."""
    config = dataclasses.replace(CONFIG, num_groups=4, group_size=4)
    state = ap.init_state(config, ap.AsyncConfig(staleness_window=RING - 1), params, window=4)
    state = state.replace(ring=drift_ring, train=state.train.replace(params=version_ring.get(drift_ring, 0)))
    key = jax.random.PRNGKey(3)

    def prepared(route):
        async_config = ap.AsyncConfig(staleness_window=RING - 1, old_logit_route=route)
        return jax.device_get(jax.jit(lambda s, k: ap.prepare(s, k, config=config, async_config=async_config,
                                                               env=ENV, model_config=MODEL))(state, key).batch)

    pure = {r: prepared(r) for r in ("snapshot", "recompute_current")}
    assert pure["snapshot"].clip_logprobs is None and pure["recompute_current"].clip_logprobs is None
    gap = np.abs(pure["snapshot"].old_logprobs - pure["recompute_current"].old_logprobs).max()
    assert gap > 10 * FP32_LOGP_ATOL  # lag 4 of a drifting ring: the two sources differ
    for route, (mask, clip) in {"mask_snapshot_clip_current": ("snapshot", "recompute_current"),
                                "mask_current_clip_snapshot": ("recompute_current", "snapshot")}.items():
        batch = prepared(route)
        np.testing.assert_array_equal(batch.tokens, pure["snapshot"].tokens)  # the same episodes
        np.testing.assert_allclose(batch.old_logprobs, pure[mask].old_logprobs, atol=FP32_LOGP_ATOL)
        np.testing.assert_allclose(batch.clip_logprobs, pure[clip].old_logprobs, atol=FP32_LOGP_ATOL)
    # the loss reads the centre: same mask, other clip centre → another clipped set
    ones = jnp.asarray(pure["snapshot"].action_mask, jnp.float32)  # A = 1: every ratio above 1 + ε clips
    logp = jnp.asarray(pure["snapshot"].old_logprobs) + 0.3 * ones
    split, snapshot = (dataclasses.replace(b, advantages=ones) for b in (prepared("mask_snapshot_clip_current"),
                                                                         pure["snapshot"]))
    _, _, m_split = LOSSES["decoupled"].fn(logp, split, config=config, proximal=None)
    _, _, m_pure = LOSSES["decoupled"].fn(logp, snapshot, config=config, proximal=None)
    assert float(m_pure["clip_fraction"]) > 0.5  # log r_s = 0.3 > log 1.2 on every kept token
    assert float(m_split["active_fraction"]) == pytest.approx(float(m_pure["active_fraction"]))
    assert float(m_split["clip_fraction"]) != pytest.approx(float(m_pure["clip_fraction"]), abs=1e-3)
