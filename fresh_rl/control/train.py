"""Jitted PPO-family trainer on gymnax with simulated policy lag: ``train(config, key)``.

One iteration (= one batch = one policy version)::

    lags_g ~ DelayConfig (one draw per actor group g, per iteration)
    θ_g, v_g ← version_ring.gather(ring, lags)           # backward lag: version v_T − k_g
    roll out T steps in num_envs envs, env e acting with θ_{group(e)};
        store s, a, r, terminated, truncated, s_{t+1}, log β(a|s), v_β
    learner at batch start (θ_T = newest ring entry): log π_T(a|s), V_T(s), V_T(s_{t+1})
    advantages, once per batch (method.advantages): GAE(λ) on V_T, or V-trace with
        log ρ = log π_T − log β on V_T, or none here (V-trace recomputed every step)
    passes × minibatches gradient steps (forward lag; passes = epochs unless the method or
        the config sets passes_per_batch), loss = policy + c_v·value − c_ent·H
    ring ← push(ring, θ)                                 # new version v_T + 1

**Methods** (:mod:`fresh_rl.control.methods`): each registered :class:`Method` fixes the
advantage source, the ratio's reference, the default advantage normalisation, the minibatch
layout and the policy loss; the reference policies and the normalisation defaults are
documented there. **Value targets**: λ-returns (GAE) or V-trace targets v_t, frozen per batch
unless the method recomputes V-trace every step (IMPALA); value loss ½·mean (V_θ(s) − target)²,
no value clipping (our choice). **Advantage normalisation** per minibatch:
``"standardize"`` (Â − mean)/std, ``"scale"`` Â/std, ``"none"`` or ``"centered_ratio"``. Plain
centring is biased unless the loss is a ratio against β (derivation in
:mod:`fresh_rl.control.methods`); on CartPole at lag 4 VACO with standardisation collapsed
(entropy → 0.05, return → 10) while "scale"/"none" learned (results/vaco/README.md).
**Hyperparameters**: every sweepable value (lag, δ, learning rate, loss coefficients, β₀, γ)
is a leaf of :class:`~fresh_rl.control.hyperparams.HyperParams`, read from the traced pytree
on every use; the config only supplies its defaults.
**Keys** (:mod:`fresh_rl.sweep.keys`): ``key_init, key_loop = split_run_key(key)``; iteration
i uses ``step_key(key_loop, i)``.
**Versions**: one ``push`` per iteration, so a version is one batch of ``epochs × minibatches``
updates and lag k means "parameters k batches old"; lags are redrawn every iteration.
**Metrics** (one value per iteration): ``episode_return`` — mean undiscounted return of the
episodes that ended during the iteration's rollout (the previous iteration's value carried if
none ended; 0 before the first), ``episodes_completed``, the batch-start ``lag/…`` metrics of
:func:`fresh_rl.lag.lag_metrics` (version gap, TV(π_T, β), ESS, KL), ``lag/forward_tv`` — the
forward lag after the batch's updates, ½·mean|π_θ/π_T − 1| over the batch's samples (actions
from β; every method, our choice of estimator: the unweighted mean, exact in expectation at
lag 0), and ``loss/…`` — the mean over all gradient steps of the loss's metrics plus
``value_loss``, ``entropy`` and ``grad_norm``.
**Learner evaluation** (``eval_every`` > 0; :mod:`fresh_rl.control.evaluation`): after the
update that makes learner version v, when v is a multiple of ``eval_every`` or the last one,
θ_v plays ``eval_episodes`` episodes on fresh envs, deterministic and stochastic, with the
run's observation statistics frozen and the key ``evaluation_key(iteration key)``;
``eval/return_deterministic`` and ``eval/return_stochastic`` are the means over episodes,
carried forward between evaluations (0 before the first), and ``eval/valid`` is 1 on the
iterations that evaluated (select those for curves: :mod:`fresh_rl.eval.scores`). With
``eval_every = 0`` (default) there is no evaluation and no ``eval/…`` metric.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp
import optax
from flax import struct

from fresh_rl.control import brax_envs
from fresh_rl.control import envs as envs_lib
from fresh_rl.control import networks
from fresh_rl.control.env_types import VecEnvState
from fresh_rl.control.evaluation import evaluation_key, evaluation_metrics
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.methods import ADVANTAGE_NORMALIZATIONS, METHODS, Method, centring_weight
from fresh_rl.corrections import (
    AdaptiveKLConfig,
    PPOClipConfig,
    PPOKLConfig,
    SPOConfig,
    VACOConfig,
    VTraceConfig,
    adaptive_kl_coefficient,
    generalized_advantage_estimation,
    tv_estimate,
    vtrace,
)
from fresh_rl.lag import DelayConfig, actor_group_ids, lag_metrics, sample_lags, version_ring
from fresh_rl.sweep.keys import split_run_key, step_keys
from fresh_rl.validation import require_choice, require_in_range, require_int

VACO_ADVANTAGE_FORMS: tuple[str, ...] = ("impala", "gae_like")


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
                          ("vaco", VACOConfig), ("delay", DelayConfig)):
            if not isinstance(getattr(self, name), cls):
                raise ValueError(f"{name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        fixed = self.method_spec.threshold_convention
        if fixed is not None and self.vaco.threshold_convention not in (fixed, VACOConfig().threshold_convention):
            raise ValueError(f"vaco.threshold_convention={self.vaco.threshold_convention!r} contradicts "
                             f"method={self.method!r}, which fixes {fixed!r} (method 'vaco' reads the config)")

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


@struct.dataclass
class Batch:
    """One iteration's rollout, batch-major ``[num_envs, T, ...]``.

    ``behaviour_log_prob`` = log β(a|s) under the acting version ``version``; ``next_obs`` is the
    true successor (final observation on episode ends). ``train_log_prob`` is the clean
    (trainer-side) log π_v(a|s) of the acting version when an inference engine perturbed the
    acting policy (:func:`_rollout`'s ``engine``), else ``None`` (it would equal
    ``behaviour_log_prob``).
    """

    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    terminated: jax.Array
    truncated: jax.Array
    next_obs: jax.Array
    behaviour_log_prob: jax.Array
    version: jax.Array
    train_log_prob: Optional[jax.Array] = None


@struct.dataclass
class TrainState:
    """Carry of the training loop (one seed). ``last_eval``: the latest ``eval/…`` values
    (``{}`` when ``eval_every = 0``)."""

    params: Any
    opt_state: Any
    ring: version_ring.VersionRing
    env_state: VecEnvState
    obs: jax.Array
    last_return: jax.Array
    kl_coef: jax.Array  # PPO-KL's β (constant unless ``kl_adaptive``)
    last_eval: dict


@struct.dataclass
class TrainOutput:
    """Result of :func:`train`: final learner parameters, final state and ``[iterations]`` metrics."""

    params: Any
    state: TrainState
    metrics: dict


def _normalize_advantages(config: TrainConfig, mb: dict, logp):
    """Per-minibatch advantages under ``config.advantage_normalization_used``, σ = std Â:
    ``"none"`` Â; ``"scale"`` Â/σ; ``"standardize"`` (Â − mean Â)/σ; ``"centered_ratio"``
    (Â − c·b)/σ with b = :func:`~fresh_rl.control.methods.centring_weight` (detached; the
    derivation is in :mod:`fresh_rl.control.methods`) and c = Σ Â·b / Σ b², the least-squares
    coefficient (our choice; = mean Â when b ≡ 1, so then it equals ``"standardize"``)."""
    adv, kind = mb["advantage"], config.advantage_normalization_used
    if kind == "none":
        return adv
    std = jnp.std(adv) + 1e-8
    if kind == "scale":
        return adv / std
    if kind == "standardize":
        return (adv - jnp.mean(adv)) / std
    b = centring_weight(config.method_spec, logp, mb["reference_log_prob"], mb["behaviour_log_prob"])
    c = jnp.sum(adv * b) / jnp.maximum(jnp.sum(b * b), 1e-8)
    return (adv - c * b) / std


InferenceEngine = Callable[[networks.PolicyOutput, chex.PRNGKey], networks.PolicyOutput]
"""``engine(policy, key) -> acting policy``: how an inference engine's distribution differs from
the trainer's clean one for the same parameters (e.g. perturbed logits)."""


