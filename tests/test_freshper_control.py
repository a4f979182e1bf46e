"""The unified control trainer with the ``replay_freshper`` data source (fresh_rl.control.train),
the shared replay methods and the FreshPER control experiment."""
import csv
import dataclasses
import hashlib
import importlib
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fresh_rl.control import networks
from fresh_rl.control.acting import batch_start
from fresh_rl.control.config import TrainConfig
from fresh_rl.control.data_sources import ReplaySettings
from fresh_rl.control.freshper_study import (BATCH_NORMALIZED, SCALES, SHORT_TAUS, check_study_config, config_fingerprint,
                                             variant_name, variants)
from fresh_rl.control.hyperparams import replay_grid
from fresh_rl.control.losses import frozen_advantages, replayed_advantages, sequences
from fresh_rl.control.train import init_state, train
from fresh_rl.provenance import REPOSITORY_ROOT
from fresh_rl.replay import make_trajectory_buffer
from fresh_rl.replay import methods as replay_methods
from fresh_rl.replay.methods import REPLAY_METHODS, replay_hparams, stack_replay_hparams
from fresh_rl.sweep.keys import seed_keys

train_module = importlib.import_module("fresh_rl.control.train")  # the attribute is the function

TINY = TrainConfig(env_name="CartPole-v1", num_envs=2, rollout_length=8, total_env_steps=2 * 8 * 6,
                   num_epochs=1, num_minibatches=1, learning_rate=3e-3, data_source="replay_freshper",
                   replay=ReplaySettings(extra_updates=2, buffer_iterations=4, drift_every=3))


def _config(**replay_fields):
    return dataclasses.replace(TINY, replay=dataclasses.replace(TINY.replay, **replay_fields))


@pytest.mark.parametrize("fields, message", [
    ({"drift_every": 4}, "drift_every"),  # must divide the 6 iterations
    ({"extra_updates": -1}, "extra_updates"),
    ({"priority": "td"}, "priority"),
    ({"priority_exponent": 2.0}, "priority_exponent"),
])
def test_bad_replay_settings_name_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        _config(**fields)


@pytest.mark.parametrize("fields, message", [
    ({"method": "vaco"}, "method"),
    ({"num_minibatches": 2}, "num_minibatches"),
    ({"num_epochs": 2}, "num_epochs"),
    ({"data_source": "replay_per"}, "data_source"),
    ({"replay": ReplaySettings(buffer_iterations=4)}, "drift_every"),
])
def test_study_config_refuses_other_trainer_settings(fields, message):
    """The study runs one full-batch PPO-clip step per iteration at lag 0 on the replay_freshper
    source with drift snapshots; other settings are refused, naming the field."""
    check_study_config(TINY)
    with pytest.raises(ValueError, match=message):
        check_study_config(dataclasses.replace(TINY, **fields))


def test_replay_targets_equal_gae_at_zero_staleness():
    """V-trace on rows collected by the current θ (ρ ≡ 1) gives the GAE(λ) advantages and
    λ-returns of the fresh update: the replay path adds no correction where none is due."""
    params = TINY.network().init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
    rng = np.random.default_rng(0)
    obs = jnp.asarray(rng.normal(size=(2, 8, 4)), jnp.float32)
    policy, _ = TINY.network().apply(params, obs)
    action = networks.sample(jax.random.PRNGKey(1), policy)
    next_obs = jnp.asarray(rng.normal(size=(2, 8, 4)), jnp.float32)
    behaviour = networks.log_prob(policy, action)
    seq = sequences(0.99, jnp.ones((2, 8)), jnp.asarray(rng.random((2, 8)) < 0.2),
                    jnp.asarray(rng.random((2, 8)) < 0.1))
    logp, values, next_values = batch_start(TINY, params, obs, action, next_obs)
    fresh = frozen_advantages(TINY, seq, logp, behaviour, values, next_values)
    replayed = replayed_advantages(TINY, seq, logp, behaviour, values, next_values)
    # two 8-step float32 recursions on |values| ≲ 8 (reward 1, γ = 0.99): ≲ 16 u·8 ≈ 8e-6 apart, and
    # ρ = 1 ± 1e-7 (two forwards) adds ≲ 1e-6: inside atol 1e-5 + rtol 1e-5
    for name, r, f in zip(("advantage", "target"), replayed, fresh):
        np.testing.assert_allclose(r, f, rtol=1e-5, atol=1e-5, err_msg=name)


