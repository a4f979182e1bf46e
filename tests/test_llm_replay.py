"""Replay in the LLM RL loop (FreshPER, arXiv 2604.16918): config errors, K = 0 is exactly
on-policy, τ = ∞ is exactly standard PER, replayed samples carry their original behaviour
log-probs and versions, τ lives in the hyperparameters (one place), checkpoint/resume is
exact, and the ci-scale experiment."""
import csv
import dataclasses
import math
import os
import runpy
import shutil
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm import replay_trainer as rt
from fresh_rl.llm.hparams import LLMHyperParams
from fresh_rl.llm.model import preset
from fresh_rl.llm.presets import FRESHPER_SCALES, SYNC, TASKS, WARM_START, freshper_methods
from fresh_rl.llm.trainer import RLConfig, loop_keys, stack_rows
from fresh_rl.llm.warm_start import restore_params
from fresh_rl.sweep.checkpoint import RunCheckpointer
from fresh_rl.sweep.keys import step_key

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = preset("tiny")
SCALE = FRESHPER_SCALES["ci"]  # the experiment's ci scale: same programs, same shapes
CONFIG, ENV = SCALE.rl, TASKS["arithmetic"]
METHODS = dict(SCALE.methods)
# fp32 log-probs of the warm start from two programs: √(5300 chained terms)·u ≈ 4e-6 of a logit's
# Σ|terms| ≤ 13 → |Δz| ≈ 6e-5, |Δ log p| ≤ 2|Δz| ≈ 1.2e-4; 2× that
FP32_LOGP_ATOL = 2.5e-4
SEEDS = list(range(SCALE.seeds))  # the experiment's seeds 0 … S − 1


@pytest.fixture(scope="module")
def params():
    return restore_params(WARM_START, MODEL)


def _run(replay_config, params, iterations=SCALE.iterations, **kwargs):
    return rt.train_loop(CONFIG, SYNC, replay_config, SEEDS, iterations, params=params,
                         env=ENV, model_config=MODEL, **kwargs)


