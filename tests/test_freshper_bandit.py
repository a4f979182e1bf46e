"""The exact stale-buffer test bed (fresh_rl.tabular_bandit) and its experiment."""
import csv
import itertools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fresh_rl.lag import fit_ess_time_constant
from fresh_rl.replay import make_trajectory_buffer
from fresh_rl.sweep.keys import seed_key
from fresh_rl.tabular_bandit import (BedConfig, apply_update, ess_fraction, expected_reward,
                                     insert, kl_divergence, method_hparams,
                                     optimizer, refresh, sample_sequences, sequence_rewards,
                                     stack_hparams, step_ess_fraction, train)
from fresh_rl.tabular_bandit.bed import _example_item

T, A = 3, 4  # small enough to enumerate in NumPy


def _hp(method, **overrides):
    row = {**method_hparams(method, 0.05, tau_fit=5.0), **overrides}
    return jax.tree.map(lambda x: x[0], stack_hparams([row]))


def _numpy_policy(logits):
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


@settings(max_examples=10)
@given(seed=st.integers(0, 10_000), scale=st.floats(0.1, 1.5))
def test_exact_kl_ess_reward_match_enumeration_and_monte_carlo(seed, scale):
    """Closed forms = enumeration over all A^T sequences (NumPy, 1e-5) and = a Monte-Carlo
    estimate from 100k sequences drawn by the bed's sampler (within 5-6 standard errors)."""
    rng = np.random.default_rng(seed)
    beta, pi = (scale * rng.standard_normal((T, A)).astype(np.float32) for _ in range(2))
    target = np.arange(T) % A
    pb, pp = _numpy_policy(beta.astype(np.float64)), _numpy_policy(pi.astype(np.float64))
    seqs = np.array(list(itertools.product(range(A), repeat=T)))
    b_seq, p_seq = pb[np.arange(T), seqs].prod(1), pp[np.arange(T), seqs].prod(1)
    kl = np.sum(b_seq * np.log(b_seq / p_seq))
    ess = 1.0 / np.sum(p_seq**2 / b_seq)
    matched = np.cumprod(seqs == target, axis=1).sum(1) / T
    # float32 closed forms from the same float32 logits: KL ≲ T·few ulp(|log p| ≲ 2) ≈ 1.5e-6 abs
    # (< atol + rtol·KL, KL ≳ 0.01); ESS's exp(2 log π − log β), |·| ≲ 18: ≲ 3·4e-6 relative < 1e-4;
    # the expected reward is products of ≤ 3 probabilities: ≲ 10 u ≈ 6e-7 < 1e-5
    np.testing.assert_allclose(kl_divergence(beta, pi), kl, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ess_fraction(beta, pi), ess, rtol=1e-4)
    # per-step weights: the mean over positions of 1/E_β[w_t²], by enumeration of one token each
    # (same float32 exp(2 log π − log β) terms as the sequence ESS: rtol 1e-4 as above)
    step_ess = np.mean(1.0 / np.sum(pp**2 / pb, axis=1))
    np.testing.assert_allclose(step_ess_fraction(beta, pi), step_ess, rtol=1e-4)
    np.testing.assert_allclose(expected_reward(pi, jnp.asarray(target)),
                               np.sum(p_seq * matched), rtol=1e-5)

    tokens = np.asarray(sample_sequences(jax.random.key(seed), jnp.asarray(beta), 100_000))
    log_w = np.log(pp[np.arange(T), tokens].prod(1)) - np.log(pb[np.arange(T), tokens].prod(1))
    w = np.exp(log_w)
    n = len(w)
    assert abs(-log_w.mean() - kl) <= 5 * log_w.std() / math.sqrt(n) + 1e-4  # 5 SE; 1e-4 for the SE's own error
    # ESS/n = (E w)²/E w² with E w = 1 and E w² = 1/ESS; the tolerances are 6 exact standard
    # errors of the two sample means (E w⁴ by enumeration: the tail of w is heavy).
    second, fourth = 1.0 / ess, np.sum(p_seq**4 / b_seq**3)
    assert abs(w.mean() - 1.0) <= 6 * math.sqrt((second - 1.0) / n)
    assert abs(np.mean(w**2) - second) <= 6 * math.sqrt((fourth - second**2) / n)
    # k/3 in float32 vs float64: ≤ u/2 ≈ 3e-8 relative, inside the default rtol 1e-7
    np.testing.assert_allclose(
        np.asarray(sequence_rewards(jnp.asarray(tokens[:50]), jnp.asarray(target))),
        np.cumprod(tokens[:50] == target, axis=1).sum(1) / T)


