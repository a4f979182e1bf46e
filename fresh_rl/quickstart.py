"""The quickstart (``experiments/quickstart.py``): three parts, each a study script run in its own
process at a small scale (:data:`PARTS`, :func:`run_part`), and the report read from their CSVs.

A :class:`Statement` compares two arms seed by seed (paired): "higher" or "lower" when the 95%
Student-t interval of the mean difference excludes 0, else "not separated"
(:func:`statements`). Beside them, :func:`measurement_tables` prints each part's measurements
with their intervals and no comparison; :func:`mechanisms_figure` draws them;
:func:`write_report` writes ``statements.{md,csv}`` and the figure, :func:`render_readme` the
README from ``timings.csv``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from fresh_rl.compilation_cache import REPORT_VARIABLE, SHORT_RUN_XLA_FLAGS, with_fast_compile_flags
from fresh_rl.control import old_logits_study
from fresh_rl.control.presets import VACO_SCALES
from fresh_rl.eval import seed_interval
from fresh_rl.presets import Preset, named
from fresh_rl.provenance import (ALLOW_DIRTY_ENV, REPOSITORY_ROOT, machine_description, read_csv, write_atomic,
                                 write_csv)
from fresh_rl.report import interval, markdown_table, plot_interval_curves, plot_seed_bands, save_panels, write_readme
from fresh_rl.studies import priority_staleness
from fresh_rl.validation import check_in_range

STALENESS, VACO, OLD_LOGITS = "freshper_priority_staleness", "vaco_lag", "old_logits_control"
PARTS = {  # part → (title, script)
    STALENESS: ("FreshPER: the age of what PER, FreshPER and uniform replay sample",
                "experiments/priority_staleness.py"),
    VACO: ("VACO: policy drift and the TV filter's kept fraction at lag 0 and 4", "experiments/vaco_lag_sweep.py"),
    OLD_LOGITS: ("Missing old logits: each route's active-token fraction against W",
                 "experiments/old_logits_control.py"),
}
CONFIDENCE = 0.95


@dataclasses.dataclass(frozen=True)
class Scale(Preset):
    """One quickstart scale: the preset each part's script runs (a name ``fresh-rl presets
    SCRIPT`` lists) and the VACO part's bootstrap replicates."""

    freshper_priority_staleness: str
    vaco_lag: str
    old_logits_control: str
    vaco_bootstrap_reps: int = 200

    def __post_init__(self):
        for part, presets in part_presets().items():
            if getattr(self, part) not in presets:
                raise ValueError(f"quickstart Scale.{part} must be a preset of {PARTS[part][1]} ({', '.join(presets)}), "
                                 f"got {getattr(self, part)!r}")
        check_in_range("quickstart Scale.vaco_bootstrap_reps", self.vaco_bootstrap_reps, 1)


def part_presets() -> dict[str, tuple[str, ...]]:
    """Each part's preset names (its script's ``--scale`` choices)."""
    return {STALENESS: tuple(priority_staleness.SCALES), VACO: tuple(VACO_SCALES),
            OLD_LOGITS: tuple(old_logits_study.SCALES)}


SCALES = named({"quick": Scale("cpu", "quick", "quick"), "ci": Scale("ci", "ci", "quick-ci")})


def part_command(part: str, scale: Scale, seed: int, out: Path, with_checks: bool = False) -> list[str]:
    """The part's script and flags at the quickstart's ``scale`` (``--checked`` where the part
    can be checkified)."""
    command = [PARTS[part][1], "--scale", getattr(scale, part), "--seed", str(seed), "--out", str(out)]
    checks = ["--checked"] if with_checks and part != STALENESS else []  # the replay sampler's batched while loop
    return command + (["--bootstrap-reps", str(scale.vaco_bootstrap_reps)] if part == VACO else []) + checks


def part_xla_flags() -> str:
    """The parts' ``XLA_FLAGS``: the caller's, with :data:`SHORT_RUN_XLA_FLAGS` for what it does
    not name (the parts are short runs whose wall time is mostly compiling)."""
    return with_fast_compile_flags(os.environ.get("XLA_FLAGS", ""), SHORT_RUN_XLA_FLAGS)