# Two programs' runs compared exactly: holds while XLA compiles the shared sampler and update
# alike (it does here); a rounding difference would change bf16-sampled tokens and Adam signs,
# which no tolerance absorbs: a cross-target risk, noted rather than hidden by a bound.
def _assert_same(run_a, run_b, keys):
    (state_a, hist_a), (state_b, hist_b) = run_a, run_b
    for key in keys:
        np.testing.assert_array_equal(hist_a[key], hist_b[key], err_msg=key)
    for a, b in zip(jax.tree_util.tree_leaves(state_a.train.params if hasattr(state_a, "train")
                                              else state_a.pipeline.train.params),
                    jax.tree_util.tree_leaves(state_b.pipeline.train.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("kwargs, match", [
    (dict(replay_updates=-1), "LLMReplayConfig.replay_updates"),
    (dict(sampling="lifo"), "LLMReplayConfig.sampling"),
    (dict(age_decay_tau=0.0), r"LLMReplayConfig.age_decay_tau must be in \(0"),
    (dict(priority="td_error"), "LLMReplayConfig.priority"),
    (dict(is_beta=1.5), r"LLMReplayConfig.is_beta must be in \[0"),
    (dict(replay_advantages="mixed"), "LLMReplayConfig.replay_advantages"),
    (dict(sampling="per", auto_tau=True), "auto_tau needs sampling='freshper'"),
    (dict(auto_tau_bounds=(5.0, 1.0)), "auto_tau_bounds"),
    (dict(auto_tau_momentum=1.0), "auto_tau_momentum"),
])
def test_bad_config_names_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rt.LLMReplayConfig(**kwargs)


def test_incompatible_trainer_settings_fail_clearly():
    replay = rt.LLMReplayConfig()
    # the loss × route check (fresh_rl.llm.policy_losses.check_route): ppo_clip reads no old
    # log-probs, so SYNC's snapshot forwards would be wasted
    with pytest.raises(ValueError, match="RLConfig.loss='ppo_clip'.*AsyncConfig.old_logit_route='snapshot'"):
        rt.make_iteration(RLConfig(estimator="reinforce_pp"), SYNC, replay, ENV, MODEL)
    with pytest.raises(ValueError, match="replay_advantages='recompute' needs"):
        rt.check_compatible(RLConfig(estimator="grpo", loss="decoupled"), replay)
    rt.check_compatible(RLConfig(estimator="grpo", loss="decoupled"),
                        dataclasses.replace(replay, replay_advantages="stored"))
    with pytest.raises(ValueError, match="capacity must be >= the batch size"):
        rt.check_compatible(CONFIG, dataclasses.replace(replay, capacity=2))
    # a factorial route centres the clip apart from the mask: a stored trajectory carries one old log-prob array
    split = dataclasses.replace(SYNC, old_logit_route="mask_snapshot_clip_current")
    with pytest.raises(ValueError, match="old_logit_route='mask_snapshot_clip_current'.*replay buffer"):
        rt.make_iteration(CONFIG, split, replay, ENV, MODEL)


def test_beta_annealing():
    config = rt.LLMReplayConfig(is_beta=0.4, is_beta_final=1.0, is_beta_anneal_iterations=10)
    # float32 schedule: ≤ 3 roundings (2e-7 relative) ≪ pytest.approx's default rel 1e-6
    assert float(config.beta_at(0)) == pytest.approx(0.4)
    assert float(config.beta_at(5)) == pytest.approx(0.7)
    assert float(config.beta_at(50)) == pytest.approx(1.0)
    assert float(rt.LLMReplayConfig(is_beta=0.4).beta_at(50)) == pytest.approx(0.4)


def test_priorities_and_insert_versions():
    returns = jnp.array([1.0, -0.15, 0.0])
    adv = jnp.array([[0.0, 2.0, 2.0], [0.0, -1.0, 0.0], [0.0, 0.0, 0.0]])
    mask = jnp.array([[False, True, True], [False, True, False], [False, False, False]])
    reward = rt.base_priority(rt.LLMReplayConfig(), returns, adv, mask)
    # float32 |x| + 1e-6 and a mean of ≤ 2 exact values: ≤ 2 roundings (1.2e-7) < rtol
    np.testing.assert_allclose(reward, [1.0 + 1e-6, 0.15 + 1e-6, 1e-6], rtol=1e-6)
    advantage = rt.base_priority(rt.LLMReplayConfig(priority="advantage"), returns, adv, mask)
    np.testing.assert_allclose(advantage, [2.0 + 1e-6, 1.0 + 1e-6, 1e-6], rtol=1e-6)
    versions = jnp.array([[0, 3, 4], [0, 5, 0], [0, 0, 0]])
    np.testing.assert_array_equal(rt.insert_versions(versions, mask, 7), [3, 5, 7])


# --------------------------------------------------------------------------- equivalences


# two LLM replay programs of their own; the update-count match
# (test_on_policy_with_one_plus_k_epochs…) stays in the default run
@pytest.mark.slow
def test_zero_replay_updates_is_exactly_on_policy(params):
    on_policy = _run(METHODS["on_policy"], params)
    plain = ap.train_loop(CONFIG, SYNC, SEEDS, SCALE.iterations, params=params,
                          env=ENV, model_config=MODEL)
    _assert_same((plain[0], plain[1]), on_policy,
                 ("loss", "success_rate", "mean_return", "clip_fraction", "grad_norm"))
    assert np.all(on_policy[1]["replay/updates"] == 0)
    assert np.all(on_policy[1]["buffer_size"][:, -1] == SCALE.iterations * CONFIG.batch_size)


# the LLM loop's matched control; the control bed's matched update counts
# (test_freshper_control) stay in the default run
@pytest.mark.slow
def test_on_policy_with_one_plus_k_epochs_matches_the_replay_update_count(params):
    """The matched control: K = 0 with fresh_epochs = 1 + K makes as many optimizer updates
    per iteration as PER with K replay updates (counted by the trainer's step), and its only
    batch is the fresh one."""
    matched = _run(dict(freshper_methods(4.0, 1, 32, controls=True))["on_policy_epochs"], params)
    # PER's count (1 + K = 2 per iteration) is checked in test_infinite_tau_is_exactly_standard_per
    assert np.all(np.asarray(matched[0].pipeline.train.step) == SCALE.iterations * 2 * CONFIG.minibatches)
    assert np.all(matched[1]["replay/updates"] == 0)
    with pytest.raises(ValueError, match="fresh_epochs"):
        rt.LLMReplayConfig(fresh_epochs=0)


# the LLM loop at τ = ∞ equals PER; the buffer-level and the control-bed equalities
# (test_replay_buffer, test_freshper_control) stay in the default run
@pytest.mark.slow
def test_infinite_tau_is_exactly_standard_per(params):
    per = _run(METHODS["per"], params)
    fresh = METHODS["freshper"]
    state = rt.init_state(CONFIG, SYNC, fresh, params, ENV)
    state = rt.set_initial_tau(state, fresh, CONFIG.batch_size, [math.inf] * len(SEEDS))
    infinite = _run(fresh, params, state=state)
    _assert_same((per[0].pipeline, per[1]), infinite,
                 ("loss", "success_rate", "replay/loss", "replay/kl_k3", "replay/age_mean",
                  "replay/importance_weight_mean"))
    assert np.all(infinite[1]["age_decay_tau"] == np.inf)
    assert np.all(per[1]["age_decay_tau"] == np.inf)  # standard PER: no decay
    assert np.all(np.asarray(infinite[0].hparams.age_decay_tau) == np.inf)
    assert np.all(per[1]["replay/updates"][:, 1:] == 1)
    # 1 fresh + K = 1 replay update per iteration (the matched on-policy control's count)
    assert np.all(np.asarray(per[0].pipeline.train.step) == SCALE.iterations * 2 * CONFIG.minibatches)
    assert per[1]["replay/age_mean"][:, -1].max() > 0  # older batches were replayed


def test_authors_pipeline_inserts_at_the_running_max_and_refreshes_what_it_samples(params):
    """``new_item_priority="max"`` (the FreshPER authors' PER pipeline): a stored trajectory holds
    the running max priority until a replay update samples it, then its base priority
    |return| + ε. With the default ``"given"`` every trajectory holds its base priority."""
    for rule in ("given", "max"):
        config = dataclasses.replace(METHODS["per"], new_item_priority=rule)
        state, _ = _run(config, params)
        replay = state.replay
        valid = np.asarray(replay.valid)
        held = np.asarray(replay.base_priority)[valid]
        base = np.abs(np.asarray(replay.experience["returns"]))[valid] + config.priority_eps
        own = held == base.astype(np.float32)
        if rule == "given":
            assert own.all()
            continue
        # entered at the running max (≥ 1, the buffer's initial max) and not sampled since: a
        # failed trajectory (base ε) still above its base; sampled ones hold their base again
        maxed = held >= 1.0
        assert (~own & maxed).any() and (own & ~maxed).any()
        assert (own | maxed).all()


def test_replayed_samples_carry_their_behaviour_log_probs_and_versions(params):
    fresh = METHODS["freshper"]
    state = rt.init_state(CONFIG, SYNC, fresh, params, ENV)
    key_loop, _ = loop_keys(SEEDS)
    # the fresh batch of iteration 0 of row 0, as the pipeline builds it
    prepared = jax.jit(lambda s, k: ap.prepare(s, k, config=CONFIG, async_config=SYNC,
                                               env=ENV, model_config=MODEL))(
        state.pipeline, step_key(key_loop[0], 0))
    # 2 iterations suffice (the program is the same for any count): the batch of iteration 0
    # must survive one later iteration's store and replay unchanged, and the insert versions
    # then count 0, 1
    iterations = 2
    final, history = _run(fresh, params, iterations=iterations)
    b = CONFIG.batch_size
    stored = jax.tree_util.tree_map(lambda x: np.asarray(x[0, :b]), final.replay.experience)
    batch = prepared.batch
    # the iteration's (vmapped) program vs this jit: equal tokens and bf16 log-probs need XLA to
    # compile the sampler alike (a cross-target risk); the fp32 old log-probs get their bound
    np.testing.assert_array_equal(stored["tokens"], batch.tokens)
    np.testing.assert_array_equal(stored["behaviour_log_probs"], batch.behaviour_log_probs)
    np.testing.assert_allclose(stored["old_logprobs"], batch.old_logprobs, rtol=0,
                               atol=FP32_LOGP_ATOL)
    np.testing.assert_array_equal(stored["version"][stored["action_mask"]], 0)
    stored_count = iterations * b
    assert int(final.replay.num_valid[0]) == stored_count
    np.testing.assert_array_equal(np.asarray(final.replay.insert_version[0, :stored_count]),
                                  np.repeat(np.arange(iterations), b))
    # the learner moved after those updates, yet the stored reference did not
    assert history["replay/kl_k3"][0, -1] > 0
    sample = jax.tree_util.tree_map(lambda x: x[:4], stored)
    rebuilt = rt.replay_batch(sample, jnp.full((4,), 0.5), config=CONFIG, replay_config=fresh)
    np.testing.assert_array_equal(rebuilt.behaviour_log_probs, sample["behaviour_log_probs"])
    np.testing.assert_array_equal(rebuilt.old_logprobs, sample["old_logprobs"])


# bit-identical resume is tested for control runs and the CLI in the default run (test_sweep,
# test_cli)
@pytest.mark.slow
def test_interrupted_run_resumes_exactly(params, tmp_path):
    fresh = METHODS["freshper"]
    full = _run(fresh, params)
    checkpointer = RunCheckpointer(tmp_path / "run", fingerprint="ci")
    _run(fresh, params, iterations=SCALE.iterations, checkpointer=checkpointer,
         checkpoint_every=1)
    assert checkpointer.steps() == [SCALE.iterations - 1, SCALE.iterations]
    # drop the last checkpoint: the restart resumes from iteration n − 1
    shutil.rmtree(tmp_path / "run" / str(SCALE.iterations))
    resumed = _run(fresh, params, checkpointer=RunCheckpointer(tmp_path / "run",
                                                               fingerprint="ci"))
    for name in ("loss", "success_rate", "replay/loss", "buffer_size"):  # one program: exact
        np.testing.assert_array_equal(full[1][name], resumed[1][name], err_msg=name)
    for a, b in zip(jax.tree_util.tree_leaves(full[0]), jax.tree_util.tree_leaves(resumed[0])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


# --------------------------------------------------------------------------- τ hyperparameter


def test_the_iteration_consumes_its_state_and_never_the_callers_params(params):
    """The replay iteration (vmapped over the seeds) donates its state; init_state copies the
    caller's ``params`` and ``hparams``, which stay readable after the run."""
    fresh = METHODS["freshper"]
    hparams = LLMHyperParams.from_config(SYNC, fresh)
    state = rt.init_state(CONFIG, SYNC, fresh, params, ENV, hparams=hparams)
    state = stack_rows(state, len(SEEDS))
    step = rt.make_iteration(CONFIG, SYNC, fresh, ENV, MODEL, len(SEEDS))  # cached
    key_loop, _ = loop_keys(SEEDS)
    new_state, _ = step(state, step_key(key_loop, 0))
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(state))
    assert np.all(np.asarray(new_state.iteration) == 1)
    for tree in (params, hparams):
        assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(tree))
    assert float(hparams.age_decay_tau) == fresh.age_decay_tau


def test_tau_lives_in_the_hyperparameters(params):
    fresh = METHODS["freshper"]
    state = rt.init_state(CONFIG, SYNC, fresh, params, ENV)
    assert float(state.hparams.age_decay_tau) == fresh.age_decay_tau
    # the buffer's own leaf is α/τ of that one value (one float32 division: ≤ 6e-8 relative)
    np.testing.assert_allclose(float(state.replay.decay_rate),
                               fresh.priority_exponent / fresh.age_decay_tau, rtol=1e-6)
    changed = rt.with_age_decay_tau(state, fresh, CONFIG.batch_size, 2.0)
    assert float(changed.hparams.age_decay_tau) == 2.0
    np.testing.assert_allclose(float(changed.replay.decay_rate), fresh.priority_exponent / 2.0,
                               rtol=1e-6)
    per = rt.init_state(CONFIG, SYNC, METHODS["per"], params, ENV)
    assert float(per.hparams.age_decay_tau) == math.inf
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ValueError, match=r"age_decay_tau must be in \(0, inf\]"):
            LLMHyperParams.from_config(SYNC, fresh, age_decay_tau=bad)
        with pytest.raises(ValueError, match=r"age_decay_tau must be in \(0, inf\]"):
            rt.set_initial_tau(state, fresh, CONFIG.batch_size, [4.0, bad])