def test_fit_ess_time_constant_recovers_an_exponential():
    ages = np.arange(200)
    # a float64 log-linear fit of an exact exponential: ~1e-14 off, inside rel 1e-6
    assert fit_ess_time_constant(ages, np.exp(-ages / 17.0)) == pytest.approx(17.0, rel=1e-6)
    assert fit_ess_time_constant(ages, np.ones(200)) == math.inf


CONFIG = BedConfig(num_steps=T, num_actions=A, batch_size=4, num_iterations=4,
                   buffer_iterations=4, log_every=4)


def _items(rng, n=4):
    tokens = rng.integers(0, A, (n, T))
    reward = np.asarray(sequence_rewards(jnp.asarray(tokens), CONFIG.target))
    return {"tokens": jnp.asarray(tokens, jnp.int32),
            "behaviour_log_probs": jnp.asarray(rng.normal(size=(n, T)), jnp.float32),
            "reward": jnp.asarray(reward), "baseline": jnp.full((n,), reward.mean()),
            "scale": jnp.full((n,), reward.std())}


def _replay_trace(config, hp, versions, tau=None):
    """The bed's replay path (insert, sample, refresh) over ``versions``, one jitted scan.
    Returns per step: max priority before the insert, base priorities after the insert and
    after the refresh, the sample, and the final probabilities."""
    buffer = make_trajectory_buffer(config.replay_config)
    rng = np.random.default_rng(0)
    batches = jax.tree.map(lambda *x: jnp.stack(x), *[_items(rng) for _ in versions])

    @jax.jit
    def run(hp, batches, versions):
        replay = buffer.init(_example_item(config))
        if tau is not None:
            replay = buffer.set_age_decay_tau(replay, tau)

        def step(replay, inputs):
            items, version = inputs
            max_before = replay.max_priority
            replay = insert(config, hp, replay, items, version)
            inserted = replay.base_priority
            sample = buffer.sample(replay, jax.random.key(0))
            replay = refresh(config, hp, replay, sample.indices, sample.experience)
            return replay, (max_before, inserted, replay.base_priority, sample)

        replay, trace = jax.lax.scan(step, replay, (batches, versions))
        return trace, buffer.sampling_probabilities(replay)

    return run(hp, batches, jnp.asarray(versions, jnp.int32))


def test_authors_per_inserts_at_max_and_refreshes_only_sampled_items():
    versions = np.arange(6)  # 24 items into 16 slots: the buffer fills and evicts
    (max_before, inserted, refreshed, sample), _ = _replay_trace(CONFIG, _hp("per_authors"),
                                                                 versions)
    for v in versions:
        slots = (np.arange(4) + 4 * v) % 16
        np.testing.assert_array_equal(np.asarray(inserted[v])[slots], np.asarray(max_before[v]))
        sampled = np.asarray(sample.indices[v])
        unsampled = np.setdiff1d(np.arange(16), sampled)
        np.testing.assert_array_equal(np.asarray(refreshed[v])[unsampled],
                                      np.asarray(inserted[v])[unsampled])
        # |r| + ε: one correctly rounded float32 add on both sides (NEP 50): equal, default rtol 1e-7
        np.testing.assert_allclose(np.asarray(refreshed[v])[sampled],
                                   np.abs(np.asarray(sample.experience["reward"][v])) + 1e-6)
    # Refreshing really happened somewhere (priorities left the running max).
    assert np.any(np.asarray(refreshed) != np.asarray(inserted))