def run_part(command: list[str], allow_dirty: bool) -> dict:
    """Runs one part in its own process with :func:`part_xla_flags`; returns its wall and compile seconds."""
    print(f"$ python {' '.join(command)}", flush=True)
    env = {**os.environ, "XLA_FLAGS": part_xla_flags(), **({ALLOW_DIRTY_ENV: "1"} if allow_dirty else {})}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "compile.json"
        start = time.perf_counter()
        subprocess.run([sys.executable, *command], cwd=REPOSITORY_ROOT, check=True,
                       env={**env, REPORT_VARIABLE: str(report)})
        wall = time.perf_counter() - start
        compile_s = json.loads(report.read_text())["total"] if report.exists() else float("nan")
    return {"wall_seconds": round(wall, 1), "compile_seconds": round(compile_s, 1),
            "run_seconds": round(wall - compile_s, 1)}


# ------------------------------------------------------------------ the parts' CSVs, per seed --

def _by_seed(rows, value: str, **match) -> np.ndarray:
    """``value`` of the rows matching ``match``, ordered by seed (one entry per seed; NaN where a run
    saved before the value existed left it empty)."""
    picked = {int(r["seed"]): float(r[value] or "nan") for r in rows
              if all(r[k] == str(v) for k, v in match.items())}
    return np.asarray([picked[s] for s in sorted(picked)], np.float64)


def staleness_curves(part_dir: Path) -> dict[str, np.ndarray]:
    """Sampler → ``[seeds, versions]`` mean sampled age."""
    per = defaultdict(lambda: defaultdict(dict))
    for r in read_csv(part_dir / "priority_staleness.csv"):
        per[r["sampler"]][int(r["seed"])][int(r["version"])] = float(r["mean_age"])
    return {sampler: np.asarray([[v for _, v in sorted(seeds[s].items())] for s in sorted(seeds)])
            for sampler, seeds in per.items()}


