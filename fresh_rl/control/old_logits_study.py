"""The control old-logit study's settings (``experiments/old_logits_control.py``, the control
analogue of arXiv 2605.12070): its routes, scales and task configs, each (task, W) grid of routes ×
learning rates × seeds (:func:`cell`) and the text its saved runs are found by
(:func:`config_text`), and the claims it decides.

Every task runs :func:`fresh_rl.control.train.train` with ``method="decoupled_ppo"``, an inference
engine and random staleness U{0, …, W}; the route is the traced ``HyperParams.route``, an index
into :data:`ROUTES`. Scales: ``ci`` (the tests), ``quick`` / ``quick-ci`` (the quickstart and its
test), ``cpu`` (the committed results), ``paper``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import itertools
from pathlib import Path

from fresh_rl.control.config import DEFAULT_MIS, TrainConfig
from fresh_rl.control.data_sources import ReplaySettings
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.corrections import ewma_beta_from_staleness
from fresh_rl.eval.route_claims import ROUTE_CLAIMS
from fresh_rl.lag import DelayConfig
from fresh_rl.presets import Preset, named

MAIN_THRESHOLD = 0.9  # the EWMA reset threshold of the route comparison (the library default)
ROUTES: tuple[str, ...] = ("recompute_current", "snapshot", "old_logit_model", "linear_proxy",
                           "loglinear_proxy", "ewma", "ewma_no_reset")
"""The study's routes, in the order of its committed results (``TrainConfig.routes``; the traced
``HyperParams.route`` indexes it): the registry's repair routes
(:data:`fresh_rl.corrections.routes.REPAIR_ROUTES`) but ``interrupt``, which in control gives
``old_logit_model``'s numbers (both read the log-probs recorded while acting)."""
STUDY_SETTINGS = dict(method="decoupled_ppo", data_source="lagged_actors", replay=ReplaySettings(),
                      route="snapshot", routes=ROUTES, inference_discrepancy=0.02, max_logit_noise=1.0,
                      decoupled_mis=DEFAULT_MIS, tis_cap=None, ewma_beta_rule="mean_age",
                      ewma_reset_threshold=MAIN_THRESHOLD)
"""The :class:`TrainConfig` fields every task of the study sets: the decoupled loss (MIS token mask
exp(±0.1) on r_d, PPO clip 0.2 on r_s, no TIS weight), engine mean |log r_d| 0.02, every route
of :data:`ROUTES` in one program (default ``snapshot``), EWMA β = W/(W + 2)."""


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    """One scale of the study: its tasks, windows W, seeds, learning rates, EWMA reset thresholds
    and the cost stage's windows and length."""

    tasks: tuple[TrainConfig, ...]  # the study's settings; W and the learning rate are set per grid point
    windows: tuple[int, ...]
    num_seeds: int
    learning_rates: tuple[float, ...]
    thresholds: tuple[float, ...]
    cost_windows: tuple[int, ...]  # W at which the cost stage times every route (first task)
    cost_iterations: int
    slow_reference: bool = True  # run the slow-reference reset stage (SLOW_REFERENCE_RULE)


def _task(env_name: str, num_envs: int, rollout_length: int, iterations: int, eval_every: int,
          eval_episodes: int) -> TrainConfig:
    return TrainConfig(env_name=env_name, num_envs=num_envs, rollout_length=rollout_length,
                       total_env_steps=num_envs * rollout_length * iterations, num_epochs=4,
                       num_minibatches=4, num_actor_groups=num_envs, eval_every=eval_every,
                       eval_episodes=eval_episodes, **STUDY_SETTINGS)


SCALES = named({
    "ci": Scale((_task("CartPole-v1", 8, 32, 20, 10, 4),), (4,), 3, (1e-3,), (0.8, 0.9), (4,), 10),
    # the quickstart: two windows, the main threshold, no cost stage (its timing program would be
    # a third compile for a table the quickstart's statements do not use)
    "quick": Scale((_task("CartPole-v1", 8, 32, 60, 10, 4),), (1, 16), 3, (1e-3,), (0.9,), (), 10,
                   slow_reference=False),
    # the quickstart's test version: two windows, the main threshold, no cost or reset stage
    "quick-ci": Scale((_task("CartPole-v1", 8, 32, 20, 10, 4),), (1, 4), 3, (1e-3,), (0.9,), (), 10,
                      slow_reference=False),
    "cpu": Scale((_task("CartPole-v1", 8, 64, 250, 25, 8), _task("Acrobot-v1", 8, 64, 250, 25, 8)),
                 (1, 4, 16, 32), 10, (3e-4, 1e-3), (0.7, 0.8, 0.9, 0.95), (1, 32), 50),
    "paper": Scale((_task("CartPole-v1", 16, 128, 500, 25, 32), _task("Acrobot-v1", 16, 128, 500, 25, 32),
                    _task("Breakout-MinAtar", 16, 128, 1000, 50, 32)),
                   (1, 4, 16, 32), 30, (3e-4, 1e-3), (0.7, 0.8, 0.9, 0.95), (1, 32), 50),
})

