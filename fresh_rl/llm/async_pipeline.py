"""Asynchronous LLM RL simulator: staleness, partial rollouts and old-logit routes.

Reproduces the missing-old-logit mechanism of arXiv 2605.12070 (docs/old_logits.md) on top of the synchronous trainer (:mod:`fresh_rl.llm.trainer`). One jitted iteration at learner
version k:

1. **lag**: the batch starts at version k − L, L drawn in [0, w] (``AsyncConfig.lag_kind``;
   default ``"fixed"``: L = w, the maximum staleness — our choice, the paper's lag
   distribution is not known), clipped to the versions the ring holds early in training.
   The run's window w ≤ W is a traced hyperparameter (``state.hparams.window``,
   :class:`fresh_rl.llm.hparams.LLMHyperParams`), so one compiled iteration serves every
   w ≤ W (a sweep over windows compiles once per route).
2. **collect** with the bf16 sampler from the ring of the last W + 1 versions
   (:mod:`fresh_rl.lag.version_ring`), the inference engine. Without partial rollouts the
   whole batch is sampled by version k − L. With ``partial_rollouts`` the engine receives a
   new version every ``segment_tokens`` decoding steps (all in-flight rows switch together,
   generation resumes by re-prefilling the transcript): decoding chunk g of an episode
   (counted over its turns) uses version k − max(L − g, 0), so one trajectory spans
   versions and its newest tokens may come from θ_k. Every action token carries its version
   tag (``Episodes.token_extras["version"]``). Optional Gaussian logit noise
   (``extra_mismatch_std``) adds a mismatch on top of bf16 vs fp32.
3. **old log-probs** by the route, looked up in the one registry every trainer shares,
   :data:`fresh_rl.corrections.routes.ROUTES` (no route names are special-cased here); the
   route calls the pipeline's sources, :class:`fresh_rl.llm.old_logits.RouteContext`.
4. **update**: the trainer's ``update`` with the policy loss ``RLConfig.loss``
   (:data:`fresh_rl.llm.policy_losses.LOSSES`): ``"decoupled"`` (MIS/TIS on r_d, clip on r_s),
   ``"vaco"`` (advantages realigned to the route's old log-probs, TV filter) or
   ``"ppo_clip"`` (with the ``behaviour`` route only: it reads no old log-probs).
   :func:`fresh_rl.llm.policy_losses.check_route` refuses a loss × route pair that does not fit.
5. **versions**: push θ_{k+1} into the ring; for the EWMA routes
   θ_ref ← β θ_ref + (1 − β) θ_{k+1} once per version (β = ``state.hparams.ewma_beta``,
   default w/(w + 1); docs/old_logits.md).

With W = 0 the sampler always uses θ_k and every route but the proxies and ``behaviour``
reduces to the synchronous trainer's loss.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from fresh_rl.corrections import (EWMAReference, ewma_beta_from_staleness, ewma_update,
                                  init_ewma_reference, version_lag_statistics)
from fresh_rl.lag import version_ring
from fresh_rl.corrections.ewma import BETA_RULES
from fresh_rl.corrections.routes import ROUTES, OldLogProbRoute, get_route, route_param_copies
from fresh_rl.lag.version_ring import VersionRing
from fresh_rl.llm.hparams import LLMHyperParams
from fresh_rl.llm.model import Qwen2Config
from fresh_rl.llm.old_logits import RouteContext, fp32_logprobs, param_bytes
from fresh_rl.llm.policy_losses import check_route
from fresh_rl.llm.rollout import Episodes, right_to_left_padded, run_episodes, write_span
from fresh_rl.llm.tasks.vocab import check_model_vocab
from fresh_rl.llm.sampler import generate, join_prompt_and_generation
from fresh_rl.llm.trainer import (Batch, RLConfig, TrainState, batch_metrics, cached_build,
                                  group_reset_keys, init_train_state, loop_keys, owned_copy,
                                  prepare_batch, program_config, sampling_config, stack_rows,
                                  update, with_learning_rate)
from fresh_rl.sweep.loop import run_loop
from fresh_rl.validation import require_choice, require_in_range, require_int

LAG_KINDS = ("fixed", "uniform")
STORED_PARAMS_DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class AsyncConfig:
    """Static settings of the asynchronous simulator; bad values raise ``ValueError``.

    Attributes:
      staleness_window: W ≥ 0, the maximum version lag of a token; the ring holds W + 1
        versions. A run uses the window w ≤ W of its hyperparameters (``hparams.window``,
        default W).
      lag_kind: ``"fixed"`` (every batch starts w versions back; default, our choice) or
        ``"uniform"`` (L uniform in [0, w] per batch).
      partial_rollouts: trajectories span versions (see the module docstring).
      segment_tokens: decoding steps per engine version with partial rollouts (our clock;
        the paper's is wall time). Ignored without partial rollouts.
      extra_mismatch_std: σ ≥ 0 of Gaussian noise on the sampler's logits (MoE-routing-like
        extra mismatch; 0 = bf16 vs fp32 only).
      old_logit_route: a route registered in :data:`fresh_rl.corrections.routes.ROUTES`.
      ewma_beta: default of ``hparams.ewma_beta``, β ∈ [0, 1] of the EWMA routes; ``None``: by
        ``ewma_beta_rule`` from the window w.
      ewma_beta_rule: a rule of :data:`fresh_rl.corrections.ewma.BETA_RULES`; the default
        ``"mean_age"`` (the control trainer's too) centres θ_ref on the data's mean lag ā,
        β = ā/(ā + 1): w/(w + 1) for the fixed lag, w/(w + 2) for the uniform one
        (:func:`fresh_rl.corrections.ewma_beta_from_staleness`; the paper's rule is not known).
      ewma_reset_threshold: default of ``hparams.ewma_reset_threshold`` ∈ (0, 1): ``ewma``
        resets θ_ref ← θ when the active-token fraction falls below it (0.9, a placeholder;
        arXiv 2605.12070 does not give its value; docs/old_logits.md). ``ewma_no_reset`` ignores it.
      stored_params_dtype: dtype of the parameter copies the pipeline stores besides the
        learner's fp32 master copy: the version ring (the sampler's weights and the snapshots)
        and θ_ref of the EWMA routes. ``"float32"`` (default: the snapshots are the exact
        training-engine versions π_train^(v), what the r_d study needs) or ``"bfloat16"``:
        half the bytes per copy (:func:`route_costs`); the ring / θ_ref cast on store, their
        readers cast up to fp32 for the training forward. The bf16 sampler sees the same
        weights either way (it rounds to bf16 itself), but a bf16 snapshot's fp32 forward
        scores bf16-rounded weights, so its "exact" old log-probs move by the weight rounding
        and r_d keeps only the activation-precision part of the discrepancy; a bf16 θ_ref also
        drops EWMA steps under half a bf16 ulp (:func:`fresh_rl.corrections.ewma_update`).
    """

    staleness_window: int = 1
    lag_kind: str = "fixed"
    partial_rollouts: bool = False
    segment_tokens: int = 8
    extra_mismatch_std: float = 0.0
    old_logit_route: str = "snapshot"
    ewma_beta: Optional[float] = None
    ewma_beta_rule: str = "mean_age"
    ewma_reset_threshold: float = 0.9
    stored_params_dtype: str = "float32"

    def __post_init__(self):
        require_int("AsyncConfig.staleness_window", self.staleness_window, 0)
        require_choice("AsyncConfig.lag_kind", self.lag_kind, LAG_KINDS)
        require_int("AsyncConfig.segment_tokens", self.segment_tokens, 1)
        require_in_range("AsyncConfig.extra_mismatch_std", self.extra_mismatch_std, 0.0,
                         math.inf)
        require_choice("AsyncConfig.old_logit_route", self.old_logit_route, tuple(ROUTES))
        if self.ewma_beta is not None:
            require_in_range("AsyncConfig.ewma_beta", self.ewma_beta, 0.0, 1.0)
        require_choice("AsyncConfig.ewma_beta_rule", self.ewma_beta_rule, BETA_RULES)
        require_in_range("AsyncConfig.ewma_reset_threshold", self.ewma_reset_threshold, 0.0,
                         1.0, low_inclusive=False, high_inclusive=False)
        require_choice("AsyncConfig.stored_params_dtype", self.stored_params_dtype,
                       STORED_PARAMS_DTYPES)

    @property
    def ring_size(self) -> int:
        return self.staleness_window + 1

    @property
    def route(self) -> OldLogProbRoute:
        """The registered :class:`~fresh_rl.corrections.routes.OldLogProbRoute`."""
        return get_route(self.old_logit_route)

    def beta(self, window: int) -> float:
        """The default EWMA β of a run with window ``window``: ``ewma_beta``, else
        ``ewma_beta_rule`` at W = ``window`` and the mean lag of ``lag_kind`` (w or w/2)."""
        if self.ewma_beta is not None:
            return self.ewma_beta
        mean_age = window if self.lag_kind == "fixed" else window / 2
        return ewma_beta_from_staleness(window, self.ewma_beta_rule, mean_age)

    def default_hparams(self, **overrides) -> LLMHyperParams:
        """:meth:`LLMHyperParams.from_config` of this config (``window=``, ``ewma_beta=`` …)."""
        return LLMHyperParams.from_config(self, **overrides)


@flax.struct.dataclass
class AsyncState:
    """Learner state, the ring of the last W + 1 versions (the inference engine's weights and
    the snapshots), the run's traced hyperparameters (:class:`LLMHyperParams`: window w ≤ W,
    EWMA β and reset threshold, …) and θ_ref of the EWMA routes (``None`` for the others).
    The ring and θ_ref are stored in ``AsyncConfig.stored_params_dtype``; the learner's
    parameters and AdamW state are fp32."""

    train: TrainState
    ring: VersionRing
    hparams: LLMHyperParams
    ewma: Optional[EWMAReference] = None


def init_state(config: RLConfig, async_config: AsyncConfig, params,
               window: Optional[int] = None, *,
               hparams: Optional[LLMHyperParams] = None) -> AsyncState:
    """Version 0 = ``params`` everywhere; ``hparams`` (default
    ``LLMHyperParams.from_config(async_config, window=window)``, window default W, must lie
    in [0, W]); θ_ref allocated iff the route ``uses_ewma``; committed to the parameters'
    device. Every leaf has its own buffer (:func:`fresh_rl.llm.trainer.owned_copy`), so the
    donating iteration never frees the caller's ``params`` / ``hparams``."""
    if hparams is None:
        hparams = LLMHyperParams.from_config(async_config, window=window)
    elif window is not None:
        raise ValueError("init_state: pass window inside hparams, not both")
    hparams.validate(async_config.staleness_window)
    hparams = owned_copy(hparams)
    train = init_train_state(config, params)
    stored = jnp.dtype(async_config.stored_params_dtype)
    ewma = init_ewma_reference(train.params, stored) if async_config.route.uses_ewma else None
    state = AsyncState(train=train,
                       ring=version_ring.init(train.params, async_config.ring_size, stored),
                       hparams=hparams, ewma=ewma)
    leaf = jax.tree_util.tree_leaves(params)[0]
    return jax.device_put(state, getattr(leaf, "sharding", None) or jax.devices()[0])


