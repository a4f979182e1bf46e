"""The traced hyperparameters of the control trainer as one pytree.

:class:`HyperParams` holds every value of :func:`fresh_rl.control.train.train` that may vary
inside one compiled program: ``jax.vmap(train, (None, 0, 0))`` over keys and a stacked
``HyperParams`` runs a seeds × values grid from a single compilation. The matching
:class:`~fresh_rl.control.config.TrainConfig` field is only the *default*:
:meth:`HyperParams.from_config` copies it, and the trainer always reads the traced leaf.
Settings that change shapes or the program's structure (network, env, batch layout, loss
variants) stay static in the config.

:meth:`HyperParams.validate` also refuses a run whose big allocations
(:func:`allocation_estimate`: version ring, metric history, rollout batch) exceed
:data:`MAX_ALLOCATION_BYTES`, naming the bytes and the setting responsible, before anything is
allocated or compiled.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from fresh_rl.corrections.ewma import ewma_beta_from_staleness
from fresh_rl.lag.delay import expected_lag
from fresh_rl.replay.methods import EXTRAS, HPARAM_DTYPES, REPLAY_OPTIMIZERS, ReplayHParams, replay_hparams
from fresh_rl.validation import check_in_range, is_traced


MAX_ALLOCATION_BYTES: int = 16 * 2**30
"""Largest :func:`allocation_estimate` total (bytes, all grid points together) that
:meth:`HyperParams.validate` accepts: 16 GiB. Raise it for a bigger machine, per call
(``validate(config, max_bytes=...)``) or for the process (assign this module attribute)."""

METRICS_PER_ITERATION: int = 40
"""Upper bound on the float32 metrics one iteration records (36 for VACO with learner
evaluation, plus the host loop's wall time), used by :func:`allocation_estimate`."""


@functools.lru_cache(maxsize=64)
def _param_bytes(config: "TrainConfig") -> int:
    """Bytes of one copy of the actor-critic parameters (shape evaluation only)."""
    obs = jnp.zeros((1, *config.vec_env.spec.obs_shape), jnp.float32)
    shapes = jax.eval_shape(config.network().init, jax.random.PRNGKey(0), obs)
    return sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(shapes))


def allocation_estimate(config: "TrainConfig", num_runs: int = 1) -> dict[str, int]:
    """Estimated bytes of the big allocations of ``num_runs`` runs of ``config``, keyed by the
    setting that sizes each:

    * ``"delay.ring_size"``: version ring + learner parameters + Adam state, (K + 3) × the
      parameter bytes;
    * ``"total_env_steps"``: metric history, ``num_iterations`` × :data:`METRICS_PER_ITERATION`
      × 4 bytes, twice (the scan's output and the host copy);
    * ``"num_envs*rollout_length"``: rollout batch (obs, next obs, action and five per-step
      scalars, float32), three copies (batch, flattened, shuffled minibatches).
    """
    spec = config.vec_env.spec
    obs_size = int(np.prod(spec.obs_shape))
    action_size = 1 if spec.discrete else spec.action_dim
    per_run = {
        "delay.ring_size": (config.delay.ring_size + 3) * _param_bytes(config),
        "total_env_steps": 2 * config.num_iterations * METRICS_PER_ITERATION * 4,
        "num_envs*rollout_length": 3 * config.batch_size * (2 * obs_size + action_size + 5) * 4,
    }
    if config.data_source_spec.buffered:  # N·H rows of T steps: obs, next obs, action, 6 scalars
        per_run["replay.buffer_iterations"] = (config.num_envs * config.replay.buffer_iterations
                                               * config.rollout_length * (2 * obs_size + action_size + 6) * 4)
    return {name: num_runs * value for name, value in per_run.items()}


