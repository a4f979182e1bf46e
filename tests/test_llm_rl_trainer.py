"""LLM policy-gradient trainer: config checks, grouping, loss / update invariants, and a short
deterministic RL run from the committed warm-start checkpoint (tiny preset, arithmetic)."""
import dataclasses
import itertools
import math

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fresh_rl.corrections import MISConfig
from fresh_rl.llm.model import preset
from fresh_rl.llm.presets import WARM_START
from fresh_rl.llm.rollout import expert_policy, run_episodes
from fresh_rl.llm.sampler import token_logprobs_and_entropy
from fresh_rl.llm.tasks import ArithmeticTask, FrozenLakeTask
from fresh_rl.llm.trainer import (Batch, RLConfig, current_learning_rate, group_prompt_match,
                                  group_reset_keys, init_train_state, make_iteration,
                                  make_optimizer, policy_loss, program_config, prompt_pool_keys,
                                  train_loop, update, with_learning_rate)
from fresh_rl.llm.warm_start import restore_params

MODEL = preset("tiny")
ENV = ArithmeticTask(digits=1, steps=2)  # the warm start's arithmetic setting
CONFIG = RLConfig(estimator="grpo", num_groups=2, group_size=4, learning_rate=1e-3)


@pytest.fixture(scope="module")
def params():
    return restore_params(WARM_START, MODEL)


@pytest.fixture(scope="module")
def expert_batch():
    """Grouped expert episodes of ENV with synthetic sampler log-probs and advantages."""
    key = jax.random.PRNGKey(3)
    reset_keys = group_reset_keys(key, CONFIG)
    episodes = jax.jit(lambda k: run_episodes(ENV, expert_policy(ENV), k, CONFIG.batch_size,
                                              reset_keys))(key)
    am = episodes.action_mask
    noise = jax.random.normal(jax.random.PRNGKey(4), am.shape)
    behaviour = jnp.where(am, -0.5 + 0.05 * noise, 0.0)
    adv = jnp.where(am, jnp.repeat(jnp.array([1.0, -1.0, 0.5, -0.5, 1.0, 0.0, -1.0, 2.0])[:, None],
                                   am.shape[1], axis=1), 0.0)
    return episodes, Batch(tokens=episodes.tokens, mask=episodes.mask, action_mask=am,
                           behaviour_log_probs=behaviour, old_logprobs=behaviour, advantages=adv)


# fp32 log-probs of the warm start from two programs: √(5300 chained terms)·u ≈ 4e-6 of a logit's
# Σ|terms| ≤ 13 → |Δz| ≈ 6e-5, |Δ log p| ≤ 2|Δz| ≈ 1.2e-4; 2× that
FP32_LOGP_ATOL = 2.5e-4
# the gradient of two programs: √(2·5300 chained terms)·u ≈ 6e-6 of the leaf's largest entry; 5×
GRAD_RTOL_OF_MAX = 3e-5
# optax.adamw's defaults (make_optimizer passes only the learning rate and weight decay)
ADAM_B1, ADAM_B2, ADAM_EPS = 0.9, 0.999, 1e-8
FLOAT32_UNIT = 2.0 ** -24  # unit roundoff u of float32

_update = jax.jit(lambda state, batch, key, config: update(state, batch, key, config=config,
                                                           model_config=MODEL),
                  static_argnums=3)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def _adam_direction(mu: np.ndarray, nu: np.ndarray, count: int) -> np.ndarray:
    """AdamW's step direction m̂ / (√v̂ + ε) from the stored moments, in float64 after the bias
    corrections 1 − β^t that optax computes in float32 (as tests/test_llm_sharding.py)."""
    b1_correction = np.float64(1 - np.float32(ADAM_B1) ** np.int32(count))
    b2_correction = np.float64(1 - np.float32(ADAM_B2) ** np.int32(count))
    mu, nu = mu.astype(np.float64), nu.astype(np.float64)
    return (mu / b1_correction) / (np.sqrt(nu / b2_correction) + ADAM_EPS)


# --------------------------------------------------------------------------- config


