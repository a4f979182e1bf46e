"""The FreshPER control study (``experiments/freshper_control.py``, arXiv 2604.16918): its arms
(method × replay optimizer), scales, the trainer settings it accepts, the fingerprint its saved
runs are found by, its four stages per task; its tables and README lines are :mod:`fresh_rl.control.freshper_report`'s.

The trainer is :func:`fresh_rl.control.train.train` with the data source ``replay_freshper``,
method ``ppo_clip``, one full-batch fresh update per iteration at lag 0 and K extra updates
chosen by the replay method (:mod:`fresh_rl.replay.methods`). Scales: ``ci`` (the tests),
``cpu`` (the committed results), ``paper`` (accelerators).

Cost and memory: a Breakout-MinAtar run keeps its buffer of 300 iterations × 8 rows × 64 steps
of [10, 10, 4] observations (twice: s and s') in float32, ~0.5 GB per run, ~44 GB for a chunk of
90 runs; on the 2-core CPU one run-iteration took 0.8 s (10 vmapped runs × 40 iterations in
324 s), so even a 5-variant × 10-seed × 300-iteration MinAtar study would take ~3.3 h there.
"""
from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import jax
import numpy as np
import optax

from fresh_rl.control.config import TrainConfig
from fresh_rl.control.data_sources import ReplaySettings
from fresh_rl.control.hyperparams import replay_grid
from fresh_rl.control.train import train
from fresh_rl.lag import fit_ess_time_constant
from fresh_rl.presets import Preset, named
from fresh_rl.replay.methods import replay_hparams
from fresh_rl.studies.freshper_tau_sweep import mean_by_age
from fresh_rl.results import NamedArrays
from fresh_rl.sweep import product_grid, run_stage

# The study's arms, as when its runs were committed (the registry may grow past them).
STUDY_METHODS = ("onpolicy", "onpolicy_epochs", "uniform", "per_authors", "per_given", "freshper_0.3",
                 "freshper_1", "freshper_3", "freshper_1_no_is")
OPTIMIZER_CONTROLS = ("uniform", "per_given", "freshper_1")  # also run with separate Adam / SGD
BATCH_NORMALIZED = ("per_authors", "per_given", "freshper_1")  # also run with per-batch IS weights
SHORT_TAUS = (3.0, 10.0, 30.0)  # FreshPER τ in iterations, set by the KL of stored data (stage 4)


def variants() -> list[tuple[str, str]]:
    """(method, replay optimizer) pairs: every method with the shared Adam state, plus the
    optimizer controls."""
    return ([(m, "shared") for m in STUDY_METHODS]
            + [(m, o) for o in ("separate", "sgd") for m in OPTIMIZER_CONTROLS])


def variant_name(method: str, optimizer: str) -> str:
    """A variant's name in the tables: the method, with ``@optimizer`` unless the shared Adam state."""
    return method if optimizer == "shared" else f"{method}@{optimizer}"


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    """One scale of the study: a config per task, the seeds and the learning-rate grid."""

    configs: tuple[TrainConfig, ...]
    num_seeds: int
    learning_rates: tuple[float, ...]


def check_study_config(config: TrainConfig) -> TrainConfig:
    """The study's trainer settings, else ``ValueError`` naming the field: method ``ppo_clip``,
    one full-batch fresh step per iteration (``num_epochs`` = ``num_minibatches`` = 1, one pass),
    one actor group at a fixed lag 0 (replay is the only staleness), the ``replay_freshper`` data
    source (the rows set every replay leaf) and drift snapshots on (``replay.drift_every`` > 0)."""
    if config.method != "ppo_clip":
        raise ValueError(f"method must be 'ppo_clip' (the study's loss), got {config.method!r}")
    for name in ("num_epochs", "num_minibatches", "num_actor_groups", "passes_per_batch_used"):
        if getattr(config, name) != 1:
            raise ValueError(f"{name} must be 1 (one full-batch fresh step per iteration; the K extra "
                             f"updates are replay.extra_updates), got {getattr(config, name)}")
    if config.delay.kind != "fixed" or config.delay.lag != 0:
        raise ValueError(f"delay must be a fixed lag 0 (replay staleness only), got {config.delay!r}")
    if config.data_source != "replay_freshper":
        raise ValueError(f"data_source must be 'replay_freshper', got {config.data_source!r}")
    if not config.replay.drift_every:
        raise ValueError("replay.drift_every must be > 0 (the pilot fits τ to the drift snapshots)")
    return config


