"""Synchronous LLM policy-gradient trainer: GRPO and REINFORCE++ over the text tasks.

One iteration (all jitted, one compiled function per (config, env, model) triple):

1. **collect**: ``num_groups × group_size`` episodes of ``env`` with the bf16 KV-cache sampler
   (:func:`fresh_rl.llm.rollout.run_episodes` + :func:`~fresh_rl.llm.rollout.model_policy`);
   the ``group_size`` rollouts of a group start from the same reset key, i.e. the same
   prompt / start state (:func:`group_reset_keys`). The sampler's log-probs are π_infer.
2. **old log-probs**: the float32 training forward of the *current* parameters at batch start
   (:func:`~fresh_rl.llm.sampler.token_logprobs_and_entropy`), π_old_train. In this
   synchronous trainer it is exact (same version v as the sampler), so
   ``log r_d = log π_old_train − log π_infer`` is the pure bf16-vs-fp32 discrepancy.
3. **advantages**: :func:`~fresh_rl.llm.advantages.grpo_advantages` or
   :func:`~fresh_rl.llm.advantages.reinforce_pp_advantages` of the episode returns.
4. **update**: ``epochs × minibatches`` AdamW steps (global-norm clip) on the token-mean loss
   ``RLConfig.loss``, an entry of the policy-loss registry
   :data:`fresh_rl.llm.policy_losses.LOSSES`: ``"ppo_clip"`` (the ratio π_θ/π_infer against
   the sampler's log-probs), ``"decoupled"`` (MIS/TIS on r_d = π_old_train/π_infer, the PPO
   clip on r_s = π_θ/π_old_train; docs/old_logits.md) or ``"vaco"`` (advantages realigned
   once per batch, then the TV filter; docs/vaco.md). A loss's once-per-batch step (VACO's
   realignment) runs at the start of ``update``.

   Each step's gradient is that of the whole minibatch, optionally accumulated exactly over
   ``grad_accumulation_steps`` micro-batches (:func:`minibatch_gradient`) and computed in
   bf16 with fp32 master parameters (``update_compute_dtype``).

No KL-to-reference and no entropy bonus (both 0 in the ROLL agentic configs the papers use).
Minibatches split episodes (rows); a fresh permutation per epoch. The jitted iteration
donates its state (:func:`make_iteration`).
Determinism: everything derives from the run's seed (:func:`train_loop`, :func:`loop_keys`).
"""
from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from fresh_rl.corrections import (DecoupledPPOConfig, MISConfig, PPOClipConfig, VACOConfig,
                                  masked_mean)
from fresh_rl.corrections.policy_losses import token_mean_loss
from fresh_rl.llm import advantages as adv_lib
from fresh_rl.llm.policy_losses import get_loss
from fresh_rl.llm.model import Qwen2Config, cast_params
from fresh_rl.llm.rollout import Episodes, model_policy, run_episodes
from fresh_rl.llm.sampler import LOGPROB_CHUNK_TOKENS, SamplingConfig, token_logprobs_and_entropy
from fresh_rl.sweep.keys import seed_key, seed_keys, split_run_key
from fresh_rl.sweep.loop import run_loop
from fresh_rl.validation import check_in_range, is_traced, require_choice, require_in_range, require_int