def staleness_per_seed(part_dir: Path) -> dict[str, np.ndarray]:
    """Sampler → per-seed mean sampled age over the last 10% of versions."""
    return {sampler: np.asarray([ages[-max(1, len(ages) // 10):].mean() for ages in curve])
            for sampler, curve in staleness_curves(part_dir).items()}


def _vaco_rows(out: Path) -> tuple[list[dict], list[int]]:
    """The VACO part's runs and its lags (the non-negative ones, ascending)."""
    rows = read_csv(out / VACO / "runs.csv")
    return rows, sorted({int(r["lag"]) for r in rows if int(r["lag"]) >= 0})


def _old_logit_rows(out: Path) -> tuple[list[dict], str, list[int]]:
    """The old-logit part's runs of the plain routes (no ``@`` variants), the reset threshold of
    the route comparison (the largest the part ran; the only one at the quickstart's scales) and
    the windows."""
    rows = [r for r in read_csv(out / OLD_LOGITS / "runs.csv") if "@" not in r["route"]]
    return rows, max({r["threshold"] for r in rows}, key=float), sorted({int(r["window"]) for r in rows})


# ------------------------------------------------------------------------------ statements --

@dataclasses.dataclass(frozen=True)
class Statement:
    """One paired comparison ``a − b`` over seeds, and the words its interval allows."""

    part: str
    key: str  # stable identifier (the test compares these across seed sets)
    subject: str  # "mean sampled age of PER − uniform replay", …
    mean: float
    low: float
    high: float
    seeds: int

    @property
    def direction(self) -> str:
        if self.low > 0:
            return "higher"
        if self.high < 0:
            return "lower"
        return "not separated"

    def text(self) -> str:
        return (f"{self.subject}: {self.mean:+.4g} [{self.low:+.4g}, {self.high:+.4g}] "
                f"(n = {self.seeds} seeds) → {self.direction}")


def compare(part: str, key: str, subject: str, a: np.ndarray, b: np.ndarray) -> Statement:
    """The paired difference ``a − b`` (seed i with seed i) and its Student-t interval."""
    if a.shape != b.shape or a.size < 2:
        raise ValueError(f"{key}: needs ≥ 2 paired seeds, got {a.shape} and {b.shape}")
    mean, low, high = (float(x) for x in seed_interval(a - b, confidence=CONFIDENCE))
    return Statement(part, key, subject, mean, low, high, int(a.size))


def statements(out: Path) -> list[Statement]:
    """Every statement the three parts' outputs under ``out`` support: PER's sampled age against
    uniform replay and each FreshPER τ's against PER; per task the backward drift at the largest
    lag against the smallest; per task recompute_current's active fraction at the largest W
    against the smallest, and snapshot's against recompute_current's at the largest W."""
    age = staleness_per_seed(out / STALENESS)
    found = [compare(STALENESS, "per_vs_uniform_age", "mean sampled age, PER − uniform replay",
                     age["PER"], age["uniform"])]
    found += [compare(STALENESS, f"{s}_vs_per_age".replace(" ", "_"), f"mean sampled age, {s} − PER",
                      age[s], age["PER"]) for s in age if s.startswith("FreshPER")]
    rows, lags = _vaco_rows(out)
    for task in sorted({r["task"] for r in rows}):
        found.append(compare(
            VACO, f"{task}_drift", f"{task}: backward drift TV(acting, learner), lag {lags[-1]} − lag {lags[0]}",
            *(_by_seed(rows, "mean_tv_behaviour", lag=lag, task=task, variant="vaco") for lag in (lags[-1], lags[0]))))
    rows, threshold, windows = _old_logit_rows(out)
    small, large = windows[0], windows[-1]
    for task in sorted({r["task"] for r in rows}):
        def active(route, window):
            return _by_seed(rows, "active_fraction", task=task, route=route, window=window, threshold=threshold)
        if large > small:
            found.append(compare(
                OLD_LOGITS, f"{task}_recompute_vs_window",
                f"{task}: recompute_current's active-token fraction, W = {large} − W = {small}",
                active("recompute_current", large), active("recompute_current", small)))
        found.append(compare(
            OLD_LOGITS, f"{task}_snapshot_vs_recompute",
            f"{task}: active-token fraction at W = {large}, snapshot − recompute_current",
            active("snapshot", large), active("recompute_current", large)))
    return found


# ------------------------------------------------ measurements (intervals, no comparisons) --

def _cell(values: np.ndarray) -> str:
    """``"m [low, high]"``: the mean and its 95% Student-t interval, 3 significant digits ("–" if a
    value is missing)."""
    return "–" if np.isnan(values).any() else "{:.3g} [{:.3g}, {:.3g}]".format(*interval(values))


def measurement_tables(out: Path) -> list[str]:
    """The measurements printed beside the statements: each sampler's sampled age; per task,
    variant and lag the drift, the filter's kept and PPO's clipped fraction and the final return;
    per task and route the active-token fraction at each W and the final return."""
    age = staleness_per_seed(out / STALENESS)
    lines = ["### FreshPER: mean sampled age over the last 10% of versions (policy versions)", "",
             *markdown_table(("sampler", "mean age [95% CI]"), ((s, _cell(v)) for s, v in age.items()))]
    rows, lags = _vaco_rows(out)
    cells = []
    for task in sorted({r["task"] for r in rows}):
        for variant in sorted({r["variant"] for r in rows}):
            for lag in lags:
                pick = dict(task=task, variant=variant, lag=lag)
                if not _by_seed(rows, "final_return", **pick).size:
                    continue
                cells.append((task, variant, lag, _cell(_by_seed(rows, "mean_tv_behaviour", **pick)),
                              _cell(_by_seed(rows, "mean_forward_tv_weighted", **pick)),
                              _cell(1 - _by_seed(rows, "mean_mask_fraction", **pick))
                              if variant.startswith("vaco") else "—",
                              _cell(_by_seed(rows, "mean_clip_fraction", **pick))
                              if variant.startswith("ppo_clip") else "—",
                              _cell(_by_seed(rows, "final_return", **pick))))
    lines += ["", "### VACO part: drift, filter and return per lag (95% CI over seeds)", "",
              *markdown_table(("task", "variant", "lag", "backward TV", "forward TV (importance-sampled)",
                               "kept by the TV filter",
                               "clipped (PPO)", "final return"), cells),
              "", f"Final returns: n = {len({r['seed'] for r in rows})} seeds, no ranking (the study in results/vaco/ "
              "decides the VACO claims; see results/VERDICTS.md)."]
    rows, threshold, windows = _old_logit_rows(out)
    lines += ["", "### Old-logit routes: active-token fraction of the MIS mask (95% CI over seeds)", "",
              *markdown_table(("task", "route", *(f"W = {w}" for w in windows), f"final return at W = {windows[-1]}"), (
                  (task, route, *(_cell(_by_seed(rows, "active_fraction", task=task, route=route, window=w,
                                                 threshold=threshold)) for w in windows),
                   _cell(_by_seed(rows, "final", task=task, route=route, window=windows[-1], threshold=threshold)))
                  for task in sorted({r["task"] for r in rows}) for route in dict.fromkeys(r["route"] for r in rows))),
              "", f"Final returns: n = {len({r['seed'] for r in rows})} seeds, no ranking "
              "(results/old_logits_control/ is the study)."]
    return lines


def mechanisms_figure(out: Path, path: Path) -> None:
    """Three panels: sampled age against version per sampler; drift and masked fraction against
    lag; active-token fraction against W per route (means with 95% t intervals over seeds)."""
    vaco, lags = _vaco_rows(out)
    old_logits, threshold, windows = _old_logit_rows(out)
    task = sorted({r["task"] for r in old_logits})[0]
    titles = ("FreshPER: age of replayed trajectories", "VACO: drift and TV filter against lag",
              f"Old logits ({task}): the mask's active fraction")

    def draw(ax, title):
        if title == titles[0]:
            plot_seed_bands(ax, {sampler: (np.arange(curve.shape[1]), curve)
                                 for sampler, curve in staleness_curves(out / STALENESS).items()},
                            "policy version", "mean sampled age (versions)", alpha=0.25)
        elif title == titles[1]:
            measures = {"mean_tv_behaviour": "backward TV", "mean_mask_fraction": "masked by the filter"}
            plot_interval_curves(ax, lags, {
                f"{task}: {label}": [_by_seed(vaco, metric, lag=lag, task=task, variant="vaco") for lag in lags]
                for task in sorted({r["task"] for r in vaco}) for metric, label in measures.items()},
                "actor lag (versions)", "fraction (95% t intervals over seeds)")
        else:
            plot_interval_curves(ax, windows, {route: [_by_seed(old_logits, "active_fraction", task=task, route=route,
                                                                window=w, threshold=threshold) for w in windows]
                                               for route in dict.fromkeys(r["route"] for r in old_logits)},
                                 "staleness window W", "active-token fraction (95% t intervals over seeds)")
        ax.legend(fontsize=8)
    save_panels(path, titles, draw, width=16 / 3, height=4.3)


# ---------------------------------------------------------------------------------- report --

def write_report(out: Path, scale: str, seed: int) -> str:
    """Writes ``statements.{md,csv}`` and ``mechanisms.png`` from the parts under ``out``;
    returns the markdown."""
    found = statements(out)
    write_csv(out / "statements.csv", (
        {"part": s.part, "key": s.key, "subject": s.subject, "mean": f"{s.mean:.6g}",
         "low": f"{s.low:.6g}", "high": f"{s.high:.6g}", "seeds": s.seeds, "direction": s.direction}
        for s in found))
    mechanisms_figure(out, out / "mechanisms.png")
    lines = [f"# Quickstart statements ({scale} scale, seeds from {seed})", "",
             "Each statement is a paired difference over seeds with its 95% Student-t interval; "
             "\"higher\"/\"lower\" only when the interval excludes 0. Figure: `mechanisms.png`.", ""]
    for part, (title, _) in PARTS.items():
        lines += [f"## {title}", "", *(f"- {s.text()}" for s in found if s.part == part), ""]
    text = "\n".join(lines + ["## Measurements", ""] + measurement_tables(out)) + "\n"
    write_atomic(out / "statements.md", text)
    return text


def render_readme(out: Path) -> str:
    """``out/README.md``: the latest run's parts, commands and times (from ``timings.csv``)."""
    history = read_csv(out / "timings.csv")
    latest = [h for h in history if h["run_id"] == history[-1]["run_id"]]
    head = latest[0]
    header = {"command": f"python experiments/quickstart.py --scale {head['scale']} --seed {head['seed']}",
              "commit": head["commit"], "machine": machine_description(),
              "wall_seconds": sum(float(r["wall_seconds"]) for r in latest)}
    return write_readme(out, "Quickstart: the three papers' mechanisms at small scale", header, [
        f"Compilation cache: {head['cache']}; XLA flags: `{head.get('xla_flags') or 'XLA defaults'}`. "
        "`statements.md` holds the statements and measurements, `mechanisms.png` the figure; each part's "
        "folder its own tables.", "",
        *markdown_table(("part", "command", "wall time", "compiling", "running"), (
            (f"`{r['part']}/`", f"`{r['command']}`",
             *(f"{float(r[f'{k}_seconds']):.0f} s" for k in ("wall", "compile", "run"))) for r in latest))])


__all__ = ["CONFIDENCE", "OLD_LOGITS", "PARTS", "STALENESS", "VACO", "SCALES", "Scale", "Statement", "compare", "measurement_tables",
           "mechanisms_figure", "part_command", "part_xla_flags", "render_readme", "run_part",
           "staleness_curves", "staleness_per_seed", "statements", "write_report"]