def _rollout(config: TrainConfig, state: TrainState, key, hparams: HyperParams,
             engine: Optional[InferenceEngine] = None) -> tuple[TrainState, Batch, dict]:
    """Act for T steps; env e uses the version of its group's sampled lag.

    With an ``engine``, each acting key is split into (perturbation, action) keys, actions are
    sampled from ``engine(π_v, key)``, ``behaviour_log_prob`` is their log-prob under it and
    ``Batch.train_log_prob`` the clean log π_v (the key schedule without an engine is unchanged).
    """
    net = config.network()
    venv = config.vec_env
    G = config.num_actor_groups
    T = config.rollout_length
    # one split for the whole rollout: the lag draw, then per step G acting keys and an env key
    keys = jax.random.split(key, 1 + T * (G + 1))
    key_lag, step_keys_ = keys[0], keys[1:].reshape(T, G + 1, *keys.shape[1:])
    lags = sample_lags(key_lag, config.delay, G, version_ring.available_versions(state.ring),
                       fixed_lag=hparams.lag if config.delay.kind == "fixed" else None)
    group_params, group_versions = version_ring.gather(state.ring, lags)
    env_versions = group_versions[actor_group_ids(config.num_envs, G)]

    def group_act(params, obs, key):
        policy, _ = net.apply(params, obs)
        if engine is None:
            actions = networks.sample(key, policy)
            logp = networks.log_prob(policy, actions)
            return actions, logp, logp
        key_engine, key_act = jax.random.split(key)
        acting = engine(policy, key_engine)
        actions = networks.sample(key_act, acting)
        return actions, networks.log_prob(acting, actions), networks.log_prob(policy, actions)

    def step(carry, keys):
        env_state, obs, ret_sum, ret_count = carry
        key_env = keys[G]
        obs_g = obs.reshape(G, config.num_envs // G, *obs.shape[1:])
        actions_g, logp_g, train_logp_g = jax.vmap(group_act)(group_params, obs_g, keys[:G])
        actions = actions_g.reshape(config.num_envs, *actions_g.shape[2:])
        logp = logp_g.reshape(config.num_envs)
        env_state, out = venv.step(key_env, env_state, actions)
        done = out.done
        ret_sum = ret_sum + jnp.sum(jnp.where(done, out.episode_return, 0.0))
        ret_count = ret_count + jnp.sum(done)
        transition = Batch(
            obs=obs, action=actions, reward=out.reward, terminated=out.terminated,
            truncated=out.truncated, next_obs=out.next_obs, behaviour_log_prob=logp,
            version=env_versions,
            train_log_prob=None if engine is None else train_logp_g.reshape(config.num_envs),
        )
        return (env_state, out.obs, ret_sum, ret_count), transition

    init = (state.env_state, state.obs, jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32))
    (env_state, obs, ret_sum, ret_count), traj = jax.lax.scan(step, init, step_keys_)
    batch = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), traj)  # [T, N, ...] → [N, T, ...]
    mean_return = jnp.where(ret_count > 0, ret_sum / jnp.maximum(ret_count, 1), state.last_return)
    state = state.replace(env_state=env_state, obs=obs, last_return=mean_return)
    return state, batch, {"episode_return": mean_return, "episodes_completed": ret_count,
                          "lag/sampled_lag_mean": jnp.mean(lags.astype(jnp.float32))}