ESTIMATORS = ("grpo", "reinforce_pp")
COMPUTE_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """Static settings of the trainer; invalid values raise ``ValueError`` naming the field.

    Attributes:
      estimator: ``"grpo"`` or ``"reinforce_pp"`` (:mod:`fresh_rl.llm.advantages`).
      num_groups: prompts per batch; batch size = ``num_groups * group_size``.
      group_size: rollouts per prompt (GRPO's G; REINFORCE++ with ``reinforce_pp_grouping=
        "batch"`` ignores the grouping in the normalisation but still samples groups).
      learning_rate, weight_decay, max_grad_norm: AdamW (optax) with a constant learning rate
        after global-norm clipping (``max_grad_norm``; ROLL default 1.0).
      epochs, minibatches: updates per batch = epochs × minibatches; ``minibatches`` must
        divide the batch size.
      grad_accumulation_steps: micro-batches per optimizer step (must divide the minibatch
        size ``batch_size // minibatches``). The minibatch's gradient is accumulated over its
        micro-batches of rows in a ``lax.scan`` as ``g = Σ_m ∇S_m / max(Σ_m N_m, 1)`` (S_m the
        token sum of the loss, N_m its token count: action tokens for ``ppo_clip``, MIS-kept
        tokens for ``decoupled``), i.e. exactly the unsplit minibatch's gradient, with the
        activation memory of one micro-batch; the metrics are computed from the whole
        minibatch's log-probs, so they equal the unsplit step's too. Costs a parameter-sized
        gradient accumulator and a sequential loop of smaller forward/backward passes
        (measured: M = 4 cuts the update's XLA temp memory from 818 to 204 MiB for 32 × 256
        tokens of the tiny preset). Default 1 (no split). A loss whose token sums do not add
        up over row parts (``PolicyLoss.splits_by_rows`` false: ``vaco``) needs 1.
      loss: a registered :class:`fresh_rl.llm.policy_losses.PolicyLoss`: ``"ppo_clip"``
        (ratio against the sampler log-probs), ``"decoupled"`` (r_d · r_s with the fp32 old
        log-probs at batch start) or ``"vaco"`` (realigned advantages and the TV filter).
      clip: the PPO clip (on the total ratio for ``ppo_clip``, on r_s for ``decoupled``).
      mis, tis_cap, tis_level: the r_d mask / weight of the decoupled loss (ignored by
        the others); see :class:`fresh_rl.corrections.DecoupledPPOConfig`.
      vaco: the TV filter of ``vaco`` (:class:`fresh_rl.corrections.VACOConfig`: δ > 0, default
        0.2 as the paper, read on the ``"tv"`` scale D̂ = ½·mean|r − 1| unless
        ``threshold_convention="l1"``; the ratio's reference ``"learner_start"`` = the batch's
        old log-probs, or ``"behaviour"`` = π_infer). Ignored by the other losses.
      vaco_rho_bar: ρ̄ ∈ (0, ∞] of ``vaco``'s realignment Â' = min(ρ̄, π_ref/π_infer)·Â
        (:func:`fresh_rl.llm.policy_losses.vaco_realign`; default 1.0, IMPALA's: the paper
        tunes ρ̄ and does not give it). Ignored by the other losses.
      temperature: sampling temperature (> 0); the fp32 forward uses the same temperature so
        that both sides score the same distribution.
      scale_by_std: GRPO divides by the group std (False: Dr. GRPO's mean-centring only).
      reinforce_pp_grouping: ``"batch"`` (REINFORCE++) or ``"group"`` (ROLL ``mean_std``
        per prompt group) for the response-level normalisation.
      whiten: token whitening of the advantages; ``None`` = estimator default (False for GRPO,
        True for REINFORCE++).
      advantage_clip: clip c > 0 of the advantages; ``None`` = estimator default (no clip for
        GRPO, 2.0 for REINFORCE++ as ROLL's example_reinforce_pp.yaml); ``math.inf`` = none.
      advantage_eps, std_ddof: eps added to stds and the std's ddof (our defaults 1e-6, 0).
      gamma: token-level discount of REINFORCE++ returns (1 in the paper).
      prompt_pool: 0 (default) draws a fresh prompt per group every batch (an endless task
        generator); P > 0 draws each batch's ``num_groups`` distinct prompts from a fixed
        training set of P prompts, as LLM RL iterates over a prompt dataset.
      prompt_pool_seed: the seed of that training set (:func:`prompt_pool_keys`).
      remat: rematerialise each decoder layer in the backward pass of the update (memory of
        one layer's activations instead of all L, one extra forward; same gradients).
      logprob_chunk_tokens: (row, position) pairs per chunk of the fp32 forward's LM head
        (:func:`fresh_rl.llm.sampler.token_logprobs_and_entropy`; no ``[B, T, V]`` array).
      update_compute_dtype: ``"float32"`` (default: the update's forward/backward in the
        training engine's precision) or ``"bfloat16"``: the loss casts the fp32 master
        parameters to bf16 and runs the forward/backward in bf16 (the log-softmax and the loss
        in fp32), so the gradients come back fp32 and AdamW's state and the parameters stay
        fp32 (mixed precision). Meant for accelerators with native bf16 matmuls (faster, bf16
        activations; not measured here); on CPU XLA keeps most buffers fp32 (update temp
        memory 812 vs 818 MiB for 32 × 256 tokens of the tiny preset). Costs bf16 rounding in
        the gradient (measured: 16 % relative on a test batch with many tokens at the clip
        boundary). The old-log-prob forward (π_old_train, the r_d study's reference) is fp32
        either way.
    """

    estimator: str = "grpo"
    num_groups: int = 4
    group_size: int = 4
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    epochs: int = 1
    minibatches: int = 1
    grad_accumulation_steps: int = 1
    loss: str = "ppo_clip"
    clip: PPOClipConfig = PPOClipConfig()
    mis: MISConfig = MISConfig()
    tis_cap: Optional[float] = None
    tis_level: str = "token"
    vaco: VACOConfig = VACOConfig()
    vaco_rho_bar: float = 1.0
    temperature: float = 1.0
    scale_by_std: bool = True
    reinforce_pp_grouping: str = "batch"
    whiten: Optional[bool] = None
    advantage_clip: Optional[float] = None
    advantage_eps: float = adv_lib.DEFAULT_EPS
    std_ddof: int = 0
    gamma: float = 1.0
    prompt_pool: int = 0
    prompt_pool_seed: int = 0
    remat: bool = False
    logprob_chunk_tokens: int = LOGPROB_CHUNK_TOKENS
    update_compute_dtype: str = "float32"

    def __post_init__(self):
        require_choice("RLConfig.estimator", self.estimator, ESTIMATORS)
        require_choice("RLConfig.update_compute_dtype", self.update_compute_dtype,
                       COMPUTE_DTYPES)
        get_loss(self.loss)  # ValueError naming RLConfig.loss and the registered losses
        require_choice("RLConfig.reinforce_pp_grouping", self.reinforce_pp_grouping,
                       ("batch", "group"))
        for name in ("num_groups", "group_size", "epochs", "minibatches", "logprob_chunk_tokens",
                     "grad_accumulation_steps"):
            # NumPy / JAX integers are stored as Python ints (the config is a static jit argument)
            object.__setattr__(self, name, require_int(f"RLConfig.{name}", getattr(self, name), 1))
        if self.batch_size % self.minibatches:
            raise ValueError(f"RLConfig.minibatches must divide the batch size "
                             f"num_groups*group_size={self.batch_size}, got {self.minibatches}")
        if self.minibatch_size % self.grad_accumulation_steps:
            raise ValueError(f"RLConfig.grad_accumulation_steps must divide the minibatch size "
                             f"batch_size/minibatches={self.minibatch_size}, got "
                             f"{self.grad_accumulation_steps}")
        if not get_loss(self.loss).splits_by_rows and self.grad_accumulation_steps != 1:
            raise ValueError(f"RLConfig.grad_accumulation_steps must be 1 with RLConfig.loss="
                             f"{self.loss!r} (its token sums do not add up over row parts), "
                             f"got {self.grad_accumulation_steps}")
        if self.estimator == "grpo" and self.group_size < 2:
            raise ValueError(f"RLConfig.group_size must be >= 2 for GRPO, got {self.group_size}")
        require_in_range("RLConfig.learning_rate", self.learning_rate, 0.0, math.inf,
                         low_inclusive=False, high_inclusive=False)
        require_in_range("RLConfig.weight_decay", self.weight_decay, 0.0, math.inf)
        require_in_range("RLConfig.max_grad_norm", self.max_grad_norm, 0.0, math.inf,
                         low_inclusive=False)
        require_in_range("RLConfig.temperature", self.temperature, 0.0, math.inf,
                         low_inclusive=False)
        require_in_range("RLConfig.advantage_eps", self.advantage_eps, 0.0, math.inf)
        require_in_range("RLConfig.gamma", self.gamma, 0.0, 1.0)
        require_in_range("RLConfig.vaco_rho_bar", self.vaco_rho_bar, 0.0, math.inf,
                         low_inclusive=False)
        if not isinstance(self.vaco, VACOConfig):
            raise ValueError(f"RLConfig.vaco must be a VACOConfig, got {self.vaco!r}")
        object.__setattr__(self, "prompt_pool", require_int("RLConfig.prompt_pool", self.prompt_pool, 0))
        if self.prompt_pool != 0 and self.prompt_pool < self.num_groups:
            raise ValueError(f"RLConfig.prompt_pool must be 0 or an integer >= num_groups="
                             f"{self.num_groups} (distinct prompts per batch), got "
                             f"{self.prompt_pool!r}")
        if self.std_ddof not in (0, 1):
            raise ValueError(f"RLConfig.std_ddof must be 0 or 1, got {self.std_ddof!r}")
        if self.advantage_clip is not None:
            require_in_range("RLConfig.advantage_clip", self.advantage_clip, 0.0, math.inf,
                             low_inclusive=False)
        # Builds (and so validates) the decoupled-loss settings once.
        DecoupledPPOConfig(clip=self.clip, mis=self.mis, tis_cap=self.tis_cap,
                           tis_level=self.tis_level)

    @property
    def batch_size(self) -> int:
        return self.num_groups * self.group_size

    @property
    def minibatch_size(self) -> int:
        """Rows per optimizer step (``minibatches`` divides the batch size)."""
        return self.batch_size // self.minibatches

    @property
    def decoupled(self) -> DecoupledPPOConfig:
        return DecoupledPPOConfig(clip=self.clip, mis=self.mis, tis_cap=self.tis_cap,
                                  tis_level=self.tis_level)

    @property
    def resolved_whiten(self) -> bool:
        return (self.estimator == "reinforce_pp") if self.whiten is None else self.whiten

    @property
    def resolved_advantage_clip(self) -> Optional[float]:
        clip = self.advantage_clip
        if clip is None:
            clip = 2.0 if self.estimator == "reinforce_pp" else None
        return None if clip is None or math.isinf(clip) else clip


