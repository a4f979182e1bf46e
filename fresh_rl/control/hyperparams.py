"""The traced hyperparameters of the control trainer as one pytree.

:class:`HyperParams` holds every value of :func:`fresh_rl.control.train.train` that may vary
inside one compiled program: ``jax.vmap(train, (None, 0, 0))`` over keys and a stacked
``HyperParams`` runs a seeds × values grid from a single compilation. The matching
:class:`~fresh_rl.control.train.TrainConfig` field is only the *default*:
:meth:`HyperParams.from_config` copies it, and the trainer always reads the traced leaf.
Settings that change shapes or the program's structure (network, env, batch layout, loss
variants) stay static in the config.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fresh_rl.validation import is_traced, require_in_range

if TYPE_CHECKING:  # annotation only: train.py imports this module
    from fresh_rl.control.train import TrainConfig


@struct.dataclass
class HyperParams:
    """Sweepable hyperparameters (scalars for one run, ``[N]`` arrays for a vmapped grid).

    Attributes (default = the config field in brackets):
      lag: int32, the fixed backward lag k of every actor group [``delay.lag``]; differs from
        the default only with ``delay.kind == "fixed"``, range [0, ``delay.ring_size`` − 1].
      vaco_delta: δ of VACO's TV filter (VACO, arXiv 2603.01365; docs/vaco.md), in (0, ∞]
        [``vaco.delta``]; read under ``vaco.threshold_convention``.
      learning_rate: Adam step size, in (0, ∞) [``learning_rate``].
      entropy_coef, value_coef: c_ent, c_v of ``L = L_π + c_v·½·MSE − c_ent·H``, in [0, ∞).
      kl_coef: PPO-KL's β (the initial β with ``kl_adaptive``), in [0, ∞) [``kl_coef``].
      gamma: discount γ of GAE and V-trace, in [0, 1] [``gamma``].
    """

    lag: jax.Array
    vaco_delta: jax.Array
    learning_rate: jax.Array
    entropy_coef: jax.Array
    value_coef: jax.Array
    kl_coef: jax.Array
    gamma: jax.Array

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names of the sweepable leaves, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @staticmethod
    def dtype(name: str):
        """``jnp.int32`` for ``lag``, ``jnp.float32`` for every other leaf."""
        return jnp.int32 if name == "lag" else jnp.float32

    @classmethod
    def from_config(cls, config: "TrainConfig") -> "HyperParams":
        """Scalar leaves holding the config's values (the defaults)."""
        defaults = dict(lag=config.delay.lag, vaco_delta=config.vaco.delta,
                        learning_rate=config.learning_rate, entropy_coef=config.entropy_coef,
                        value_coef=config.value_coef, kl_coef=config.kl_coef, gamma=config.gamma)
        return cls(**{n: jnp.asarray(v, cls.dtype(n)) for n, v in defaults.items()})

    @classmethod
    def from_grid(cls, config: "TrainConfig", values: Mapping[str, Sequence],
                  size: Optional[int] = None) -> "HyperParams":
        """``[N]`` leaves for an N-point grid: ``values[name]`` where swept, the config default
        broadcast elsewhere (e.g. ``from_grid(config, product_grid(...).values)``). ``size``
        = N, needed only when nothing is swept."""
        unknown = sorted(set(values) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"unknown HyperParams fields {unknown}; allowed: {cls.field_names()}")
        sizes = {len(v) for v in values.values()} | ({size} if size is not None else set())
        if len(sizes) != 1:
            raise ValueError(f"every swept field (and size) needs one number of points, got {sorted(sizes)}")
        (n,) = sizes
        base = cls.from_config(config)
        return cls(**{name: jnp.asarray(values[name], cls.dtype(name)) if name in values
                      else jnp.broadcast_to(getattr(base, name), (n,)) for name in cls.field_names()})

    def validate(self, config: "TrainConfig") -> None:
        """Host-side range checks of every concrete leaf (traced leaves are skipped: the
        trainer clips a traced lag to [0, K − 1]). ``ValueError`` names the field and range."""
        top = config.delay.ring_size - 1
        ranges = {
            "lag": (0, top, True, True),
            "vaco_delta": (0.0, math.inf, False, True),
            "learning_rate": (0.0, math.inf, False, False),
            "entropy_coef": (0.0, math.inf, True, False),
            "value_coef": (0.0, math.inf, True, False),
            "kl_coef": (0.0, math.inf, True, False),
            "gamma": (0.0, 1.0, True, True),
        }
        for name, (low, high, low_in, high_in) in ranges.items():
            leaf = getattr(self, name)
            if is_traced(leaf):
                continue
            values = np.asarray(leaf)
            if name == "lag":
                if not np.issubdtype(values.dtype, np.integer):
                    raise ValueError(f"HyperParams.lag must be an integer in [0, {top}], got dtype {values.dtype}")
                if config.delay.kind != "fixed" and np.any(values != config.delay.lag):
                    raise ValueError(f"HyperParams.lag needs delay.kind='fixed', got {config.delay.kind!r}")
            for value in np.unique(values):
                require_in_range(f"HyperParams.{name}", value.item(), low, high,
                                 low_inclusive=low_in, high_inclusive=high_in)