@dataclasses.dataclass(frozen=True)
class _PERBufferConfig(TrainConfig):
    """The same run on a plain PER buffer (``sampling="per"``: no age term at all)."""

    @property
    def replay_config(self):
        return dataclasses.replace(super().replay_config, sampling="per")


def _init_state_with_per_buffer(config, key, hparams=None):
    """``init_state``; for a :class:`_PERBufferConfig`, with the empty buffer of a PER buffer
    (the trainer sets τ on its FreshPER buffer, which a PER buffer has no use for)."""
    if not isinstance(config, _PERBufferConfig):
        return init_state(config, key, hparams)
    fresh = TrainConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(TrainConfig)})
    state = init_state(fresh, key, hparams)
    empty_row = jax.tree.map(lambda x: jnp.zeros_like(x[0]), state.replay.buffer.experience)
    per = make_trajectory_buffer(config.replay_config).init(empty_row)
    return state.replace(replay=state.replay.replace(buffer=per))


@pytest.fixture(scope="module")
def tau_inf_runs():
    """Two seeds of PER (authors', given priorities) through ``train`` on the trainer's FreshPER
    buffer (τ = ∞) and on a PER buffer: 6 iterations into a 4-iteration buffer, drift every 3."""
    config = _config()
    per_config = _PERBufferConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(TrainConfig)})
    assert config.replay_config.sampling == "freshper" and per_config.replay_config.sampling == "per"
    hp = replay_grid(config, [replay_hparams("per_authors"), replay_hparams("per_given")])
    assert np.all(np.isinf(np.asarray(hp.age_decay_tau)))
    # both runs in one jitted program: each is the same function of the same inputs as when compiled
    # alone, and XLA compiles one program holding both in less time than two programs
    fn = jax.jit(lambda keys, hp: [jax.vmap(train, (None, 0, 0))(cfg, keys, hp) for cfg in (config, per_config)])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train_module, "init_state", _init_state_with_per_buffer)
        return config, fn(seed_keys([3, 4]), hp)


def test_drift_by_age_matches_numpy(tau_inf_runs):
    """The trainer's last drift snapshot (per-age per-step and per-row ESS/n and k3 KL of the
    stored rows) against a plain NumPy loop over the slots of the final buffer."""
    config, (out, _) = tau_inf_runs
    buf = jax.tree.map(lambda x: x[0], out.state.replay.buffer)
    params = jax.tree.map(lambda x: x[0], out.params)
    drift = {k: np.asarray(out.metrics[f"drift/{k}"][0, -1]) for k in ("ess", "ess_row", "kl")}
    policy, _ = TINY.network().apply(params, buf.experience["obs"])
    log_r = np.asarray(networks.log_prob(policy, buf.experience["action"])
                       - buf.experience["behaviour_log_prob"], np.float64)
    age = np.asarray(buf.latest_version - buf.insert_version)
    for a in range(config.replay.buffer_iterations):
        sel = np.asarray(buf.valid) & (age == a)
        if not sel.any():
            assert drift["ess"][a] == -1.0
            continue
        r = np.exp(log_r[sel]).ravel()
        # trajectory weights Π_t r_t of the rows of that age (T = 8 steps), in float64
        w = np.exp(log_r[sel].sum(-1))
        # the trainer sums T = 8 float32 log-ratios of |log r| ≲ 1 (error ≲ 8 ulp ≈ 1e-6 in log w, so
        # relative in w) and the 2 rows' weights: ≲ 1e-5 relative in ESS/n; rtol 1e-4 covers it
        np.testing.assert_allclose(drift["ess_row"][a], w.sum() ** 2 / (w.size * (w * w).sum()), rtol=1e-4)
        # ESS: float32 sums of ≤ 64 ratios and log π from another forward (Δ ≲ 1e-6): ≲ 1e-5, rtol 1e-4
        np.testing.assert_allclose(drift["ess"][a], r.sum() ** 2 / (r.size * (r * r).sum()), rtol=1e-4)
        # k3 = (r − 1) − log r in float32 keeps exp's rounding, ≤ 1 ulp(r) ≈ 1.2e-7 per step (r < 2), which
        # the old atol 1e-7 did not cover when KL ≲ 1e-4: atol 3e-7
        np.testing.assert_allclose(drift["kl"][a], np.mean(r - 1 - np.log(r)), rtol=1e-3, atol=3e-7)
    assert (drift["ess"] > 0).sum() == 4  # 6 iterations into a 4-iteration buffer: ages 0..3 all stored


