"""The VACO study in its paper's regime (``experiments/vaco_forward_lag.py``, arXiv 2603.01365 §5):
the compared methods and their tuning knobs, the scale type, and the stages that tune every method
at the middle cell and score every cell.

A cell is a backward lag (fixed, one traced ``HyperParams.lag`` program; or a geometric mixture
per actor group and iteration) × a forward lag M updates per batch (epochs × the task's
minibatches, the batch fixed). Equal tuning: each method gets a grid of the same size, learning
rate × its own knob, on the tuning seeds at the middle cell, picked by mean learner return over the
run's evaluations; every cell is then scored on other seeds at the pick, plus the ablations
(align-only, filter-only) and VACO's δ curve at the middle M. Each stage is a resumable
:func:`fresh_rl.sweep.run_stage` whose fingerprint is the stage name, the program's config and its
rows.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from fresh_rl.control.config import TrainConfig
from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.control.methods import METHODS
from fresh_rl.control.train import train
from fresh_rl.corrections import PPOClipConfig, SPOConfig
from fresh_rl.eval import eval_first_score, eval_mean_score
from fresh_rl.lag import DelayConfig
from fresh_rl.presets import Preset
from fresh_rl.sweep import nonfinite_cells, run_stage
from fresh_rl.sweep.keys import seed_keys

MIXTURE = "mixture"
KNOBS = {  # method → (knob name, its 3 values, traced HyperParams leaf or None: a static config field)
    "ppo_clip": ("ε", (0.1, 0.2, 0.3), None),
    "ppo_kl": ("β", (0.03, 0.1, 0.3), "kl_coef"),
    "spo": ("ε", (0.1, 0.2, 0.3), None),
    "impala": ("ρ̄", (0.5, 1.0, 2.0), None),
    "vaco": ("δ", (0.1, 0.2, 0.4), "vaco_delta"),
}
ABLATIONS = ("vaco_align_only", "vaco_filter_only")
DELTA_CURVE = (0.05, 0.1, 0.2, 0.4)
MEASURED = ("version_gap", "backward_tv", "forward_tv", "masked_fraction", "clip_fraction")  # run means per cell
AVERAGES = (("backward_tv", "lag/tv", np.mean), ("forward_tv", "lag/forward_tv", np.median),
            ("version_gap", "lag/version_gap_mean", np.mean), ("clip_fraction", "loss/clip_fraction", np.mean),
            ("masked_fraction", "loss/mask_fraction", np.mean))  # column, kept metric, average over iterations
KEEP = ("eval/return_deterministic", "eval/valid", "lag/tv", "lag/forward_tv", "lag/version_gap_mean",
        "loss/clip_fraction", "loss/mask_fraction")
FORWARD_TV_WEIGHTED = ("forward_tv_weighted", "lag/forward_tv_weighted", np.mean)  # kept by the forward-TV stages


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    tasks: tuple[TrainConfig, ...]  # per task: everything but the method, its knob, M and the delay
    lags: tuple[int, ...]  # fixed backward lags (the middle one is the tuning cell's)
    mixture_mean: float
    updates: tuple[int, ...]  # forward lag M = epochs × minibatches (minibatches fixed)
    warmup: int
    learning_rates: tuple[float, ...]
    tuning_seeds: int
    scoring_seeds: int
    chunk: int
    forward_tv_seeds: int = 2
    """The first scoring seeds rerun by :func:`measure_forward_tv` (0: none)."""
    knobs: tuple[tuple[str, tuple[float, ...]], ...] = tuple((m, v) for m, (_, v, _) in KNOBS.items())
    """(method, its knob values): the compared methods and their tuning grids (the same size for each)."""

    @property
    def middle(self) -> tuple[int, int]:
        return self.lags[len(self.lags) // 2], self.updates[len(self.updates) // 2]

    def scoring_range(self, seed: int, count: int) -> range:
        """The first ``count`` scoring seeds of a study started at ``seed``: they follow its tuning seeds."""
        return range(seed + self.tuning_seeds, seed + self.tuning_seeds + count)


def config_for(task: TrainConfig, scale: Scale, method: str, knob: float, updates: int, delay: str) -> TrainConfig:
    """The static config of a program: the method, its knob where static, M and the delay kind. Every
    method makes M = passes × minibatches updates per batch, IMPALA included (its registry default is
    one pass, arXiv 1802.01561 §4; here ``passes_per_batch`` follows M, so the comparison with
    realign-once is at equal updates)."""
    static = {"ppo_clip": lambda: {"ppo_clip": PPOClipConfig(knob, knob)}, "spo": lambda: {"spo": SPOConfig(knob)},
              "impala": lambda: {"vtrace_rho_bar": knob},
              "vaco_filter_only": lambda: {"vaco": dataclasses.replace(task.vaco, delta=knob)}}.get(method, dict)()
    if METHODS[method].passes_per_batch is not None:  # IMPALA's one pass by default: M updates like the others
        static["passes_per_batch"] = updates // task.num_minibatches
    ring = max(scale.lags) + 1
    d = DelayConfig.fixed(0, ring) if delay == "fixed" else DelayConfig.geometric(scale.mixture_mean, ring)
    return dataclasses.replace(task, method=method, num_epochs=updates // task.num_minibatches, delay=d,
                               lag_warmup_versions=scale.warmup, **static)


def train_kept(config, keep, key, hp):
    metrics = train(config, key, hp).metrics
    return {k: metrics[k] for k in keep if k in metrics}


def task_folder(env_name: str) -> str:
    """The prefix of a task's stage folders under ``runs/`` (a Brax id's ``/`` becomes ``_``)."""
    return env_name.replace("/", "_")


def run_summaries(out: dict) -> list[dict]:
    """Per run of a stage's outputs ``[runs, iterations]``: its mean and final learner return, the
    iteration it diverged at (−1: never) and its measured lags averaged over iterations (``AVERAGES``).

    Diverged runs (declared in the claims file before any scoring run): a run diverges at the first
    iteration where a kept metric is NaN, or ±inf where the guard forbids it
    (:func:`~fresh_rl.sweep.nonfinite_cells`). Its evaluations from there on score the run's first
    evaluation, the learner closest to untrained in the same deterministic mode (the stage's mean
    first evaluation if the run diverged before its first), so a diverged run is scored as having
    unlearned; its measured lags are averaged over the iterations before the divergence. A run that
    never diverges is scored as the plain mean over its evaluations."""
    averages = AVERAGES + ((FORWARD_TV_WEIGHTED,) if FORWARD_TV_WEIGHTED[1] in out else ())
    ret = np.asarray(out["eval/return_deterministic"], np.float64)
    valid = np.asarray(out["eval/valid"]).astype(bool)
    n, iterations = ret.shape
    diverged = np.full(n, -1)
    for run, (step, _) in nonfinite_cells(out).items():
        diverged[run] = step
    before = np.arange(iterations) < np.where(diverged < 0, iterations, diverged)[:, None]
    first = eval_first_score(np.where(before, ret, np.nan), valid)
    first = np.where(np.isnan(first), np.nanmean(first), first)  # NaN: diverged before its first evaluation
    ret = np.where(before, ret, first[:, None])
    mean = eval_mean_score(ret, valid)
    return [{"mean_return": float(mean[i]), "final_return": float(ret[i, -1]), "diverged_at": int(diverged[i]),
             **{col: float(average(out[key][i][before[i]])) if key in out and before[i].any() else math.nan
                for col, key, average in averages}} for i in range(n)]


def diverged_text(rows: list[dict]) -> str:
    """`` (k diverged)`` for rows of :func:`run_summaries` with k > 0 diverged runs, else ``""``."""
    count = sum(r["diverged_at"] >= 0 for r in rows)
    return f" ({count} diverged)" if count else ""


def stage(config, scale, rows, out_dir, name, keep=KEEP):
    """``rows`` (dicts with ``seed``, ``learning_rate``, ``lag`` and the traced knob if any) of one program;
    per run :func:`run_summaries` of the ``keep`` metrics. The forward TV is a run's median over
    iterations: the trainer's ``lag/forward_tv`` is ½·mean|π_θ/π_T − 1| on the batch's actions, which
    come from the behaviour policy β: exact in expectation at lag 0, biased and unbounded under
    backward lag (one iteration's value reached 1.9e14 on CartPole at M = 64); its importance-sampled
    form ``lag/forward_tv_weighted`` (unbiased, a run's mean) is kept by :func:`measure_forward_tv`."""
    traced = KNOBS.get(config.method, (None, None, None))[2]
    grid = {"learning_rate": [r["learning_rate"] for r in rows], "lag": [r["lag"] for r in rows]}
    if traced:
        grid[traced] = [r["knob"] for r in rows]
    label = f"{config.env_name} {config.method} M={config.num_epochs * config.num_minibatches} {name}"
    out, _ = run_stage(functools.partial(train_kept, config, keep), seed_keys([r["seed"] for r in rows]),
                       HyperParams.from_grid(config, grid), directory=out_dir / "runs" / task_folder(label.replace(" ", "-")),
                       fingerprint=f"{name} {config!r} rows={rows}", chunk_size=scale.chunk, label=label)
    return [{**r, **summary} for r, summary in zip(rows, run_summaries(out))]


def tune(task, scale, out_dir, seed) -> tuple[dict, list[dict]]:
    """Every method's (lr, knob) pick at the middle cell on the tuning seeds."""
    lag, updates = scale.middle
    picks, rows_out = {}, []
    for method, values in scale.knobs:
        traced = KNOBS[method][2]
        groups = [values] if traced else [(v,) for v in values]  # one program per static knob value
        for group in groups:
            rows = [{"method": method, "knob": k, "learning_rate": lr, "lag": lag, "seed": s}
                    for k in group for lr in scale.learning_rates for s in range(seed, seed + scale.tuning_seeds)]
            rows_out += stage(config_for(task, scale, method, group[0], updates, "fixed"), scale, rows, out_dir,
                              "tuning")
        score = {}
        for r in rows_out:
            if r["method"] == method:
                score.setdefault((r["learning_rate"], r["knob"]), []).append(r["mean_return"])
        picks[method] = max(score, key=lambda k: np.mean(score[k]))
    return picks, [{"task": task.env_name, **r} for r in rows_out]


def score_cells(task, scale, method, lr, knob, updates, seeds, out_dir, name, keep=KEEP, knobs=None) -> list[dict]:
    """One method at (lr, knob: its pick) with M = ``updates`` in every backward-lag cell (the fixed lags in
    one program, the mixture in another) on ``seeds``, at each of ``knobs`` (default: the pick); per run
    the cell's row (:func:`stage`)."""
    out = []
    for delay, lags in (("fixed", scale.lags), (MIXTURE, (0,))):
        rows = [{"method": method, "knob": k, "learning_rate": lr, "lag": lag, "seed": s}
                for k in knobs or (knob,) for lag in lags for s in seeds]
        config = config_for(task, scale, method, knob, updates, delay)
        out += [{"task": task.env_name, **r, "backward": MIXTURE if delay == MIXTURE else str(r["lag"]),
                 "updates": updates, "tuned_knob": r["knob"] == knob, "versions": config.num_iterations}
                for r in stage(config, scale, rows, out_dir, name, keep)]
    return out


def score(task, scale, picks, out_dir, seed) -> list[dict]:
    """Every method at its pick in every cell, then the ablations at the middle M."""
    seeds = scale.scoring_range(seed, scale.scoring_seeds)
    jobs = [(m, *picks[m], updates) for m, _ in scale.knobs for updates in scale.updates]
    if "vaco" in picks:
        jobs += [(m, *picks["vaco"], scale.middle[1]) for m in ABLATIONS]
    return [r for method, lr, knob, updates in jobs for r in score_cells(
        task, scale, method, lr, knob, updates, seeds, out_dir, "scoring",
        knobs=DELTA_CURVE if (method, updates) == ("vaco", scale.middle[1]) else None)]


def measure_forward_tv(task, scale, picks, out_dir, seed) -> list[dict]:
    """The compared methods at their picks in every cell, rerun on the first ``scale.forward_tv_seeds``
    scoring seeds keeping also the unbiased ``lag/forward_tv_weighted`` (the same configs, keys and
    rows as their scoring runs, in another compiled program whose float rounding can steer a run elsewhere)."""
    seeds = scale.scoring_range(seed, scale.forward_tv_seeds)
    return [r for m, _ in scale.knobs for updates in scale.updates for r in score_cells(
        task, scale, m, *picks[m], updates, seeds, out_dir, "forward_tv", KEEP + (FORWARD_TV_WEIGHTED[1],))]
