"""Old-logit routes of the asynchronous pipeline and their costs (arXiv 2605.12070).

A token y_t sampled by the inference engine at policy version v needs the *training-side*
old log-prob log π_train^(v)(y_t) so that the decoupled loss can split the total ratio into
r_d = π_train^(v)/π_infer^(v) (MIS mask / TIS) and r_s = π_θ/π_train^(v) (PPO clip)
(docs/old_logits.md). Routes, selected by ``AsyncConfig.old_logit_route``:

* ``recompute_current`` — fp32 forward of the learner's *current* parameters θ_k: the
  failure the paper describes, r̂_d = r_d · π_train^(k)/π_train^(v) absorbs the staleness.
* ``snapshot`` (exact) — the ring keeps the last W+1 versions; at train time one fp32
  forward per version present in the batch, each token keeping the value of its own
  version tag (:func:`snapshot_logprobs`).
* ``old_logit_model`` (exact) — a dedicated fp32 copy that follows the inference
  version scores every segment when it finishes, during collection.
* ``interrupt`` (exact) — before each weight switch, a forward over the in-flight
  prefixes with the still-resident version, during collection. In this single-process
  simulator the engine switches versions for all rows at once, so ``old_logit_model`` and
  ``interrupt`` run the same forward at the same point (``collect_segment_old_logprobs`` of
  :func:`fresh_rl.llm.async_pipeline.versioned_policy`); they differ in what a real system
  holds and pauses, which :attr:`OldLogitRoute.param_copies` and the overhead table account for.
* ``linear_proxy`` / ``loglinear_proxy`` (Proposition 1) — A-3PO interpolation between
  π_infer and the detached π_θ of each minibatch with α = (v_prox − v)/(v_θ − v), v_prox = k
  (the learner version at batch start, AReaL's "one step behind π_θ"), v_θ = k + 1 (:func:`proxy_alpha`);
  no forward pass.
* ``ewma`` / ``ewma_no_reset`` (revised PPO-EWMA) — fp32 forward of θ_ref, the EWMA of the
  learner's versions; ``ewma`` resets θ_ref ← θ_k when the active-token fraction under θ_ref falls
  below the threshold (``hparams.ewma_reset_threshold``) and then recomputes this batch with
  θ_k (our choice of the two options; docs/old_logits.md), ``ewma_no_reset`` never resets
  (:func:`ewma_logprobs`).

**The registry.** Every route is one frozen :class:`OldLogitRoute` in :data:`ROUTES`: its
old-log-prob function ``fn(ctx: RouteContext) -> RouteOutput`` and the static facts the
pipeline reads (parameter copies, collection-time scoring, exactness, the proximal proxy of
the loss, whether it needs an EWMA reference). :func:`fresh_rl.llm.async_pipeline.prepare`,
``init_state``, ``collect``, ``AsyncConfig`` validation and :func:`route_param_copies` read
only the registry, so a new route is one :func:`register_route` call.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from fresh_rl.corrections import (EWMAReference, MISConfig, ewma_maybe_reset, fraction,
                                  interpolation_weight, mis_mask)
from fresh_rl.lag.version_ring import VersionRing
from fresh_rl.llm.model import Qwen2Config, cast_params
from fresh_rl.llm.sampler import token_logprobs_and_entropy
from fresh_rl.validation import register_entry

PROXIMALS = (None, "linear", "loglinear")


def fp32_logprobs(params, model_config: Qwen2Config, tokens, mask, temperature: float):
    """``[B, T]`` training-engine (fp32) log-probs of ``tokens`` under ``params``, cast up to
    float32 first (a bf16-stored snapshot or θ_ref runs the same fp32 forward)."""
    return token_logprobs_and_entropy(cast_params(params, jnp.float32), model_config, tokens,
                                      mask, temperature=temperature)[0]


def snapshot_logprobs(ring: VersionRing, tokens, mask, versions, action_mask, *,
                      model_config: Qwen2Config, temperature: float):
    """Exact old log-probs from the version snapshots (docs/old_logits.md, routes).

    For each ring slot whose version tags some action token, one fp32 forward of the full
    sequences with that version; token t keeps the value of the slot with
    ``versions[t]``. Slots not used by the batch are skipped (``lax.cond``; under ``vmap``
    both branches run). Returns ``(old [B, T], forwards)`` with ``forwards`` the number of
    versions evaluated.
    """
    def one_slot(old, slot):
        version = ring.versions[slot]
        rows = action_mask & (versions == version) & (version >= 0)
        used = jnp.any(rows)
        params = jax.tree_util.tree_map(lambda buf: buf[slot], ring.params)
        logp = jax.lax.cond(used, lambda: fp32_logprobs(params, model_config, tokens, mask,
                                                        temperature),
                            lambda: jnp.zeros(tokens.shape, jnp.float32))
        return jnp.where(rows, logp, old), used

    old, used = jax.lax.scan(one_slot, jnp.zeros(tokens.shape, jnp.float32),
                             jnp.arange(ring.capacity))
    return old, jnp.sum(used.astype(jnp.int32))


def proxy_alpha(versions, action_mask, learner_version):
    """Per-token α = (k − v)/(k + 1 − v) of the interpolation proxies (0 off the actions).

    v = the token's version tag, k = ``learner_version`` (the proximal version: the
    parameters at batch start), k + 1 = the version being optimised
    (:func:`fresh_rl.corrections.interpolation_weight`; AReaL ``prox_logp_method``).
    """
    alpha = interpolation_weight(versions, learner_version, learner_version + 1)
    return jnp.where(action_mask, alpha, 0.0)


def ewma_logprobs(reference: EWMAReference, params, tokens, mask, behaviour_log_probs,
                  action_mask, *, model_config: Qwen2Config, temperature: float,
                  mis: MISConfig, reset_threshold=None):
    """Revised PPO-EWMA old log-probs π_ref = π_{θ_ref} with auto-reset (docs/old_logits.md).

    ρ_active is the fraction of action tokens the MIS rules keep for
    r̃_d = π_ref/π_infer. If ``reset_threshold`` = τ_reset is given (may be traced) and
    ρ_active < τ_reset, θ_ref ← θ (``params``, the learner at batch start) and the batch is
    re-scored with it. Returns ``(old [B, T], reference, reset (bool), forwards)``.
    """
    forward = lambda p: fp32_logprobs(p, model_config, tokens, mask, temperature)  # noqa: E731
    old = forward(reference.params)
    if reset_threshold is None:
        return old, reference, jnp.zeros((), bool), jnp.ones((), jnp.int32)
    kept, _ = mis_mask(old - behaviour_log_probs, action_mask, mis)
    new_reference = ewma_maybe_reset(reference, params, fraction(kept, action_mask),
                                     threshold=reset_threshold)
    reset = new_reference.reset_count > reference.reset_count
    old = jax.lax.cond(reset, lambda: forward(params), lambda: old)
    return old, new_reference, reset, 1 + reset.astype(jnp.int32)


def param_bytes(params: Any, dtype: Optional[Any] = None) -> int:
    """Bytes of one copy of ``params`` stored in ``dtype`` (default: each leaf's own dtype;
    4 per entry for the fp32 training parameters, 2 for bfloat16)."""
    return int(sum(leaf.size * jnp.dtype(dtype or leaf.dtype).itemsize
                   for leaf in jax.tree_util.tree_leaves(params)))


# --------------------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True)
class RouteContext:
    """What a route's function sees (traced arrays inside the jitted iteration).

    Attributes:
      params: the learner's parameters θ_k at batch start.
      ring: the version ring (the sampler's weights and the snapshots).
      ewma: θ_ref (:class:`~fresh_rl.corrections.EWMAReference`) for routes with
        ``uses_ewma``, else ``None``.
      hparams: the run's :class:`fresh_rl.llm.hparams.LLMHyperParams` (traced scalars).
      episodes: the collected :class:`~fresh_rl.llm.rollout.Episodes`.
      action_mask: ``[B, T]`` action tokens of played turns.
      behaviour_log_probs: ``[B, T]`` sampler log-probs π_infer (0 off the actions).
      versions: ``[B, T]`` int32 version tag of each action token.
      config, async_config, model_config: the trainer's static settings.
      segments: the static number of decoding segments an episode can have (turns × chunks).
    """

    params: Any
    ring: VersionRing
    ewma: Optional[EWMAReference]
    hparams: Any
    episodes: Any
    action_mask: jax.Array
    behaviour_log_probs: jax.Array
    versions: jax.Array
    config: Any
    async_config: Any
    model_config: Qwen2Config
    segments: int

    def forward(self, params) -> jax.Array:
        """``[B, T]`` fp32 log-probs of the batch under ``params``."""
        return fp32_logprobs(params, self.model_config, self.episodes.tokens,
                             self.episodes.mask, self.config.temperature)


@dataclasses.dataclass(frozen=True)
class RouteOutput:
    """A route's result: ``old`` ``[B, T]`` old log-probs; ``proxy_alpha`` ``[B, T]`` the
    interpolation weight of a proximal proxy (``None`` otherwise); ``ewma`` the EWMA reference
    after a possible reset (``None``: unchanged); ``reset`` (bool scalar) and ``forwards``
    (int32 scalar, fp32 forward passes spent) for the metrics."""

    old: jax.Array
    forwards: Any = 0
    proxy_alpha: Optional[jax.Array] = None
    ewma: Optional[EWMAReference] = None
    reset: Any = False


@dataclasses.dataclass(frozen=True)
class OldLogitRoute:
    """One old-logit route (module docstring).

    Attributes:
      name: the ``AsyncConfig.old_logit_route`` value.
      fn: ``fn(ctx: RouteContext) -> RouteOutput`` (pure, jittable).
      param_copies: ``param_copies(window) -> int``, parameter copies the route holds besides
        the learner's own at window w (docs/old_logits.md); the simulator's own ring of
        sampler versions (the inference engine) is not counted.
      collection_time: old log-probs are computed while sampling (the sampler writes
        ``token_extras["old_logprobs"]`` per finished segment).
      exact: the old log-probs are π_train of the token's own version.
      proximal: ``None``, ``"linear"`` or ``"loglinear"``: the loss replaces the old log-probs
        by that interpolation proxy per minibatch (:data:`fresh_rl.llm.trainer.PROXIMAL_PROXIES`).
      uses_ewma: the state carries an EWMA reference θ_ref (allocated iff set).
    """

    name: str
    fn: Callable[[RouteContext], RouteOutput]
    param_copies: Callable[[int], int] = lambda window: 0
    collection_time: bool = False
    exact: bool = False
    proximal: Optional[str] = None
    uses_ewma: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"OldLogitRoute.name must be a non-empty string, got {self.name!r}")
        if not callable(self.fn) or not callable(self.param_copies):
            raise ValueError(f"OldLogitRoute {self.name!r}: fn and param_copies must be callable")
        if self.proximal not in PROXIMALS:
            raise ValueError(f"OldLogitRoute.proximal must be one of {PROXIMALS}, "
                             f"got {self.proximal!r}")


ROUTES: dict[str, OldLogitRoute] = {}


def register_route(route: OldLogitRoute, *, replace: bool = False) -> OldLogitRoute:
    """Adds ``route`` to :data:`ROUTES` (``ValueError`` if the name is taken, unless
    ``replace``). Returns it."""
    return register_entry(ROUTES, route, OldLogitRoute, "old-logit route", replace=replace)


def unregister_route(name: str) -> None:
    """Removes a route from :data:`ROUTES` (no error if absent)."""
    ROUTES.pop(name, None)


def get_route(name: str) -> OldLogitRoute:
    """The registered route ``name`` (``ValueError`` listing the routes otherwise)."""
    try:
        return ROUTES[name]
    except KeyError:
        raise ValueError(f"unknown old-logit route {name!r}; registered: {tuple(ROUTES)}") \
            from None


def routes_where(**flags) -> tuple[str, ...]:
    """Names of the registered routes whose attributes equal ``flags``, e.g.
    ``routes_where(exact=True)``."""
    return tuple(name for name, route in ROUTES.items()
                 if all(getattr(route, k) == v for k, v in flags.items()))


def route_param_copies(route: str, staleness_window: int) -> int:
    """Parameter copies route ``route`` holds at window w (:attr:`OldLogitRoute.param_copies`).

    snapshot: W + 1 (every version an in-flight or buffered token may carry, the current one
    included, since the learner overwrites it); old_logit_model: 1 (the dedicated replica);
    ewma / ewma_no_reset: 1 (θ_ref); the others: 0. Each copy is held in the pipeline's
    storage dtype (``AsyncConfig.stored_params_dtype``; bytes:
    :func:`fresh_rl.llm.async_pipeline.route_costs`).
    """
    return int(get_route(route).param_copies(staleness_window))


def _recompute_current(ctx: RouteContext) -> RouteOutput:
    return RouteOutput(old=ctx.forward(ctx.params), forwards=1)


def _snapshot(ctx: RouteContext) -> RouteOutput:
    old, forwards = snapshot_logprobs(ctx.ring, ctx.episodes.tokens, ctx.episodes.mask,
                                      ctx.versions, ctx.action_mask,
                                      model_config=ctx.model_config,
                                      temperature=ctx.config.temperature)
    return RouteOutput(old=old, forwards=forwards)


def _collected(ctx: RouteContext) -> RouteOutput:
    """The segment log-probs the sampler wrote; one forward per segment that has tokens."""
    segments = ctx.episodes.token_extras["segment"]
    used = jax.vmap(lambda s: jnp.any(ctx.action_mask & (segments == s)))(
        jnp.arange(1, ctx.segments + 1))
    return RouteOutput(old=ctx.episodes.token_extras["old_logprobs"],
                       forwards=jnp.sum(used.astype(jnp.int32)))


def _proxy(ctx: RouteContext) -> RouteOutput:
    # old is a placeholder: the loss builds the proxy per minibatch
    return RouteOutput(old=ctx.behaviour_log_probs, forwards=0,
                       proxy_alpha=proxy_alpha(ctx.versions, ctx.action_mask,
                                               ctx.ring.latest_version))


def _ewma(reset: bool):
    def fn(ctx: RouteContext) -> RouteOutput:
        old, ewma, did_reset, forwards = ewma_logprobs(
            ctx.ewma, ctx.params, ctx.episodes.tokens, ctx.episodes.mask,
            ctx.behaviour_log_probs, ctx.action_mask, model_config=ctx.model_config,
            temperature=ctx.config.temperature, mis=ctx.config.mis,
            reset_threshold=ctx.hparams.ewma_reset_threshold if reset else None)
        return RouteOutput(old=old, forwards=forwards, ewma=ewma, reset=did_reset)
    return fn


def _one(window: int) -> int:
    return 1


for _route in (
        OldLogitRoute("recompute_current", _recompute_current),
        OldLogitRoute("snapshot", _snapshot, param_copies=lambda window: window + 1, exact=True),
        OldLogitRoute("old_logit_model", _collected, param_copies=_one, collection_time=True,
                      exact=True),
        OldLogitRoute("interrupt", _collected, collection_time=True, exact=True),
        OldLogitRoute("linear_proxy", _proxy, proximal="linear"),
        OldLogitRoute("loglinear_proxy", _proxy, proximal="loglinear"),
        OldLogitRoute("ewma", _ewma(reset=True), param_copies=_one, uses_ewma=True),
        OldLogitRoute("ewma_no_reset", _ewma(reset=False), param_copies=_one, uses_ewma=True)):
    register_route(_route)
del _route

BUILTIN_ROUTES = tuple(ROUTES)  # the routes above, in order (the experiments' grid)


__all__ = ["BUILTIN_ROUTES", "OldLogitRoute", "ROUTES", "RouteContext", "RouteOutput",
           "ewma_logprobs", "fp32_logprobs", "get_route", "param_bytes", "proxy_alpha",
           "register_route", "route_param_copies", "routes_where", "snapshot_logprobs",
           "unregister_route"]
