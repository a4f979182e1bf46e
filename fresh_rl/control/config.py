"""The control trainer's static configuration: :class:`TrainConfig`, its three seams and their checks.

A run of :func:`fresh_rl.control.train.train` is one :class:`TrainConfig` (static: shapes,
networks, the program's structure) and one :class:`~fresh_rl.control.hyperparams.HyperParams`
(traced: every value a sweep may vary inside one compiled program). The config names one entry
of each of the trainer's three registries:

* ``method`` (:data:`fresh_rl.control.methods.METHODS`): advantages, policy loss, value
  targets, minibatch layout, passes per batch — ppo_clip, ppo_kl, spo, impala, the VACO family,
  decoupled_ppo;
* ``data_source`` (:data:`fresh_rl.control.data_sources.DATA_SOURCES`): lagged actors only, or
  replay on top of them (uniform, PER, the authors' PER, the age-decayed buffer);
* ``route`` (:data:`fresh_rl.corrections.routes.ROUTES`): where the ratio's old log-probs come
  from (``None``: the method's default route).

Every (method, data source, route) triple either runs or is refused here, naming both parts
(:func:`combination_error`; docs/control.md has the table).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import chex
import optax

from fresh_rl.control import brax_envs
from fresh_rl.control import envs as envs_lib
from fresh_rl.control import networks
from fresh_rl.control.data_sources import DATA_SOURCES, DataSource, ReplaySettings
from fresh_rl.control.methods import ADVANTAGE_NORMALIZATIONS, METHODS, Method
from fresh_rl.corrections import (
    AdaptiveKLConfig,
    DecoupledPPOConfig,
    MISConfig,
    PPOClipConfig,
    PPOKLConfig,
    SPOConfig,
    VACOConfig,
    VTraceConfig,
)
from fresh_rl.corrections.ewma import BETA_RULES
from fresh_rl.corrections.routes import ROUTES, OldLogProbRoute
from fresh_rl.lag import DelayConfig
from fresh_rl.replay import ReplayConfig
from fresh_rl.validation import require_choice, require_in_range, require_int

VACO_ADVANTAGE_FORMS: tuple[str, ...] = ("impala", "gae_like")
DEFAULT_MIS = MISConfig(token_bounds=(math.exp(-0.1), math.exp(0.1)))
"""Token mask exp(±0.1) on r_d of ``decoupled_ppo`` (our choice: loose for an engine
discrepancy of 0.02, where |log r_d| > 0.1 is a 4σ event, tight for staleness)."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Static configuration of one training run (hashable: pass as ``static_argnums``).

    Seed-independent: the seed is the ``key`` given to :func:`train`.

    Attributes:
      env_name: a gymnax id or ``"brax/<name>"`` (``fresh_rl.control.envs.env_names()``).
      brax_backend: Brax pipeline (``brax_envs.BRAX_BACKENDS``) of ``"brax/<name>"`` env_name ids.
      num_envs: parallel environments (actors) per seed.
      rollout_length: T, steps per env per iteration; batch = num_envs · T samples.
      total_env_steps: budget; iterations = total_env_steps // (num_envs · T) (≥ 1).
      num_epochs, num_minibatches: forward lag — updates per batch = passes × minibatches,
        passes = ``passes_per_batch_used`` (``num_epochs`` unless the method or
        ``passes_per_batch`` says otherwise). ``num_minibatches`` must divide num_envs · T (and
        num_envs for methods whose minibatches are whole env rows, e.g. ``impala``).
      learning_rate, max_grad_norm, adam_eps: Adam with global-norm clipping (constant lr).
      gamma, gae_lambda: γ and λ (λ also is V-trace's trace parameter).
      value_coef, entropy_coef: c_v, c_ent of ``L = L_π + c_v·½·MSE − c_ent·H``.
        ``learning_rate``, ``gamma``, ``value_coef``, ``entropy_coef``, ``kl_coef``,
        ``vaco.delta`` and ``delay.lag`` are the defaults of the traced
        :class:`~fresh_rl.control.hyperparams.HyperParams` the trainer reads.
      advantage_normalization: per-minibatch ``"standardize"``, ``"scale"`` (divide by the std
        only), ``"none"`` or ``"centered_ratio"`` (unbiased baseline, see
        :mod:`fresh_rl.control.methods`); ``None`` = the method's ``default_normalization``.
      passes_per_batch: passes over each batch, an integer ≥ 1; one pass = one epoch =
        ``num_minibatches`` SGD steps, each sample used once. ``None`` = the method's
        ``passes_per_batch`` (IMPALA: 1), else ``num_epochs``. Static (it sets the scan length).
      normalize_obs, obs_clip: running observation normalisation of the env adapter.
      hidden_sizes, activation, init_log_std: network (see ``networks.ActorCritic``).
      encoder: ``"auto"`` (MLP for vector observations ``[D]``, CNN for images ``[H, W, C]``),
        ``"mlp"`` or ``"cnn"`` (must match the observation rank; ``encoder_used``).
      conv_channels, conv_kernel_size: the CNN's VALID stride-1 convolutions before the MLP;
        default one 3×3 conv with 16 channels (the MinAtar network, arXiv 1903.03176 §4).
      method: a name registered in :data:`fresh_rl.control.methods.METHODS`.
      ppo_clip, ppo_kl, kl_coef, spo, vaco: the losses' configs; ``kl_coef`` is PPO-KL's β ≥ 0
        (fixed, or the initial value when ``kl_adaptive`` is set).
      kl_adaptive: ``None`` (fixed β, the VACO paper's PPO-KL baseline) or an
        :class:`~fresh_rl.corrections.AdaptiveKLConfig`: after each batch β is halved/doubled
        when the measured KL is below target/1.5 / above target·1.5 (PPO §4). The measured KL
        is the mean of the loss's KL penalty over the last epoch's minibatches (our choice;
        it costs no extra forward pass).
      vtrace_rho_bar, vtrace_c_bar: ρ̄, c̄ of V-trace (vaco, vaco_align_only, impala).
      vaco_advantage: realigned advantage form: ``"impala"`` ρ_t(r_t + γ v_{t+1} − V_t)
        (default, docs/vaco.md) or ``"gae_like"`` v_t − V_t.
      delay: backward-lag distribution and ring size K (``fresh_rl.lag.DelayConfig``).
      num_actor_groups: G groups of num_envs/G envs, each with its own lag draw.
      lag_warmup_versions: W_u ≥ 0. The actors act on-policy while the learner's latest version
        v < W_u, and afterwards with the drawn lag clipped to v − W_u, so the oldest version they
        ever act with is W_u: the lag ramps up one version per version after the warm-up and
        the ring never serves θ0 to a lagged actor. 0 (the default) is no warm-up: a lag L
        serves θ0 until v = L (our choice of mechanism; the VACO paper does not say how its
        actors start).
      data_source: a name registered in :data:`fresh_rl.control.data_sources.DATA_SOURCES`.
      replay: the replay sources' static settings (:class:`~fresh_rl.control.data_sources.ReplaySettings`).
      route: the old-log-prob route (:data:`fresh_rl.corrections.routes.ROUTES`) that fills the
        ratio's reference; ``None`` = the method's ``default_route`` (``route_used``).
      routes: the routes the traced ``HyperParams.route`` index may pick (one program for all
        of them; ``()`` = just ``route_used``; ``routes_used``).
      inference_discrepancy: ``None`` (actors sample from the trainer's own π_v) or the target
        mean |log r_d| ≥ 0 of a simulated inference engine whose logits are perturbed
        (:func:`fresh_rl.control.acting.make_inference_engine`); the clean log π_v is then
        recorded beside the acting log-prob.
      max_logit_noise: cap > 0 on the engine's logit noise σ(s).
      decoupled_mis, tis_cap: ``decoupled_ppo``'s MIS rules on r_d (default :data:`DEFAULT_MIS`)
        and the truncation C of its IS weight (``None``: no weight).
      ewma_beta_rule: default β of the EWMA routes (:data:`fresh_rl.corrections.ewma.BETA_RULES`),
        from W = ``delay.ring_size`` − 1 and the delay's mean lag ā: ``"mean_age"`` (the one
        default, our choice) β = ā/(ā + 1), i.e. W/(W + 2) for lags U{0..W}, W/(W + 1) for a
        fixed lag W; the window rules ignore ā (docs/old_logits.md, "One β rule").
      ewma_reset_threshold: default of the traced reset threshold of the ``ewma`` route, in [0, 1]
        (0.9, our choice; the study sweeps it).
      eval_every: learner evaluation every ``eval_every`` versions and at the last one
        (0 = off, the default; see the module docstring).
      eval_episodes: episodes per evaluation, each mode (≥ 1).
    """

    env_name: str = "CartPole-v1"
    brax_backend: str = "spring"
    num_envs: int = 8
    rollout_length: int = 64
    total_env_steps: int = 50_000
    num_epochs: int = 4
    num_minibatches: int = 4
    learning_rate: float = 2.5e-4
    max_grad_norm: float = 0.5
    adam_eps: float = 1e-5
    gamma: float = 0.99
    gae_lambda: float = 0.95
    value_coef: float = 0.5
    entropy_coef: float = 0.01
    advantage_normalization: Optional[str] = None
    passes_per_batch: Optional[int] = None
    normalize_obs: bool = False
    obs_clip: float = 10.0
    hidden_sizes: tuple[int, ...] = (64, 64)
    activation: str = "tanh"
    init_log_std: float = 0.0
    encoder: str = "auto"
    conv_channels: tuple[int, ...] = (16,)
    conv_kernel_size: int = 3
    method: str = "ppo_clip"
    ppo_clip: PPOClipConfig = PPOClipConfig()
    ppo_kl: PPOKLConfig = PPOKLConfig()
    kl_coef: float = 1.0
    kl_adaptive: Optional[AdaptiveKLConfig] = None
    spo: SPOConfig = SPOConfig()
    vaco: VACOConfig = VACOConfig()
    vtrace_rho_bar: float = 1.0
    vtrace_c_bar: float = 1.0
    vaco_advantage: str = "impala"
    delay: DelayConfig = DelayConfig()
    num_actor_groups: int = 1
    lag_warmup_versions: int = 0
    data_source: str = "lagged_actors"
    replay: ReplaySettings = ReplaySettings()
    route: Optional[str] = None
    routes: tuple[str, ...] = ()
    inference_discrepancy: Optional[float] = None
    max_logit_noise: float = 1.0
    decoupled_mis: MISConfig = DEFAULT_MIS
    tis_cap: Optional[float] = None
    ewma_beta_rule: str = "mean_age"
    ewma_reset_threshold: float = 0.9
    eval_every: int = 0
    eval_episodes: int = 8

    def __post_init__(self):
        require_choice("env_name", self.env_name, envs_lib.env_names())
        require_choice("brax_backend", self.brax_backend, brax_envs.BRAX_BACKENDS)
        require_choice("method", self.method, tuple(METHODS))
        require_choice("vaco_advantage", self.vaco_advantage, VACO_ADVANTAGE_FORMS)
        if self.advantage_normalization is not None:
            require_choice("advantage_normalization", self.advantage_normalization, ADVANTAGE_NORMALIZATIONS)
        require_choice("activation", self.activation, tuple(networks.ACTIVATIONS))
        require_int("num_envs", self.num_envs, 1)
        require_int("rollout_length", self.rollout_length, 1)
        require_int("num_epochs", self.num_epochs, 1)
        require_int("num_minibatches", self.num_minibatches, 1)
        if self.passes_per_batch is not None:
            require_int("passes_per_batch", self.passes_per_batch, 1)
        require_int("num_actor_groups", self.num_actor_groups, 1, self.num_envs)
        require_int("lag_warmup_versions", self.lag_warmup_versions, 0)
        require_int("total_env_steps", self.total_env_steps, self.batch_size)
        if self.num_envs % self.num_actor_groups:
            raise ValueError(
                f"num_actor_groups must divide num_envs={self.num_envs}, got {self.num_actor_groups}"
            )
        if self.batch_size % self.num_minibatches:
            raise ValueError(
                f"num_minibatches must divide the batch num_envs*rollout_length={self.batch_size}, "
                f"got {self.num_minibatches}"
            )
        if self.method_spec.minibatch_layout == "env_rows" and self.num_envs % self.num_minibatches:
            raise ValueError(
                f"num_minibatches must divide num_envs={self.num_envs} for method={self.method!r} "
                f"(minibatches are whole env rows), got {self.num_minibatches}"
            )
        for name in ("learning_rate", "max_grad_norm", "adam_eps", "vtrace_rho_bar", "vtrace_c_bar",
                     "obs_clip"):
            require_in_range(name, getattr(self, name), 0.0, math.inf, low_inclusive=False, high_inclusive=False)
        require_in_range("gamma", self.gamma, 0.0, 1.0)
        require_in_range("gae_lambda", self.gae_lambda, 0.0, 1.0)
        for name in ("value_coef", "entropy_coef", "kl_coef"):
            require_in_range(name, getattr(self, name), 0.0, math.inf, high_inclusive=False)
        require_in_range("init_log_std", self.init_log_std, -math.inf, math.inf, low_inclusive=False,
                         high_inclusive=False)
        for name in ("hidden_sizes", "conv_channels"):
            widths = getattr(self, name)
            if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
                raise ValueError(f"{name} must be a non-empty tuple of integers ≥ 1, got {widths!r}")
        require_int("conv_kernel_size", self.conv_kernel_size, 1)
        require_int("eval_every", self.eval_every, 0)
        require_int("eval_episodes", self.eval_episodes, 1)
        require_choice("encoder", self.encoder, ("auto",) + networks.ENCODERS)
        self._check_encoder()
        if self.kl_adaptive is not None and not isinstance(self.kl_adaptive, AdaptiveKLConfig):
            raise ValueError(f"kl_adaptive must be None or an AdaptiveKLConfig, got {self.kl_adaptive!r}")
        for name, cls in (("ppo_clip", PPOClipConfig), ("ppo_kl", PPOKLConfig), ("spo", SPOConfig),
                          ("vaco", VACOConfig), ("delay", DelayConfig), ("replay", ReplaySettings),
                          ("decoupled_mis", MISConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"{name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        fixed = self.method_spec.threshold_convention
        if fixed is not None and self.vaco.threshold_convention not in (fixed, VACOConfig().threshold_convention):
            raise ValueError(f"vaco.threshold_convention={self.vaco.threshold_convention!r} contradicts "
                             f"method={self.method!r}, which fixes {fixed!r} (method 'vaco' reads the config)")
        require_choice("data_source", self.data_source, tuple(DATA_SOURCES))
        if self.route is not None:
            require_choice("route", self.route, tuple(ROUTES))
        if not isinstance(self.routes, tuple):
            raise ValueError(f"routes must be a tuple of route names, got {self.routes!r}")
        for name in self.routes:
            require_choice("every entry of routes", name, tuple(ROUTES))
        if self.routes and self.route_used not in self.routes:
            raise ValueError(f"routes={self.routes!r} must contain the run's route {self.route_used!r} "
                             f"(route, or method {self.method!r}'s default route)")
        if self.inference_discrepancy is not None:
            require_in_range("inference_discrepancy", self.inference_discrepancy, 0.0, math.inf,
                             high_inclusive=False)
            if not self.vec_env.spec.discrete:
                raise ValueError(f"inference_discrepancy needs discrete actions (the engine perturbs "
                                 f"logits), env_name={self.env_name!r} has continuous actions")
        require_in_range("max_logit_noise", self.max_logit_noise, 0.0, math.inf, low_inclusive=False,
                         high_inclusive=False)
        require_choice("ewma_beta_rule", self.ewma_beta_rule, BETA_RULES)
        require_in_range("ewma_reset_threshold", self.ewma_reset_threshold, 0.0, 1.0)
        self.decoupled_config  # validates tis_cap, naming it
        for route in self.routes_used:
            problem = combination_error(self.method_spec, self.data_source_spec, ROUTES[route])
            if problem:
                raise ValueError(problem)
        if self.replay.drift_every:
            if not self.data_source_spec.buffered:
                raise ValueError(f"replay.drift_every={self.replay.drift_every} needs a replay data source "
                                 f"(it scores the stored rows), got data_source={self.data_source!r}")
            if self.num_iterations % self.replay.drift_every:
                raise ValueError(f"replay.drift_every={self.replay.drift_every} must divide the run's "
                                 f"iterations num_iterations={self.num_iterations}")

    @property
    def encoder_used(self) -> str:
        """``encoder``, with ``"auto"`` resolved by the observation rank (1: mlp, 3: cnn)."""
        if self.encoder != "auto":
            return self.encoder
        rank = len(self.vec_env.spec.obs_shape)
        return next((enc for enc, r in networks.OBS_RANK.items() if r == rank), "auto")

    def _check_encoder(self) -> None:
        shape = self.vec_env.spec.obs_shape
        encoder = self.encoder_used
        if encoder == "auto":
            raise ValueError(f"encoder='auto' handles observations of rank 1 (mlp) or 3 (cnn, [H, W, C]); "
                             f"env_name={self.env_name!r} gives shape {shape}")
        if len(shape) != networks.OBS_RANK[encoder]:
            raise ValueError(f"encoder={encoder!r} needs observations of rank {networks.OBS_RANK[encoder]}, "
                             f"env_name={self.env_name!r} gives shape {shape}; use encoder='auto'")
        if encoder == "cnn" and networks.conv_output_size(
                min(shape[:2]), len(self.conv_channels), self.conv_kernel_size) < 1:
            raise ValueError(f"conv_kernel_size={self.conv_kernel_size} with {len(self.conv_channels)} "
                             f"conv_channels layers leaves no pixel of the {shape[:2]} image (VALID "
                             f"padding shrinks each side by conv_kernel_size − 1 per layer)")

    @property
    def method_spec(self) -> Method:
        """The registered :class:`~fresh_rl.control.methods.Method` named ``method``."""
        return METHODS[self.method]

    @property
    def data_source_spec(self) -> DataSource:
        """The registered :class:`~fresh_rl.control.data_sources.DataSource` named ``data_source``."""
        return DATA_SOURCES[self.data_source]

    @property
    def route_used(self) -> str:
        """``route``, else the method's ``default_route``."""
        return self.method_spec.default_route if self.route is None else self.route

    @property
    def routes_used(self) -> tuple[str, ...]:
        """The routes the traced ``HyperParams.route`` indexes: ``routes``, else ``(route_used,)``."""
        return self.routes or (self.route_used,)

    @property
    def route_specs(self) -> tuple[OldLogProbRoute, ...]:
        return tuple(ROUTES[name] for name in self.routes_used)

    @property
    def decoupled_config(self) -> DecoupledPPOConfig:
        """``decoupled_ppo``'s loss settings: the clip on r_s is ``ppo_clip``."""
        return DecoupledPPOConfig(clip=self.ppo_clip, mis=self.decoupled_mis, tis_cap=self.tis_cap)

    @property
    def replay_config(self) -> ReplayConfig:
        """The trajectory buffer of the replay sources: N·H rows, N per sample, age-decayed
        priorities with τ set from the traced ``HyperParams.age_decay_tau``."""
        n = self.num_envs
        return ReplayConfig(
            capacity=n * self.replay.buffer_iterations, sample_batch_size=n, sampling="freshper",
            priority_exponent=self.replay.priority_exponent,
            importance_exponent=self.replay.importance_exponent, age_decay_tau=math.inf,
            new_item_priority="given", min_decayed_priority=self.replay.min_decayed_priority,
            importance_weight_normalization=self.replay.importance_weight_normalization)

    @property
    def advantage_normalization_used(self) -> str:
        if self.advantage_normalization is not None:
            return self.advantage_normalization
        return self.method_spec.default_normalization

    @property
    def passes_per_batch_used(self) -> int:
        """Passes (epochs) over each batch: ``passes_per_batch``, else the method's, else ``num_epochs``."""
        for passes in (self.passes_per_batch, self.method_spec.passes_per_batch):
            if passes is not None:
                return passes
        return self.num_epochs

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.rollout_length

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_iterations(self) -> int:
        return self.total_env_steps // self.batch_size

    @property
    def vtrace_config(self) -> VTraceConfig:
        return VTraceConfig(lambda_=self.gae_lambda, rho_bar=self.vtrace_rho_bar, c_bar=self.vtrace_c_bar)

    @property
    def vec_env(self) -> "envs_lib.VecEnv | brax_envs.BraxVecEnv":
        return envs_lib.make_vec_env(self.env_name, self.num_envs, self.normalize_obs, self.obs_clip,
                                     brax_backend=self.brax_backend)

    def network(self) -> networks.ActorCritic:
        spec = self.vec_env.spec
        return networks.ActorCritic(
            action_dim=spec.action_dim, discrete=spec.discrete, hidden_sizes=tuple(self.hidden_sizes),
            activation=self.activation, init_log_std=self.init_log_std, encoder=self.encoder_used,
            conv_channels=tuple(self.conv_channels), conv_kernel_size=self.conv_kernel_size,
        )

    def optimizer(self, learning_rate: chex.Numeric) -> optax.GradientTransformation:
        """Global-norm clipping then Adam with step size ``learning_rate`` (may be traced: the
        optimiser state does not depend on it)."""
        return optax.chain(
            optax.clip_by_global_norm(self.max_grad_norm),
            optax.scale_by_adam(eps=self.adam_eps),
            optax.scale_by_learning_rate(learning_rate),
        )




def combination_error(method: Method, source: DataSource, route: OldLogProbRoute) -> str:
    """Why a (method, data source, route) triple cannot run, naming both parts; ``""`` if it can.

    Refused: ``snapshot`` with a replay source (a replayed row may be older than the version
    ring; ``old_logit_model`` records the same numbers at collection time and works there);
    ``impala`` with a replay source (its V-trace runs per step along whole rows of the fresh
    batch; replayed rows would need their own per-step pass) and with a proxy route (its loss
    −Â·log π_θ has no ratio for a proxy to stand in for); a factorial route (``splits_clip``)
    with a replay source (it reads snapshots) and with any loss but the decoupled one (the only
    loss with a mask on r_d and a clip on r_s to feed apart).
    """
    if route.splits_clip and source.buffered:
        return (f"route {route.name!r} cannot serve data_source {source.name!r}: it reads snapshots, and a "
                f"replayed row may be older than the version ring")
    if route.splits_clip and method.policy_loss is not METHODS["decoupled_ppo"].policy_loss:
        return (f"method {method.name!r} cannot use route {route.name!r}: only decoupled_ppo's loss has a mask "
                f"on r_d and a clip on r_s for the route to feed from two sources")
    if route.name == "snapshot" and source.buffered:
        return (f"route 'snapshot' cannot serve data_source {source.name!r}: a replayed row may be older "
                f"than the version ring; use route 'old_logit_model' (the same numbers, recorded at "
                f"collection time)")
    if method.advantages == "vtrace_per_step" and source.buffered:
        return (f"method {method.name!r} cannot use data_source {source.name!r}: its V-trace runs per SGD "
                f"step along whole fresh rows (minibatch_layout='env_rows')")
    if method.loss_form == "log_prob" and route.proximal is not None:
        return (f"method {method.name!r} cannot use route {route.name!r}: its loss −Â·log π_θ has no "
                f"ratio for the {route.proximal} proxy to stand in for")
    return ""


def combination_table_markdown() -> str:
    """Which routes each (method, data source) pair accepts, as a Markdown table (docs/control.md):
    ``all`` or ``all but …`` per cell, ``—`` where none runs; the reasons are
    :func:`combination_error`'s."""
    sources = DATA_SOURCES
    lines = ["| method | " + " | ".join(f"`{s}`" for s in sources) + " |", "|---|" + "---|" * len(sources)]
    for method in METHODS.values():
        cells = []
        for source in sources.values():
            refused = [r for r in ROUTES.values() if combination_error(method, source, r)]
            cells.append("all" if not refused else "—" if len(refused) == len(ROUTES)
                         else "all but " + ", ".join(f"`{r.name}`" for r in refused))
        lines.append(f"| `{method.name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)