@pytest.mark.parametrize("kwargs, field", [
    (dict(estimator="ppo"), "RLConfig.estimator"),
    (dict(loss="vtrace"), "RLConfig.loss"),
    (dict(group_size=0), "RLConfig.group_size"),
    (dict(group_size=1), "RLConfig.group_size"),  # GRPO needs >= 2
    (dict(num_groups=3, group_size=2, minibatches=4), "RLConfig.minibatches"),
    (dict(learning_rate=0.0), "RLConfig.learning_rate"),
    (dict(max_grad_norm=-1.0), "RLConfig.max_grad_norm"),
    (dict(temperature=0.0), "RLConfig.temperature"),
    (dict(advantage_clip=0.0), "RLConfig.advantage_clip"),
    (dict(gamma=1.5), "RLConfig.gamma"),
    (dict(reinforce_pp_grouping="prompt"), "RLConfig.reinforce_pp_grouping"),
    (dict(tis_cap=-1.0), "tis_cap"),
    (dict(num_groups=4, prompt_pool=3), "RLConfig.prompt_pool"),
    (dict(prompt_pool=-1), "RLConfig.prompt_pool"),
    (dict(logprob_chunk_tokens=0), "RLConfig.logprob_chunk_tokens"),
    (dict(vaco_rho_bar=0.0), r"RLConfig.vaco_rho_bar must be in \(0"),
    (dict(vaco="tv"), "RLConfig.vaco must be a VACOConfig"),
    # VACO's D̂ is a statistic of the whole minibatch: its token sums do not add up over rows
    (dict(loss="vaco", grad_accumulation_steps=2), "RLConfig.grad_accumulation_steps must be 1 "
                                                   "with RLConfig.loss='vaco'"),
])
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        RLConfig(**kwargs)


def test_config_estimator_defaults():
    assert RLConfig().resolved_whiten is False and RLConfig().resolved_advantage_clip is None
    pp = RLConfig(estimator="reinforce_pp", group_size=1)
    assert pp.resolved_whiten is True and pp.resolved_advantage_clip == 2.0
    assert RLConfig(estimator="reinforce_pp", advantage_clip=math.inf).resolved_advantage_clip \
        is None


# --------------------------------------------------------------------------- grouping


def _prompts_differ_across_groups(episodes, group_size):
    first_action = int(np.argmax(np.asarray(episodes.action_mask)[0]))
    tokens = np.asarray(episodes.tokens)[:, :first_action]
    return not np.array_equal(tokens[0], tokens[group_size])


def test_grouped_reset_single_turn(expert_batch):
    episodes, _ = expert_batch
    assert float(group_prompt_match(episodes, CONFIG.group_size)) == 1.0
    assert _prompts_differ_across_groups(episodes, CONFIG.group_size)


@hypothesis.settings(max_examples=25, deadline=None)
@hypothesis.given(num_groups=st.integers(1, 6), extra=st.integers(0, 5), seed=st.integers(0, 99))
def test_prompt_pool_draws_distinct_prompts_of_a_fixed_set(num_groups, extra, seed):
    config = RLConfig(num_groups=num_groups, group_size=2, prompt_pool=num_groups + extra,
                      prompt_pool_seed=7)
    pool = np.asarray(prompt_pool_keys(config))
    keys = np.asarray(group_reset_keys(jax.random.PRNGKey(seed), config))
    assert keys.shape == (config.batch_size, 2)
    groups = keys[::2]
    np.testing.assert_array_equal(keys[1::2], groups)  # one prompt per group
    index = [int(np.flatnonzero((pool == g).all(axis=1))[0]) for g in groups]  # in the pool
    assert len(set(index)) == num_groups  # distinct within the batch
    # the pool is fixed by its seed, and the default (no pool) draws keys outside it
    np.testing.assert_array_equal(pool, np.asarray(prompt_pool_keys(config)))
    fresh = np.asarray(group_reset_keys(jax.random.PRNGKey(seed), RLConfig(
        num_groups=num_groups, group_size=2)))[::2]
    assert not any((pool == g).all(axis=1).any() for g in fresh)


