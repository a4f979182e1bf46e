"""Exact gradient accumulation of the LLM trainer (RLConfig.grad_accumulation_steps): the
optimizer step over M micro-batches equals the unsplit minibatch's step for PPO-clip and the
decoupled loss with token- and sequence-level MIS masks (whose kept-token count, the loss's
denominator, differs between micro-batches), and the naive average of micro-batch means
does not."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fresh_rl.corrections import MISConfig
from fresh_rl.llm.model import init_params, preset
from fresh_rl.llm.sampler import token_logprobs_and_entropy
from fresh_rl.llm.trainer import (Batch, RLConfig, init_train_state, minibatch_gradient,
                                  policy_loss, update)

MODEL = preset("tiny")
ROWS, WIDTH = 8, 24
BASE = RLConfig(estimator="grpo", num_groups=2, group_size=4, learning_rate=1e-3, minibatches=2)
LOSSES = {
    "ppo_clip": BASE,
    "decoupled_token_mis": dataclasses.replace(BASE, loss="decoupled",
                                               mis=MISConfig(token_bounds=(0.6, 1.6))),
    # sequence-level rules (and a sequence-level TIS weight) act on whole rows
    "decoupled_sequence_mis": dataclasses.replace(
        BASE, loss="decoupled", tis_cap=1.5, tis_level="sequence",
        mis=MISConfig(token_bounds=None, geometric_mean_bounds=(0.8, 1.25))),
}


@pytest.fixture(scope="module")
def params():
    # jitted: an eager init dispatches the scanned model's ops one by one (~2.5× the time)
    return jax.jit(init_params, static_argnums=0)(MODEL, jax.random.PRNGKey(0))


@pytest.fixture(scope="module")
def batch(params):
    """Random transcripts with ragged prompts and responses; π_infer = π_θ + noise and
    π_old_train = π_infer + larger per-row and per-token noise, so the MIS rules reject a
    different number of tokens in every row."""
    keys = jax.random.split(jax.random.PRNGKey(1), 6)
    tokens = jax.random.randint(keys[0], (ROWS, WIDTH), 0, MODEL.vocab_size)
    length = jax.random.randint(keys[1], (ROWS, 1), WIDTH // 2, WIDTH + 1)
    prompt = jax.random.randint(keys[2], (ROWS, 1), 2, 6)
    position = jnp.arange(WIDTH)[None]
    mask = position < length
    action_mask = mask & (position >= prompt)
    current, _ = jax.jit(lambda p, t, m: token_logprobs_and_entropy(p, MODEL, t, m))(
        params, tokens, mask)  # one program, not an eager op-by-op forward
    behaviour = jnp.where(action_mask, current + 0.1 * jax.random.normal(keys[3], mask.shape),
                          0.0)
    row_offset = jnp.linspace(-0.4, 0.4, ROWS)[:, None]
    old = jnp.where(action_mask, behaviour + row_offset
                    + 0.4 * jax.random.normal(keys[4], mask.shape), 0.0)
    advantages = jnp.where(action_mask, jax.random.normal(keys[5], (ROWS, 1)), 0.0)
    return Batch(tokens=tokens, mask=mask, action_mask=action_mask,
                 behaviour_log_probs=behaviour, old_logprobs=old, advantages=advantages)


_update = jax.jit(lambda state, batch, config: update(state, batch, jax.random.PRNGKey(2),
                                                      config=config, model_config=MODEL),
                  static_argnums=2)
_gradient = jax.jit(lambda params, batch, config: minibatch_gradient(
    params, batch, config=config, model_config=MODEL), static_argnums=2)
# ∇ of the unsplit loss (:func:`policy_loss`) and its metrics, one program per config and batch
# shape: the reference of the gradient test and of the naive-average test share it
_reference_gradient = jax.jit(jax.grad(lambda params, batch, config: policy_loss(
    params, batch, config=config, model_config=MODEL), has_aux=True), static_argnums=2)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


@pytest.mark.parametrize("steps, field", [(0, "RLConfig.grad_accumulation_steps"),
                                          (1.5, "RLConfig.grad_accumulation_steps"),
                                          (3, "RLConfig.grad_accumulation_steps must divide"),
                                          (8, "RLConfig.grad_accumulation_steps must divide")])
def test_bad_accumulation_steps_name_the_field(steps, field):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(BASE, grad_accumulation_steps=steps)  # minibatch of 4 rows


def test_the_batch_rejects_different_token_counts_per_row(batch):
    """The fixture exercises what accumulation must get right: the decoupled loss's
    denominator (kept tokens) differs between rows, hence between micro-batches."""
    from fresh_rl.corrections import mis_mask
    for name in ("decoupled_token_mis", "decoupled_sequence_mis"):
        kept, _ = mis_mask(batch.old_logprobs - batch.behaviour_log_probs, batch.action_mask,
                           LOSSES[name].mis)
        per_row = np.asarray(kept.sum(axis=1))
        assert 0 < per_row.sum() < int(batch.action_mask.sum()), name
        assert len(np.unique(per_row)) > 2, (name, per_row)


# a weight whose gradient is not at rounding level differs by lr·Δd, Δd ≲ 1e-5: ≤ 1e-8 ≪ atol
def _outside_tolerance(a, b, rtol=1e-5, atol=1e-6):
    return np.abs(b - a) > atol + rtol * np.abs(a)


# metrics are token means (≤ their largest term) of |A·r| ≲ 5 × |Δ log p| ≲ 2·√5000·u·Σ|terms| (≲ 2)
# ≈ 2e-5 per token; counts (clip, MIS) change only if a ratio is within that of a bound: risk noted
METRIC_ATOL = 1e-4

# Each case compiles its programs (~10 s each on a loaded 2-core machine): the default run
# covers every loss once; the rest of the M ∈ {2, 4} product is marked slow.
SLOW = pytest.mark.slow


@pytest.mark.parametrize("name, m", [("decoupled_sequence_mis", 4), ("decoupled_token_mis", 2),
                                     pytest.param("ppo_clip", 2, marks=SLOW),
                                     pytest.param("decoupled_sequence_mis", 2, marks=SLOW)])
def test_accumulated_gradient_equals_the_unsplit_gradient(params, batch, name, m):
    """∇ of the minibatch loss = Σ_m ∇S_m / Σ_m N_m over M micro-batches, against the
    gradient of the unsplit loss (:func:`policy_loss`), and every metric equal."""
    config = dataclasses.replace(LOSSES[name], minibatches=1)
    reference, ref_metrics = _reference_gradient(params, batch, config)
    scale = max(np.abs(g).max() for g in _leaves(reference))
    assert scale > 1e-3  # not a vanishing gradient: the scale-relative atol below is not ~0
    grads, metrics = _gradient(params, batch, dataclasses.replace(config,
                                                                  grad_accumulation_steps=m))
    for a, b in zip(_leaves(reference), _leaves(grads)):
        # other micro-batch shapes, other programs: √(2·5000 chained terms)·u ≈ 6e-6 of the scale
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5 * scale)
    assert set(metrics) == set(ref_metrics)
    for key, value in ref_metrics.items():
        np.testing.assert_allclose(float(metrics[key]), float(value), rtol=1e-5, atol=METRIC_ATOL,
                                   err_msg=key)


def test_averaging_micro_batch_means_is_not_the_minibatch_gradient(params, batch):
    """The naive accumulation 1/M Σ_m ∇(S_m/N_m) is off by far more than the tolerance of the
    test above (the kept-token counts N_m differ), so that test can fail."""
    config = dataclasses.replace(LOSSES["decoupled_token_mis"], minibatches=1)
    grad_mean = lambda p, b: _reference_gradient(p, b, config)[0]  # noqa: E731
    reference = grad_mean(params, batch)
    scale = max(np.abs(g).max() for g in _leaves(reference))
    pairs = [jax.tree_util.tree_map(lambda x: x[i:i + 2], batch) for i in range(0, ROWS, 2)]
    naive = jax.tree_util.tree_map(lambda *g: sum(g) / len(g),
                                   *[grad_mean(params, b) for b in pairs])
    naive_error = max(np.abs(a - n).max() for a, n in zip(_leaves(reference), _leaves(naive)))
    assert naive_error > 1e-2 * scale, naive_error  # 10^3 × the rounding bound above


@pytest.fixture(scope="module")
def unsplit_updates(params, batch):
    """The M = 1 update of each loss, computed once."""
    return {name: _update(init_train_state(config, params), batch, config)
            for name, config in LOSSES.items()}


@pytest.mark.parametrize("name, m", [(name, 4) for name in sorted(LOSSES)]
                         + [pytest.param(name, 2, marks=SLOW) for name in sorted(LOSSES)])
def test_accumulated_update_equals_the_unsplit_update(params, batch, unsplit_updates, name, m):
    """Two AdamW steps (2 minibatches of 4 rows) with M = 1, 2, 4: the same step count, every
    metric equal, and the parameters equal within rtol 1e-5 / atol 1e-6 except for a handful
    of weights (< 0.1 %): Adam's first steps are lr·g/(|g| + ε), so a weight whose gradient
    is at the float-rounding level (|g| ≲ 1e-6 max|g|, where the split and unsplit sums
    differ in their last bits) moves by O(lr) in either run. The gradients themselves agree
    to float precision (test above)."""
    config = LOSSES[name]
    ref_state, ref_metrics = unsplit_updates[name]
    assert float(ref_metrics["grad_norm"]) > 0
    total = sum(a.size for a in _leaves(params))
    moved = sum(int((a != b).sum()) for a, b in zip(_leaves(params), _leaves(ref_state.params)))
    assert moved > total // 2  # the update moved the parameters
    new_state, metrics = _update(init_train_state(config, params), batch,
                                 dataclasses.replace(config, grad_accumulation_steps=m))
    assert int(new_state.step) == int(ref_state.step) == config.epochs * config.minibatches
    outside = sum(int(_outside_tolerance(a, b).sum())
                  for a, b in zip(_leaves(ref_state.params), _leaves(new_state.params)))
    assert outside < 1e-3 * total, (outside, total)
    assert set(metrics) == set(ref_metrics)
    for key, value in ref_metrics.items():  # every metric, not only the token means
        np.testing.assert_allclose(float(metrics[key]), float(value), rtol=1e-5,
                                   atol=METRIC_ATOL, err_msg=key)
