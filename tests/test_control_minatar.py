"""Image observations: the CNN encoder on gymnax MinAtar (``Breakout-MinAtar``, obs [10, 10, 4]).

* PPO-clip trains a few iterations on Breakout-MinAtar with observation normalisation:
  finite metrics, per-pixel statistics, conv parameters of the configured shape.
* The CNN tower equals a NumPy VALID convolution + ReLU + flatten + MLP.
* ``init_params`` gives conv kernels orthogonal as ``[k·k·C_in, C_out]`` matrices with gain √2.
* The encoder is chosen by observation rank; a mismatched encoder raises naming the field.
* The allocation estimate counts the image's pixels.

One trainer program compiled once (module fixture); networks and batches are tiny.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fresh_rl.control import ActorCritic, TrainConfig, train
from fresh_rl.control.hyperparams import allocation_estimate
from fresh_rl.control.networks import init_params

CONFIG = TrainConfig(
    env_name="Breakout-MinAtar", method="ppo_clip", num_envs=4, rollout_length=8,
    total_env_steps=4 * 8 * 2, num_epochs=1, num_minibatches=2, hidden_sizes=(16,), activation="relu",
    conv_channels=(4,), normalize_obs=True, learning_rate=1e-3,
)


@pytest.fixture(scope="module")
def run():
    return jax.jit(train, static_argnums=0)(CONFIG, jax.random.PRNGKey(0))


def test_ppo_clip_trains_on_breakout_minatar(run):
    assert CONFIG.encoder_used == "cnn"
    n = CONFIG.num_iterations
    for name, value in run.metrics.items():
        value = np.asarray(value)
        assert value.shape == (n,), name
        assert np.all(np.isfinite(value)), name
    assert float(np.min(run.metrics["loss/grad_norm"])) > 0
    p = run.params["params"]
    for tower in ("actor", "critic"):
        assert p[f"{tower}_conv_0"]["kernel"].shape == (3, 3, 4, 4)
        assert p[f"{tower}_hidden_0"]["kernel"].shape == (8 * 8 * 4, 16)
    assert p["actor_out"]["kernel"].shape == (16, 3)  # Breakout: 3 actions
    stats = run.state.env_state.obs_stats
    assert stats.mean.shape == (10, 10, 4)
    assert float(stats.count) == 4 + 4 * 8 * n  # first reset batch + every successor
    assert run.state.obs.shape == (4, 10, 10, 4)


def _numpy_tower(p, obs, name):
    """VALID 3×3 conv (cross-correlation, as flax/XLA) + ReLU, flatten, dense + ReLU, dense."""
    k = np.asarray(p[f"{name}_conv_0"]["kernel"], np.float64)
    kh, kw = k.shape[:2]
    h_out, w_out = obs.shape[1] - kh + 1, obs.shape[2] - kw + 1
    x = np.zeros((obs.shape[0], h_out, w_out, k.shape[-1]))
    for i in range(h_out):
        for j in range(w_out):
            x[:, i, j] = np.einsum("nabc,abcd->nd", obs[:, i:i + kh, j:j + kw], k)
    x = np.maximum(x + np.asarray(p[f"{name}_conv_0"]["bias"]), 0.0).reshape(obs.shape[0], -1)
    x = np.maximum(x @ np.asarray(p[f"{name}_hidden_0"]["kernel"], np.float64) + p[f"{name}_hidden_0"]["bias"], 0.0)
    return x @ np.asarray(p[f"{name}_out"]["kernel"], np.float64) + p[f"{name}_out"]["bias"]


def test_cnn_tower_matches_numpy(run):
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32) * 0.3, run.params)
    obs = rng.integers(0, 2, size=(3, 10, 10, 4)).astype(np.float32)
    policy, value = jax.jit(CONFIG.network().apply)(params, obs)
    # float32 conv (36 terms) → dense (256) → dense (16), |w| ≈ 0.24: typical √n·u·Σ|terms| errors
    # ≈ 3e-6, 4e-5, 5e-5 at the outputs (|out| ~ 2), inside atol 1e-4 + rtol 1e-4·|out|
    np.testing.assert_allclose(policy.loc, _numpy_tower(params["params"], obs, "actor"), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(value, _numpy_tower(params["params"], obs, "critic")[:, 0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("obs_shape, channels", [((10, 10, 4), 16), ((5, 5, 1), 16)])
def test_init_params_conv_kernels_are_orthogonal_with_gain_sqrt2(obs_shape, channels):
    """[3·3·4, 16] has orthogonal columns, [3·3·1, 16] orthogonal rows; each squared norm 2."""
    net = ActorCritic(action_dim=3, discrete=True, hidden_sizes=(8,), encoder="cnn", conv_channels=(channels,))
    obs = jnp.zeros((1, *obs_shape))
    params = jax.jit(init_params, static_argnums=0)(net, jax.random.PRNGKey(1), obs)
    flax_shapes = jax.eval_shape(net.init, jax.random.PRNGKey(0), obs)
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(lambda s: s.shape, flax_shapes)
    for tower in ("actor", "critic"):
        kernel = np.asarray(params["params"][f"{tower}_conv_0"]["kernel"], np.float64)
        m = kernel.reshape(-1, kernel.shape[-1])
        gram = m.T @ m if m.shape[0] >= m.shape[1] else m @ m.T
        # float32 Householder QR: |QᵀQ − I| ≲ m·u = 36·6e-8 ≈ 2e-6, × gain² = 2: ≲ 5e-6 < 1e-5
        np.testing.assert_allclose(gram, 2.0 * np.eye(len(gram)), atol=1e-5)
        np.testing.assert_array_equal(params["params"][f"{tower}_conv_0"]["bias"], 0.0)  # zeros: exact
    a, c = (np.asarray(params["params"][f"{t}_conv_0"]["kernel"]) for t in ("actor", "critic"))
    assert not np.allclose(a, c)  # independent draws per tower


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(encoder="mlp"), "encoder"),  # vector encoder on an image task
        (dict(env_name="CartPole-v1", encoder="cnn"), "encoder"),  # CNN on vectors
        (dict(env_name="Catch-bsuite"), "encoder"),  # rank-2 observations: neither encoder
        (dict(encoder="resnet"), "encoder"),
        (dict(conv_kernel_size=11), "conv_kernel_size"),  # 10 × 10 image, one 11 × 11 VALID conv
        (dict(conv_channels=()), "conv_channels"),
        (dict(conv_channels=(0,)), "conv_channels"),
    ],
)
def test_encoder_mismatch_raises_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(CONFIG, **changes)


def test_encoder_auto_follows_the_observation_rank_and_allocation_counts_pixels(run):
    assert dataclasses.replace(CONFIG, env_name="CartPole-v1").encoder_used == "mlp"
    assert dataclasses.replace(CONFIG, encoder="cnn").encoder_used == "cnn"
    estimate = allocation_estimate(CONFIG)
    assert estimate["num_envs*rollout_length"] == 3 * CONFIG.batch_size * (2 * 10 * 10 * 4 + 1 + 5) * 4
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(run.params))
    assert estimate["delay.ring_size"] == (CONFIG.delay.ring_size + 3) * param_bytes