def test_prompt_pool_covers_the_pool_over_batches():
    config = RLConfig(num_groups=2, group_size=2, prompt_pool=4)
    draw = jax.jit(lambda k: group_reset_keys(k, config))
    pool = np.asarray(prompt_pool_keys(config))
    seen = {int(np.flatnonzero((pool == g).all(axis=1))[0])
            for i in range(20) for g in np.asarray(draw(jax.random.PRNGKey(i)))[::2]}
    assert seen == {0, 1, 2, 3}


def test_grouped_reset_multi_turn():
    env = FrozenLakeTask(size=3, hole_prob=0.2, max_turns=4)
    key = jax.random.PRNGKey(11)
    reset_keys = group_reset_keys(key, RLConfig(num_groups=2, group_size=4))
    both = jax.jit(lambda k: (run_episodes(env, expert_policy(env), k, 8, reset_keys),
                              run_episodes(env, expert_policy(env), k, 8)))
    episodes, plain = both(key)
    assert float(group_prompt_match(episodes, 4)) == 1.0
    assert _prompts_differ_across_groups(episodes, 4)
    # without grouped reset keys the iid resets do not form groups
    assert float(group_prompt_match(plain, 4)) < 1.0


# --------------------------------------------------------------------------- update invariants


def test_zero_advantages_zero_gradient_and_no_change(params, expert_batch):
    _, batch = expert_batch
    batch = batch.replace(advantages=jnp.zeros_like(batch.advantages))
    state = init_train_state(CONFIG, params)
    new, metrics = _update(state, batch, jax.random.PRNGKey(0), CONFIG)
    # exact: A = 0 zeroes every token's cotangent, and Adam's step from g = 0 is 0 / (0 + ε)
    assert float(metrics["grad_norm"]) == 0.0
    assert int(new.step) == 1
    for a, b in zip(_leaves(state.params), _leaves(new.params)):
        np.testing.assert_array_equal(a, b)


def test_update_raises_positive_and_lowers_negative_advantage_sequences(params, expert_batch):
    """The policy-gradient direction: a small step raises the surrogate Σ_i A_i log π(y_i),
    i.e. moves probability towards the A > 0 sequences (to first order this holds for any
    sign-preserving optimizer step, Adam's first step included)."""
    _, batch = expert_batch
    # one jitted forward serves the three evaluations (same shapes; run eagerly, every op was
    # dispatched on its own, three times)
    forward = jax.jit(lambda p: token_logprobs_and_entropy(p, MODEL, batch.tokens, batch.mask)[0])
    logp = lambda p: np.asarray((forward(p) * batch.action_mask).sum(axis=1))  # noqa: E731
    before = logp(params)
    current = jnp.where(batch.action_mask, forward(params), 0.0)
    batch = batch.replace(behaviour_log_probs=current, old_logprobs=current)
    small = dataclasses.replace(CONFIG, learning_rate=1e-6)
    new, _ = _update(init_train_state(small, params), batch, jax.random.PRNGKey(0), small)
    change = logp(new.params) - before
    adv = np.asarray(batch.advantages.sum(axis=1) / batch.action_mask.sum(axis=1))
    assert np.sum(adv * change) > 0, (change, adv)
    # a small step at lr 1e-6: each weight moves ≤ lr, far below moving a sequence's log π by 1
    assert np.abs(change).max() < 1.0


def test_masked_tokens_do_not_change_the_update(params, expert_batch):
    _, batch = expert_batch
    state = init_train_state(CONFIG, params)
    outside = ~batch.action_mask
    garbage = batch.replace(behaviour_log_probs=jnp.where(outside, 7.0, batch.behaviour_log_probs),
                            old_logprobs=jnp.where(outside, -9.0, batch.old_logprobs),
                            advantages=jnp.where(outside, 1e3, batch.advantages))
    new_a, m_a = _update(state, batch, jax.random.PRNGKey(0), CONFIG)
    new_b, m_b = _update(state, garbage, jax.random.PRNGKey(0), CONFIG)
    assert float(m_a["grad_norm"]) > 0
    # exact: one compiled program, and the masked entries are selected away by where()
    for a, b in zip(_leaves(new_a.params), _leaves(new_b.params)):
        np.testing.assert_array_equal(a, b)
    assert float(m_a["loss"]) == float(m_b["loss"])