def test_freshper_with_infinite_tau_equals_per_exactly():
    """The bed's replay path on a "freshper" buffer with τ = ∞ and on a "per" buffer (no decay
    at all), versions far apart: identical indices, probabilities, weights and priorities."""
    per_config = BedConfig(**{**CONFIG.__dict__, "buffer_sampling": "per"})
    hp = _hp("per_authors", age_decay_tau=math.inf)
    versions = np.arange(0, 3000, 500)
    fresh = _replay_trace(CONFIG, hp, versions, tau=math.inf)
    per = _replay_trace(per_config, hp, versions)
    # exact by construction, though two programs: the keys α log p + 0·Δt equal PER's also as an FMA,
    # no item is floored (p ≥ 1e-6 > f, so F·n_f = 0), the trees are adds only and every other float
    # is the same elementwise op on the same value (no multiply-add left to contract differently)
    for x, y in zip(jax.tree.leaves(fresh), jax.tree.leaves(per)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_freshper_authors_is_per_authors_plus_decay_and_its_twin_is_per_authors_bitwise():
    """``freshper_authors`` keeps the authors' PER pipeline (max-priority insert, refresh) and adds
    the decay; its no-decay twin has ``per_authors``' settings and, in one vmapped program of the
    bed with the same key, the same run bit for bit, while the decaying row samples younger data."""
    rows = [method_hparams(m, 0.05, tau_fit=2.0)
            for m in ("per_authors", "freshper_authors_no_decay", "freshper_authors")]
    assert rows[1] == rows[0]
    assert rows[2] == {**rows[0], "age_decay_tau": 2.0}
    config = BedConfig(num_steps=T, num_actions=A, batch_size=8, num_iterations=24,
                       buffer_iterations=12, log_every=8)
    out = jax.jit(jax.vmap(train, (None, None, 0)), static_argnums=0)(
        config, seed_key(3), stack_hparams(rows))
    for x in jax.tree.leaves(out):
        np.testing.assert_array_equal(np.asarray(x[1]), np.asarray(x[0]))
    ages = np.arange(config.buffer_iterations)
    mean_age = (np.asarray(out["sampled_age_counts"]) @ ages
                / np.asarray(out["sampled_age_counts"]).sum(-1))
    # τ = 2 versions in a 12-version buffer: items 6 versions old keep e^-3 of their priority
    assert mean_age[2] < 0.8 * mean_age[0], mean_age


@pytest.mark.parametrize("replay_optimizer, moves", [("shared", True), ("separate", False),
                                                     ("sgd", False)])
def test_zero_gradient_replay_step(replay_optimizer, moves):
    """After a fresh Adam step, a replay step with zero gradient leaves θ unchanged under a
    separate optimizer state or SGD; under the shared Adam state momentum still moves θ."""
    hp = _hp("uniform", replay_optimizer=["shared", "separate", "sgd"].index(replay_optimizer))
    params = jnp.zeros((T, A))
    opt = replay_opt = optimizer(hp.learning_rate).init(params)
    grads = jnp.asarray(np.random.default_rng(0).normal(size=(T, A)), jnp.float32)
    params, opt, replay_opt = apply_update(hp, params, opt, replay_opt, grads, 1)
    after, _, _ = apply_update(hp, params, opt, replay_opt, jnp.zeros_like(grads), 2)
    assert (not np.array_equal(after, params)) == moves
    none, _, _ = apply_update(hp, params, opt, replay_opt, grads, 0)
    np.testing.assert_array_equal(none, params)  # no update: exact


# ------------------------------------------------------------------------- the experiment


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, run_study):
    """``python experiments/freshper_bandit.py --scale ci``: its folder and its ``config.json``
    (the scale's bed, learning rates, seeds and arms)."""
    out = tmp_path_factory.mktemp("freshper_bandit")
    run_study("freshper_bandit", "ci", out)
    return out, json.loads((out / "config.json").read_text())


