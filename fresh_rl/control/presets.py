"""The VACO study's settings: tasks, scales, method variants and their static configs.

``experiments/vaco_lag_sweep.py`` runs these through :mod:`fresh_rl.control.vaco_sweep_study`
(VACO, arXiv 2603.01365; docs/vaco.md): each
(task, variant) is one static :class:`~fresh_rl.control.train.TrainConfig`, and its seeds × lags
× δ grid (:func:`variant_grid`, built by :func:`fresh_rl.sweep.product_grid`, the same grid and
keys as ``fresh-rl sweep``) is one compiled program over traced :class:`HyperParams`, sharded
over every device by :func:`run_variant` (the script, notebook 02 and the tests call it, so
they share compiled programs).
Scales: ``ci`` (the tests), ``quick`` (the quickstart), ``cpu`` (the committed results),
``paper`` (Brax MuJoCo tasks at 100M steps, for accelerators).

**Variants.** A variant is a method with TrainConfig overrides (:data:`VARIANTS`,
:data:`ABLATIONS`) and the values of one swept loss hyperparameter, the grid's second axis
(:func:`swept_field`): δ for the VACO family, PPO-KL's fixed β for ``ppo_kl_fixed``
(:data:`KL_COEFS`), a single unused δ for the rest. PPO-KL runs twice: ``ppo_kl_adaptive``
(PPO §4's adaptive β, target KL 0.01 from β₀ = 1; our choice, the study's PPO-KL before) and
``ppo_kl_fixed`` (fixed β, as the VACO paper ran it; its β values are unknown, hence the grid).
Saved runs, ``runs.csv`` and the ``delta`` columns hold the swept values (β for
``ppo_kl_fixed``). :func:`headline_index` picks the value a variant is reported with.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Optional

import jax
import numpy as np

from fresh_rl.compilation_cache import CompileMeter

from fresh_rl.control.hyperparams import MAX_ALLOCATION_BYTES, HyperParams
from fresh_rl.control.config import TrainConfig
from fresh_rl.control.train import train
from fresh_rl.corrections import AdaptiveKLConfig
from fresh_rl.lag import DelayConfig
from fresh_rl.presets import Preset, named
from fresh_rl.sweep import Grid, nonfinite_cells, product_grid, run_sharded, to_host

MAIN_METHODS = ("ppo_clip", "ppo_kl_adaptive", "ppo_kl_fixed", "spo", "impala", "vaco", "vaco_l1")
VACO_VARIANTS = ("vaco", "vaco_tv", "vaco_l1")
"""The method's variants (``vaco`` ≡ ``vaco_tv``: δ on ½·mean|r − 1|; ``vaco_l1``: δ on
mean|r − 1|): each runs the δ sweep on ablation tasks and is compared against the baselines."""
KL_COEFS = (0.01, 0.03, 0.1, 0.3, 1.0)
"""Fixed β grid of ``ppo_kl_fixed`` (a traced ``kl_coef`` sweep: one program)."""
# main variants that are not a bare method name: name → (method, TrainConfig overrides);
# "ppo_kl" (the name before the fixed-β variant existed) stays an alias of ppo_kl_adaptive
_ADAPTIVE_KL = ("ppo_kl", {"kl_adaptive": AdaptiveKLConfig(target=0.01)})
VARIANTS = {"ppo_kl_adaptive": _ADAPTIVE_KL, "ppo_kl": _ADAPTIVE_KL, "ppo_kl_fixed": ("ppo_kl", {})}
SWEPT_BASELINES = {"ppo_kl_fixed": KL_COEFS}
"""Variants whose second grid axis is a baseline's own hyperparameter grid → its values."""
# ablation variants: name → (method, TrainConfig overrides)
ABLATIONS = {
    "vaco_align_only": ("vaco_align_only", {}),
    "vaco_filter_only": ("vaco_filter_only", {}),
    "vaco_standardized": ("vaco", {"advantage_normalization": "standardize"}),
    # the unbiased centring (b-weighted baseline, fresh_rl.control.methods) against scale-only,
    # for VACO and for IMPALA, and IMPALA with the biased plain centring it used to get
    "vaco_centered_ratio": ("vaco", {"advantage_normalization": "centered_ratio"}),
    "impala_standardized": ("impala", {"advantage_normalization": "standardize"}),
    "impala_centered_ratio": ("impala", {"advantage_normalization": "centered_ratio"}),
}
DELTAS = (0.05, 0.1, 0.2, 0.4)
PAPER_DELTA = 0.2
# Saved runs record the seed → key schedule they used; 2 = fresh_rl.sweep.keys (seed_key(s),
# fold-in step keys). Runs without it (the older split-based keys) are recomputed.
KEY_SCHEDULE = 2