def test_decoupled_with_old_equal_sampler_equals_ppo_clip(params, expert_batch):
    _, batch = expert_batch  # old_logprobs == behaviour_log_probs, so r_d = 1
    state = init_train_state(CONFIG, params)
    decoupled = RLConfig(estimator="grpo", num_groups=2, group_size=4, learning_rate=1e-3,
                         loss="decoupled", mis=MISConfig(token_bounds=(0.5, 2.0)))
    new_p, m_p = _update(state, batch, jax.random.PRNGKey(0), CONFIG)
    new_d, m_d = _update(state, batch, jax.random.PRNGKey(0), decoupled)
    # two programs: the token-mean loss moves by ≤ max |A·r| (|A| ≤ 2, r ≲ e^0.65: < 4) × δ
    np.testing.assert_allclose(float(m_p["loss"]), float(m_d["loss"]), rtol=1e-6,
                               atol=4 * FP32_LOGP_ATOL)
    np.testing.assert_allclose(float(m_p["grad_norm"]), float(m_d["grad_norm"]),
                               rtol=GRAD_RTOL_OF_MAX)  # a norm keeps the gradient's rounding
    assert float(m_d["active_token_fraction"]) == 1.0
    # AdamW's first step is lr·g/(|g| + ε): where g ≈ 0 one rounding flips it by up to 2 lr, so
    # (as tests/test_llm_sharding.py) the moments agree to the gradient's rounding, each run's
    # weights are θ0 − lr·d(its moments) to float32 rounding, and the runs differ by ≤ lr·|Δd|
    assert int(new_p.step) == int(new_d.step) == 1 and CONFIG.weight_decay == 0.0
    lr = CONFIG.learning_rate
    adam_p, adam_d = new_p.opt_state[1].inner_state[0], new_d.opt_state[1].inner_state[0]
    for theta0, a, b, mu_p, nu_p, mu_d, nu_d in zip(
            _leaves(state.params), _leaves(new_p.params), _leaves(new_d.params),
            _leaves(adam_p.mu), _leaves(adam_p.nu), _leaves(adam_d.mu), _leaves(adam_d.nu)):
        np.testing.assert_allclose(mu_d, mu_p, rtol=0, atol=GRAD_RTOL_OF_MAX * np.abs(mu_p).max())
        np.testing.assert_allclose(nu_d, nu_p, rtol=0,  # ν ∝ g²: twice g's relative rounding
                                   atol=2 * GRAD_RTOL_OF_MAX * np.abs(nu_p).max())
        # d (≤ 4 roundings, |d| ≤ 1), lr·d and θ + update: ≤ 6u·lr + half an ulp of θ; twice that
        rounding = 2 * (6 * FLOAT32_UNIT * lr + np.spacing(np.abs(a)))
        d_p, d_d = _adam_direction(mu_p, nu_p, 1), _adam_direction(mu_d, nu_d, 1)
        for theta, d in ((a, d_p), (b, d_d)):
            assert np.all(np.abs(theta - (theta0.astype(np.float64) - lr * d)) <= rounding)
        assert np.all(np.abs(b - a) <= lr * np.abs(d_d - d_p) + 2 * rounding)
    assert float(m_p["clip_fraction"]) == float(m_d["clip_fraction"])  # (unless r ties the clip)
    # the comparison is not vacuous: the update moved the parameters
    assert any(not np.array_equal(a, b)
               for a, b in zip(_leaves(state.params), _leaves(new_p.params)))