def _require_allocation(config: "TrainConfig", num_runs: int, max_bytes: int) -> None:
    estimate = allocation_estimate(config, num_runs)
    total = sum(estimate.values())
    if total <= max_bytes:
        return
    setting, largest = max(estimate.items(), key=lambda item: item[1])
    values = {"delay.ring_size": config.delay.ring_size, "total_env_steps": config.total_env_steps,
              "num_envs*rollout_length": config.batch_size,
              "replay.buffer_iterations": config.replay.buffer_iterations}
    raise ValueError(
        f"{setting} = {values[setting]} needs about {largest:,} bytes ({largest / 2**30:.1f} GiB) "
        f"for {num_runs} run(s); all estimated allocations: {total:,} bytes > the limit "
        f"{max_bytes:,} (fresh_rl.control.hyperparams.MAX_ALLOCATION_BYTES)")


_REPLAY_LEAVES = {"replay_extra": "extra", "age_decay_tau": "age_decay_tau",
                  "importance_exponent": "importance_exponent", "uniform_priority": "uniform_priority",
                  "insert_at_max": "insert_at_max", "refresh_priorities": "refresh",
                  "replay_optimizer": "replay_optimizer"}
"""HyperParams leaf → :class:`~fresh_rl.replay.methods.ReplayHParams` field."""


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
      route: int32 index into ``config.routes_used`` of the old-log-prob route
        [``route_used``]: unbatched it is a real branch (``lax.switch``), so a run pays only its
        own route; batched, vmap evaluates every branch and selects, so all routes of a study
        share one compiled program.
      ewma_beta: β ∈ [0, 1] of the EWMA routes' θ_ref ← β θ_ref + (1 − β) θ
        [``ewma_beta_rule`` at W = ``delay.ring_size`` − 1 and the config's mean lag
        :func:`fresh_rl.lag.expected_lag` (a grid over ``lag`` sets its own β)].
      ewma_reset_threshold: the ``ewma`` route's auto-reset threshold on the MIS-active
        fraction, in [0, 1] [``ewma_reset_threshold``].
      replay_extra, age_decay_tau, importance_exponent, uniform_priority, insert_at_max,
      refresh_priorities, replay_optimizer: the replay sources' traced settings, the leaves of
        :class:`fresh_rl.replay.methods.ReplayHParams` (:attr:`replay`) [the data source's
        replay method with ``replay.age_decay_tau`` and ``replay.importance_exponent``].
    """

    lag: jax.Array
    vaco_delta: jax.Array
    learning_rate: jax.Array
    entropy_coef: jax.Array
    value_coef: jax.Array
    kl_coef: jax.Array
    gamma: jax.Array
    route: jax.Array
    ewma_beta: jax.Array
    ewma_reset_threshold: jax.Array
    replay_extra: jax.Array
    age_decay_tau: jax.Array
    importance_exponent: jax.Array
    uniform_priority: jax.Array
    insert_at_max: jax.Array
    refresh_priorities: jax.Array
    replay_optimizer: jax.Array

    @property
    def replay(self) -> ReplayHParams:
        """The replay leaves as the :class:`~fresh_rl.replay.methods.ReplayHParams` the buffer
        functions take."""
        return ReplayHParams(**{field: getattr(self, leaf) for leaf, field in _REPLAY_LEAVES.items()})

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """Names of the sweepable leaves, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @staticmethod
    def dtype(name: str):
        """``jnp.int32`` for ``lag``, ``route`` and the replay indices, ``bool`` for the replay
        flags, ``jnp.float32`` for every other leaf."""
        if name in ("lag", "route"):
            return jnp.int32
        if name in _REPLAY_LEAVES:
            return HPARAM_DTYPES[_REPLAY_LEAVES[name]]
        return jnp.float32

    @classmethod
    def from_config(cls, config: "TrainConfig") -> "HyperParams":
        """Scalar leaves holding the config's values (the defaults)."""
        source = config.data_source_spec
        replay = replay_hparams(source.replay_method or "onpolicy", tau_fit=config.replay.age_decay_tau,
                                importance_exponent=config.replay.importance_exponent)
        defaults = dict(lag=config.delay.lag, vaco_delta=config.vaco.delta,
                        learning_rate=config.learning_rate, entropy_coef=config.entropy_coef,
                        value_coef=config.value_coef, kl_coef=config.kl_coef, gamma=config.gamma,
                        route=config.routes_used.index(config.route_used),
                        ewma_beta=ewma_beta_from_staleness(config.delay.ring_size - 1, config.ewma_beta_rule,
                                                           expected_lag(config.delay)),
                        ewma_reset_threshold=config.ewma_reset_threshold,
                        **{leaf: replay[field] for leaf, field in _REPLAY_LEAVES.items()})
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

    def validate(self, config: "TrainConfig", max_bytes: Optional[int] = None) -> None:
        """Host-side checks of every concrete leaf, before anything is traced or allocated
        (traced leaves are skipped: the trainer clips a traced lag to [0, K − 1]).

        Ranges: lag an integer in [0, K − 1] and < ``config.num_iterations`` (a larger lag acts
        as num_iterations − 1: lags are clipped to the versions that exist); vaco_delta in
        (0, ∞]; learning_rate in (0, ∞); entropy_coef, value_coef, kl_coef in [0, ∞); gamma in
        [0, 1]; NaN never. Then the :func:`allocation_estimate` of all grid points must stay
        within ``max_bytes`` (default :data:`MAX_ALLOCATION_BYTES`). ``ValueError`` names the
        field, its range and the bad value (or the bytes and the setting responsible).
        """
        top = config.delay.ring_size - 1
        ranges = {
            "lag": (0, top, True, True),
            "vaco_delta": (0.0, math.inf, False, True),
            "learning_rate": (0.0, math.inf, False, False),
            "entropy_coef": (0.0, math.inf, True, False),
            "value_coef": (0.0, math.inf, True, False),
            "kl_coef": (0.0, math.inf, True, False),
            "gamma": (0.0, 1.0, True, True),
            "route": (0, len(config.routes_used) - 1, True, True),
            "ewma_beta": (0.0, 1.0, True, True),
            "ewma_reset_threshold": (0.0, 1.0, True, True),
            "replay_extra": (0, len(EXTRAS) - 1, True, True),
            "age_decay_tau": (0.0, math.inf, False, True),
            "importance_exponent": (0.0, 1.0, True, True),
            "replay_optimizer": (0, len(REPLAY_OPTIMIZERS) - 1, True, True),
        }
        num_runs = 1
        for name, (low, high, low_in, high_in) in ranges.items():
            leaf = getattr(self, name)
            if is_traced(leaf):
                continue
            values = np.asarray(leaf)
            num_runs = max(num_runs, values.size)
            if name == "lag":
                if not np.issubdtype(values.dtype, np.integer):
                    raise ValueError(f"HyperParams.lag must be an integer in [0, {top}], got dtype {values.dtype}")
                if config.delay.kind != "fixed" and np.any(values != config.delay.lag):
                    raise ValueError(f"HyperParams.lag needs delay.kind='fixed', got {config.delay.kind!r}")
            check_in_range(f"HyperParams.{name}", values, low, high,
                           low_inclusive=low_in, high_inclusive=high_in)
            if name == "lag" and values.max(initial=0) >= config.num_iterations:
                raise ValueError(
                    f"HyperParams.lag must be < num_iterations = {config.num_iterations} (the run's "
                    f"length; a larger lag acts as {config.num_iterations - 1}), got {values.max()}")
        _require_allocation(config, num_runs, MAX_ALLOCATION_BYTES if max_bytes is None else max_bytes)


def replay_grid(config: "TrainConfig", rows: Sequence[Mapping], values: Optional[Mapping[str, Sequence]] = None
                ) -> HyperParams:
    """``[N]`` :class:`HyperParams` for N replay rows: row i's
    :func:`~fresh_rl.replay.methods.replay_hparams` dict fills the replay leaves (by their
    :class:`~fresh_rl.replay.methods.ReplayHParams` field names), ``values`` (N values per
    other leaf) the rest as in :meth:`HyperParams.from_grid`; unnamed leaves keep the config's
    defaults."""
    rows = list(rows)
    values = dict(values or {})
    clash = sorted(set(values) & set(_REPLAY_LEAVES))
    if clash:
        raise ValueError(f"replay leaves {clash} come from rows; pass them there, not in values")
    values.update({leaf: [row[field] for row in rows] for leaf, field in _REPLAY_LEAVES.items()})
    return HyperParams.from_grid(config, values, size=len(rows))
