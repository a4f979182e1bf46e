"""Jitted PPO with the decoupled loss and missing old logits, the control analogue of arXiv
2605.12070: ``train(config, key, hp)``.

The LLM pipeline's question (docs/old_logits.md) in a setting where reward is cheap to
measure: does computing the "old" log-probs with the wrong parameters cost return, and which
repair recovers it? One iteration = one policy version::

    lags_g ~ U{0, …, W} per actor group (random staleness; ``train.delay``)
    inference engine of version v = k − lag_g: acting policy π_infer^(v) = perturbed π_v
        (engine noise on the logits, sized so that mean |log r_d| = ``discrepancy``);
        stored: a, log π_infer^(v)(a|s) and, for the record, the clean log π_train^(v)(a|s)
    learner at batch start θ_k: log π_k, V_k; GAE(λ) advantages on V_k
    old log-probs by the route (``hp.route``, traced: one program serves every route)
    passes × minibatches steps of the decoupled loss (fresh_rl.corrections.decoupled_ppo_loss):
        r_d = π_old/π_infer → MIS keep-mask (+ optional TIS weight),
        r_s = π_θ/π_old → PPO clip; value loss to the λ-returns, entropy bonus
    EWMA routes: θ_ref ← β θ_ref + (1 − β) θ_{k+1}; push θ_{k+1}; learner evaluation

**Routes** (the LLM pipeline's names; :mod:`fresh_rl.llm.old_logits` for the token version):
``recompute_current`` π_k (the failure: staleness leaks into r̂_d = r_d·π_k/π_v, the clip
starts at 1); ``snapshot`` π_v from the version ring, one forward per distinct version, by
actor group (exact); ``old_logit_model`` the clean π_v recorded while acting, by a trainer-side
replica beside each actor group's engine (exact; the same numbers as ``snapshot``, computed at
collection time, so the two differ only in cost); ``linear_proxy`` / ``loglinear_proxy`` the
A-3PO interpolation between π_infer and the detached π_θ of each minibatch with
α = (k − v)/(k + 1 − v); ``ewma`` / ``ewma_no_reset`` π_ref of the EWMA θ_ref (revised PPO-EWMA),
``ewma`` resetting θ_ref ← θ_k when the active fraction under θ_ref falls below
``hp.ewma_reset_threshold`` (the batch then uses π_k, already computed).

**Where the paper is silent, our choices (config fields):**

* The engine perturbation. Logits z̃ = z + σ(s)·ε, ε ~ N(0, I) fresh at every step, with
  σ(s) = ``discrepancy`` / κ(s), κ(s) = √(2/π)·Σ_a π(a|s)·√(1 − 2π(a|s) + Σ_b π(b|s)²), the
  first-order mean of |log r_d| per unit σ, so that E|log r_d| ≈ ``discrepancy`` in every state
  whatever the policy (a real engine's discrepancy is set by its kernels; holding it fixed
  makes the staleness window the only thing that varies); σ ≤ ``max_logit_noise`` where the
  policy is nearly deterministic (there E|log r_d| falls below the target).
* The MIS token bounds default to exp(±0.1) ≈ [0.905, 1.105]: loose for the injected
  discrepancy (|log r_d| > 0.1 is a 4σ event at ``discrepancy`` 0.02), tight for staleness,
  the regime the paper's thresholds are set for (numerical noise). No TIS weight by default.
* β of the EWMA: the ``"mean_age"`` rule β = W/(W + 2), centre of mass W/2, the mean lag of
  U{0, …, W} (:func:`fresh_rl.corrections.ewma_beta_from_staleness`); θ_ref follows once per
  version; the reset threshold 0.9 (traced: swept by the study).
* Advantages: GAE(λ) on V_k for every route (the routes change only the ratio's reference).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp
from flax import struct

from fresh_rl.control import networks
from fresh_rl.control.evaluation import evaluation_key
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.train import (Batch, TrainConfig, TrainState, _batch_start,
                                    _evaluate_learner, _rollout, sgd_passes)
from fresh_rl.control.train import init_state as init_train_state
from fresh_rl.corrections.ewma import BETA_RULES
from fresh_rl.corrections import (DecoupledPPOConfig, EWMAReference, MISConfig,
                                  decoupled_ppo_loss, ewma_beta_from_staleness, ewma_maybe_reset,
                                  ewma_update, fraction, generalized_advantage_estimation,
                                  init_ewma_reference, interpolation_weight,
                                  linear_proximal_log_probs, loglinear_proximal_log_probs, mis_mask)
from fresh_rl.lag import version_ring
from fresh_rl.sweep.keys import split_run_key, step_keys
from fresh_rl.validation import check_in_range, is_traced, register_entry, require_choice, require_in_range

DEFAULT_MIS = MISConfig(token_bounds=(math.exp(-0.1), math.exp(0.1)))
"""Token mask exp(±0.1) on r_d (module docstring: loose for the engine, tight for staleness)."""


# --------------------------------------------------------------------------- inference engine


def first_order_discrepancy(logits: jax.Array) -> jax.Array:
    """κ(s) = E|log r_d| per unit logit noise σ, to first order in σ, ``[...]``.

    With z̃ = z + σε, log π(a) − log π̃(a) ≈ −σ(ε_a − Σ_b π_b ε_b), a centred normal of variance
    σ²(1 − 2π_a + Σ_b π_b²); its mean absolute value is σ√(2/π)·√(·), averaged over a ~ π.
    """
    p = jax.nn.softmax(logits, axis=-1)
    spread = jnp.sqrt(jnp.maximum(1.0 - 2.0 * p + jnp.sum(p * p, axis=-1, keepdims=True), 0.0))
    return math.sqrt(2.0 / math.pi) * jnp.sum(p * spread, axis=-1)


def make_inference_engine(discrepancy: float, max_logit_noise: float):
    """``engine(policy, key)``: discrete π with logits z + σ(s)ε, σ(s) = min(discrepancy/κ(s),
    max_logit_noise) (module docstring); the identity when ``discrepancy`` = 0."""

    def engine(policy: networks.PolicyOutput, key) -> networks.PolicyOutput:
        kappa = first_order_discrepancy(policy.loc)
        sigma = jnp.minimum(discrepancy / jnp.maximum(kappa, 1e-12), max_logit_noise)
        noise = jax.random.normal(key, policy.loc.shape, policy.loc.dtype)
        return policy.replace(loc=policy.loc + sigma[..., None] * noise)

    return engine


# --------------------------------------------------------------------------- routes


@struct.dataclass
class RouteInputs:
    """What a route sees at batch start: θ_k, the version ring, θ_ref, the traced
    hyperparameters, the batch and the learner's log π_k(a|s) ``[N, T]``."""

    params: Any
    ring: version_ring.VersionRing
    ewma: EWMAReference
    hp: Any
    batch: Batch
    learner_log_prob: jax.Array


