"""Actor-critic networks (flax.linen) and the log-prob / entropy / sampling of their policies.

Two independent towers (no shared torso, our choice, as in most continuous-control PPO
setups): the actor maps an observation to a :class:`PolicyOutput`, the critic to a scalar
V(s). Each tower is an MLP on vector observations ``[D]`` (``encoder="mlp"``); on image
observations ``[H, W, C]`` (``encoder="cnn"``) it first applies ``len(conv_channels)``
convolutions (``conv_kernel_size`` square kernels, stride 1, VALID padding, the tower's
activation) and flattens, then the MLP. This is the MinAtar network (Young & Tian, arXiv
1903.03176 §4: one 3×3 conv with 16 channels, stride 1, then a 128-unit dense layer, ReLU);
the default sizes here are our choice (``conv_channels=(16,)``, ``conv_kernel_size=3``, the
MLP's ``hidden_sizes``), and each tower has its own convolution (our choice, as for the MLP).

* **Discrete** (categorical) policy: ``loc`` holds the logits ``z``; ``log_std`` is ``None``::

      log π(a|s) = z_a − log Σ_b e^{z_b},     H = −Σ_a π_a log π_a

* **Continuous** (diagonal Gaussian, state-independent log-std, VACO/PPO convention):
  ``loc`` is the mean μ(s) and ``log_std`` a learned vector ``log σ`` (one per action dim,
  broadcast over the batch)::

      log π(a|s) = Σ_i [ −½ ((a_i − μ_i)/σ_i)² − log σ_i − ½ log 2π ]
      H          = Σ_i [ ½ + ½ log 2π + log σ_i ]

  Actions are sampled unbounded; the env adapter clips them to the action box before the
  environment sees them and log-probs are those of the unclipped sample (our choice, the
  usual PPO practice; no tanh squashing).

Initialisation (our choice): orthogonal, gain √2 on hidden and convolution layers, 0.01 on the
policy head, 1.0 on the value head, zero biases; initial log-std ``init_log_std`` (default 0 ⇒
σ = 1). A convolution kernel ``[k, k, C_in, C_out]`` is orthogonal as the matrix
``[k·k·C_in, C_out]`` (flax's ``orthogonal`` convention: every axis but the last is fan-in).
``net.init`` draws each kernel with flax's own key per parameter; :func:`init_params` makes the
same distribution (exactly orthogonal kernels, same gains) from ONE normal draw and one batched
QR per distinct kernel shape, which keeps the trainer's compiled program small (flax's path costs
a Threefry body per key derivation and per draw: ~⅓ of the program's HLO).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu}
ENCODERS: tuple[str, ...] = ("mlp", "cnn")
OBS_RANK = {"mlp": 1, "cnn": 3}
"""Observation rank each encoder takes: ``[D]`` for the MLP, ``[H, W, C]`` for the CNN."""
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


@struct.dataclass
class PolicyOutput:
    """Parameters of π(·|s) for a batch ``[...]`` of observations.

    Attributes:
      loc: ``[..., A]`` logits (discrete) or Gaussian means (continuous).
      log_std: ``None`` (discrete) or ``[A]`` / ``[..., A]`` Gaussian log-std.
    """

    loc: jax.Array
    log_std: Optional[jax.Array] = None

    @property
    def discrete(self) -> bool:
        return self.log_std is None


def _conv_encoder(x, channels, kernel_size, activation, name):
    """VALID stride-1 convolutions over ``[..., H, W, C]``, then flatten the last three axes."""
    act = ACTIVATIONS[activation]
    for i, width in enumerate(channels):
        x = nn.Conv(width, (kernel_size, kernel_size), padding="VALID",
                    kernel_init=nn.initializers.orthogonal(np.sqrt(2.0)),
                    bias_init=nn.initializers.zeros, name=f"{name}_conv_{i}")(x)
        x = act(x)
    return x.reshape(*x.shape[:-3], -1)


def conv_output_size(size: int, num_layers: int, kernel_size: int) -> int:
    """Spatial size after ``num_layers`` VALID stride-1 convolutions: ``size − L·(k − 1)``."""
    return size - num_layers * (kernel_size - 1)


def _mlp(x, hidden_sizes, activation, out_dim, out_gain, name):
    act = ACTIVATIONS[activation]
    for i, width in enumerate(hidden_sizes):
        x = nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2.0)),
                     bias_init=nn.initializers.zeros, name=f"{name}_hidden_{i}")(x)
        x = act(x)
    return nn.Dense(out_dim, kernel_init=nn.initializers.orthogonal(out_gain),
                    bias_init=nn.initializers.zeros, name=f"{name}_out")(x)


class ActorCritic(nn.Module):
    """``apply(params, obs) → (PolicyOutput, value)`` for obs ``[..., obs_dim]`` (``encoder="mlp"``)
    or ``[..., H, W, C]`` (``encoder="cnn"``); value ``[...]``.

    Attributes:
      action_dim: number of discrete actions, or the continuous action dimension.
      discrete: categorical (True) or Gaussian (False) policy.
      hidden_sizes: widths of the hidden layers of each tower's MLP.
      activation: "tanh" or "relu" (every hidden and convolution layer).
      init_log_std: initial log σ of the Gaussian policy.
      encoder: "mlp" (vector observations) or "cnn" (image observations).
      conv_channels: output channels of each convolution (``encoder="cnn"`` only).
      conv_kernel_size: side k of the square convolution kernels (``encoder="cnn"`` only).
    """

    action_dim: int
    discrete: bool
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    init_log_std: float = 0.0
    encoder: str = "mlp"
    conv_channels: Sequence[int] = (16,)
    conv_kernel_size: int = 3

    def _tower(self, obs, out_dim, out_gain, name):
        if self.encoder == "cnn":
            obs = _conv_encoder(obs, self.conv_channels, self.conv_kernel_size, self.activation, name)
        return _mlp(obs, self.hidden_sizes, self.activation, out_dim, out_gain, name)

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[PolicyOutput, jax.Array]:
        obs = obs.astype(jnp.float32)
        loc = self._tower(obs, self.action_dim, 0.01, "actor")
        value = self._tower(obs, 1, 1.0, "critic")[..., 0]
        if self.discrete:
            return PolicyOutput(loc=loc), value
        log_std = self.param("log_std", nn.initializers.constant(self.init_log_std), (self.action_dim,))
        return PolicyOutput(loc=loc, log_std=log_std), value


def _gain(layer_name: str) -> float:
    if "_hidden_" in layer_name or "_conv_" in layer_name:
        return float(np.sqrt(2.0))
    return 0.01 if layer_name.startswith("actor") else 1.0


def _matrix_shape(kernel_shape: tuple[int, ...]) -> tuple[int, int]:
    """``(fan_in, fan_out)`` of a dense ``[n_in, n_out]`` or conv ``[k, k, C_in, C_out]`` kernel."""
    return math.prod(kernel_shape[:-1]), kernel_shape[-1]


def init_params(net: ActorCritic, key: chex.PRNGKey, obs: jax.Array):
    """Parameters with the same tree, shapes and distribution as ``net.init(key, obs)`` (orthogonal
    kernels, zero biases, constant log-std), built with one ``jax.random.normal`` call for all
    kernels and one (batched) QR per distinct kernel shape.

    Kernel ``[n_in, n_out]`` = gain · Q (transposed when n_in < n_out) with ``A = Q R`` the QR of a
    standard normal ``max(n_in, n_out) × min(n_in, n_out)`` matrix and Q's columns signed by
    ``sign(diag R)``: Haar-distributed, exactly orthogonal columns (rows) — the construction of
    ``jax.nn.initializers.orthogonal``, only the random stream differs. A convolution kernel
    ``[k, k, C_in, C_out]`` is made as the matrix ``[k·k·C_in, C_out]`` and reshaped back.
    """
    shapes = jax.eval_shape(net.init, jax.random.PRNGKey(0), obs)
    params = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    inner = dict(params["params"])
    kernels = sorted(name for name, leaf in inner.items() if isinstance(leaf, dict) and "kernel" in leaf)
    if not kernels:
        return params
    # group kernels by the matrix whose QR makes them, draw every matrix at once
    groups: dict[tuple[int, int], list[str]] = {}
    for name in kernels:
        n_in, n_out = _matrix_shape(inner[name]["kernel"].shape)
        groups.setdefault((max(n_in, n_out), min(n_in, n_out)), []).append(name)
    sizes = [len(names) * rows * cols for (rows, cols), names in groups.items()]
    flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
    offset = 0
    for ((rows, cols), names), size in zip(groups.items(), sizes):
        a = flat[offset:offset + size].reshape(len(names), rows, cols)
        offset += size
        q, r = jnp.linalg.qr(a)  # reduced: q [n, rows, cols]
        q = q * jnp.sign(jnp.diagonal(r, axis1=-2, axis2=-1))[:, None, :]
        for i, name in enumerate(names):
            shape = inner[name]["kernel"].shape
            n_in, n_out = _matrix_shape(shape)
            kernel = (q[i] if n_in >= n_out else q[i].T).reshape(shape)
            inner[name] = {**inner[name], "kernel": (_gain(name) * kernel).astype(inner[name]["kernel"].dtype)}
    if "log_std" in inner:
        inner["log_std"] = jnp.full(inner["log_std"].shape, net.init_log_std, inner["log_std"].dtype)
    return {**params, "params": inner}


def log_prob(policy: PolicyOutput, actions: chex.Array) -> jax.Array:
    """``log π(a|s)``, shape ``[...]``. Discrete ``actions`` are int ``[...]``; continuous ``[..., A]``."""
    if policy.discrete:
        logp_all = jax.nn.log_softmax(policy.loc, axis=-1)
        return jnp.take_along_axis(logp_all, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]
    log_std = jnp.broadcast_to(policy.log_std, policy.loc.shape)
    z = (actions - policy.loc) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * jnp.square(z) - log_std - _HALF_LOG_2PI, axis=-1)


def entropy(policy: PolicyOutput) -> jax.Array:
    """``H[π(·|s)]``, shape ``[...]`` (formulas in the module docstring)."""
    if policy.discrete:
        logp_all = jax.nn.log_softmax(policy.loc, axis=-1)
        return -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    log_std = jnp.broadcast_to(policy.log_std, policy.loc.shape)
    return jnp.sum(0.5 + _HALF_LOG_2PI + log_std, axis=-1)


def mode(policy: PolicyOutput) -> jax.Array:
    """The most likely action: ``argmax_a z_a`` (int32 ``[...]``) or the Gaussian mean ``[..., A]``."""
    if policy.discrete:
        return jnp.argmax(policy.loc, axis=-1).astype(jnp.int32)
    return policy.loc


def sample(key: chex.PRNGKey, policy: PolicyOutput) -> jax.Array:
    """One action per batch entry: int32 ``[...]`` (discrete) or float ``[..., A]`` (continuous)."""
    if policy.discrete:
        return jax.random.categorical(key, policy.loc, axis=-1).astype(jnp.int32)
    noise = jax.random.normal(key, policy.loc.shape, policy.loc.dtype)
    return policy.loc + jnp.exp(policy.log_std) * noise