def _batch_start(config: TrainConfig, params, batch: Batch):
    """Learner forward pass at batch start (θ_T): log π_T(a|s), V_T(s), V_T(s_{t+1})."""
    net = config.network()
    # one forward pass on [obs; next_obs] (N rows each) instead of two
    policy, values = net.apply(params, jnp.concatenate([batch.obs, batch.next_obs], axis=0))
    n = batch.obs.shape[0]
    policy = jax.tree.map(lambda x: x[:n] if x.ndim > 1 else x, policy)
    return networks.log_prob(policy, batch.action), values[:n], values[n:]


def _frozen_advantages(config: TrainConfig, data: dict, values, next_values):
    """Once-per-batch (advantages, value targets) ``[N, T]``: V-trace (log ρ = log π_T − log β)
    or GAE(λ), both on V_T."""
    if config.method_spec.advantages == "vtrace":
        out = vtrace(values, next_values, data["reward"], data["discount"],
                     data["learner_log_prob"] - data["behaviour_log_prob"],
                     config=config.vtrace_config, episode_ends=data["episode_end"])
        adv = out.impala_advantages if config.vaco_advantage == "impala" else out.gae_advantages
        return adv, out.targets
    gae = generalized_advantage_estimation(data["reward"], values, next_values, data["discount"],
                                           lambda_=config.gae_lambda, episode_ends=data["episode_end"])
    return gae.advantages, gae.returns


def _per_step_vtrace(config: TrainConfig, net, params, mb: dict, logp, values):
    """IMPALA-style V-trace with the current parameters on whole rows ``mb [rows, T]``:
    log ρ = log π_θ − log β and V_θ, all detached (IMPALA, arXiv 1802.01561 §4.2)."""
    _, next_values = net.apply(params, mb["next_obs"])
    out = vtrace(jax.lax.stop_gradient(values), jax.lax.stop_gradient(next_values), mb["reward"],
                 mb["discount"], jax.lax.stop_gradient(logp - mb["behaviour_log_prob"]),
                 config=config.vtrace_config, episode_ends=mb["episode_end"])
    return {"advantage": out.impala_advantages, "target": out.targets}