def test_freshper_with_infinite_tau_equals_per_exactly(tau_inf_runs):
    """The whole replay run on the trainer's FreshPER buffer with τ = ∞ equals the run on a
    "per" buffer (no age term at all): the keys bit for bit, the run to float32 rounding."""
    _, runs = tau_inf_runs
    outs = [{**out.metrics, "params": out.params, "sampled_age_counts": out.state.replay.sampled_age_counts,
             "num_updates": out.state.num_updates} for out in runs]
    assert np.all(np.asarray(outs[0]["sampled_age_counts"]).sum(-1) > 0)  # replay did sample
    # the keys α log p + 0·Δt equal PER's exactly (also as an FMA) and no item is floored (p ≥ 1e-6 > f),
    # but the two runs (freshper compiles its rebase and τ paths) may fuse the training ops
    # differently: float32 rounding, kept ≲ 1e-6 relative by Adam's scale-free steps: rtol 1e-5, atol 1e-6
    for k in outs[0]:
        for a, b in zip(jax.tree.leaves(outs[0][k]), jax.tree.leaves(outs[1][k])):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("replay_optimizer, moves", [("shared", True), ("separate", False),
                                                     ("sgd", False)])
def test_zero_gradient_replay_step_with_the_control_optimizer(replay_optimizer, moves):
    """With the control trainer's optimizer (global-norm clip + Adam), a zero-gradient replay
    step after a fresh step leaves θ unchanged under a separate Adam state or SGD; the shared
    state's momentum still moves it. A non-zero SGD step moves θ by exactly −lr·clip(g)."""
    hp = jax.tree.map(lambda x: x[0], stack_replay_hparams(
        [replay_hparams("uniform", replay_optimizer=replay_optimizer)]))
    lr = 1e-2
    optimizer = TINY.optimizer(lr)
    sgd = optax.chain(optax.clip_by_global_norm(TINY.max_grad_norm), optax.sgd(lr))
    params = TINY.network().init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
    opt = replay_opt = optimizer.init(params)
    grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.01, params)
    params, opt, replay_opt = replay_methods.apply_update(hp, optimizer, sgd, params, opt, replay_opt,
                                                          grads, replay_methods.UPDATE_FRESH)
    zeros = jax.tree.map(jnp.zeros_like, grads)
    after, _, _ = replay_methods.apply_update(hp, optimizer, sgd, params, opt, replay_opt, zeros,
                                              replay_methods.UPDATE_REPLAY)
    # exact: a zero SGD step and a fresh Adam state's zero step add exactly 0
    changed = any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(after), jax.tree.leaves(params)))
    assert changed == moves
    if replay_optimizer == "sgd":
        stepped, _, _ = replay_methods.apply_update(hp, optimizer, sgd, params, opt, replay_opt, grads,
                                                    replay_methods.UPDATE_REPLAY)
        norm = float(optax.tree.norm(grads))
        scale = min(1.0, TINY.max_grad_norm / norm)
        # one float32 update p − lr·s·g: ≲ 3 u relative for |p| ≲ 1, ≲ 3 u·5e-5 ≈ 1e-11 where p = 0
        for s, p, g in zip(jax.tree.leaves(stepped), jax.tree.leaves(params), jax.tree.leaves(grads)):
            np.testing.assert_allclose(s, p - lr * scale * g, rtol=1e-5, atol=1e-8)


# ------------------------------------------------------------------------- the experiment