# --------------------------------------------------------------------------- ci experiment
# Last in the file: the experiment reuses the on_policy, per and freshper programs the tests
# above compiled.


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory):
    """The script run as ``python experiments/freshper.py --scale ci`` would run it, in this
    process: the jitted programs the tests above traced are reused as they are (a subprocess
    would load them from the compilation cache but trace each again, ~20 s a program)."""
    out = str(tmp_path_factory.mktemp("ci"))
    script = os.path.join(ROOT, "experiments", "freshper.py")
    argv = sys.argv
    sys.argv = [script, "--scale", "ci", "--out", out]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = argv
    return out


# experiments/freshper.py end to end (its own LLM programs); the replay trainer's equalities
# and behaviour tags stay in the default run
@pytest.mark.slow
def test_ci_experiment_writes_results(ci_run):
    for name in ("curves.csv", "final.csv", "ess_vs_age.csv", "ess_fit.csv", "config.json",
                 "learning_curves.png", "ess_vs_age.png", "runs/arithmetic_freshper.npz"):
        assert os.path.exists(os.path.join(ci_run, name)), name
    with open(os.path.join(ci_run, "final.csv")) as f:
        final = {row["method"]: row for row in csv.DictReader(f)}
    assert set(final) == {"on_policy", "per", "freshper"}
    assert float(final["on_policy"]["replay_age_mean"]) == 0.0
    assert float(final["per"]["replay_age_mean"]) > 0.0
    assert float(final["freshper"]["age_decay_tau"]) == pytest.approx(4.0)  # a stored constant
    with open(os.path.join(ci_run, "ess_vs_age.csv")) as f:
        ess = list(csv.DictReader(f))
    # (Σw)²/(n·Σw²) ≤ 1 (Cauchy–Schwarz) up to its float32 sums over n tokens: ≤ 3n·u
    assert all(0.0 < float(r["ess_fraction"])
               <= 1.0 + max(1e-6, 3 * int(r["tokens"]) * 2.0 ** -24) for r in ess)
    # ages count from the learner's version: the newest batch is 1 version old
    assert {int(r["age"]) for r in ess} == set(range(1, SCALE.iterations + 1))


def test_ess_by_age_sequence_weights_by_hand():
    """Sequence ESS/n of one age's trajectories from their Σ log r: weights (1, 2, ½) give
    (3.5)²/(3 · 5.25) = 7/9; a second age with one trajectory is 1 (a single weight)."""
    drift = {"valid": np.array([[True, True, True, True]]), "age": np.array([[2.0, 2.0, 2.0, 5.0]]),
             "log_ratio_sum": np.log(np.array([[1.0, 2.0, 0.5, 3.0]])),
             "ratio_sum": np.ones((1, 4)), "ratio_sq_sum": np.ones((1, 4)), "tokens": np.ones((1, 4)),
             "kl_k1": np.zeros((1, 4)), "kl_k3": np.zeros((1, 4))}
    points = {p["age"]: p for p in rt.ess_by_age(drift, [True])}
    # float64 sums of three small exact-ish numbers: rtol 1e-12
    np.testing.assert_allclose(points[2]["sequence_ess_fraction"], 7 / 9, rtol=1e-12)
    assert points[5]["sequence_ess_fraction"] == 1.0 and points[2]["trajectories"] == 3