def _update(config: TrainConfig, state: TrainState, batch: Batch, key,
            hparams: HyperParams) -> tuple[TrainState, dict]:
    method = config.method_spec
    net = config.network()
    opt = config.optimizer(hparams.learning_rate)
    loss_hparams = hparams.replace(kl_coef=state.kl_coef)  # the losses see the current β
    logp_T, values_T, next_values_T = _batch_start(config, state.params, batch)
    learner_version = state.ring.latest_version
    metrics = {f"lag/{k}": v for k, v in lag_metrics(
        batch.behaviour_log_prob, logp_T, batch.version, learner_version).items()}

    data = {
        "obs": batch.obs, "action": batch.action, "behaviour_log_prob": batch.behaviour_log_prob,
        "learner_log_prob": logp_T,
        "reference_log_prob": logp_T if method.reference == "learner_start" else batch.behaviour_log_prob,
    }
    sequence = {"reward": batch.reward, "discount": hparams.gamma * (1.0 - batch.terminated.astype(jnp.float32)),
                "episode_end": batch.terminated | batch.truncated}
    per_step = method.advantages == "vtrace_per_step"
    if per_step:
        data.update(sequence, next_obs=batch.next_obs)
    else:
        adv, targets = _frozen_advantages(config, {**data, **sequence}, values_T, next_values_T)
        data.update(advantage=adv, target=targets)
        metrics["advantage_mean"] = jnp.mean(adv)
        metrics["advantage_std"] = jnp.std(adv)

    def loss_fn(params, mb):
        policy, values = net.apply(params, mb["obs"])
        logp = networks.log_prob(policy, mb["action"])
        if per_step:
            mb = {**mb, **_per_step_vtrace(config, net, params, mb, logp, values)}
        mb = {**mb, "advantage": _normalize_advantages(config, mb, logp)}
        pg, pm = method.policy_loss(logp, mb, loss_hparams, config)
        v_loss = 0.5 * jnp.mean(jnp.square(values - mb["target"]))
        ent = jnp.mean(networks.entropy(policy))
        total = pg + hparams.value_coef * v_loss - hparams.entropy_coef * ent
        return total, {**pm, "value_loss": v_loss, "entropy": ent}

    if method.minibatch_layout == "samples":
        data = jax.tree.map(lambda x: x.reshape(config.batch_size, *x.shape[2:]), data)
    (params, opt_state), step_metrics = sgd_passes(
        loss_fn, opt, state.params, state.opt_state, data, key, config.passes_per_batch_used,
        config.num_minibatches)
    metrics.update({f"loss/{k}": jnp.mean(v) for k, v in step_metrics.items()})
    metrics["lag/forward_tv"] = _forward_tv(config, logp_T, params, batch)
    kl_coef = state.kl_coef
    if config.kl_adaptive is not None and "kl_penalty" in step_metrics:
        kl_coef = adaptive_kl_coefficient(kl_coef, jnp.mean(step_metrics["kl_penalty"][-1]),
                                          config.kl_adaptive)
    ring = version_ring.push(state.ring, params)
    return state.replace(params=params, opt_state=opt_state, ring=ring, kl_coef=kl_coef), metrics