@flax.struct.dataclass
class TrainState:
    params: Any
    opt_state: Any
    step: jax.Array  # number of optimizer updates done


@flax.struct.dataclass
class Batch:
    """A training batch: the episodes' token arrays plus old log-probs and advantages."""

    tokens: jax.Array  # [B, T]
    mask: jax.Array  # [B, T]
    action_mask: jax.Array  # [B, T]
    behaviour_log_probs: jax.Array  # [B, T] sampler (bf16) log-probs, pi_infer
    old_logprobs: jax.Array  # [B, T] fp32 trainer log-probs at batch start, pi_old_train
    advantages: jax.Array  # [B, T]
    # [B, T] interpolation weight α of a proxy π_old (``policy_loss(proximal=...)``), else None
    proxy_alpha: Optional[jax.Array] = None
    # [B, T] fp32 clip centre of r_s when a factorial route takes it from other old log-probs
    # than the mask's (``RouteOutput.clip_old``), else None (the clip is centred on old_logprobs)
    clip_logprobs: Optional[jax.Array] = None


# every argument of optax.adamw but the learning rate stays a Python constant of the program
_ADAMW_STATIC_ARGS = tuple(n for n in inspect.signature(optax.adamw).parameters
                           if n != "learning_rate")


def make_optimizer(config: RLConfig) -> optax.GradientTransformation:
    """Global-norm clip then AdamW at a constant learning rate. The learning rate is a leaf of
    the optimizer state (``optax.inject_hyperparams``; ``config.learning_rate`` is its initial
    value), so runs that differ only in it share one compiled iteration (:func:`program_config`)
    and an lr grid can be a row axis of the state. The other AdamW arguments stay constants:
    the update is the one a plain ``optax.adamw`` makes, bit for bit (tested)."""
    adamw = optax.inject_hyperparams(optax.adamw, static_args=_ADAMW_STATIC_ARGS)
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm),
                       adamw(learning_rate=config.learning_rate, weight_decay=config.weight_decay))


