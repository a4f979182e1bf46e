"""The control trainer's side of the old-log-prob routes: its :class:`RouteSources` and the
traced choice among ``TrainConfig.routes_used``.

The routes themselves (what each needs, which source it reads) are the one registry
:mod:`fresh_rl.corrections.routes`, shared with the LLM pipeline. Here the control trainer says
how it provides each source for a block of rows ``[rows, T]`` (the fresh batch, or rows replayed
from the buffer):

* ``stored_behaviour``: the acting log-probs log β stored with the rows;
* ``current``: log π under the learner's parameters (at batch start for the fresh batch, at the
  replay step for replayed rows), already computed by the trainer: one forward;
* ``snapshot``: each actor group's rows scored by its acting version θ_v gathered from the
  version ring, one forward per distinct version (fresh rows only: a replay source refuses it);
* ``collected``: the clean log π_v the actors recorded beside the engine's (one replica forward
  per distinct version, at collection time; none for replayed rows);
* ``proxy_alpha``: α = (k − v)/(k + 1 − v) with k the learner version;
* ``ewma``: a forward of θ_ref; with ``reset`` (fresh rows only) θ_ref ← θ_k when the fraction
  of steps the MIS rules keep under r̃_d = π_ref/β falls below ``HyperParams.ewma_reset_threshold``,
  and the batch then uses π_k, already computed (revised PPO-EWMA; our choice of the two options).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Optional

import jax
import jax.numpy as jnp

from fresh_rl.control.acting import log_probs
from fresh_rl.control.config import TrainConfig
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.corrections import EWMAReference, ewma_maybe_reset, fraction, interpolation_weight, mis_mask
from fresh_rl.corrections.routes import PROXIMALS, RouteOutput
from fresh_rl.lag import version_ring


@dataclasses.dataclass(frozen=True)
class ControlRouteSources:
    """:class:`fresh_rl.corrections.routes.RouteSources` of the control trainer over ``rows``.

    Attributes:
      config, hparams: the run's static config and traced hyperparameters.
      params: the learner's parameters θ (batch start, or the current step's for replayed rows).
      ring: the version ring; ``ewma_reference``: θ_ref (``None`` when no route uses it).
      rows: ``obs``, ``action``, ``behaviour_log_prob``, ``train_log_prob``, ``version`` ``[rows, T, ...]``.
      learner_log_prob: log π_θ(a|s) of ``rows``, detached.
      fresh: the rows are this iteration's batch (snapshots by actor group, EWMA resets and
        collection-time forwards apply only then).
    """

    config: TrainConfig
    hparams: HyperParams
    params: Any
    ring: version_ring.VersionRing
    ewma_reference: Optional[EWMAReference]
    rows: dict
    learner_log_prob: jax.Array
    fresh: bool

    def _acting_versions(self) -> jax.Array:
        """``[G]`` acting version of each actor group (every env of a group shares it)."""
        per_group = self.config.num_envs // self.config.num_actor_groups
        return self.rows["version"][::per_group, 0]

    def _distinct_versions(self) -> jax.Array:
        if not self.fresh:
            return jnp.zeros((), jnp.int32)
        s = jnp.sort(self._acting_versions())
        return 1 + jnp.sum((s[1:] != s[:-1]).astype(jnp.int32))

    def stored_behaviour(self) -> jax.Array:
        return self.rows["behaviour_log_prob"]

    def current(self) -> RouteOutput:
        return RouteOutput(old=self.learner_log_prob, forwards=jnp.ones((), jnp.int32))

    def snapshot(self) -> RouteOutput:
        config, g = self.config, self.config.num_actor_groups
        params, _ = version_ring.gather(self.ring, self.ring.latest_version - self._acting_versions())
        obs = self.rows["obs"].reshape(g, config.num_envs // g, *self.rows["obs"].shape[1:])
        actions = self.rows["action"].reshape(g, config.num_envs // g, *self.rows["action"].shape[1:])

        old = jax.vmap(lambda p, o, a: log_probs(config, p, o, a))(params, obs, actions)
        old = old.reshape(self.learner_log_prob.shape)
        return RouteOutput(old=old, forwards=self._distinct_versions())

    def collected(self) -> RouteOutput:
        return RouteOutput(old=self.rows["train_log_prob"], forwards=self._distinct_versions())

    def proxy_alpha(self) -> jax.Array:
        k = self.ring.latest_version
        return interpolation_weight(self.rows["version"], k, k + 1)

    def ewma(self, reset: bool) -> RouteOutput:
        old = log_probs(self.config, self.ewma_reference.params, self.rows["obs"], self.rows["action"])
        if not (reset and self.fresh):
            return RouteOutput(old=old, forwards=jnp.ones((), jnp.int32))
        infer = self.rows["behaviour_log_prob"]
        every = jnp.ones(infer.shape, bool)
        kept, _ = mis_mask(old - infer, every, self.config.decoupled_mis)
        reference = ewma_maybe_reset(self.ewma_reference, self.params, fraction(kept, every),
                                     threshold=self.hparams.ewma_reset_threshold)
        did_reset = reference.reset_count > self.ewma_reference.reset_count
        return RouteOutput(old=jnp.where(did_reset, self.learner_log_prob, old),
                           forwards=jnp.ones((), jnp.int32), ewma=reference, reset=did_reset)


@dataclasses.dataclass(frozen=True)
class SelectedRoute:
    """The traced route's result: ``old`` ``[rows, T]``, ``clip_old`` (the clip centre: ``old``
    unless the route splits it), ``alpha`` (zeros unless a proxy), ``proximal`` (int32 index into
    :data:`~fresh_rl.corrections.routes.PROXIMALS`), ``uses_ewma``, ``ewma`` (θ_ref after a
    possible reset, or ``None``), ``reset`` and ``forwards``."""

    old: jax.Array
    clip_old: jax.Array
    alpha: jax.Array
    proximal: jax.Array
    uses_ewma: jax.Array
    ewma: Optional[EWMAReference]
    reset: jax.Array
    forwards: jax.Array


def select_route(config: TrainConfig, sources: ControlRouteSources, index: jax.Array) -> SelectedRoute:
    """Run route ``config.routes_used[index]`` on ``sources`` (``lax.switch`` when there are several)."""
    specs = config.route_specs

    def run(route):
        out = route.fn(sources)
        alpha = jnp.zeros_like(out.old) if out.proxy_alpha is None else out.proxy_alpha
        ewma = sources.ewma_reference if out.ewma is None else out.ewma
        clip = out.old if out.clip_old is None else out.clip_old
        return (out.old, clip, alpha, ewma, jnp.asarray(out.reset, bool), jnp.asarray(out.forwards, jnp.int32))

    if len(specs) == 1:
        result = run(specs[0])
    else:
        result = jax.lax.switch(index, [lambda r=r: run(r) for r in specs])
    old, clip_old, alpha, ewma, reset, forwards = result
    proximal = jnp.asarray([PROXIMALS.index(r.proximal) for r in specs], jnp.int32)[index]
    uses_ewma = jnp.asarray([r.uses_ewma for r in specs])[index]
    return SelectedRoute(old=old, clip_old=clip_old, alpha=alpha, proximal=proximal, uses_ewma=uses_ewma,
                         ewma=ewma, reset=reset, forwards=forwards)


def uses_proxies(config: TrainConfig) -> bool:
    """Whether any route of the run replaces the old log-probs by a proxy in the loss."""
    return any(r.proximal is not None for r in config.route_specs)


def splits_clip(config: TrainConfig) -> bool:
    """Whether any route of the run centres the clip on other old log-probs than the mask's."""
    return any(r.splits_clip for r in config.route_specs)


def uses_ewma(config: TrainConfig) -> bool:
    """Whether the run carries θ_ref."""
    return any(r.uses_ewma for r in config.route_specs)


__all__ = ["ControlRouteSources", "SelectedRoute", "select_route", "splits_clip", "uses_ewma", "uses_proxies"]