@struct.dataclass
class RouteResult:
    """``old`` ``[N, T]`` old log-probs (for proxies: a placeholder, the loss interpolates per
    minibatch with ``alpha``); ``forwards`` forward passes over the batch spent on them;
    ``ewma`` θ_ref after a possible reset; ``reset`` whether it reset."""

    old: jax.Array
    forwards: jax.Array
    alpha: jax.Array
    ewma: EWMAReference
    reset: jax.Array


@dataclasses.dataclass(frozen=True)
class ControlRoute:
    """One old-logit route of the control trainer.

    Attributes:
      name: the ``OldLogitTrainConfig.route`` value.
      fn: ``fn(config, inputs: RouteInputs) -> RouteResult`` (pure, jittable).
      param_copies: ``param_copies(window, actor_groups) -> int``, parameter copies held
        besides the learner's own and the engines' (snapshot W + 1, the old-logit model one
        replica per actor group, EWMA one θ_ref).
      exact: the old log-probs are π_train of the acting version.
      proximal: ``None``, ``"linear"`` or ``"loglinear"`` (interpolation proxy in the loss).
      uses_ewma: θ_ref is updated after each batch.
    """

    name: str
    fn: Callable[["OldLogitTrainConfig", RouteInputs], RouteResult]
    param_copies: Callable[[int, int], int] = lambda window, groups: 0
    exact: bool = False
    proximal: Optional[str] = None
    uses_ewma: bool = False