@dataclasses.dataclass(frozen=True)
class Task:
    """One environment with its training settings (shared by every method)."""

    name: str
    overrides: tuple  # TrainConfig fields as (key, value) pairs, hashable
    ablations: bool = True  # run the ablation variants and the δ sweep on this task


MIXTURE_LAG = -1
"""The ``lags`` entry that stands for :attr:`Scale.mixture` in saved runs and tables."""


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    """One scale of the study. ``lags``: the fixed backward lags (a traced grid axis, one
    program). ``mixture``: actor delays drawn per actor group and iteration from this
    distribution (the realistic asynchronous case), run as one more column of the lag axis
    (:data:`MIXTURE_LAG`; a second program per variant, its static delay config differs) with
    ``mixture_actor_groups`` actor groups; its support must fit the ring of ``max(lags) + 1``."""

    tasks: tuple[Task, ...]
    lags: tuple[int, ...]
    num_seeds: int
    methods: tuple[str, ...] = MAIN_METHODS
    ablations: tuple[str, ...] = tuple(ABLATIONS)
    deltas: tuple[float, ...] = DELTAS
    mixture: Optional[DelayConfig] = None
    mixture_actor_groups: int = 4
    chunk_size: Optional[int] = None  # grid points per program call (run_sharded); None: all

    def __post_init__(self):
        if not self.lags or min(self.lags) < 0:
            raise ValueError(f"Scale.lags must be non-empty integers >= 0, got {self.lags!r}")
        if self.mixture is not None and self.mixture.ring_size != self.ring_size:
            raise ValueError(f"Scale.mixture.ring_size must be max(Scale.lags) + 1 = {self.ring_size}, "
                             f"got {self.mixture.ring_size}")

    @property
    def ring_size(self) -> int:
        """Version ring of every config: the largest fixed lag + 1."""
        return max(self.lags) + 1

    def with_tasks(self, names) -> "Scale":
        """This scale on the subset ``names`` of its tasks (in the scale's order; same lags,
        seeds, methods and configs, so saved runs of those tasks still match), e.g. the tasks a
        resumable study has finished. ``ValueError`` names an unknown task and the allowed ones."""
        known = [t.name for t in self.tasks]
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise ValueError(f"tasks must be a non-empty subset of the scale's tasks {known}, got {list(names)}")
        return dataclasses.replace(self, tasks=tuple(t for t in self.tasks if t.name in names))

    @property
    def study_lags(self) -> tuple[int, ...]:
        """The lag axis of saved runs and tables: the fixed lags, then :data:`MIXTURE_LAG`."""
        return tuple(self.lags) + ((MIXTURE_LAG,) if self.mixture is not None else ())


def lag_name(lag: int) -> str:
    """``"mixture"`` for :data:`MIXTURE_LAG`, else the lag as text (tables, CSV columns)."""
    return "mixture" if lag == MIXTURE_LAG else str(lag)


def _task(name, ablations=True, **overrides):
    return Task(name, tuple(sorted(overrides.items())), ablations)


_GYMNAX_DISCRETE = dict(num_envs=16, rollout_length=64, num_epochs=4, num_minibatches=4,
                        learning_rate=1e-3, normalize_obs=True, hidden_sizes=(64, 64))
_BRAX = dict(num_envs=32, rollout_length=32, num_epochs=4, num_minibatches=4, learning_rate=3e-4,
             normalize_obs=True, hidden_sizes=(64, 64), entropy_coef=0.0, brax_backend="spring")
