"""Old-log-prob routes: where the "old" log-probs of a decoupled or clipped loss come from.

One registry serves every trainer (the control trainer, :mod:`fresh_rl.control.train`, and the
LLM pipeline, :mod:`fresh_rl.llm.async_pipeline`). A sample acted by version v of the policy
needs the training-side log π_train^(v)(a|s) for the decoupled ratio split
r_d = π_train^(v)/π_infer^(v), r_s = π_θ/π_train^(v) (arXiv 2605.12070; docs/old_logits.md).
When it is missing the routes repair it exactly or approximately:

* ``behaviour`` — the stored acting log-probs π_infer: r_d ≡ 1, the loss is the plain ratio
  π_θ/β of a naive asynchronous PPO (no forward pass).
* ``recompute_current`` — a forward pass of the learner's batch-start parameters θ_k: staleness
  leaks into r̂_d = r_d·π_k/π_v (the failure the paper describes; VACO's π_T reference).
* ``snapshot`` (exact) — one forward per acting version still in the version ring.
* ``old_logit_model`` (exact) — a trainer-side replica scores each sample while it is collected.
* ``interrupt`` (exact) — the in-flight prefixes are scored before each weight switch, during
  collection (same numbers as ``old_logit_model``, no extra copy, a pause instead).
* ``linear_proxy`` / ``loglinear_proxy`` — A-3PO interpolation between π_infer and the
  detached π_θ of each minibatch with α = (k − v)/(k + 1 − v) (Proposition 1): no forward.
* ``ewma`` / ``ewma_no_reset`` — a forward of θ_ref, the EWMA of the learner's versions
  (revised PPO-EWMA); ``ewma`` resets θ_ref ← θ_k when the MIS-active fraction under θ_ref
  falls below the threshold and then uses θ_k for the batch.
* ``mask_snapshot_clip_current`` / ``mask_current_clip_snapshot`` — the crossed cells of the
  mask × clip factorial between ``snapshot`` and ``recompute_current``: the MIS mask reads one
  route's old log-probs, the clip is centred on the other's (which half of recompute_current's
  failure costs the reward: the tokens the mask drops, or the clip no longer bounding the move
  from the behaviour version).

A route is a plain record of what it needs and a function of a trainer's
:class:`RouteSources`; a trainer implements the sources once (how *it* runs a forward pass,
reads its ring, its collected log-probs, its EWMA tree) and every route, present or future,
works there. A new route is one :func:`register_route` call.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Protocol

import jax
import jax.numpy as jnp

from fresh_rl.corrections.ewma import EWMAReference
from fresh_rl.validation import register_entry, require_choice

PROXIMALS: tuple[Optional[str], ...] = (None, "linear", "loglinear")


@dataclasses.dataclass(frozen=True)
class RouteOutput:
    """A route's result.

    Attributes:
      old: old log-probs, shaped like the batch's log-probs (for a proxy: the stored acting
        log-probs, a placeholder; the loss interpolates per minibatch with ``proxy_alpha``).
      forwards: int32 scalar, forward passes over the batch spent on ``old``.
      proxy_alpha: the interpolation weight of a proxy, like ``old``; ``None`` otherwise.
      ewma: θ_ref after a possible reset (``None``: unchanged).
      reset: bool scalar, whether θ_ref was reset.
      clip_old: the clip centre's old log-probs when they differ from ``old`` (the factorial
        routes: ``old`` feeds the MIS mask on r_d, ``clip_old`` the clip on r_s); ``None``:
        ``old`` for both.
    """

    old: jax.Array
    forwards: Any = 0
    proxy_alpha: Optional[jax.Array] = None
    ewma: Optional[EWMAReference] = None
    reset: Any = False
    clip_old: Optional[jax.Array] = None


class RouteSources(Protocol):
    """What a trainer offers the routes; each method is traced inside the trainer's step."""

    def stored_behaviour(self) -> jax.Array:
        """The acting log-probs log π_infer(a|s) stored with the samples."""

    def current(self) -> RouteOutput:
        """log π_train under the learner's batch-start parameters θ_k."""

    def snapshot(self) -> RouteOutput:
        """log π_train^(v) of each sample's acting version v, from the version ring."""

    def collected(self) -> RouteOutput:
        """log π_train^(v) recorded at collection time."""

    def proxy_alpha(self) -> jax.Array:
        """α = (k − v)/(k + 1 − v) of each sample (``interpolation_weight``)."""

    def ewma(self, reset: bool) -> RouteOutput:
        """log π_train under θ_ref; with ``reset``, the auto-reset rule applied first."""


@dataclasses.dataclass(frozen=True)
class OldLogProbRoute:
    """One route: its function and what it needs.

    Attributes:
      name: the ``route`` value of a trainer's config.
      fn: ``fn(sources: RouteSources) -> RouteOutput`` (pure, jittable).
      param_copies: ``param_copies(window, actor_groups) -> int``, parameter copies held
        besides the learner's own and the inference engines' at staleness window W with G
        actor groups (snapshot W + 1; old-logit model one replica per actor group; EWMA one θ_ref).
      extra_forward: needs a forward pass over the batch at batch start.
      collection_time: the old log-probs are computed while the samples are collected.
      exact: the old log-probs are π_train of the acting version.
      proximal: ``None``, ``"linear"`` or ``"loglinear"``: the loss replaces ``old`` by that
        interpolation proxy per minibatch.
      uses_ewma: the trainer carries θ_ref and updates it after each batch.
      splits_clip: the route gives the clip centre separately (``RouteOutput.clip_old``).
    """

    name: str
    fn: Callable[[RouteSources], RouteOutput]
    param_copies: Callable[[int, int], int] = lambda window, actor_groups: 0
    extra_forward: bool = False
    collection_time: bool = False
    exact: bool = False
    proximal: Optional[str] = None
    uses_ewma: bool = False
    splits_clip: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"OldLogProbRoute.name must be a non-empty string, got {self.name!r}")
        if not callable(self.fn) or not callable(self.param_copies):
            raise ValueError(f"OldLogProbRoute {self.name!r}: fn and param_copies must be callable")
        require_choice("OldLogProbRoute.proximal", self.proximal, PROXIMALS)