def study_config(env_name: str, num_envs: int, rollout_length: int, iterations: int, buffer: int,
                 drift_every: int, eval_every: int, eval_episodes: int, **train_fields) -> TrainConfig:
    """A FreshPER study's trainer settings (:func:`check_study_config`): ``iterations`` of
    ``num_envs`` × ``rollout_length`` steps, K = 2 extra updates, a buffer of ``buffer`` versions,
    drift snapshots every ``drift_every`` iterations, ``eval_episodes`` learner evaluation episodes
    every ``eval_every``."""
    return check_study_config(TrainConfig(
        env_name=env_name, num_envs=num_envs, rollout_length=rollout_length,
        total_env_steps=num_envs * rollout_length * iterations, num_epochs=1, num_minibatches=1,
        eval_every=eval_every, eval_episodes=eval_episodes, data_source="replay_freshper",
        replay=ReplaySettings(extra_updates=2, buffer_iterations=buffer, drift_every=drift_every),
        **train_fields))


def adam_count(opt_state) -> jax.Array:
    """The step count of the (one) Adam state in ``opt_state``: the updates it has taken."""
    (count,) = [s.count for s in jax.tree.leaves(opt_state, is_leaf=lambda s: isinstance(
        s, optax.ScaleByAdamState)) if isinstance(s, optax.ScaleByAdamState)]
    return count


STATE_OUTPUTS = {"sampled_age_counts": lambda state: state.replay.sampled_age_counts,
                 "num_updates": lambda state: state.num_updates,
                 "adam_count": lambda state: adam_count(state.opt_state)}
"""Outputs a run keeps from its final state (replayed rows per age, optimizer updates, the shared
Adam state's step count); every other kept name is a per-iteration metric of the trainer."""


def train_kept(config: TrainConfig, keep: tuple[str, ...], key, hp) -> dict:
    """One run (:func:`fresh_rl.control.train.train`): the outputs named by ``keep``, metrics or
    :data:`STATE_OUTPUTS`."""
    out = train(config, key, hp)
    return {k: STATE_OUTPUTS[k](out.state) if k in STATE_OUTPUTS else out.metrics[k] for k in keep}


def run_kept(config: TrainConfig, keep: tuple[str, ...], grid, hp, directory: Path, fingerprint: str, chunk: int,
             label: str = "") -> tuple[dict, float]:
    """:func:`train_kept` over ``grid`` (hyperparameters ``hp``, one row a point) as one resumable
    stage (:func:`fresh_rl.sweep.run_stage`)."""
    return run_stage(functools.partial(train_kept, config, keep), grid.keys, hp, directory=directory,
                     fingerprint=fingerprint, chunk_size=chunk, label=label)


# TrainConfig's fields when the committed runs were saved (results/freshper_control/runs/), in
# their order; the fields added since then must be at their defaults for the legacy fingerprint
_LEGACY_TRAIN_FIELDS = (
    "env_name", "brax_backend", "num_envs", "rollout_length", "total_env_steps", "num_epochs",
    "num_minibatches", "learning_rate", "max_grad_norm", "adam_eps", "gamma", "gae_lambda",
    "value_coef", "entropy_coef", "advantage_normalization", "passes_per_batch", "normalize_obs",
    "obs_clip", "hidden_sizes", "activation", "init_log_std", "encoder", "conv_channels",
    "conv_kernel_size", "method", "ppo_clip", "ppo_kl", "kl_coef", "kl_adaptive", "spo", "vaco",
    "vtrace_rho_bar", "vtrace_c_bar", "vaco_advantage", "delay", "num_actor_groups", "eval_every",
    "eval_episodes")