# MinAtar [10, 10, C] observations: the small CNN encoder (TrainConfig.encoder="auto")
_MINATAR = dict(num_envs=16, rollout_length=64, num_epochs=4, num_minibatches=4, learning_rate=1e-3,
                normalize_obs=False, hidden_sizes=(64,), entropy_coef=0.01)
_BRAX_PAPER = dict(num_envs=2048, rollout_length=10, num_epochs=4, num_minibatches=32, learning_rate=3e-4,
                   normalize_obs=True, hidden_sizes=(256, 256), entropy_coef=1e-3,
                   brax_backend="generalized", total_env_steps=100_000_000)

# Learner evaluation for the scored scales: every 4 learner versions and at the last, 16
# episodes per mode (our choice); the scores then use the learner, not the stale actors.
_EVAL = dict(eval_every=4, eval_episodes=16)
# Lags that bind (the study's earlier 0/4/8 left PPO's backward TV at 0.02–0.07), and the
# realistic case: per actor group and iteration a geometric delay of mean 8, truncated at the
# ring (our choice; the paper's actor-delay distribution is not given), 4 actor groups.
STUDY_LAGS = (0, 8, 32, 64)
STUDY_MIXTURE = DelayConfig.geometric(mean_lag=8.0, ring_size=max(STUDY_LAGS) + 1)

VACO_SCALES = named({
    "ci": Scale(
        tasks=(_task("CartPole-v1", total_env_steps=16 * 64 * 24, **_GYMNAX_DISCRETE),),
        lags=(0, 4), num_seeds=3, methods=("ppo_clip", "vaco"), ablations=(), deltas=(PAPER_DELTA,),
    ),
    "quick": Scale(  # the quickstart's VACO part: two gymnax tasks, three methods, ~5 min
        tasks=(_task("CartPole-v1", total_env_steps=50_176, **_GYMNAX_DISCRETE),
               _task("Acrobot-v1", total_env_steps=50_176, **_GYMNAX_DISCRETE)),
        lags=(0, 4), num_seeds=3, methods=("ppo_clip", "ppo_kl_adaptive", "vaco"), ablations=(), deltas=(PAPER_DELTA,),
    ),
    # The study that can decide its claims: many hours on 2 cores, resumed from the saved
    # runs. Budgets as before; whether lag-0 runs plateau is read off
    # the curves and stated in results/vaco/README.md.
    "cpu": Scale(
        tasks=(
            _task("CartPole-v1", total_env_steps=100_000, **_GYMNAX_DISCRETE, **_EVAL),
            _task("Acrobot-v1", total_env_steps=100_000, **_GYMNAX_DISCRETE, **_EVAL),
            _task("brax/inverted_double_pendulum", ablations=False, total_env_steps=150_528, **_BRAX, **_EVAL),
            _task("Breakout-MinAtar", ablations=False, total_env_steps=200_704, **_MINATAR, **_EVAL),
            _task("SpaceInvaders-MinAtar", ablations=False, total_env_steps=200_704, **_MINATAR, **_EVAL),
        ),
        lags=STUDY_LAGS, num_seeds=10, mixture=STUDY_MIXTURE,
    ),
    # Ten minutes on one GPU (the budget is an estimate, not yet run on a
    # GPU): two Brax tasks, lags 0 and 32, three methods, 5 seeds vmapped.
    "gpu10": Scale(
        tasks=tuple(_task(f"brax/{n}", ablations=False, **{**_BRAX_PAPER, "total_env_steps": 5_000_000}, **_EVAL)
                    for n in ("halfcheetah", "hopper")),
        lags=(0, 32), num_seeds=5, methods=("ppo_clip", "ppo_kl_adaptive", "vaco"), ablations=(),
        deltas=(PAPER_DELTA,),
    ),
    "paper": Scale(
        tasks=tuple(_task(f"brax/{n}", **_BRAX_PAPER, **_EVAL)
                    for n in ("ant", "halfcheetah", "hopper", "walker2d", "humanoid")),
        lags=STUDY_LAGS, num_seeds=10, mixture=STUDY_MIXTURE, chunk_size=20,
    ),
})