def sgd_passes(loss_fn: Callable, optimizer: optax.GradientTransformation, params, opt_state,
               data: dict, key: chex.PRNGKey, passes: int, num_minibatches: int):
    """``passes`` shuffled passes over ``data`` (leading axis = the shuffled units: samples or
    env rows), each ``num_minibatches`` gradient steps of ``loss_fn(params, mb) -> (loss,
    metrics)``. Returns ``((params, opt_state), metrics [passes, num_minibatches])`` with
    ``grad_norm`` added."""
    units = jax.tree.leaves(data)[0].shape[0]
    M = num_minibatches

    def make_minibatches(perm):
        return jax.tree.map(lambda x: x[perm].reshape(M, units // M, *x.shape[1:]), data)

    def sgd_step(carry, mb):
        params, opt_state = carry
        grads, m = jax.grad(loss_fn, has_aux=True)(params, mb)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return (params, opt_state), {**m, "grad_norm": optax.tree.norm(grads)}

    def epoch(carry, perm):
        return jax.lax.scan(sgd_step, carry, make_minibatches(perm))

    # every epoch's shuffle from one draw: argsort of uniform random bits is a uniformly random
    # permutation (ties, probability ~units²/2³³, keep a valid permutation by the stable sort)
    perms = jnp.argsort(jax.random.bits(key, (passes, units), jnp.uint32), axis=-1)
    return jax.lax.scan(epoch, (params, opt_state), perms)


def _forward_tv(config: TrainConfig, logp_T, params, batch: Batch) -> jax.Array:
    """½·mean|π_θ/π_T − 1| on the batch's (s, a): ``logp_T`` = log π_T(a|s) from the batch start
    (:func:`_batch_start`), θ = ``params`` after the batch's updates (one forward pass)."""
    policy, _ = config.network().apply(params, batch.obs)
    return tv_estimate(networks.log_prob(policy, batch.action) - logp_T)


def _evaluate_learner(config: TrainConfig, state: TrainState, key) -> tuple[TrainState, dict]:
    """Evaluate the new learner version when it is a multiple of ``eval_every`` or the last one
    (``lax.cond``), else carry ``state.last_eval`` forward; ``eval/…`` metrics."""
    version = state.ring.latest_version
    due = (version % config.eval_every == 0) | (version == config.num_iterations)
    last_eval = jax.lax.cond(
        due, lambda: evaluation_metrics(config, state.params, state.env_state.obs_stats, key),
        lambda: state.last_eval)
    metrics = {f"eval/{k}": v for k, v in last_eval.items()}
    return state.replace(last_eval=last_eval), {**metrics, "eval/valid": due.astype(jnp.int32)}


def init_state(config: TrainConfig, key: chex.PRNGKey, hparams: Optional[HyperParams] = None) -> TrainState:
    """Network, optimiser, version ring (K = ``config.delay.ring_size``) and env state of one
    seed; β starts at ``hparams.kl_coef`` (``hparams`` default: ``HyperParams.from_config``)."""
    hparams = HyperParams.from_config(config) if hparams is None else hparams
    key_net, key_env = jax.random.split(key)
    venv = config.vec_env
    env_state, obs = venv.reset(key_env)
    params = networks.init_params(config.network(), key_net, obs[:1])
    return TrainState(
        params=params,
        opt_state=config.optimizer(hparams.learning_rate).init(params),
        ring=version_ring.init(params, config.delay.ring_size),
        env_state=env_state,
        obs=obs,
        last_return=jnp.zeros((), jnp.float32),
        kl_coef=jnp.asarray(hparams.kl_coef, jnp.float32),
        last_eval={f"return_{kind}": jnp.zeros((), jnp.float32) for kind in ("deterministic", "stochastic")}
        if config.eval_every else {},
    )


def train_iteration(config: TrainConfig, state: TrainState, key: chex.PRNGKey,
                    hparams: Optional[HyperParams] = None) -> tuple[TrainState, dict]:
    """One rollout + one batch of updates + one ring push, then the learner evaluation when due
    (see the module docstring)."""
    hparams = HyperParams.from_config(config) if hparams is None else hparams
    key_roll, key_upd = jax.random.split(key)
    state, batch, roll_metrics = _rollout(config, state, key_roll, hparams)
    state, upd_metrics = _update(config, state, batch, key_upd, hparams)
    metrics = {**roll_metrics, **upd_metrics}
    if config.eval_every:
        state, eval_metrics = _evaluate_learner(config, state, evaluation_key(key))
        metrics.update(eval_metrics)
    return state, metrics


def train(config: TrainConfig, key: chex.PRNGKey, hparams: Optional[HyperParams] = None) -> TrainOutput:
    """A whole run; ``jax.jit(train, static_argnums=0)`` and ``jax.vmap(train, (None, 0))`` over keys.

    ``hparams`` (:class:`~fresh_rl.control.hyperparams.HyperParams`, default
    ``HyperParams.from_config(config)``) holds the traced hyperparameters: vmap over it too
    (``jax.vmap(train, (None, 0, 0))``) to run a seeds × values grid from one compilation.
    Concrete values are range-checked here (``ValueError`` naming the field).

    Returns the final learner parameters, the final :class:`TrainState` and a dict of
    ``[config.num_iterations]`` metric arrays (see the module docstring).
    """
    hparams = HyperParams.from_config(config) if hparams is None else hparams
    hparams.validate(config)
    key_init, key_loop = split_run_key(key)
    state = init_state(config, key_init, hparams)
    state, metrics = jax.lax.scan(
        lambda s, k: train_iteration(config, s, k, hparams), state,
        step_keys(key_loop, 0, config.num_iterations),
    )
    return TrainOutput(params=state.params, state=state, metrics=metrics)