def _group_versions(config: "OldLogitTrainConfig", batch: Batch) -> jax.Array:
    """``[G]`` acting version of each actor group (every env of a group shares it)."""
    per_group = config.train.num_envs // config.train.num_actor_groups
    return batch.version[::per_group, 0]


def _distinct(values: jax.Array) -> jax.Array:
    s = jnp.sort(values)
    return 1 + jnp.sum((s[1:] != s[:-1]).astype(jnp.int32))


def snapshot_log_probs(config: "OldLogitTrainConfig", ring: version_ring.VersionRing,
                       batch: Batch) -> jax.Array:
    """Exact old log-probs ``[N, T]``: each actor group's rows scored by its own version θ_v,
    gathered from the ring (one vmapped forward per group)."""
    tc = config.train
    g = tc.num_actor_groups
    versions = _group_versions(config, batch)
    params, _ = version_ring.gather(ring, ring.latest_version - versions)
    obs = batch.obs.reshape(g, tc.num_envs // g, *batch.obs.shape[1:])
    actions = batch.action.reshape(g, tc.num_envs // g, *batch.action.shape[1:])

    def score(p, o, a):
        policy, _ = tc.network().apply(p, o)
        return networks.log_prob(policy, a)

    return jax.vmap(score)(params, obs, actions).reshape(batch.behaviour_log_prob.shape)


def _result(inputs: RouteInputs, old, forwards, alpha=None, ewma=None, reset=False) -> RouteResult:
    return RouteResult(old=old, forwards=jnp.asarray(forwards, jnp.int32),
                       alpha=jnp.zeros_like(old) if alpha is None else alpha,
                       ewma=inputs.ewma if ewma is None else ewma, reset=jnp.asarray(reset))


def _recompute_current(config, inputs: RouteInputs) -> RouteResult:
    return _result(inputs, inputs.learner_log_prob, 1)


def _snapshot(config, inputs: RouteInputs) -> RouteResult:
    return _result(inputs, snapshot_log_probs(config, inputs.ring, inputs.batch),
                   _distinct(_group_versions(config, inputs.batch)))


def _old_logit_model(config, inputs: RouteInputs) -> RouteResult:
    return _result(inputs, inputs.batch.train_log_prob, _distinct(_group_versions(config, inputs.batch)))


def _proxy(config, inputs: RouteInputs) -> RouteResult:
    k = inputs.ring.latest_version
    return _result(inputs, inputs.batch.behaviour_log_prob, 0,
                   alpha=interpolation_weight(inputs.batch.version, k, k + 1))


def _ewma(reset: bool):
    def fn(config: "OldLogitTrainConfig", inputs: RouteInputs) -> RouteResult:
        policy, _ = config.train.network().apply(inputs.ewma.params, inputs.batch.obs)
        old = networks.log_prob(policy, inputs.batch.action)
        if not reset:
            return _result(inputs, old, 1)
        infer = inputs.batch.behaviour_log_prob
        ones = jnp.ones(infer.shape, bool)
        kept, _ = mis_mask(old - infer, ones, config.mis)
        ewma = ewma_maybe_reset(inputs.ewma, inputs.params, fraction(kept, ones),
                                threshold=inputs.hp.ewma_reset_threshold)
        did_reset = ewma.reset_count > inputs.ewma.reset_count
        return _result(inputs, jnp.where(did_reset, inputs.learner_log_prob, old), 1,
                       ewma=ewma, reset=did_reset)
    return fn


ROUTES: dict[str, ControlRoute] = {}


def register_route(route: ControlRoute) -> ControlRoute:
    """Add ``route`` to :data:`ROUTES` (``ValueError`` if the name is taken); returns it."""
    return register_entry(ROUTES, route, ControlRoute, "control old-logit route")


for _route in (
        ControlRoute("recompute_current", _recompute_current),
        ControlRoute("snapshot", _snapshot, param_copies=lambda w, g: w + 1, exact=True),
        ControlRoute("old_logit_model", _old_logit_model, param_copies=lambda w, g: g, exact=True),
        ControlRoute("linear_proxy", _proxy, proximal="linear"),
        ControlRoute("loglinear_proxy", _proxy, proximal="loglinear"),
        ControlRoute("ewma", _ewma(reset=True), param_copies=lambda w, g: 1, uses_ewma=True),
        ControlRoute("ewma_no_reset", _ewma(reset=False), param_copies=lambda w, g: 1, uses_ewma=True)):
    register_route(_route)
del _route

BUILTIN_ROUTES: tuple[str, ...] = tuple(ROUTES)
PROXIMALS: tuple[Optional[str], ...] = (None, "linear", "loglinear")


def route_index(name: str) -> int:
    """Position of route ``name`` in :data:`ROUTES` (the value of ``OldLogitHParams.route``)."""
    require_choice("route", name, tuple(ROUTES))
    return tuple(ROUTES).index(name)


# --------------------------------------------------------------------------- config and state


@dataclasses.dataclass(frozen=True)
class OldLogitTrainConfig:
    """Static configuration (hashable); traced settings are :class:`OldLogitHParams`.

    Attributes:
      train: actor-critic, env, PPO settings (:class:`~fresh_rl.control.train.TrainConfig`);
        its ``method`` must be ``"ppo_clip"`` (``train.ppo_clip`` is the clip on r_s) and its
        ``delay`` sets the staleness (the study: ``DelayConfig.uniform(0, W, W + 1)``).
      route: a name in :data:`ROUTES`, the default of the traced ``OldLogitHParams.route``.
      discrepancy: the engine's target mean |log r_d| ≥ 0 (0: the engine is exact).
      max_logit_noise: cap on the engine's logit noise σ(s), > 0.
      mis: the MIS mask rules on r_d (default :data:`DEFAULT_MIS`).
      tis_cap: truncation C of the IS weight on r_d (``None``: no weight).
      ewma_beta_rule: the default β of the EWMA from W (:data:`fresh_rl.corrections.BETA_RULES`).
      ewma_reset_threshold: default of ``OldLogitHParams.ewma_reset_threshold``, in [0, 1].
    """

    train: TrainConfig
    route: str = "snapshot"
    discrepancy: float = 0.02
    max_logit_noise: float = 1.0
    mis: MISConfig = DEFAULT_MIS
    tis_cap: Optional[float] = None
    ewma_beta_rule: str = "mean_age"
    ewma_reset_threshold: float = 0.9

    def __post_init__(self):
        t = self.train
        if not isinstance(t, TrainConfig):
            raise ValueError(f"OldLogitTrainConfig.train must be a TrainConfig, got {t!r}")
        require_choice("OldLogitTrainConfig.train.method", t.method, ("ppo_clip",))
        if not t.vec_env.spec.discrete:
            raise ValueError(f"OldLogitTrainConfig.train.env_name must have discrete actions (the engine "
                             f"perturbs logits), got {t.env_name!r}")
        require_choice("OldLogitTrainConfig.route", self.route, tuple(ROUTES))
        require_in_range("OldLogitTrainConfig.discrepancy", self.discrepancy, 0.0, math.inf,
                         high_inclusive=False)
        require_in_range("OldLogitTrainConfig.max_logit_noise", self.max_logit_noise, 0.0, math.inf,
                         low_inclusive=False, high_inclusive=False)
        if not isinstance(self.mis, MISConfig):
            raise ValueError(f"OldLogitTrainConfig.mis must be a MISConfig, got {self.mis!r}")
        require_choice("OldLogitTrainConfig.ewma_beta_rule", self.ewma_beta_rule, BETA_RULES)
        require_in_range("OldLogitTrainConfig.ewma_reset_threshold", self.ewma_reset_threshold, 0.0, 1.0)
        self.loss_config  # validates tis_cap, naming it

    @property
    def staleness_window(self) -> int:
        """W: the largest lag the ring can serve (``train.delay.ring_size`` − 1)."""
        return self.train.delay.ring_size - 1

    @property
    def loss_config(self) -> DecoupledPPOConfig:
        return DecoupledPPOConfig(clip=self.train.ppo_clip, mis=self.mis, tis_cap=self.tis_cap)

    @property
    def num_iterations(self) -> int:
        return self.train.num_iterations


@struct.dataclass
class OldLogitHParams:
    """Traced settings (scalars for one run, ``[N]`` for a vmapped grid): the control
    :class:`HyperParams`, the route (int32 index into :data:`ROUTES`, :func:`route_index`), the
    EWMA's β ∈ [0, 1] and the reset threshold ∈ [0, 1].

    The route is traced so that every route shares one compiled program: unbatched (vmap
    ``in_axes`` None for this leaf) it is a real branch (``lax.switch``), so a run pays only its
    own route; batched, vmap evaluates every branch and selects (the study's grids do this:
    a few extra forward passes per iteration instead of one compilation per route)."""

    control: HyperParams
    route: jax.Array
    ewma_beta: jax.Array
    ewma_reset_threshold: jax.Array

    @classmethod
    def from_config(cls, config: OldLogitTrainConfig) -> "OldLogitHParams":
        beta = ewma_beta_from_staleness(config.staleness_window, config.ewma_beta_rule)
        return cls(control=HyperParams.from_config(config.train),
                   route=jnp.asarray(route_index(config.route), jnp.int32),
                   ewma_beta=jnp.asarray(beta, jnp.float32),
                   ewma_reset_threshold=jnp.asarray(config.ewma_reset_threshold, jnp.float32))

    @classmethod
    def from_grid(cls, config: OldLogitTrainConfig, size: int, *, routes=None, ewma_reset_threshold=None,
                  learning_rate=None, ewma_beta=None) -> "OldLogitHParams":
        """``[size]`` leaves: the swept values where given (``routes`` as names), the config
        defaults elsewhere."""
        base = cls.from_config(config)
        control = HyperParams.from_grid(
            config.train, {} if learning_rate is None else {"learning_rate": list(learning_rate)}, size=size)

        def leaf(values, default, dtype, convert=lambda v: v):
            if values is None:
                return jnp.broadcast_to(default, (size,))
            if len(values) != size:
                raise ValueError(f"every swept OldLogitHParams field needs {size} values, got {len(values)}")
            return jnp.asarray([convert(v) for v in values], dtype)

        return cls(control=control, route=leaf(routes, base.route, jnp.int32, route_index),
                   ewma_beta=leaf(ewma_beta, base.ewma_beta, jnp.float32),
                   ewma_reset_threshold=leaf(ewma_reset_threshold, base.ewma_reset_threshold, jnp.float32))

    def validate(self, config: OldLogitTrainConfig) -> None:
        """Range checks of the concrete leaves (``ValueError`` naming the field and range)."""
        self.control.validate(config.train)
        for name in ("ewma_beta", "ewma_reset_threshold"):
            leaf = getattr(self, name)
            if not is_traced(leaf):
                check_in_range(f"OldLogitHParams.{name}", jnp.asarray(leaf), 0.0, 1.0)
        if not is_traced(self.route):
            check_in_range("OldLogitHParams.route", jnp.asarray(self.route), 0, len(ROUTES) - 1)


@struct.dataclass
class OldLogitTrainState:
    """Carry: the control ``TrainState`` (θ, Adam, version ring, envs) and θ_ref."""

    train: TrainState
    ewma: EWMAReference


def init_state(config: OldLogitTrainConfig, key: chex.PRNGKey, hp: OldLogitHParams) -> OldLogitTrainState:
    train_state = init_train_state(config.train, key, hp.control)
    return OldLogitTrainState(train=train_state, ewma=init_ewma_reference(train_state.params))


# --------------------------------------------------------------------------- one iteration


def _loss_fn(config: OldLogitTrainConfig, hp: HyperParams, proximal: jax.Array):
    """Decoupled-loss step; ``proximal`` (traced index into :data:`PROXIMALS`) picks the batch's
    old log-probs or an interpolation proxy built from this minibatch's detached π_θ."""
    net = config.train.network()

    def loss_fn(params, mb):
        policy, values = net.apply(params, mb["obs"])
        logp = networks.log_prob(policy, mb["action"])
        old = jax.lax.switch(proximal, (
            lambda: mb["old_log_prob"],
            lambda: linear_proximal_log_probs(mb["behaviour_log_prob"], logp, mb["alpha"]),
            lambda: loglinear_proximal_log_probs(mb["behaviour_log_prob"], logp, mb["alpha"])))
        adv = mb["advantage"]
        adv = (adv - jnp.mean(adv)) / (jnp.std(adv) + 1e-8)
        pg, pm = decoupled_ppo_loss(logp[None], old[None], mb["behaviour_log_prob"][None], adv[None],
                                    config=config.loss_config)
        v_loss = 0.5 * jnp.mean(jnp.square(values - mb["target"]))
        ent = jnp.mean(networks.entropy(policy))
        metrics = {name: pm[name] for name in ("active_token_fraction", "clip_fraction")}
        log_rd_abs = jnp.mean(jnp.abs(jax.lax.stop_gradient(old) - mb["behaviour_log_prob"]))
        return pg + hp.value_coef * v_loss - hp.entropy_coef * ent, {
            **metrics, "log_rd_abs": log_rd_abs, "value_loss": v_loss, "entropy": ent}

    return loss_fn


def train_iteration(config: OldLogitTrainConfig, state: OldLogitTrainState, key: chex.PRNGKey,
                    hp: OldLogitHParams) -> tuple[OldLogitTrainState, dict]:
    """One rollout through the engine, the route's old log-probs, the decoupled-loss updates,
    the EWMA step and the ring push, then the learner evaluation when due."""
    tc = config.train
    key_roll, key_upd = jax.random.split(key)
    engine = make_inference_engine(config.discrepancy, config.max_logit_noise)
    ts, batch, metrics = _rollout(tc, state.train, key_roll, hp.control, engine=engine)
    logp_k, values, next_values = _batch_start(tc, ts.params, batch)
    inputs = RouteInputs(params=ts.params, ring=ts.ring, ewma=state.ewma, hp=hp, batch=batch,
                         learner_log_prob=logp_k)
    routes = tuple(ROUTES.values())
    route = jax.lax.switch(hp.route, [lambda x, r=r: r.fn(config, x) for r in routes], inputs)
    proximal = jnp.asarray([PROXIMALS.index(r.proximal) for r in routes], jnp.int32)[hp.route]
    uses_ewma = jnp.asarray([r.uses_ewma for r in routes])[hp.route]
    episode_end = batch.terminated | batch.truncated
    gae = generalized_advantage_estimation(
        batch.reward, values, next_values, hp.control.gamma * (1.0 - batch.terminated.astype(jnp.float32)),
        lambda_=tc.gae_lambda, episode_ends=episode_end)
    data = {"obs": batch.obs, "action": batch.action, "behaviour_log_prob": batch.behaviour_log_prob,
            "old_log_prob": route.old, "alpha": route.alpha, "advantage": gae.advantages,
            "target": gae.returns}
    data = jax.tree.map(lambda x: x.reshape(tc.batch_size, *x.shape[2:]), data)
    (params, opt_state), step_metrics = sgd_passes(
        _loss_fn(config, hp.control, proximal), tc.optimizer(hp.control.learning_rate), ts.params, ts.opt_state,
        data, key_upd, tc.passes_per_batch_used, tc.num_minibatches)
    ewma = jax.tree.map(lambda new, old: jnp.where(uses_ewma, new, old),
                        ewma_update(route.ewma, params, beta=hp.ewma_beta), route.ewma)
    ts = ts.replace(params=params, opt_state=opt_state, ring=version_ring.push(ts.ring, params))
    lag = (ts.ring.latest_version - 1 - batch.version).astype(jnp.float32)
    metrics.update({
        **{f"loss/{k}": jnp.mean(v) for k, v in step_metrics.items()},
        "old_logits/log_rd_abs_true": jnp.mean(jnp.abs(batch.train_log_prob - batch.behaviour_log_prob)),
        "old_logits/staleness_log_ratio_abs": jnp.mean(jnp.abs(logp_k - batch.train_log_prob)),
        "old_logits/forwards": route.forwards,
        "old_logits/reset": route.reset.astype(jnp.int32),
        "lag/version_gap_mean": jnp.mean(lag),
        "lag/version_gap_max": jnp.max(lag),
    })
    if tc.eval_every:
        ts, eval_metrics = _evaluate_learner(tc, ts, evaluation_key(key))
        metrics.update(eval_metrics)
    return OldLogitTrainState(train=ts, ewma=ewma), metrics


def train(config: OldLogitTrainConfig, key: chex.PRNGKey, hp: Optional[OldLogitHParams] = None) -> dict:
    """One whole run; ``jax.jit(train, static_argnums=0)`` and ``jax.vmap(train, (None, 0, 0))``
    over keys and hyperparameter rows. Keys as :func:`fresh_rl.control.train.train`.

    Returns ``[num_iterations]`` metrics: ``episode_return``, ``eval/…`` (with
    ``train.eval_every``), ``loss/active_token_fraction`` (ρ_active, mean over the batch's
    steps), ``loss/clip_fraction`` (r_s), ``old_logits/log_rd_abs_true`` (mean |log r_d| of the
    engine: clean π_v vs π_infer), ``loss/log_rd_abs`` (the route's mean |log r̂_d| =
    |log π_old − log π_infer|, over the steps; proxies move with θ),
    ``old_logits/staleness_log_ratio_abs`` (mean |log π_k/π_v| on the batch), ``old_logits/forwards``,
    ``old_logits/reset``, ``lag/version_gap_mean``/``_max``; plus ``ewma_reset_count``.
    """
    hp = OldLogitHParams.from_config(config) if hp is None else hp
    hp.validate(config)
    key_init, key_loop = split_run_key(key)
    state, metrics = jax.lax.scan(
        lambda s, k: train_iteration(config, s, k, hp), init_state(config, key_init, hp),
        step_keys(key_loop, 0, config.num_iterations))
    return {**metrics, "ewma_reset_count": state.ewma.reset_count}


def route_table(window: int, actor_groups: int) -> list[dict]:
    """Per route: exactness, proxy, parameter copies at window W with G actor groups."""
    return [{"route": r.name, "exact": r.exact, "proximal": r.proximal or "",
             "param_copies": r.param_copies(window, actor_groups)} for r in ROUTES.values()]


__all__ = ["BUILTIN_ROUTES", "ControlRoute", "DEFAULT_MIS", "OldLogitHParams", "OldLogitTrainConfig",
           "OldLogitTrainState", "PROXIMALS", "ROUTES", "RouteInputs", "RouteResult", "first_order_discrepancy",
           "init_state", "make_inference_engine", "register_route", "route_index", "route_table", "snapshot_log_probs",
           "train", "train_iteration"]