def variant_config(task: Task, method: str, overrides: dict, ring_size: int) -> TrainConfig:
    """The static config of one (task, variant); the lag itself is a traced HyperParams leaf.
    ``method``/``overrides`` come from :func:`study_variants` (PPO-KL's adaptive β is an override)."""
    return TrainConfig(env_name=task.name, method=method, delay=DelayConfig.fixed(0, ring_size),
                       **dict(task.overrides), **overrides)


def swept_field(config: TrainConfig) -> str:
    """The HyperParams leaf on a variant's second grid axis: ``kl_coef`` for PPO-KL with a fixed
    β (β is then the loss's only hyperparameter), ``vaco_delta`` otherwise (unused by non-VACO
    methods, which run one value)."""
    if "kl_coef" in config.method_spec.loss_hyperparams and config.kl_adaptive is None:
        return "kl_coef"
    return "vaco_delta"


def variant_grid(config: TrainConfig, lags, deltas, num_seeds: int, seed: int) -> tuple[Grid, HyperParams]:
    """Seeds ``seed … seed + S − 1`` × lags × the :func:`swept_field` values ``deltas``
    (``product_grid``: values inside lag, seed fastest, so row-major ``[L, D, S]``) and the
    stacked :class:`HyperParams` of its points."""
    grid = product_grid(num_seeds, seed=seed, lag=list(lags), **{swept_field(config): list(deltas)})
    return grid, HyperParams.from_grid(config, grid.values)