def test_committed_runs_keep_their_fingerprint():
    """The saved runs of results/freshper_control (written by the former replay trainer) are
    found and accepted by the ported script: the "cpu" scale's pilot fingerprints name the
    committed folders and equal the fingerprints saved in their checkpoints (no JAX run)."""
    scale = SCALES["cpu"]
    runs = REPOSITORY_ROOT / "results" / "freshper_control" / "runs"
    if not runs.is_dir():
        pytest.skip("results/freshper_control/runs is not in this checkout")
    seed = json.loads((runs.parent / "config.json").read_text())["seed"]
    for config in scale.configs:
        fingerprint = (f"pilot {config_fingerprint(config)} seeds={scale.num_seeds}@{seed} "
                       f"lrs={scale.learning_rates}")
        folder = runs / f"{config.env_name}-pilot-{hashlib.sha256(fingerprint.encode()).hexdigest()[:10]}"
        metas = sorted(folder.glob("*/meta/metadata"))
        assert metas, folder
        assert all(json.loads(m.read_text())["fingerprint"] == fingerprint for m in metas)
    other = dataclasses.replace(scale.configs[0], max_logit_noise=2.0)  # a field the old runs lacked
    assert config_fingerprint(other) == repr(other)


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, run_study):
    out = tmp_path_factory.mktemp("freshper_control")
    run_study("freshper_control", "ci", out)
    return out


def _rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# experiments/freshper_control.py end to end (slow lane: the script's ci scale compiles the study's
# programs); the bed's equalities (τ = ∞ is PER, drift by age, update counts) stay in the default run
@pytest.mark.slow
def test_ci_scale_writes_its_files(ci_run):
    out = ci_run
    for name in ("README.md", "config.json", "runs.csv", "final.csv", "ess_vs_age.csv",
                 "sampled_age.csv", "score_vs_tau.csv", "verdicts.csv", "is_normalization.csv", "drift_by_method.csv",
                 "short_tau.csv",
                 "score_vs_tau.png"):
        assert (out / name).stat().st_size > 0, name
    runs = _rows(out / "runs.csv")
    scale = SCALES["ci"]
    assert len(runs) == len(variants()) * len(scale.learning_rates) * scale.num_seeds
    verdicts = _rows(out / "verdicts.csv")
    assert {r["verdict"] for r in verdicts} <= {"reproduced", "refuted", "undecided"}
    assert all(float(r["p_holm"]) >= float(r["p_value"]) for r in verdicts)  # Holm-corrected per claim
    assert all(math.isfinite(float(r["final_return"])) for r in runs)
    norm = _rows(out / "is_normalization.csv")
    assert len(norm) == len(BATCH_NORMALIZED) * len(scale.learning_rates)
    assert len(_rows(out / "short_tau.csv")) == len(SHORT_TAUS) * len(scale.learning_rates)
    short_runs = _rows(out / "short_tau_runs.csv")  # the per-seed data experiments/verdicts.py reads
    assert len(short_runs) == len(SHORT_TAUS) * len(scale.learning_rates) * scale.num_seeds
    ess = [float(r["ess_fraction"]) for r in _rows(out / "ess_vs_age.csv")]
    # (Σr)²/(nΣr²) ≤ 1 exactly; float32 sums of n = 64 terms add ≲ 3n·u ≈ 1.2e-5 (the old 1e-6 was
    # below even the typical 3√n·u): 1 + 2e-5
    assert all(0 < e <= 1 + 2e-5 for e in ess)
    assert "Trainer: `fresh_rl.control.train` with data source `replay_freshper`" in (out / "README.md").read_text()


@pytest.mark.slow
def test_matched_updates_and_optimizer_state_counts(ci_run):
    """1 + K epochs and every replay method make exactly K + 1 optimizer updates per batch,
    on-policy makes 1; the shared Adam state counts them all, except under a separate replay
    state or SGD, where it counts the fresh updates only."""
    out = ci_run
    config = SCALES["ci"].configs[0]
    iterations, k = config.num_iterations, config.replay.extra_updates
    for r in _rows(out / "runs.csv"):
        method, _, optimizer = r["variant"].partition("@")
        updates = iterations * (1 if method == "onpolicy" else 1 + k)
        assert int(r["num_updates"]) == updates, r
        shared_counts = iterations if optimizer or method == "onpolicy" else updates
        assert int(r["adam_count"]) == shared_counts, r
    replayed = {r["variant"] for r in _rows(out / "sampled_age.csv")}
    assert replayed == {variant_name(m, o) for m, o in variants()
                        if REPLAY_METHODS[m].extra == "replay"}


# needs the ci study above
@pytest.mark.slow
def test_ci_scale_rerun_skips_saved_chunks(ci_run, run_study):
    out = ci_run
    before = (out / "runs.csv").read_text()
    run_study("freshper_control", "ci", out)
    assert (out / "runs.csv").read_text() == before