def chunk_schedule(async_config: AsyncConfig, action_len: int) -> tuple[int, int]:
    """``(chunk_tokens, chunks_per_turn)``: one chunk per turn without partial rollouts."""
    if not async_config.partial_rollouts:
        return action_len, 1
    size = min(async_config.segment_tokens, action_len)
    return size, -(-action_len // size)


def versioned_policy(ring: VersionRing, start_lag, *, config: RLConfig,
                     async_config: AsyncConfig, env, model_config: Qwen2Config,
                     collect_segment_old_logprobs: bool):
    """Sampler policy for :func:`~fresh_rl.llm.rollout.run_episodes` that reads the weights
    from ``ring``: decoding chunk c of turn t uses lag max(L − (t·C + c), 0) with partial
    rollouts, else L (``start_lag``).

    Extras per action token: ``version`` (the tag), ``segment`` (1 + t·C + c) and, with
    ``collect_segment_old_logprobs``, ``old_logprobs``: the fp32 log-probs of each finished
    segment under its own version, from one forward over the in-flight prefix plus the
    segment (the old-logit-model / interrupt routes).
    """
    sampling = dataclasses.replace(sampling_config(config, env),
                                   logit_noise_std=async_config.extra_mismatch_std)
    action_len = sampling.max_new_tokens
    size, chunks = chunk_schedule(async_config, action_len)
    chunk_sampling = dataclasses.replace(sampling, max_new_tokens=size)
    stops = jnp.asarray(sampling.stop_tokens, jnp.int32)
    write = jax.vmap(write_span)

    def policy(key, tokens, lengths, states, turn):
        del states
        b = tokens.shape[0]
        out = {"tokens": jnp.zeros((b, action_len), jnp.int32),
               "logprobs": jnp.zeros((b, action_len), jnp.float32),
               "version": jnp.zeros((b, action_len), jnp.int32),
               "segment": jnp.zeros((b, action_len), jnp.int32)}
        if collect_segment_old_logprobs:
            out["old_logprobs"] = jnp.zeros((b, action_len), jnp.float32)

        def chunk(carry, c):
            out, generated, done = carry
            segment = turn * chunks + c
            lag = jnp.maximum(start_lag - segment, 0) if async_config.partial_rollouts \
                else start_lag
            params = version_ring.get(ring, lag)
            prompt, prompt_mask = right_to_left_padded(
                write(tokens, lengths, out["tokens"], generated), lengths + generated)
            limit = jnp.where(done, 0, jnp.minimum(size, action_len - c * size))
            gen = generate(params, model_config, chunk_sampling, prompt, prompt_mask,
                           key if chunks == 1 else jax.random.fold_in(key, c),
                           max_new_per_row=limit)
            values = {"tokens": gen.tokens, "logprobs": gen.logprobs,
                      "version": jnp.broadcast_to(version_ring.version_of(ring, lag),
                                                  gen.tokens.shape),
                      "segment": jnp.broadcast_to(segment + 1, gen.tokens.shape)}
            if collect_segment_old_logprobs:
                full, full_mask = join_prompt_and_generation(prompt, prompt_mask, gen)
                logp = fp32_logprobs(params, model_config, full, full_mask, config.temperature)
                values["old_logprobs"] = logp[:, prompt.shape[1]:]
            out = {name: write(out[name], generated, values[name], gen.lengths)
                   for name in out}
            last = jnp.take_along_axis(gen.tokens, jnp.maximum(gen.lengths - 1, 0)[:, None],
                                       axis=1)[:, 0]
            generated = generated + gen.lengths
            done = done | ((gen.lengths > 0) & jnp.isin(last, stops)) | (generated >= action_len)
            return (out, generated, done), None

        init = (out, jnp.zeros(b, jnp.int32), jnp.zeros(b, bool))
        (out, generated, _), _ = jax.lax.scan(chunk, init, jnp.arange(chunks, dtype=jnp.int32))
        extras = {name: value for name, value in out.items()
                  if name not in ("tokens", "logprobs")}
        return out["tokens"], generated, out["logprobs"], extras

    return policy


def collect(ring: VersionRing, start_lag, key, *, config: RLConfig, async_config: AsyncConfig,
            env, model_config: Qwen2Config) -> Episodes:
    """Grouped episodes from the stale / mixed versions of ``ring`` (keys as
    :func:`fresh_rl.llm.trainer.collect`, so W = 0 samples the same episodes). Raises
    ``ValueError`` unless the model speaks ``env``'s task vocabulary (the replay trainer
    collects through here too)."""
    check_model_vocab(env, model_config)
    reset_keys = group_reset_keys(jax.random.fold_in(key, 1), config)
    policy = versioned_policy(
        ring, start_lag, config=config, async_config=async_config, env=env,
        model_config=model_config,
        collect_segment_old_logprobs=async_config.route.collection_time)
    return run_episodes(env, policy, key, config.batch_size, reset_keys)


@flax.struct.dataclass
class FreshBatch:
    """What :func:`prepare` hands to the update: the episodes, the training batch (advantages
    and the route's old log-probs), the EWMA reference after a possible reset and the route's
    diagnostics (scalars)."""

    episodes: Episodes
    batch: Batch
    ewma: Optional[EWMAReference]
    start_lag: jax.Array
    forwards: jax.Array
    reset: jax.Array


def prepare(state: AsyncState, key, *, config: RLConfig, async_config: AsyncConfig, env,
            model_config: Qwen2Config) -> FreshBatch:
    """Steps 1–3 of an iteration: lag → collect → old log-probs by the registered route
    (:class:`fresh_rl.corrections.routes.OldLogProbRoute`, called with the pipeline's
    :class:`~fresh_rl.llm.old_logits.RouteContext`)."""
    k_collect, _ = jax.random.split(key)
    ring, train, window = state.ring, state.train, state.hparams.window
    lag = window if async_config.lag_kind == "fixed" else jax.random.randint(
        jax.random.fold_in(key, 2), (), 0, window + 1)
    start_lag = version_ring.effective_lag(ring, lag)
    episodes = collect(ring, start_lag, k_collect, config=config, async_config=async_config,
                       env=env, model_config=model_config)
    action_mask = episodes.action_mask & episodes.mask
    context = RouteContext(
        params=train.params, ring=ring, ewma_reference=state.ewma, hparams=state.hparams,
        episodes=episodes, action_mask=action_mask,
        behaviour_log_probs=jnp.where(action_mask, episodes.behaviour_log_probs, 0.0),
        versions=episodes.token_extras["version"], config=config, model_config=model_config,
        segments=env.max_turns * chunk_schedule(async_config, env.action_len)[1])
    out = async_config.route.fn(context)
    batch = prepare_batch(train.params, episodes, config=config, model_config=model_config,
                          old_logprobs=out.old, proxy_alpha=out.proxy_alpha, clip_logprobs=out.clip_old)
    return FreshBatch(episodes=episodes, batch=batch,
                      ewma=state.ewma if out.ewma is None else out.ewma, start_lag=start_lag,
                      forwards=jnp.asarray(out.forwards, jnp.int32),
                      reset=jnp.asarray(out.reset, bool))


def update_key(key):
    """The key of the fresh-batch update of an iteration run with ``key``."""
    return jax.random.split(key)[1]


def finish(state: AsyncState, train: TrainState, ewma: Optional[EWMAReference], *,
           async_config: AsyncConfig) -> AsyncState:
    """Step 5: push the learner's new version into the ring; EWMA update of θ_ref with
    β = ``state.hparams.ewma_beta``."""
    del async_config  # the update reads only traced hyperparameters
    if ewma is not None:
        ewma = ewma_update(ewma, train.params, beta=state.hparams.ewma_beta)
    return state.replace(train=train, ring=version_ring.push(state.ring, train.params),
                         ewma=ewma)


def fresh_metrics(fresh: FreshBatch, update_metrics, learner_version, *,
                  config: RLConfig) -> dict[str, jax.Array]:
    """The metrics of :func:`iteration` (documented there)."""
    episodes = fresh.episodes
    action_mask = episodes.action_mask & episodes.mask
    ewma = fresh.ewma
    gaps = version_lag_statistics(episodes.token_extras["version"], learner_version,
                                  action_mask)
    metrics = {**update_metrics, **batch_metrics(episodes, fresh.batch, config)}
    if "train_infer/log_ratio_abs_mean" in update_metrics:  # r_d as the loss saw it (proxies)
        metrics["abs_log_rd_mean"] = update_metrics["train_infer/log_ratio_abs_mean"]
    return {**metrics, **{f"lag/{name}": value for name, value in gaps.items()},
            "start_lag": fresh.start_lag.astype(jnp.float32),
            "old_logit_forwards": fresh.forwards.astype(jnp.float32),
            "ewma_reset": fresh.reset.astype(jnp.float32),
            "ewma_reset_count": (ewma.reset_count if ewma is not None
                                 else jnp.zeros((), jnp.int32)).astype(jnp.float32)}


def iteration(state: AsyncState, key, *, config: RLConfig, async_config: AsyncConfig, env,
              model_config: Qwen2Config):
    """lag → collect → old log-probs (route) → decoupled update → push version / EWMA
    (:func:`prepare`, the trainer's ``update``, :func:`finish`).

    Metrics: the trainer's (success_rate, active_token_fraction, clip_fraction on r_s, …) plus
    ``abs_log_rd_mean`` (mean |log r_d|: as the decoupled loss saw it, averaged over
    minibatches, for the proxies the in-loss proxy; for the other losses |log π_old − log
    π_infer| of the batch), ``lag/version_gap_mean`` / ``lag/version_gap_max`` (version
    gap k − v of the action tokens, the control trainers' names), ``start_lag``, ``old_logit_forwards`` (fp32 forward passes spent on old log-probs:
    full-batch forwards at train time, one per segment at collection time, none for the
    proxies), ``ewma_reset`` / ``ewma_reset_count``.
    """
    fresh = prepare(state, key, config=config, async_config=async_config, env=env,
                    model_config=model_config)
    train, metrics = update(state.train, fresh.batch, update_key(key), config=config,
                            model_config=model_config,
                            proximal=async_config.route.proximal)
    metrics = fresh_metrics(fresh, metrics, state.ring.latest_version, config=config)
    return finish(state, train, fresh.ewma, async_config=async_config), metrics


def make_iteration(config: RLConfig, async_config: AsyncConfig, env, model_config: Qwen2Config,
                   num_seeds: Optional[int] = None):
    """Jitted ``(state, key) -> (state, metrics)``; with ``num_seeds`` vmapped over a leading
    seed axis of state and key. Cached and state-donating like
    :func:`fresh_rl.llm.trainer.make_iteration`. ``ValueError`` (naming ``RLConfig.loss`` and
    ``AsyncConfig.old_logit_route``) for a loss × route pair that does not fit
    (:func:`fresh_rl.llm.policy_losses.check_route`)."""
    check_route(config.loss, async_config.old_logit_route)
    config = program_config(config)  # the learning rate is read from the state

    def build():
        fn = lambda state, key: iteration(state, key, config=config,  # noqa: E731
                                          async_config=async_config, env=env,
                                          model_config=model_config)
        return jax.jit(fn if num_seeds is None else jax.vmap(fn), donate_argnums=0)

    return cached_build(("async", config, async_config, env, model_config, num_seeds), build)


def train_loop(config: RLConfig, async_config: AsyncConfig, seeds, num_iterations: int, *,
               params, env, model_config: Qwen2Config, window: Optional[int] = None,
               hparams: Optional[LLMHyperParams] = None, state: Optional[AsyncState] = None,
               learning_rates=None, log=None, checkpointer=None,
               checkpoint_every: Optional[int] = None):
    """Runs ``num_iterations`` iterations from ``params`` (or ``state``) through the one host
    loop :func:`fresh_rl.sweep.run_loop`.

    ``seeds``: an int (one run; ``history[name]`` ``[num_iterations]``) or a sequence of ints
    (S rows vmapped in one program, all from ``params``; ``[S, num_iterations]``), or run keys
    (:func:`fresh_rl.llm.trainer.loop_keys`: the project's key schedule). ``hparams``: the
    run's :class:`LLMHyperParams` (default from ``async_config`` with ``window``), unbatched
    (the same for every row) or with a leading axis of S (one value per row: a sweep).
    ``learning_rates``: ``None`` (``config.learning_rate``) or one value per row, S of them (a
    learning-rate sweep in the same program: the rate is a leaf of the optimizer state,
    :func:`fresh_rl.llm.trainer.with_learning_rate`); only for a fresh state.
    Logging and checkpoint/resume of the whole state: :func:`fresh_rl.sweep.run_loop`.
    """
    key_loop, num_seeds = loop_keys(seeds)
    step_fn = make_iteration(config, async_config, env, model_config, num_seeds)
    if state is None:
        if hparams is None:
            hparams = LLMHyperParams.from_config(async_config, window=window)
        batched = num_seeds is not None and np.ndim(hparams.window) == 1
        state = init_state(config, async_config, params,
                           hparams=jax.tree_util.tree_map(lambda x: x[0], hparams) if batched
                           else hparams)
        state = stack_rows(state, num_seeds)
        if batched:
            hparams.validate(async_config.staleness_window)
            state = state.replace(hparams=jax.device_put(owned_copy(hparams),
                                                         jax.tree_util.tree_leaves(
                                                             state.hparams)[0].sharding))
        if learning_rates is not None:
            rates = np.asarray(learning_rates, np.float64)
            if num_seeds is None or rates.shape != (num_seeds,):
                raise ValueError(f"learning_rates must hold one value per row ({num_seeds} rows "
                                 f"from seeds), got shape {rates.shape}")
            state = state.replace(train=with_learning_rate(state.train, rates))
    elif learning_rates is not None:
        raise ValueError("learning_rates sets a fresh state's rates; a passed state keeps its own")
    return run_loop(step_fn, state, key_loop, num_iterations, checkpointer=checkpointer,
                    checkpoint_every=checkpoint_every, log=log)


def route_costs(async_config: AsyncConfig, params: Any,
                window: Optional[int] = None) -> dict[str, float]:
    """Static memory cost of the route at window w (default W): extra parameter copies besides
    the learner's own and the inference engine's, with one actor group
    (:func:`fresh_rl.corrections.routes.route_param_copies`: snapshot W + 1, every version an
    in-flight or buffered token may carry, the current one included, since the learner
    overwrites it; old_logit_model 1, the dedicated replica; ewma / ewma_no_reset 1, θ_ref;
    the others 0) and their bytes in the storage dtype ``async_config.stored_params_dtype``
    (4 per parameter for fp32, 2 for bf16)."""
    window = async_config.staleness_window if window is None else window
    copies = route_param_copies(async_config.old_logit_route, window, actor_groups=1)
    return {"extra_param_copies": copies,
            "extra_param_bytes": copies * param_bytes(params, async_config.stored_params_dtype)}


__all__ = ["AsyncConfig", "AsyncState", "FreshBatch", "LAG_KINDS", "STORED_PARAMS_DTYPES", "chunk_schedule", "collect",
           "finish", "fresh_metrics", "init_state", "iteration", "make_iteration", "prepare",
           "route_costs", "train_loop", "update_key", "versioned_policy"]