def program_config(config: RLConfig) -> RLConfig:
    """``config`` with the learning rate at its default. A compiled iteration reads the learning
    rate from the optimizer state (:func:`init_train_state` puts ``config.learning_rate`` there),
    never from the config, so the iteration builders key their programs on this: configs that
    differ only in the learning rate get one program."""
    return dataclasses.replace(config, learning_rate=RLConfig.learning_rate)


def current_learning_rate(state: TrainState) -> jax.Array:
    """The learning rate the next update of ``state`` uses (any leading row axes kept)."""
    return state.opt_state[1].hyperparams["learning_rate"]


def with_learning_rate(state: TrainState, learning_rate) -> TrainState:
    """``state`` whose next updates use ``learning_rate``: a scalar, or one value per row of a
    state with a leading row axis (an lr grid in one program). ``ValueError`` for a concrete
    value outside (0, ∞) (:func:`fresh_rl.validation.check_in_range`)."""
    check_in_range("learning_rate", learning_rate, 0.0, math.inf, low_inclusive=False,
                   high_inclusive=False)
    current = current_learning_rate(state)
    value = jnp.broadcast_to(jnp.asarray(learning_rate, current.dtype), current.shape)
    if not is_traced(value):
        value = jax.device_put(value, current.sharding)  # where the state's leaf lives
    hyper = {**state.opt_state[1].hyperparams, "learning_rate": value}
    adamw = state.opt_state[1]._replace(hyperparams=hyper)
    return state.replace(opt_state=(state.opt_state[0], adamw, *state.opt_state[2:]))