def route_config(task: TrainConfig, window: int, iterations=None) -> TrainConfig:
    """The task with random staleness U{0, …, W} (ring W + 1); the route is a traced hyperparameter."""
    steps = task.total_env_steps if iterations is None else task.batch_size * iterations
    return dataclasses.replace(task, delay=DelayConfig.uniform(0, window, window + 1), total_env_steps=steps)


def route_index(config: TrainConfig, route: str) -> int:
    """The ``HyperParams.route`` value of ``route`` (its position in ``config.routes_used``)."""
    return config.routes_used.index(route)


# The saved runs are found by a text naming their config (the RunCheckpointer fingerprint and the
# folder's digest; the costs' key). It is the config's text from before the unified trainer, when the
# study ran fresh_rl.control.old_logits_train: an OldLogitTrainConfig wrapping the control TrainConfig
# (method 'ppo_clip', its clip the clip on r_s) with the engine and decoupled-loss settings beside it.
# The unified trainer reproduces that trainer's metrics bit for bit on these configs
# (tests/fixtures/recorded_trainers/old_logits_control.npz), so the committed runs in
# results/old_logits_control stay valid and are found; a setting that text cannot express is appended.
LEGACY_TRAIN_FIELDS: tuple[str, ...] = (
    "env_name", "brax_backend", "num_envs", "rollout_length", "total_env_steps", "num_epochs",
    "num_minibatches", "learning_rate", "max_grad_norm", "adam_eps", "gamma", "gae_lambda", "value_coef",
    "entropy_coef", "advantage_normalization", "passes_per_batch", "normalize_obs", "obs_clip",
    "hidden_sizes", "activation", "init_log_std", "encoder", "conv_channels", "conv_kernel_size", "method",
    "ppo_clip", "ppo_kl", "kl_coef", "kl_adaptive", "spo", "vaco", "vtrace_rho_bar", "vtrace_c_bar",
    "vaco_advantage", "delay", "num_actor_groups", "eval_every", "eval_episodes")
"""The fields of the control TrainConfig of the committed runs, in its order."""
LEGACY_STUDY_FIELDS: dict[str, str] = {
    "route": "route", "discrepancy": "inference_discrepancy", "max_logit_noise": "max_logit_noise",
    "mis": "decoupled_mis", "tis_cap": "tis_cap", "ewma_beta_rule": "ewma_beta_rule",
    "ewma_reset_threshold": "ewma_reset_threshold"}
"""The old OldLogitTrainConfig's fields beside ``train``, in its order → today's TrainConfig field."""


def _legacy_train_text(config: TrainConfig) -> str:
    fields = ", ".join(f"{name}={'ppo_clip' if name == 'method' else getattr(config, name)!r}"
                       for name in LEGACY_TRAIN_FIELDS)
    return f"TrainConfig({fields})"


def _unexpressed(config: TrainConfig, expressed) -> str:
    """`` name=value`` of every field outside ``expressed`` that differs from the study's setting
    (or the field's default); ``method`` counts as unexpressed (the old text says 'ppo_clip')."""
    extra = [f" {f.name}={getattr(config, f.name)!r}" for f in dataclasses.fields(TrainConfig)
             if (f.name == "method" or f.name not in expressed)
             and getattr(config, f.name) != STUDY_SETTINGS.get(f.name, f.default)]
    return "".join(extra)


def config_text(config: TrainConfig) -> str:
    """The text that names a run's config in its fingerprint (comment above)."""
    study = ", ".join(f"{old}={getattr(config, 'route_used' if new == 'route' else new)!r}"
                      for old, new in LEGACY_STUDY_FIELDS.items())
    return (f"OldLogitTrainConfig(train={_legacy_train_text(config)}, {study})"
            + _unexpressed(config, LEGACY_TRAIN_FIELDS + tuple(LEGACY_STUDY_FIELDS.values())))


def task_text(task: TrainConfig) -> str:
    """The text that names a task in the costs' key (the committed runs': the plain TrainConfig)."""
    return _legacy_train_text(task) + _unexpressed(task, LEGACY_TRAIN_FIELDS)