def test_ci_scale_writes_its_files(ci_run):
    out, config = ci_run
    for name in ("README.md", "runs.csv", "tuning.csv", "ess_vs_age.csv", "sampled_age.csv",
                 "score_vs_tau.csv", "ess_vs_age.png", "score_vs_tau.png", "config.json"):
        assert (out / name).stat().st_size > 0, name
    readme = (out / "README.md").read_text()
    assert "Made by" in readme and "## Verdicts" in readme
    rows = list(csv.DictReader(open(out / "runs.csv")))
    assert len(rows) == len(config["arms"]) * config["scoring_seeds"]
    # a mean of products of probabilities ≤ 1 divided by T: monotone float rounding keeps it in [0, 1]
    assert all(0.0 <= float(r["final_expected_reward"]) <= 1.0 for r in rows)
    # per-step ESS ≥ trajectory ESS at every age: 1/Π_t m_t ≤ mean_t 1/m_t for m_t = E[w_t²] ≥ 1
    # (equal when T − 1 positions have m_t = 1). Slack 1e-5 relative: each side is a float32
    # exp of a float32 logsumexp, a few ulps (≈ 1e-6) apart from the exact value, then averaged
    for r in csv.DictReader(open(out / "ess_vs_age.csv")):
        if float(r["ess_fraction"]) == float(r["ess_fraction"]):  # reached ages only (not NaN)
            assert float(r["ess_step_fraction"]) >= float(r["ess_fraction"]) * (1 - 1e-5)


def test_tuning_seeds_are_not_scoring_seeds(ci_run):
    """Each arm's learning rate is the best seed-mean J of the tuning seeds; the scoring runs use
    it, on seeds disjoint from the tuning ones."""
    out, config = ci_run
    tuning = list(csv.DictReader(open(out / "tuning.csv")))
    runs = list(csv.DictReader(open(out / "runs.csv")))
    tuning_seeds, scoring_seeds = config["tuning_seeds"], config["scoring_seeds"]
    assert {int(r["seed"]) for r in runs} == set(range(tuning_seeds, tuning_seeds + scoring_seeds))
    assert all(int(r["tuning_seeds"]) == tuning_seeds for r in tuning)
    for arm in config["arms"]:
        rows = [r for r in tuning if r["arm"] == arm]
        assert len(rows) == len(config["learning_rates"])
        best = max(rows, key=lambda r: float(r["mean_expected_reward"]))
        assert [r["picked"] for r in rows].count("True") == 1 and best["picked"] == "True"
        assert {r["learning_rate"] for r in runs if r["arm"] == arm} == {best["learning_rate"]}


@pytest.mark.slow
def test_ci_scale_rerun_skips_saved_chunks(ci_run, run_study):
    """Every chunk is saved: a rerun restores them (no training) and writes the same table."""
    out, _ = ci_run
    before = (out / "runs.csv").read_text()
    run_study("freshper_bandit", "ci", out)
    assert (out / "runs.csv").read_text() == before


def test_epoch_method_makes_exactly_k_plus_one_updates_per_batch(ci_run):
    """Counted by the bed and by Adam's own step counter of the shared state."""
    out, config = ci_run
    bed = config["bed"]
    rows = list(csv.DictReader(open(out / "runs.csv")))
    per_method = {m: [r for r in rows if r["method"] == m] for m in ("onpolicy", "onpolicy_epochs")}
    for r in per_method["onpolicy_epochs"]:
        assert int(r["num_updates"]) == int(r["adam_count"]) == (
            bed["num_iterations"] * (bed["extra_updates"] + 1))
    for r in per_method["onpolicy"]:
        assert int(r["num_updates"]) == int(r["adam_count"]) == bed["num_iterations"]
