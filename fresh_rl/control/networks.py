"""Actor-critic MLPs (flax.linen) and the log-prob / entropy / sampling of their policies.

Two independent MLP towers (no shared torso, our choice, as in most continuous-control PPO
setups): the actor maps an observation to a :class:`PolicyOutput`, the critic to a scalar
V(s).

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

Initialisation (our choice): orthogonal, gain √2 on hidden layers, 0.01 on the policy head,
1.0 on the value head, zero biases; initial log-std ``init_log_std`` (default 0 ⇒ σ = 1).
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


def _mlp(x, hidden_sizes, activation, out_dim, out_gain, name):
    act = ACTIVATIONS[activation]
    for i, width in enumerate(hidden_sizes):
        x = nn.Dense(width, kernel_init=nn.initializers.orthogonal(np.sqrt(2.0)),
                     bias_init=nn.initializers.zeros, name=f"{name}_hidden_{i}")(x)
        x = act(x)
    return nn.Dense(out_dim, kernel_init=nn.initializers.orthogonal(out_gain),
                    bias_init=nn.initializers.zeros, name=f"{name}_out")(x)


class ActorCritic(nn.Module):
    """``apply(params, obs) → (PolicyOutput, value)`` for obs ``[..., obs_dim]``; value ``[...]``.

    Attributes:
      action_dim: number of discrete actions, or the continuous action dimension.
      discrete: categorical (True) or Gaussian (False) policy.
      hidden_sizes: widths of the hidden layers of each tower.
      activation: "tanh" or "relu".
      init_log_std: initial log σ of the Gaussian policy.
    """

    action_dim: int
    discrete: bool
    hidden_sizes: Sequence[int] = (64, 64)
    activation: str = "tanh"
    init_log_std: float = 0.0

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[PolicyOutput, jax.Array]:
        obs = obs.astype(jnp.float32)
        loc = _mlp(obs, self.hidden_sizes, self.activation, self.action_dim, 0.01, "actor")
        value = _mlp(obs, self.hidden_sizes, self.activation, 1, 1.0, "critic")[..., 0]
        if self.discrete:
            return PolicyOutput(loc=loc), value
        log_std = self.param("log_std", nn.initializers.constant(self.init_log_std), (self.action_dim,))
        return PolicyOutput(loc=loc, log_std=log_std), value


def _gain(layer_name: str) -> float:
    if "_hidden_" in layer_name:
        return float(np.sqrt(2.0))
    return 0.01 if layer_name.startswith("actor") else 1.0


def init_params(net: ActorCritic, key: chex.PRNGKey, obs: jax.Array):
    """Parameters with the same tree, shapes and distribution as ``net.init(key, obs)`` (orthogonal
    kernels, zero biases, constant log-std), built with one ``jax.random.normal`` call for all
    kernels and one (batched) QR per distinct kernel shape.

    Kernel ``[n_in, n_out]`` = gain · Q (transposed when n_in < n_out) with ``A = Q R`` the QR of a
    standard normal ``max(n_in, n_out) × min(n_in, n_out)`` matrix and Q's columns signed by
    ``sign(diag R)``: Haar-distributed, exactly orthogonal columns (rows) — the construction of
    ``jax.nn.initializers.orthogonal``, only the random stream differs.
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
        n_in, n_out = inner[name]["kernel"].shape
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
            kernel = q[i] if shape[0] >= shape[1] else q[i].T
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


def sample(key: chex.PRNGKey, policy: PolicyOutput) -> jax.Array:
    """One action per batch entry: int32 ``[...]`` (discrete) or float ``[..., A]`` (continuous)."""
    if policy.discrete:
        return jax.random.categorical(key, policy.loc, axis=-1).astype(jnp.int32)
    noise = jax.random.normal(key, policy.loc.shape, policy.loc.dtype)
    return policy.loc + jnp.exp(policy.log_std) * noise