ROUTES: dict[str, OldLogProbRoute] = {}


def register_route(route: OldLogProbRoute, *, replace: bool = False) -> OldLogProbRoute:
    """Add ``route`` to :data:`ROUTES` (``ValueError`` if the name is taken, unless ``replace``)."""
    return register_entry(ROUTES, route, OldLogProbRoute, "old-log-prob route", replace=replace)


def unregister_route(name: str) -> None:
    """Remove a route from :data:`ROUTES` (no error if absent)."""
    ROUTES.pop(name, None)


def get_route(name: str) -> OldLogProbRoute:
    """The registered route ``name`` (``ValueError`` listing the routes otherwise)."""
    require_choice("route", name, tuple(ROUTES))
    return ROUTES[name]


def routes_where(**flags) -> tuple[str, ...]:
    """Names of the routes whose attributes equal ``flags``, e.g. ``routes_where(exact=True)``."""
    return tuple(name for name, route in ROUTES.items()
                 if all(getattr(route, k) == v for k, v in flags.items()))


def route_param_copies(name: str, window: int, actor_groups: int = 1) -> int:
    """Parameter copies route ``name`` holds at window W with G actor groups."""
    return int(get_route(name).param_copies(window, actor_groups))


def _behaviour(sources: RouteSources) -> RouteOutput:
    return RouteOutput(old=sources.stored_behaviour(), forwards=jnp.zeros((), jnp.int32))


def _proxy(sources: RouteSources) -> RouteOutput:
    return RouteOutput(old=sources.stored_behaviour(), forwards=jnp.zeros((), jnp.int32),
                       proxy_alpha=sources.proxy_alpha())


def _one(window: int, actor_groups: int) -> int:
    return 1


def _mask_and_clip(mask: RouteOutput, clip: RouteOutput) -> RouteOutput:
    """The mask's old log-probs from one source and the clip centre from another (both forwards paid)."""
    return RouteOutput(old=mask.old, clip_old=clip.old,
                       forwards=jnp.asarray(mask.forwards, jnp.int32) + jnp.asarray(clip.forwards, jnp.int32))


for _route in (
        OldLogProbRoute("behaviour", _behaviour),
        OldLogProbRoute("recompute_current", lambda s: s.current(), extra_forward=True),
        OldLogProbRoute("snapshot", lambda s: s.snapshot(), param_copies=lambda w, g: w + 1,
                        extra_forward=True, exact=True),
        OldLogProbRoute("old_logit_model", lambda s: s.collected(), param_copies=lambda w, g: g,
                        collection_time=True, exact=True),
        OldLogProbRoute("interrupt", lambda s: s.collected(), collection_time=True, exact=True),
        OldLogProbRoute("linear_proxy", _proxy, proximal="linear"),
        OldLogProbRoute("loglinear_proxy", _proxy, proximal="loglinear"),
        OldLogProbRoute("ewma", lambda s: s.ewma(reset=True), param_copies=_one, extra_forward=True,
                        uses_ewma=True),
        OldLogProbRoute("ewma_no_reset", lambda s: s.ewma(reset=False), param_copies=_one,
                        extra_forward=True, uses_ewma=True),
        OldLogProbRoute("mask_snapshot_clip_current", lambda s: _mask_and_clip(s.snapshot(), s.current()),
                        param_copies=lambda w, g: w + 1, extra_forward=True, splits_clip=True),
        OldLogProbRoute("mask_current_clip_snapshot", lambda s: _mask_and_clip(s.current(), s.snapshot()),
                        param_copies=lambda w, g: w + 1, extra_forward=True, splits_clip=True)):
    register_route(_route)
del _route

BUILTIN_ROUTES: tuple[str, ...] = tuple(ROUTES)
"""The routes above, in registration order."""
FACTORIAL_ROUTES: tuple[str, ...] = ("mask_snapshot_clip_current", "mask_current_clip_snapshot")
"""The 2 × 2 of mask source × clip centre between ``snapshot`` and ``recompute_current``: the two
crossed cells (the diagonal is those two routes)."""
REPAIR_ROUTES: tuple[str, ...] = tuple(r for r in BUILTIN_ROUTES if r not in ("behaviour",) + FACTORIAL_ROUTES)
"""The routes of the missing-old-logits studies (``behaviour`` is the no-repair baseline of
the plain clipped loss, not a repair of the decoupled loss's old log-probs; the factorial
routes are a diagnostic of two of them)."""


def route_table(window: int, actor_groups: int = 1) -> list[dict]:
    """Per route: what it needs (parameter copies at window W with G actor groups, an extra
    forward, collection-time scoring) and what it gives (exact, proxy)."""
    return [{"route": r.name, "exact": r.exact, "proximal": r.proximal or "",
             "param_copies": r.param_copies(window, actor_groups), "extra_forward": r.extra_forward,
             "collection_time": r.collection_time} for r in ROUTES.values()]


__all__ = ["BUILTIN_ROUTES", "FACTORIAL_ROUTES", "OldLogProbRoute", "PROXIMALS", "REPAIR_ROUTES", "ROUTES",
           "RouteOutput", "RouteSources", "get_route", "register_route", "route_param_copies",
           "route_table", "routes_where", "unregister_route"]