def test_remat_and_a_chunked_head_give_the_same_update(params, expert_batch):
    """RLConfig.remat and a small RLConfig.logprob_chunk_tokens change memory, not the step."""
    _, batch = expert_batch
    lean = dataclasses.replace(CONFIG, remat=True, logprob_chunk_tokens=37)
    grad = jax.jit(jax.grad(lambda p, config: policy_loss(p, batch, config=config,
                                                          model_config=MODEL)[0]),
                   static_argnums=1)
    plain, chunked = grad(params, CONFIG), grad(params, lean)
    assert max(np.abs(g).max() for g in _leaves(plain)) > 1e-3  # not a vanishing gradient
    for a, b in zip(_leaves(plain), _leaves(chunked)):
        # other programs (remat, chunked head): ≈ 6e-6 of the leaf's largest entry (see above)
        np.testing.assert_allclose(b, a, rtol=1e-4,
                                   atol=max(1e-6, GRAD_RTOL_OF_MAX * np.abs(a).max()))


# --------------------------------------------------------------------------- short RL run


@pytest.fixture(scope="module")
def short_run(params):
    run = lambda seed: train_loop(CONFIG, seed, 2, params=params, env=ENV,  # noqa: E731
                                  model_config=MODEL)
    return run(7), run(7), run(8)


def test_short_run_is_deterministic(short_run):
    (s1, h1), (s2, h2), _ = short_run
    assert set(h1) == set(h2)
    for k in set(h1) - {"wall_seconds"}:  # everything but the clock; one program run twice: exact
        np.testing.assert_array_equal(h1[k], h2[k], err_msg=k)
    for a, b in zip(_leaves(s1.params), _leaves(s2.params)):
        np.testing.assert_array_equal(a, b)
    assert int(s1.step) == 2 * CONFIG.epochs * CONFIG.minibatches


def test_short_run_metrics_are_finite_and_sane(short_run, params):
    (_, h1), _, (_, h3) = short_run
    for k, v in h1.items():
        assert v.shape == (2,) and np.all(np.isfinite(v)), k
    assert np.all(h1["group_prompt_match"] == 1.0)
    assert np.all((0 <= h1["success_rate"]) & (h1["success_rate"] <= 1))
    # real bf16 sampler vs fp32 trainer discrepancy: small but not zero
    # bf16 roundings set it (u_bf16 ≈ 4e-3 of typical |z| of a few): > 0, ≪ 0.05 on any target
    assert np.all(h1["abs_log_rd_mean"] > 0) and np.all(h1["abs_log_rd_mean"] < 0.05)
    assert np.all(h1["abs_log_rd_max"] < 5.0)  # a sanity bound, 50× 2·u_bf16·max|z| ≈ 0.1
    for key in ("tv", "kl_k3", "ess", "clip_fraction", "entropy", "grad_norm", "adv_abs_mean"):
        assert key in h1
    assert np.all(h1["response_tokens"] >= 1)
    # a different key gives a different batch
    assert not np.array_equal(h1["abs_log_rd_mean"], h3["abs_log_rd_mean"])


def test_the_iteration_consumes_its_state_and_never_the_callers_params(short_run, params):
    """make_iteration donates the state (donate_argnums=0): on this CPU backend every leaf of
    the passed state is deleted after the call (XLA aliased or freed it), while the caller's
    ``params`` survive the three train_loops of ``short_run`` (init_train_state copies them)."""
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(params))
    for a, b in zip(_leaves(params), _leaves(restore_params(WARM_START, MODEL))):
        np.testing.assert_array_equal(a, b)
    step = make_iteration(CONFIG, ENV, MODEL)  # cached: the program short_run compiled
    state = init_train_state(CONFIG, params)
    assert not any(a.unsafe_buffer_pointer() == b.unsafe_buffer_pointer()
                   for a, b in zip(jax.tree_util.tree_leaves(state.params),
                                   jax.tree_util.tree_leaves(params)))
    new_state, _ = step(state, jax.random.PRNGKey(0))
    assert all(x.is_deleted() for x in jax.tree_util.tree_leaves(state))
    assert int(new_state.step) == CONFIG.epochs * CONFIG.minibatches
    assert not any(x.is_deleted() for x in jax.tree_util.tree_leaves(params))