def config_fingerprint(config: TrainConfig) -> str:
    """The configuration's part of a stage's fingerprint (the saved runs' folder and identity).

    The study's runs were saved by the former replay trainer (``fresh_rl.control.replay_train``,
    now :func:`fresh_rl.control.train.train` with the ``replay_freshper`` data source) under the
    repr of its config; a config those runs could have had keeps that string, so the committed
    chunks are restored and the tables re-decided from them. Any other config (a field added
    since then off its default) gets its own repr, hence its own folder.
    """
    check_study_config(config)
    new = set(f.name for f in dataclasses.fields(TrainConfig)) - set(_LEGACY_TRAIN_FIELDS) - {"replay", "data_source"}
    default = TrainConfig()
    if any(getattr(config, name) != getattr(default, name) for name in new):
        return repr(config)
    r = config.replay
    train_repr = "TrainConfig(" + ", ".join(f"{name}={getattr(config, name)!r}" for name in _LEGACY_TRAIN_FIELDS) + ")"
    return (f"ReplayTrainConfig(train={train_repr}, extra_updates={r.extra_updates!r}, "
            f"buffer_iterations={r.buffer_iterations!r}, priority={r.priority!r}, "
            f"priority_exponent={r.priority_exponent!r}, importance_exponent_default={r.importance_exponent!r}, "
            f"min_decayed_priority={r.min_decayed_priority!r}, "
            f"importance_weight_normalization={r.importance_weight_normalization!r}, "
            f"buffer_sampling='freshper', log_every={r.drift_every!r})")


SCALES = named({
    "ci": Scale((study_config("CartPole-v1", 4, 16, 20, 8, 5, 10, 2),), 2, (1e-3,)),
    "cpu": Scale((study_config("CartPole-v1", 8, 64, 300, 256, 25, 25, 8),
                  study_config("Acrobot-v1", 8, 64, 300, 256, 25, 25, 8)), 10, (3e-3, 1e-2)),
    "paper": Scale((study_config("CartPole-v1", 16, 128, 1000, 500, 50, 50, 32),
                    study_config("Acrobot-v1", 16, 128, 1000, 500, 50, 50, 32),
                    study_config("Breakout-MinAtar", 8, 64, 1000, 300, 50, 50, 32)), 30,
                   (1e-3, 3e-3, 1e-2)),
})


KEEP = ("eval/return_deterministic", "eval/valid", "episode_return", "drift/ess", "drift/kl", "sampled_age_counts",
        "num_updates", "adam_count")


def drift_pilot(config: TrainConfig, scale: Scale, out_dir: Path, seed: int) -> dict:
    """Stage 1, on-policy runs per learning rate → per-step ESS/n and KL by age (mean over seeds
    and every snapshot that holds rows of that age) and τ_fit per learning rate."""
    lrs, n = scale.learning_rates, scale.num_seeds
    grid = product_grid(n, seed, learning_rate=lrs)
    hp = replay_grid(config, [replay_hparams("onpolicy")] * grid.size,
                     {"learning_rate": [r["learning_rate"] for r in grid.rows]})
    out, seconds = run_kept(config, KEEP, grid, hp, out_dir / "runs" / f"{config.env_name}-pilot",
                            f"pilot {config_fingerprint(config)} seeds={n}@{seed} lrs={lrs}", n * len(lrs))
    runs = NamedArrays.from_grid(out, {"learning_rate": lrs, "seed": range(seed, seed + n)})
    ages = np.arange(config.replay.buffer_iterations)
    drift = {}
    for lr in lrs:
        ess, kl = (mean_by_age(runs.sel(learning_rate=lr)[f"drift/{k}"]) for k in ("ess", "kl"))
        drift[lr] = {"ess": ess, "kl": kl, "tau_fit": fit_ess_time_constant(ages, ess), "stage_seconds": seconds}
    return drift


