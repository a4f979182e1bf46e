"""The three papers composed in one LLM run: the VACO loss (fresh_rl.llm.policy_losses), the
FreshPER age-decayed replay buffer (fresh_rl.llm.replay_trainer) and the revised PPO-EWMA
old-log-prob route (fresh_rl.corrections.routes), at the ci scale of the FreshPER study; the
loss × route check over every pair; VACO's critic-free realignment on a hand-made batch."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from fresh_rl.corrections import VACOConfig, vaco_policy_loss
from fresh_rl.corrections.routes import FACTORIAL_ROUTES, ROUTES
from fresh_rl.llm import async_pipeline as ap
from fresh_rl.llm import replay_trainer as rt
from fresh_rl.llm.model import preset
from fresh_rl.llm.policy_losses import BUILTIN_LOSSES, get_loss, vaco_realign
from fresh_rl.llm.presets import FRESHPER_SCALES, TASKS, WARM_START
from fresh_rl.llm.trainer import Batch, loss_terms
from fresh_rl.llm.warm_start import restore_params

MODEL = preset("tiny")
ENV = TASKS["arithmetic"]
CONFIG = dataclasses.replace(FRESHPER_SCALES["ci"].rl, loss="vaco")  # REINFORCE++, 2 × 4 episodes
PIPELINE = ap.AsyncConfig(staleness_window=1, old_logit_route="ewma")
REPLAY = rt.LLMReplayConfig(replay_updates=1, capacity=32, sampling="freshper", age_decay_tau=4.0)


def test_vaco_with_freshper_replay_and_the_ewma_route():
    params = restore_params(WARM_START, MODEL)
    state, history = rt.train_loop(CONFIG, PIPELINE, REPLAY, 0, 2, params=params, env=ENV,
                                   model_config=MODEL)
    for name in ("loss", "replay/loss", "grad_norm"):
        assert np.all(np.isfinite(history[name])), name
    # VACO: the filter's masked fraction and the realignment weight min(ρ̄ = 1, π_ref/π_infer)
    assert np.all((history["mask_fraction"] >= 0) & (history["mask_fraction"] <= 1))
    assert np.all((history["realign_weight_mean"] > 0) & (history["realign_weight_mean"] <= 1))
    assert np.all(history["clip_fraction"] == 0.0)  # VACO clips nothing
    # the EWMA route: one forward of θ_ref, one more when it resets; the counter adds the resets
    np.testing.assert_array_equal(history["old_logit_forwards"], 1 + history["ewma_reset"])
    np.testing.assert_array_equal(history["ewma_reset_count"], np.cumsum(history["ewma_reset"]))
    assert state.pipeline.ewma is not None
    # staleness: iteration 1 is sampled by version 0 (W = 1)
    np.testing.assert_array_equal(history["lag/version_gap_mean"], [0.0, 1.0])
    # FreshPER: one replay update per iteration; iteration 0 replays its own batch (age 0),
    # iteration 1 the version-0 trajectories, one version old
    np.testing.assert_array_equal(history["replay/updates"], [1.0, 1.0])
    np.testing.assert_array_equal(history["buffer_size"], [8.0, 16.0])
    assert history["replay/age_mean"][0] == 0.0 and history["replay/age_mean"][1] > 0.0
    np.testing.assert_array_equal(history["age_decay_tau"], [4.0, 4.0])
    assert int(state.pipeline.ring.latest_version) == 2


@pytest.mark.parametrize("loss", BUILTIN_LOSSES)
def test_every_loss_and_route_pair_builds_or_names_both_fields(loss):
    """Building the pipeline's and the replay trainer's iteration (no compilation) either
    succeeds or raises a ValueError naming RLConfig.loss and AsyncConfig.old_logit_route."""
    config = dataclasses.replace(CONFIG, loss=loss)
    built = []
    for route in ROUTES:
        async_config = ap.AsyncConfig(staleness_window=1, old_logit_route=route)
        try:
            ap.make_iteration(config, async_config, ENV, MODEL)
            rt.make_iteration(config, async_config, REPLAY, ENV, MODEL)
        except ValueError as error:
            assert f"RLConfig.loss={loss!r}" in str(error), str(error)
            assert f"AsyncConfig.old_logit_route={route!r}" in str(error), str(error)
        else:
            built.append(route)
    proxies = {"linear_proxy", "loglinear_proxy"}
    # the factorial routes: the async pipeline runs them with decoupled, the replay trainer refuses them
    serving = [r for r in ROUTES if r not in FACTORIAL_ROUTES]
    expected = {"ppo_clip": ["behaviour"], "decoupled": serving,
                "vaco": [r for r in serving if r not in proxies]}[loss]
    assert built == expected


def _batch(old, behaviour, advantages, mask):
    arrays = [jnp.asarray(x, jnp.float32) for x in (old, behaviour, advantages)]
    mask = jnp.asarray(mask, bool)
    zeros = jnp.zeros(mask.shape, jnp.int32)
    return Batch(tokens=zeros, mask=mask, action_mask=mask, behaviour_log_probs=arrays[1],
                 old_logprobs=arrays[0], advantages=arrays[2])


def test_vaco_realignment_is_the_truncated_weight_times_the_advantage():
    """Â' = min(ρ̄, π_ref/π_infer)·Â on the action tokens (V-trace with V ≡ 0, γ = 0), 0 off
    them; with reference="behaviour" the weight is 1."""
    w = np.array([[0.5, 1.0, 2.0, 4.0], [3.0, 0.25, 1.0, 1.0]])
    behaviour = np.log(np.full(w.shape, 0.2))
    old = behaviour + np.log(w)
    adv = np.array([[1.0, -2.0, 3.0, -1.0], [2.0, 2.0, -1.0, 5.0]])
    mask = np.array([[True, True, True, True], [True, True, True, False]])
    batch = _batch(old, behaviour, adv, mask)
    for rho_bar in (1.0, 2.5, np.inf):
        config = dataclasses.replace(CONFIG, vaco_rho_bar=rho_bar)
        realigned, metrics = vaco_realign(batch, config)
        expected = np.where(mask, np.minimum(rho_bar, w) * adv, 0.0)
        # float32 exp(log w) and one product: a few ulps of values ≤ 20
        np.testing.assert_allclose(realigned.advantages, expected, rtol=1e-5, atol=1e-6)
        # float32 means of ≤ 7 values
        assert float(metrics["realign_weight_mean"]) == pytest.approx(
            np.minimum(rho_bar, w)[mask].mean(), rel=1e-5)
        assert float(metrics["realign_truncated_fraction"]) == pytest.approx(
            (w[mask] > rho_bar * (1 + 1e-6)).mean())
    behaviour_ref = dataclasses.replace(CONFIG, vaco=VACOConfig(reference="behaviour"))
    realigned, _ = vaco_realign(batch, behaviour_ref)
    np.testing.assert_allclose(realigned.advantages, np.where(mask, adv, 0.0), rtol=1e-6)


def test_vaco_loss_terms_are_vaco_policy_loss_over_the_valid_tokens():
    """The registry entry's token sum / count is the library loss (mean over valid tokens),
    with the TV filter on (δ = 0.1 < D̂); the metrics every LLM loss reports are there."""
    old = np.log(np.array([[0.2, 0.3, 0.1], [0.4, 0.2, 0.3]]))
    behaviour = old - 0.05
    logp = old + np.log(np.array([[2.0, 0.5, 1.0], [2.0, 0.5, 1.2]]))
    adv = np.array([[1.0, -1.0, 1.0], [-1.0, 1.0, 0.5]])
    mask = np.array([[True, True, True], [True, True, False]])
    config = dataclasses.replace(CONFIG, vaco=VACOConfig(delta=0.1))
    batch = _batch(old, behaviour, adv, mask)
    logp = jnp.asarray(logp, jnp.float32)
    total, count, metrics = loss_terms(logp, jnp.zeros_like(logp), batch, config=config)
    expected, reference = vaco_policy_loss(logp, batch.old_logprobs, batch.behaviour_log_probs,
                                           batch.advantages, batch.action_mask,
                                           config=config.vaco)
    assert float(count) == 5.0
    # total = loss·N then / N: two float32 roundings
    assert float(total / count) == pytest.approx(float(expected), rel=1e-6)
    assert float(reference["filter_on"]) == 1.0 and 0 < float(metrics["mask_fraction"]) < 1
    for key in ("loss", "active_token_fraction", "clip_fraction", "kl_k3", "ess"):
        assert key in metrics, key
    assert float(metrics["active_token_fraction"]) == pytest.approx(
        1 - float(metrics["mask_fraction"]))
    assert not get_loss("vaco").splits_by_rows and get_loss("decoupled").accepts_proximal