def checked_variant_grid(config: TrainConfig, lags, deltas, num_seeds: int, seed: int,
                         chunk_size: Optional[int] = None) -> tuple[Grid, HyperParams]:
    """:func:`variant_grid` after :meth:`HyperParams.validate` (every value's range; memory of
    one chunk of ``chunk_size`` points, the part resident at a time), before anything compiles."""
    grid, hparams = variant_grid(config, lags, deltas, num_seeds, seed)
    chunks = 1 if chunk_size is None else -(-grid.size // chunk_size)
    hparams.validate(config, max_bytes=MAX_ALLOCATION_BYTES * chunks)
    return grid, hparams


def run_variant(config: TrainConfig, lags, deltas, num_seeds: int, seed: int,
                chunk_size: Optional[int] = None) -> dict:
    """Runs one variant's grid (:func:`variant_grid`: all seeds × lags × deltas of ``config``)
    as one compiled program sharded over all devices (:func:`fresh_rl.sweep.run_sharded`).

    Returns numpy metrics shaped ``[lags, deltas, seeds, iterations]`` plus timing: compile_s
    sums JAX's trace, lowering, XLA compile and cache-load seconds of the call
    (:class:`fresh_rl.compilation_cache.CompileMeter`), run_s is the rest."""
    L, D, S = len(lags), len(deltas), num_seeds
    grid, hparams = checked_variant_grid(config, lags, deltas, num_seeds, seed, chunk_size)
    fn = lambda key, hp: train(config, key, hp).metrics  # noqa: E731
    meter = CompileMeter()
    start = time.perf_counter()
    out = to_host(jax.block_until_ready(run_sharded(fn, grid.keys, hparams, chunk_size=chunk_size)))
    total_s = time.perf_counter() - start
    compile_s = meter.total
    meter.close()
    keep = ("episode_return", "episodes_completed", "lag/version_gap_mean", "lag/tv", "lag/ess", "lag/forward_tv",
            "lag/forward_tv_weighted",
            "eval/return_deterministic", "eval/return_stochastic", "eval/valid",
            "loss/tv", "loss/filter_on", "loss/mask_fraction", "loss/clip_fraction", "loss/entropy")
    metrics = {k: v.reshape(L, D, S, -1) for k, v in out.items() if k in keep}
    first_bad = np.full(L * D * S, -1)  # the non-finite guard of a sweep: mark cells, keep the rest
    for cell, (step, _) in nonfinite_cells(out).items():
        first_bad[cell] = step
    return {"metrics": metrics, "compile_s": compile_s, "run_s": total_s - compile_s,
            "env_steps": L * D * S * config.num_iterations * config.batch_size,
            "nonfinite_from_iteration": first_bad.reshape(L, D, S)}


def mixture_config(scale: Scale, config: TrainConfig) -> TrainConfig:
    """``config`` with the scale's actor-delay mixture (:attr:`Scale.mixture`)."""
    return dataclasses.replace(config, delay=scale.mixture, num_actor_groups=scale.mixture_actor_groups)


def run_study_variant(scale: Scale, config: TrainConfig, deltas, seed: int) -> dict:
    """:func:`run_variant` over the scale's fixed lags and, with :attr:`Scale.mixture`, over the
    mixture (:func:`mixture_config`, lag leaf 0) too, concatenated on the lag axis in
    :attr:`Scale.study_lags` order; times and env steps add up."""
    res = run_variant(config, scale.lags, deltas, scale.num_seeds, seed, scale.chunk_size)
    if scale.mixture is None:
        return res
    mix = run_variant(mixture_config(scale, config), (0,), deltas, scale.num_seeds, seed, scale.chunk_size)
    return {"metrics": {k: np.concatenate([v, mix["metrics"][k]]) for k, v in res["metrics"].items()
                        if k in mix["metrics"]},
            **{k: res[k] + mix[k] for k in ("compile_s", "run_s", "env_steps")},
            "nonfinite_from_iteration": np.concatenate([res["nonfinite_from_iteration"],
                                                        mix["nonfinite_from_iteration"]])}


def headline_index(variant: str, values, final_scores) -> int:
    """Index on the swept axis of the value ``variant`` is reported with in the per-task table,
    curves and aggregates. VACO's δ: :data:`PAPER_DELTA` (the paper's value). A baseline's own
    grid (:data:`SWEPT_BASELINES`): the value with the best seed-mean final score at the first
    (smallest) lag, i.e. tuned without lag and then run under lag (our choice; the paper's β
    is unknown; a value with any diverged seed counts as −∞). Else 0. ``final_scores``:
    ``[lags, values, seeds]``."""
    if variant in SWEPT_BASELINES:
        return best_at_first_lag(final_scores)
    values = [float(v) for v in np.asarray(values).tolist()]
    return values.index(PAPER_DELTA) if PAPER_DELTA in values else 0


def best_at_first_lag(final_scores) -> int:
    """Index of the swept value with the best seed-mean final score at the first lag
    (``final_scores``: ``[lags, values, seeds]``); a value with any diverged (NaN) seed counts
    as −∞. The tuning rule of :func:`headline_index` for a baseline's own grid, and of the
    results' equal-tuning table for every variant."""
    first_lag = np.asarray(final_scores, np.float64)[0]
    means = np.where(np.isfinite(first_lag), first_lag, -np.inf).mean(axis=-1)
    return int(np.argmax(means))


def study_variants(scale: Scale, task: Task):
    """``(variant name, method, TrainConfig overrides, swept values)`` of every variant run on
    ``task``: the scale's methods (VACO with the δ sweep on ablation tasks, ``ppo_kl_fixed``
    with its β grid) and the ablations. A main variant not in :data:`VARIANTS` is the method
    of that name without overrides."""
    for variant in scale.methods:
        method, overrides = VARIANTS.get(variant, (variant, {}))
        if variant in SWEPT_BASELINES:
            values = SWEPT_BASELINES[variant]
        else:
            values = scale.deltas if variant in VACO_VARIANTS and task.ablations else (PAPER_DELTA,)
        yield variant, method, dict(overrides), values
    if task.ablations:
        for name in scale.ablations:
            method, overrides = ABLATIONS[name]
            yield name, method, overrides, (PAPER_DELTA,)


def saved_run_matches(data: dict, config: TrainConfig, seed: int, lags, deltas, num_seeds: int,
                      mixture: Optional[DelayConfig] = None) -> bool:
    """Whether a loaded ``.npz`` holds exactly this variant's grid (``lags``: the study's lag
    axis, :attr:`Scale.study_lags`; ``mixture``: its delay mixture) under the current key
    schedule."""
    return (data.get("key_schedule", np.array(1)).item() == KEY_SCHEDULE
            and data.get("mixture", np.array(repr(None))).item() == repr(mixture)
            and data["config"].item() == repr(config) and data["seed"].item() == seed
            and tuple(data["lags"]) == tuple(lags) and tuple(data["deltas"]) == tuple(deltas)
            and data["episode_return"].shape[2] == num_seeds)