def owned_copy(tree):
    """``tree`` with every array leaf copied into a buffer of its own. The jitted iterations
    donate their state (``donate_argnums=0``: the new state reuses its memory, so it is not
    held twice), which frees the donated arrays; a state must therefore share no buffer with
    its caller's arrays, nor one leaf with another."""
    return jax.tree_util.tree_map(jnp.array, tree)


def init_train_state(config: RLConfig, params) -> TrainState:
    """Fresh optimizer state and a copy of ``params`` (:func:`owned_copy`: the iteration
    donates the state, the caller keeps its ``params``); every leaf is committed to the device
    of the parameters, so the jitted iteration sees the same argument placement on its first
    and later calls (an uncommitted optimizer counter would otherwise trigger a second
    compilation)."""
    params = owned_copy(params)
    state = TrainState(params=params, opt_state=make_optimizer(config).init(params),
                       step=jnp.zeros((), jnp.int32))
    leaf = jax.tree_util.tree_leaves(params)[0]
    sharding = getattr(leaf, "sharding", None) or jax.devices()[0]
    return jax.device_put(state, sharding)


def sampling_config(config: RLConfig, env) -> SamplingConfig:
    """The sampler stops on the task vocabulary's end tokens and pads with its pad id."""
    return SamplingConfig(max_new_tokens=env.action_len, temperature=config.temperature,
                          stop_tokens=env.stop_tokens, pad_id=env.pad_id)


def first_action_index(action_mask: jax.Array) -> jax.Array:
    """``[B]`` position of each row's first action token (the row width if it has none)."""
    width = action_mask.shape[1]
    return jnp.where(action_mask.any(axis=1), jnp.argmax(action_mask, axis=1), width)


def prompt_pool_keys(config: RLConfig) -> jax.Array:
    """``[prompt_pool]`` reset keys of the fixed training prompts (``config.prompt_pool > 0``)."""
    return jax.random.split(jax.random.PRNGKey(config.prompt_pool_seed), config.prompt_pool)


def group_reset_keys(key, config: RLConfig) -> jax.Array:
    """``[batch_size]`` reset keys, each group's ``group_size`` rows sharing one key, hence one
    prompt / start state (what GRPO's group normalisation needs). The group keys are fresh
    (split from ``key``) or, with a prompt pool, ``num_groups`` distinct pool entries."""
    if config.prompt_pool:
        chosen = jax.random.choice(key, config.prompt_pool, (config.num_groups,), replace=False)
        groups = prompt_pool_keys(config)[chosen]
    else:
        groups = jax.random.split(key, config.num_groups)
    return jnp.repeat(groups, config.group_size, axis=0)


def group_prompt_match(episodes: Episodes, group_size: int) -> jax.Array:
    """Fraction of rows whose prompt (tokens before the first action) equals the prompt of
    the first row of its group (1 when the grouping worked)."""
    b, width = episodes.tokens.shape
    start = first_action_index(episodes.action_mask)
    prompt = jnp.where(jnp.arange(width)[None] < start[:, None], episodes.tokens, -1)
    leader = jnp.repeat(prompt[::group_size], group_size, axis=0)
    return jnp.mean(jnp.all(prompt == leader, axis=1).astype(jnp.float32))


def collect(params, key, *, config: RLConfig, env, model_config: Qwen2Config) -> Episodes:
    """Grouped episodes from the bf16 sampler (pure; jit with the statics closed)."""
    reset_keys = group_reset_keys(jax.random.fold_in(key, 1), config)
    policy = model_policy(params, model_config, sampling_config(config, env))
    return run_episodes(env, policy, key, config.batch_size, reset_keys)


def compute_advantages(config: RLConfig, returns, action_mask):
    if config.estimator == "grpo":
        return adv_lib.grpo_advantages(
            returns, action_mask, config.group_size, scale_by_std=config.scale_by_std,
            eps=config.advantage_eps, ddof=config.std_ddof, whiten_tokens=config.resolved_whiten,
            advantage_clip=config.resolved_advantage_clip)
    group = config.group_size if config.reinforce_pp_grouping == "group" else None
    return adv_lib.reinforce_pp_advantages(
        returns, action_mask, group_size=group, eps=config.advantage_eps, ddof=config.std_ddof,
        gamma=config.gamma, whiten_tokens=config.resolved_whiten,
        advantage_clip=config.resolved_advantage_clip)