def test_the_optimizer_is_plain_adamw_bit_for_bit():
    """make_optimizer's AdamW reads its learning rate from the state; every other argument is a
    constant, so three steps make the same float32 operations in the same order as a plain
    ``chain(clip_by_global_norm, adamw)``, the learning rate a runtime scalar of the same value
    instead of a literal: equal bit for bit. A non-zero weight decay exercises every term."""
    config = RLConfig(num_groups=2, group_size=4, learning_rate=3e-4, weight_decay=0.01)
    plain = optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                        optax.adamw(config.learning_rate, weight_decay=config.weight_decay))
    rng = np.random.default_rng(0)
    params = {"w": jnp.asarray(rng.normal(size=(64, 8)), jnp.float32),
              "b": jnp.asarray(rng.normal(size=8), jnp.float32)}
    grads = [jax.tree_util.tree_map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
             for _ in range(3)]

    @jax.jit
    def run(params):
        out = []
        for opt in (plain, make_optimizer(config)):
            p, state = params, opt.init(params)
            for g in grads:
                updates, state = opt.update(g, state, p)
                p = optax.apply_updates(p, updates)
            out.append(p)
        return out

    ours, reference = run(params)[::-1]
    for a, b in zip(_leaves(ours), _leaves(reference)):
        np.testing.assert_array_equal(a, b)


def test_a_learning_rate_grid_is_one_program(short_run, params, expert_batch):
    """Configs that differ only in the learning rate share one compiled iteration: the rate is a
    leaf of the optimizer state. Three rates through the program ``short_run`` compiled: one
    cache entry and each state carries its config's rate. The rate is really used: one jitted
    update of the expert batch (non-zero advantages) from three states of different rates is
    one program whose three results differ."""
    rates = (1e-4, 3e-4, 1e-3)
    configs = [dataclasses.replace(CONFIG, learning_rate=lr) for lr in rates]
    step = make_iteration(CONFIG, ENV, MODEL)
    assert {id(make_iteration(c, ENV, MODEL)) for c in configs} == {id(step)}
    for config, lr in zip(configs, rates):
        state, _ = step(init_train_state(config, params), jax.random.PRNGKey(5))
        assert float(current_learning_rate(state)) == np.float32(lr)
    assert step._cache_size() == 1
    _, batch = expert_batch
    one_update = jax.jit(lambda state: update(state, batch, jax.random.PRNGKey(0),
                                              config=program_config(CONFIG), model_config=MODEL))
    finals = [_leaves(one_update(init_train_state(c, params))[0].params) for c in configs]
    assert one_update._cache_size() == 1
    for a, b in itertools.combinations(finals, 2):
        assert any(not np.array_equal(x, y) for x, y in zip(a, b))
    # with_learning_rate sets a state's rate; bad values are refused naming the field
    state = with_learning_rate(init_train_state(CONFIG, params), 2e-4)
    assert float(current_learning_rate(state)) == np.float32(2e-4)
    with pytest.raises(ValueError, match="learning_rate"):
        with_learning_rate(state, 0.0)


def test_compute_advantages_dispatch():
    from fresh_rl.llm import advantages as adv
    from fresh_rl.llm.trainer import compute_advantages
    returns = jnp.array([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, -0.15])
    mask = jnp.arange(6)[None] < jnp.array([2, 3, 4, 5, 6, 1, 2, 3])[:, None]
    grpo = compute_advantages(RLConfig(num_groups=2, group_size=4), returns, mask)
    np.testing.assert_array_equal(grpo, adv.grpo_advantages(returns, mask, 4))
    pp = RLConfig(estimator="reinforce_pp", num_groups=2, group_size=4, advantage_clip=0.2)
    got = compute_advantages(pp, returns, mask)
    np.testing.assert_array_equal(got, adv.reinforce_pp_advantages(returns, mask,
                                                                   advantage_clip=0.2))
    assert float(jnp.max(jnp.abs(got))) == pytest.approx(0.2)  # float32(0.2): 1.5e-8 relative
    grouped = RLConfig(estimator="reinforce_pp", num_groups=2, group_size=4,
                       reinforce_pp_grouping="group", whiten=False)
    np.testing.assert_array_equal(
        compute_advantages(grouped, returns, mask),
        adv.reinforce_pp_advantages(returns, mask, group_size=4, whiten_tokens=False))