def study(config: TrainConfig, scale: Scale, drift: dict, out_dir: Path, seed: int, log=print, names=None,
          stage: str = "study") -> dict:
    """Stages 2 and 3: every (method, optimizer) of ``names`` (default :func:`variants`) × lrs ×
    seeds, FreshPER's τ the multiple of the pilot's τ_fit its method names; ``data`` over the dims
    ``variant`` (:func:`variant_name`), ``learning_rate``, ``seed``."""
    lrs, env, names, n = scale.learning_rates, config.env_name, names or variants(), scale.num_seeds
    grid = product_grid(n, seed, variant=list(range(len(names))), learning_rate=lrs)
    rows = [replay_hparams(names[r["variant"]][0], drift[r["learning_rate"]]["tau_fit"], names[r["variant"]][1])
            for r in grid.rows]
    hp = replay_grid(config, rows, {"learning_rate": [r["learning_rate"] for r in grid.rows]})
    taus = {lr: drift[lr]["tau_fit"] for lr in lrs}
    log(f"{env} {stage}: {grid.size} runs ({len(names)} variants x {len(lrs)} lrs x {n} seeds), tau_fit={taus}")
    out, seconds = run_kept(config, KEEP, grid, hp, out_dir / "runs" / f"{env}-{stage}",
                            f"{stage} {config_fingerprint(config)} seeds={n}@{seed} lrs={lrs} "
                            f"tau_fit={taus} variants={names}", n * len(lrs))
    coords = {"variant": [variant_name(*v) for v in names], "learning_rate": lrs, "seed": range(seed, seed + n)}
    return {"grid": grid, "rows": rows, "data": NamedArrays.from_grid(out, coords), "seconds": seconds}


def short_tau_stage(config: TrainConfig, scale: Scale, out_dir: Path, seed: int, log=print) -> dict:
    """Stage 4: FreshPER (shared Adam, IS) at the absolute τ of :data:`SHORT_TAUS` × lrs × seeds;
    ``data`` over the dims ``tau``, ``learning_rate``, ``seed``."""
    lrs, env, n = scale.learning_rates, config.env_name, scale.num_seeds
    grid = product_grid(n, seed, tau=SHORT_TAUS, learning_rate=lrs)
    hp = replay_grid(config, [replay_hparams("freshper_1", r["tau"]) for r in grid.rows],
                     {"learning_rate": [r["learning_rate"] for r in grid.rows]})
    log(f"{env} short_tau: {grid.size} runs (tau {SHORT_TAUS} x {len(lrs)} lrs x {n} seeds)")
    out, seconds = run_kept(config, KEEP, grid, hp, out_dir / "runs" / f"{env}-short_tau",
                            f"short_tau {config_fingerprint(config)} seeds={n}@{seed} lrs={lrs} taus={SHORT_TAUS}",
                            n * len(lrs))
    coords = {"tau": SHORT_TAUS, "learning_rate": lrs, "seed": range(seed, seed + n)}
    return {"data": NamedArrays.from_grid(out, coords), "seconds": seconds}


def run_task(config: TrainConfig, scale: Scale, out_dir: Path, seed: int, log=print) -> dict:
    """The four stages of one task: the pilot's drift, the study, per-batch IS weights, short τ."""
    drift = drift_pilot(config, scale, out_dir, seed)
    log(f"{config.env_name} tau_fit per lr: " + ", ".join(f"{lr}: {d['tau_fit']:.1f}" for lr, d in drift.items()))
    batch_config = dataclasses.replace(config, replay=dataclasses.replace(
        config.replay, importance_weight_normalization="batch"))
    return {"config": config, "drift": drift, "study": study(config, scale, drift, out_dir, seed, log),
            "batch_is": study(batch_config, scale, drift, out_dir, seed, log,
                              [(m, "shared") for m in BATCH_NORMALIZED], "batch_is"),
            "short_tau": short_tau_stage(config, scale, out_dir, seed, log)}