def prepare_batch(params, episodes: Episodes, *, config: RLConfig,
                  model_config: Qwen2Config, old_logprobs=None, proxy_alpha=None,
                  clip_logprobs=None) -> Batch:
    """The advantages of ``episodes`` and their old log-probs: ``old_logprobs`` if given (an
    old-log-prob route of :mod:`fresh_rl.corrections.routes`), else the fp32 forward of ``params``;
    ``clip_logprobs``: a factorial route's separate clip centre (``None``: the old log-probs)."""
    if old_logprobs is None:
        old_logprobs, _ = token_logprobs_and_entropy(
            params, model_config, episodes.tokens, episodes.mask, temperature=config.temperature,
            chunk_tokens=config.logprob_chunk_tokens)
    action_mask = episodes.action_mask & episodes.mask
    return Batch(tokens=episodes.tokens, mask=episodes.mask, action_mask=action_mask,
                 behaviour_log_probs=jnp.where(action_mask, episodes.behaviour_log_probs, 0.0),
                 old_logprobs=jnp.where(action_mask, jax.lax.stop_gradient(old_logprobs), 0.0),
                 advantages=compute_advantages(config, episodes.returns, action_mask),
                 proxy_alpha=proxy_alpha,
                 clip_logprobs=None if clip_logprobs is None else
                 jnp.where(action_mask, jax.lax.stop_gradient(clip_logprobs), 0.0))


def policy_logprobs(params, batch: Batch, *, config: RLConfig, model_config: Qwen2Config):
    """``(log π_θ, entropy)``, ``[B, T]`` float32, of ``batch`` by the update's forward in
    ``config.update_compute_dtype`` (bf16: the parameters are cast here, so the gradient of
    the loss reaches the fp32 master parameters as fp32)."""
    dtype = config.update_compute_dtype
    return token_logprobs_and_entropy(cast_params(params, jnp.dtype(dtype)), model_config,
                                      batch.tokens, batch.mask, temperature=config.temperature,
                                      chunk_tokens=config.logprob_chunk_tokens,
                                      remat=config.remat, dtype=dtype)


def loss_terms(logp, entropy, batch: Batch, *, config: RLConfig,
               proximal: Optional[str] = None):
    """``(token_sum, token_count, metrics)`` of the policy loss ``config.loss`` (an entry of
    :data:`fresh_rl.llm.policy_losses.LOSSES`) of ``batch`` given its log-probs ``logp`` =
    log π_θ (and ``entropy``): the loss is ``token_sum / max(token_count, 1)``
    (:func:`~fresh_rl.corrections.policy_losses.token_mean_loss`; the count carries no gradient).

    ``proximal`` (``"linear"`` / ``"loglinear"``, losses with ``accepts_proximal`` only:
    ``decoupled``) replaces ``batch.old_logprobs`` by the interpolation proxy between π_infer
    and the detached π_θ with weight ``batch.proxy_alpha`` (A-3PO / AReaL
    ``prox_logp_method``; no extra forward pass; docs/old_logits.md, Proposition 1)."""
    total, count, metrics = get_loss(config.loss).fn(logp, batch, config=config,
                                                     proximal=proximal)
    return total, count, dict(metrics, entropy=masked_mean(entropy, batch.action_mask))


def policy_loss(params, batch: Batch, *, config: RLConfig, model_config: Qwen2Config,
                proximal: Optional[str] = None):
    """Token-mean policy loss of ``batch`` and its metrics (see the module docstring and
    :func:`loss_terms` for ``proximal``)."""
    logp, entropy = policy_logprobs(params, batch, config=config, model_config=model_config)
    total, count, metrics = loss_terms(logp, entropy, batch, config=config, proximal=proximal)
    return token_mean_loss(total, count), metrics