SLOW_REFERENCE_RULE = "window"
"""β rule of the slow-reference reset stage: β = W/(W + 1), centre of mass W, twice the mean lag
W/2 of U{0, …, W} (the named variant ``"window"``). The route comparison uses the default
``"mean_age"`` (β = W/(W + 2) under U{0..W}), centred on the batch's mean version, where a
reset to θ_k has nothing to fix;
with the slow reference θ_ref is older than most of the batch, the case a reset is meant for."""
EWMA_ROUTES = ("ewma", "ewma_no_reset")
"""The EWMA routes: rerun by the slow-reference stage, listed in the reset tables."""
SLOW = "@slow"
"""Suffix of a route's name in the results of the slow-reference stage (``ewma@slow``)."""


def base_route(route: str) -> str:
    """The route of a result's name (``ewma@slow`` → ``ewma``)."""
    return route.removesuffix(SLOW)


def reference_rule(route: str) -> str:
    """The EWMA β rule a result used: the route comparison's or the slow-reference stage's."""
    return SLOW_REFERENCE_RULE if route.endswith(SLOW) else STUDY_SETTINGS["ewma_beta_rule"]


def route_thresholds(scale: Scale, route: str) -> tuple[float, ...]:
    """The reset thresholds ``route`` runs at: every one of the scale for ``ewma``, else the main one."""
    return scale.thresholds if base_route(route) == "ewma" else (MAIN_THRESHOLD,)


def route_coords(scale: Scale, route: str, seed: int) -> dict[str, tuple]:
    """The dims of one route's block of a (task, W) grid with their coordinates, in row order (the
    first slowest, the last fastest): ``threshold`` (:func:`route_thresholds`, the ``ewma_reset_threshold``
    the runs are given), ``learning_rate`` and ``seed`` (the seed numbers)."""
    return {"threshold": route_thresholds(scale, route), "learning_rate": scale.learning_rates,
            "seed": tuple(range(seed, seed + scale.num_seeds))}


def cell_rows(scale: Scale, seed: int, routes=ROUTES) -> list[dict]:
    """The grid of one (task, W): each route's block in turn (route slowest), the block the
    product of its :func:`route_coords` in their order (threshold × lr × seed, seed fastest)."""
    rows = []
    for route in routes:
        coords = route_coords(scale, route, seed)
        rows += [{"route": route, **dict(zip(coords, point))} for point in itertools.product(*coords.values())]
    return rows


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (task, W) grid: its config, rows, traced hyperparameters and where its runs are saved."""

    config: TrainConfig
    routes: tuple[str, ...]
    rows: list
    hparams: HyperParams
    fingerprint: str
    folder: Path


def cell(scale: Scale, task: TrainConfig, window: int, out_dir: Path, seed: int,
         slow_reference: bool = False) -> Cell:
    """The grid of one (task, W) that the study runs as one program (nothing run here): its folder is ``<task>-W<W>[-slowref]-<digest>``,
    the digest of its fingerprint (:func:`config_text`, the rows, the slow stage's β)."""
    config = route_config(task, window)
    routes = EWMA_ROUTES if slow_reference else ROUTES
    rows = cell_rows(scale, seed, routes)
    beta = ewma_beta_from_staleness(window, SLOW_REFERENCE_RULE) if slow_reference else None
    grid = {"route": [route_index(config, r["route"]) for r in rows],
            "ewma_reset_threshold": [r["threshold"] for r in rows],
            "learning_rate": [r["learning_rate"] for r in rows]}
    if beta is not None:
        grid["ewma_beta"] = [beta] * len(rows)
    hp = HyperParams.from_grid(config, grid)
    fingerprint = f"{config_text(config)} rows={rows}" + (f" ewma_beta={beta!r}" if slow_reference else "")
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:10]  # new settings, new folder
    stage = "-slowref" if slow_reference else ""
    folder = Path(out_dir) / "runs" / f"{task.env_name}-W{window}{stage}-{digest}"
    return Cell(config, routes, rows, hp, fingerprint, folder)


CLAIMS = ROUTE_CLAIMS + (
    # the slow-reference stage's claims (this study's own): β = W/(W + 1) with and without reset
    ("slow reference β = W/(W + 1): reset restores coverage", "ewma" + SLOW, "ewma_no_reset" + SLOW, True, "active"),
    ("slow reference β = W/(W + 1): reset helps reward", "ewma" + SLOW, "ewma_no_reset" + SLOW, True, "return"),
    ("centred β = W/(W + 2) beats the slow β = W/(W + 1) (no reset)", "ewma_no_reset", "ewma_no_reset" + SLOW,
     True, "return"),
)
"""The paper's route claims (:data:`fresh_rl.eval.route_claims.ROUTE_CLAIMS`; metric "return" =
the mean learner return over the run's evaluations) and the slow-reference stage's."""