def minibatch_gradient(params, minibatch: Batch, *, config: RLConfig,
                       model_config: Qwen2Config, proximal: Optional[str] = None):
    """``(∇L, metrics)`` of the token-mean loss L of ``minibatch`` over
    ``config.grad_accumulation_steps`` = M micro-batches of its rows:

        ∇L = Σ_m ∇S_m / max(Σ_m N_m, 1)

    with S_m, N_m the token sum and token count of micro-batch m (:func:`loss_terms`). The
    micro-batches run in a ``lax.scan`` (activations of one micro-batch); the denominator and
    the metrics come from the whole minibatch's log-probs, collected from the scan, so both
    equal the unsplit minibatch's (no forward pass is repeated)."""
    def token_sum(p, rows):
        logp, entropy = policy_logprobs(p, rows, config=config, model_config=model_config)
        total, _, _ = loss_terms(logp, entropy, rows, config=config, proximal=proximal)
        return total, (logp, entropy)

    sum_grad = jax.grad(token_sum, has_aux=True)
    steps = config.grad_accumulation_steps
    if steps == 1:
        grads, (logp, entropy) = sum_grad(params, minibatch)
    else:
        micro = jax.tree_util.tree_map(
            lambda x: x.reshape(steps, x.shape[0] // steps, *x.shape[1:]), minibatch)

        def accumulate(total, rows):
            grads, out = sum_grad(params, rows)
            return jax.tree_util.tree_map(jnp.add, total, grads), out

        grads, (logp, entropy) = jax.lax.scan(
            accumulate, jax.tree_util.tree_map(jnp.zeros_like, params), micro)
        logp, entropy = (x.reshape(-1, x.shape[-1]) for x in (logp, entropy))
    _, count, metrics = loss_terms(logp, entropy, minibatch, config=config, proximal=proximal)
    grads = jax.tree_util.tree_map(lambda g: g / jnp.maximum(count, 1.0), grads)
    return grads, metrics


def update(state: TrainState, batch: Batch, key, *, config: RLConfig,
           model_config: Qwen2Config, proximal: Optional[str] = None):
    """``epochs × minibatches`` optimizer steps on ``batch`` (each over
    ``grad_accumulation_steps`` micro-batches, :func:`minibatch_gradient`); metrics averaged
    over the steps (``proximal``: see :func:`loss_terms`). The loss's once-per-batch step
    (``PolicyLoss.realign``: VACO's advantage realignment) runs first, and its metrics join
    the steps'."""
    loss = get_loss(config.loss)
    if proximal is not None and not loss.accepts_proximal:
        raise ValueError(f"RLConfig.loss={config.loss!r} takes no interpolation proxy for its "
                         f"old log-probs, got proximal={proximal!r}")
    realigned = {}
    if loss.realign is not None:
        batch, realigned = loss.realign(batch, config)
    optimizer = make_optimizer(config)
    size = config.minibatch_size

    def epoch_order(k):
        return jax.random.permutation(k, config.batch_size).reshape(config.minibatches, size)

    order = jax.vmap(epoch_order)(jax.random.split(key, config.epochs)).reshape(-1, size)

    def one_step(state, rows):
        minibatch = jax.tree_util.tree_map(lambda x: x[rows], batch)
        grads, metrics = minibatch_gradient(state.params, minibatch, config=config,
                                            model_config=model_config, proximal=proximal)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        metrics["grad_norm"] = optax.tree.norm(grads)
        state = TrainState(params=optax.apply_updates(state.params, updates),
                           opt_state=opt_state, step=state.step + 1)
        return state, metrics

    state, metrics = jax.lax.scan(one_step, state, order)
    return state, {**jax.tree_util.tree_map(jnp.mean, metrics), **realigned}


def batch_metrics(episodes: Episodes, batch: Batch, config: RLConfig) -> dict[str, jax.Array]:
    """Episode outcomes, train–inference discrepancy and advantage statistics of a batch."""
    log_rd = jnp.abs(batch.old_logprobs - batch.behaviour_log_probs)
    return {"mean_return": jnp.mean(episodes.returns),
            "success_rate": jnp.mean(episodes.success.astype(jnp.float32)),
            "abs_log_rd_mean": masked_mean(log_rd, batch.action_mask),
            "abs_log_rd_max": jnp.max(jnp.where(batch.action_mask, log_rd, 0.0)),
            "response_tokens": jnp.sum(batch.action_mask) / config.batch_size,
            "group_prompt_match": group_prompt_match(episodes, config.group_size),
            **adv_lib.advantage_statistics(batch.advantages, batch.action_mask)}


def iteration(state: TrainState, key, *, config: RLConfig, env, model_config: Qwen2Config):
    """collect → old log-probs / advantages → update. Returns (state, metrics)."""
    k_collect, k_update = jax.random.split(key)
    episodes = collect(state.params, k_collect, config=config, env=env,
                       model_config=model_config)
    batch = prepare_batch(state.params, episodes, config=config, model_config=model_config)
    state, metrics = update(state, batch, k_update, config=config, model_config=model_config)
    return state, {**metrics, **batch_metrics(episodes, batch, config)}


_ITERATION_CACHE: dict = {}


def cached_build(cache_key: tuple, build):
    """``build()`` memoised per ``cache_key`` when it is hashable (an env holding array data
    banks is not; it gets a fresh result, i.e. a new compilation of a jitted function)."""
    try:
        hash(cache_key)
    except TypeError:
        return build()
    if cache_key not in _ITERATION_CACHE:
        _ITERATION_CACHE[cache_key] = build()
    return _ITERATION_CACHE[cache_key]


def make_iteration(config: RLConfig, env, model_config: Qwen2Config):
    """Jitted ``(state, key) -> (state, metrics)`` of one full iteration, cached per
    ``(config, env, model_config)`` (:func:`cached_build`). The state argument is donated:
    the new state reuses its buffers and the passed state is consumed (deleted), so call it
    as ``state, metrics = step(state, key)``. The learning rate comes from the state
    (:func:`program_config`)."""
    config = program_config(config)
    return cached_build(("sync", config, env, model_config), lambda: jax.jit(
        lambda state, key: iteration(state, key, config=config, env=env,
                                     model_config=model_config), donate_argnums=0))


def loop_keys(seeds) -> tuple[jax.Array, Optional[int]]:
    """``(key_loop, num_seeds)`` of a run by the project's one key schedule
    (:mod:`fresh_rl.sweep.keys`): run key ``seed_key(s)``, ``key_loop = split_run_key(run)[1]``,
    step i's key ``step_key(key_loop, i)``.

    ``seeds``: an int (one run, ``num_seeds`` None), a sequence of ints (a leading seed axis
    of ``len(seeds)`` rows; a seed may repeat, e.g. common seeds across a τ sweep), or run
    keys already built (uint32 ``[2]`` or ``[S, 2]``, e.g. :func:`fresh_rl.sweep.seed_keys`).
    """
    if isinstance(seeds, (int, np.integer)) and not isinstance(seeds, bool):
        run = seed_key(int(seeds))
    elif isinstance(seeds, (jax.Array, np.ndarray)) and np.asarray(seeds).dtype == np.uint32:
        run = jnp.asarray(seeds)
        if run.ndim not in (1, 2) or run.shape[-1] != 2:
            raise ValueError(f"run keys must be uint32 [2] or [S, 2], got shape {run.shape}")
    else:
        run = seed_keys(list(seeds))
    return split_run_key(run)[1], (run.shape[0] if run.ndim == 2 else None)


def stack_rows(tree, num_rows: Optional[int]):
    """``tree`` with a leading axis of ``num_rows`` copies (unchanged for ``None``)."""
    if num_rows is None:
        return tree
    return jax.tree_util.tree_map(lambda x: jnp.stack([x] * num_rows), tree)


def train_loop(config: RLConfig, seed, num_iterations: int, *, params, env,
               model_config: Qwen2Config, state: Optional[TrainState] = None,
               log=None, checkpointer=None, checkpoint_every: Optional[int] = None):
    """Runs ``num_iterations`` iterations of seed ``seed`` (an int, or a run key; see
    :func:`loop_keys`) from ``params`` (or ``state``) through the one host loop
    :func:`fresh_rl.sweep.run_loop` (history ``[num_iterations]`` per metric plus
    ``wall_seconds``; logging; checkpoint/resume of the whole state). Returns
    ``(state, history)``. A passed ``state`` is consumed (the iteration donates it);
    ``params`` are copied and stay the caller's."""
    key_loop, num_seeds = loop_keys(seed)
    if num_seeds is not None:
        raise ValueError("the synchronous trainer runs one seed; pass an int seed")
    step_fn = make_iteration(config, env, model_config)
    state = init_train_state(config, params) if state is None else state
    return run_loop(step_fn, state, key_loop, num_iterations, checkpointer=checkpointer,
                    checkpoint_every=checkpoint_every, log=log)


__all__ = ["Batch", "COMPUTE_DTYPES", "RLConfig", "TrainState", "batch_metrics",
           "cached_build", "collect", "compute_advantages", "group_prompt_match",
           "current_learning_rate", "group_reset_keys", "init_train_state", "iteration",
           "loop_keys", "loss_terms", "make_iteration", "make_optimizer", "minibatch_gradient",
           "owned_copy", "policy_logprobs", "policy_loss", "prepare_batch", "program_config",
           "sampling_config", "stack_rows", "train_loop", "update", "with_learning_rate"]
