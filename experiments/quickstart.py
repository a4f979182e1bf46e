"""The main job: the three papers' mechanisms at small scale on a CPU, each with its interval.

Three seeds cannot rank methods by return, so the quickstart shows what its scale can show —
the mechanisms each paper relies on, measured per seed with a 95% Student-t interval over
seeds (``fresh_rl.eval.seed_interval``):

1. FreshPER (arXiv 2604.16918): the age of what standard PER samples against uniform replay
   and the age-decayed buffer, on one aging buffer (``experiments/priority_staleness.py``).
2. VACO (arXiv 2603.01365): the measured backward policy drift (TV between the acting and the
   learning policy) at lag 0 and 4 on CartPole and Acrobot, and beside it the fraction of
   samples the TV filter keeps (a measurement: at this scale the filter rarely fires, so its
   kept fraction is shown, not compared) (``experiments/vaco_lag_sweep.py --scale quick``).
3. Missing old logits (arXiv 2605.12070): the old-logit mask's active-token fraction against
   the staleness window W for every route, in the control analogue at W = 1 and 16
   (``experiments/old_logits_control.py --scale quick``).

A *statement* compares two arms seed by seed (paired): "higher" or "lower" when the 95%
interval of the mean difference excludes 0, else "not separated". Returns are printed with
their intervals and "n = 3 seeds: no ranking". Outputs (default ``runs/quickstart/``,
git-ignored): each part's folder, ``statements.{md,csv}``, ``mechanisms.png``, ``timings.csv``
and ``README.md`` (wall and compile time per part). The committed reference run lives in
``results/quickstart/`` (made with ``--out results/quickstart`` at a clean commit); compare
with ``diff runs/quickstart/statements.md results/quickstart/statements.md``.

    python experiments/quickstart.py                 # ~5-8 min on 2 cores
    python experiments/quickstart.py --seed 3        # seeds 3, 4, 5 instead of 0, 1, 2
    python experiments/quickstart.py --scale ci      # the test suite's version (~2 min)
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from fresh_rl.compilation_cache import REPORT_VARIABLE, host_cache_directory
from fresh_rl.eval import seed_interval
from fresh_rl.provenance import (ALLOW_DIRTY_ENV, REPOSITORY_ROOT, git_commit, machine_description,
                                 require_clean, write_csv)
from fresh_rl.sweep.study_cli import start_study
from fresh_rl.validation import CHECKED_HELP

OUT = REPOSITORY_ROOT / "runs" / "quickstart"
STALENESS, VACO, OLD_LOGITS = "freshper_priority_staleness", "vaco_lag", "old_logits_control"
PARTS = {  # part → (title, script, its scale at each quickstart scale)
    STALENESS: ("FreshPER: the age of what PER, FreshPER and uniform replay sample",
                "experiments/priority_staleness.py", {"quick": "cpu", "ci": "ci"}),
    VACO: ("VACO: policy drift and the TV filter's kept fraction at lag 0 and 4",
           "experiments/vaco_lag_sweep.py", {"quick": "quick", "ci": "ci"}),
    OLD_LOGITS: ("Missing old logits: each route's active-token fraction against W",
                 "experiments/old_logits_control.py", {"quick": "quick", "ci": "quick-ci"}),
}
CONFIDENCE = 0.95


# --------------------------------------------------------------------------------------------
# Running the parts


def part_command(part: str, scale: str, seed: int, out: Path, with_checks: bool = False) -> list[str]:
    _, script, scales = PARTS[part]
    command = [script, "--scale", scales[scale], "--seed", str(seed), "--out", str(out)]
    checks = ["--checked"] if with_checks and part != STALENESS else []  # the replay sampler's batched while loop
    return command + (["--bootstrap-reps", "200"] if part == VACO else []) + checks


def run_part(command: list[str], allow_dirty: bool) -> dict:
    """Runs one part in its own process; returns its wall and compile seconds."""
    print(f"$ python {' '.join(command)}", flush=True)
    env = {**os.environ, **({ALLOW_DIRTY_ENV: "1"} if allow_dirty else {})}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "compile.json"
        start = time.perf_counter()
        subprocess.run([sys.executable, *command], cwd=REPOSITORY_ROOT, check=True,
                       env={**env, REPORT_VARIABLE: str(report)})
        wall = time.perf_counter() - start
        compile_s = json.loads(report.read_text())["total"] if report.exists() else float("nan")
    return {"wall_seconds": round(wall, 1), "compile_seconds": round(compile_s, 1),
            "run_seconds": round(wall - compile_s, 1)}


# --------------------------------------------------------------------------------------------
# Per-seed mechanism tables from the parts' CSVs


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _by_seed(rows, value: str, **match) -> np.ndarray:
    """``value`` of the rows matching ``match``, ordered by seed (one entry per seed)."""
    picked = {int(r["seed"]): float(r[value]) for r in rows
              if all(r[k] == str(v) for k, v in match.items())}
    return np.asarray([picked[s] for s in sorted(picked)], np.float64)


def staleness_per_seed(part_dir: Path) -> dict[str, np.ndarray]:
    """Sampler → per-seed mean sampled age over the last 10% of versions."""
    per = defaultdict(lambda: defaultdict(list))
    for r in _rows(part_dir / "priority_staleness.csv"):
        per[r["sampler"]][int(r["seed"])].append((int(r["version"]), float(r["mean_age"])))
    out = {}
    for sampler, seeds in per.items():
        values = []
        for s in sorted(seeds):
            ages = np.asarray([a for _, a in sorted(seeds[s])])
            values.append(ages[-max(1, len(ages) // 10):].mean())
        out[sampler] = np.asarray(values)
    return out


def staleness_curves(part_dir: Path) -> dict[str, np.ndarray]:
    """Sampler → ``[seeds, versions]`` mean sampled age."""
    per = defaultdict(lambda: defaultdict(dict))
    for r in _rows(part_dir / "priority_staleness.csv"):
        per[r["sampler"]][int(r["seed"])][int(r["version"])] = float(r["mean_age"])
    return {sampler: np.asarray([[v for _, v in sorted(seeds[s].items())] for s in sorted(seeds)])
            for sampler, seeds in per.items()}


# --------------------------------------------------------------------------------------------
# Statements


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


def staleness_statements(part_dir: Path) -> list[Statement]:
    age = staleness_per_seed(part_dir)
    decayed = [s for s in age if s.startswith("FreshPER")]
    out = [compare(STALENESS, "per_vs_uniform_age", "mean sampled age, PER − uniform replay",
                   age["PER"], age["uniform"])]
    out += [compare(STALENESS, f"{s}_vs_per_age".replace(" ", "_"),
                    f"mean sampled age, {s} − PER", age[s], age["PER"]) for s in decayed]
    return out


def vaco_statements(part_dir: Path) -> list[Statement]:
    rows = _rows(part_dir / "runs.csv")
    tasks = sorted({r["task"] for r in rows})
    lags = sorted({int(r["lag"]) for r in rows if int(r["lag"]) >= 0})
    low_lag, high_lag = lags[0], lags[-1]
    out = []
    for task in tasks:
        pick = dict(task=task, variant="vaco")
        out.append(compare(
            VACO, f"{task}_drift", f"{task}: backward drift TV(acting, learner), lag {high_lag} − lag {low_lag}",
            _by_seed(rows, "mean_tv_behaviour", lag=high_lag, **pick),
            _by_seed(rows, "mean_tv_behaviour", lag=low_lag, **pick)))
    return out


def old_logit_statements(part_dir: Path) -> list[Statement]:
    rows = [r for r in _rows(part_dir / "runs.csv") if "@" not in r["route"]]
    windows = sorted({int(r["window"]) for r in rows})
    small, large = windows[0], windows[-1]
    out = []
    for task in sorted({r["task"] for r in rows}):
        def active(route, window):
            return _by_seed(rows, "active_fraction", task=task, route=route, window=window,
                            threshold=_main_threshold(rows))
        if large > small:
            out.append(compare(
                OLD_LOGITS, f"{task}_recompute_vs_window",
                f"{task}: recompute_current's active-token fraction, W = {large} − W = {small}",
                active("recompute_current", large), active("recompute_current", small)))
        out.append(compare(
            OLD_LOGITS, f"{task}_snapshot_vs_recompute",
            f"{task}: active-token fraction at W = {large}, snapshot − recompute_current",
            active("snapshot", large), active("recompute_current", large)))
    return out


def _main_threshold(rows) -> str:
    """The reset threshold of the route comparison (the largest the part ran; the only one
    at the quickstart's scales)."""
    return max({r["threshold"] for r in rows}, key=float)


def statements(out: Path) -> list[Statement]:
    """Every statement the three parts' outputs under ``out`` support."""
    return (staleness_statements(out / STALENESS) + vaco_statements(out / VACO)
            + old_logit_statements(out / OLD_LOGITS))


# --------------------------------------------------------------------------------------------
# Measurements printed beside the statements (intervals, no comparisons)


def _interval_cell(values: np.ndarray) -> str:
    mean, low, high = (float(x) for x in seed_interval(values, confidence=CONFIDENCE))
    return f"{mean:.3g} [{low:.3g}, {high:.3g}]"


def measurement_tables(out: Path) -> list[str]:
    lines = []
    age = staleness_per_seed(out / STALENESS)
    lines += ["### FreshPER: mean sampled age over the last 10% of versions (policy versions)", "",
              "| sampler | mean age [95% CI] |", "|---|---|"]
    lines += [f"| {s} | {_interval_cell(v)} |" for s, v in age.items()]
    rows = _rows(out / VACO / "runs.csv")
    lags = sorted({int(r["lag"]) for r in rows if int(r["lag"]) >= 0})
    lines += ["", "### VACO part: drift, filter and return per lag (95% CI over seeds)", "",
              "| task | variant | lag | backward TV | forward TV | kept by the TV filter | clipped (PPO) | final return |",
              "|---|---|---|---|---|---|---|---|"]
    for task in sorted({r["task"] for r in rows}):
        for variant in sorted({r["variant"] for r in rows}):
            for lag in lags:
                pick = dict(task=task, variant=variant, lag=lag)
                if not _by_seed(rows, "final_return", **pick).size:
                    continue
                kept = (_interval_cell(1 - _by_seed(rows, "mean_mask_fraction", **pick))
                        if variant.startswith("vaco") else "—")
                clipped = (_interval_cell(_by_seed(rows, "mean_clip_fraction", **pick))
                           if variant.startswith("ppo_clip") else "—")
                lines.append(
                    f"| {task} | {variant} | {lag} | {_interval_cell(_by_seed(rows, 'mean_tv_behaviour', **pick))} | "
                    f"{_interval_cell(_by_seed(rows, 'mean_forward_tv', **pick))} | {kept} | {clipped} | "
                    f"{_interval_cell(_by_seed(rows, 'final_return', **pick))} |")
    seeds = len({r["seed"] for r in rows})
    lines += ["", f"Final returns: n = {seeds} seeds, no ranking (the study in results/vaco/ decides "
              "the VACO claims; see results/VERDICTS.md)."]
    rows = [r for r in _rows(out / OLD_LOGITS / "runs.csv") if "@" not in r["route"]]
    threshold = _main_threshold(rows)
    windows = sorted({int(r["window"]) for r in rows})
    lines += ["", "### Old-logit routes: active-token fraction of the MIS mask (95% CI over seeds)", "",
              "| task | route | " + " | ".join(f"W = {w}" for w in windows) + " | final return at W = "
              f"{windows[-1]} |", "|---|---|" + "---|" * (len(windows) + 1)]
    for task in sorted({r["task"] for r in rows}):
        for route in dict.fromkeys(r["route"] for r in rows):
            cells = [_interval_cell(_by_seed(rows, "active_fraction", task=task, route=route,
                                             window=w, threshold=threshold)) for w in windows]
            ret = _interval_cell(_by_seed(rows, "final", task=task, route=route, window=windows[-1],
                                          threshold=threshold))
            lines.append(f"| {task} | {route} | " + " | ".join(cells) + f" | {ret} |")
    seeds = len({r["seed"] for r in rows})
    lines += ["", f"Final returns: n = {seeds} seeds, no ranking (results/old_logits_control/ is the study)."]
    return lines


def mechanisms_figure(out: Path, path: Path) -> None:
    """Three panels: sampled age against version per sampler; drift and kept fraction against
    lag; active-token fraction against W per route (means with 95% t intervals over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.3))
    ax = axes[0]
    for sampler, curve in staleness_curves(out / STALENESS).items():
        mean, low, high = seed_interval(curve, confidence=CONFIDENCE)
        versions = np.arange(curve.shape[1])
        ax.plot(versions, mean, label=sampler)
        ax.fill_between(versions, low, high, alpha=0.25)
    ax.set(title="FreshPER: age of replayed trajectories", xlabel="policy version",
           ylabel="mean sampled age (versions)")
    ax.legend(fontsize=8)

    ax = axes[1]
    rows = _rows(out / VACO / "runs.csv")
    lags = sorted({int(r["lag"]) for r in rows if int(r["lag"]) >= 0})
    for task in sorted({r["task"] for r in rows}):
        pick = dict(task=task, variant="vaco")
        for metric, label, style in (("mean_tv_behaviour", "backward TV", "-o"),
                                     ("mean_mask_fraction", "masked by the filter", "--s")):
            stats = np.asarray([seed_interval(_by_seed(rows, metric, lag=lag, **pick),
                                              confidence=CONFIDENCE) for lag in lags])
            ax.errorbar(lags, stats[:, 0], yerr=[stats[:, 0] - stats[:, 1], stats[:, 2] - stats[:, 0]],
                        fmt=style, capsize=3, label=f"{task}: {label}")
    ax.set(title="VACO: drift and TV filter against lag", xlabel="actor lag (versions)",
           ylabel="fraction")
    ax.set_xticks(lags)
    ax.legend(fontsize=8)

    ax = axes[2]
    rows = [r for r in _rows(out / OLD_LOGITS / "runs.csv") if "@" not in r["route"]]
    threshold = _main_threshold(rows)
    windows = sorted({int(r["window"]) for r in rows})
    task = sorted({r["task"] for r in rows})[0]
    for route in dict.fromkeys(r["route"] for r in rows):
        stats = np.asarray([seed_interval(_by_seed(rows, "active_fraction", task=task, route=route,
                                                   window=w, threshold=threshold),
                                          confidence=CONFIDENCE) for w in windows])
        ax.errorbar(windows, stats[:, 0], yerr=[stats[:, 0] - stats[:, 1], stats[:, 2] - stats[:, 0]],
                    fmt="-o", capsize=3, label=route)
    ax.set(title=f"Old logits ({task}): the mask's active fraction", xlabel="staleness window W",
           ylabel="active-token fraction", xscale="log")
    ax.set_xticks(windows, [str(w) for w in windows])
    ax.legend(fontsize=8)
    fig.suptitle("Quickstart mechanisms (means with 95% Student-t intervals over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------
# Report


def report(out: Path, scale: str, seed: int) -> str:
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
    for part, (title, _, _) in PARTS.items():
        lines += [f"## {title}", ""]
        lines += [f"- {s.text()}" for s in found if s.part == part]
        lines.append("")
    lines += ["## Measurements", ""] + measurement_tables(out)
    text = "\n".join(lines) + "\n"
    (out / "statements.md").write_text(text)
    return text


def read_timings(path: Path) -> list[dict]:
    return _rows(path) if path.exists() else []


def render_readme(out: Path) -> str:
    """``out/README.md``: the latest run's parts, commands and times (from ``timings.csv``)."""
    history = read_timings(out / "timings.csv")
    latest = [h for h in history if h["run_id"] == history[-1]["run_id"]]
    head = latest[0]
    total = sum(float(r["wall_seconds"]) for r in latest)
    lines = ["# Quickstart: the three papers' mechanisms at small scale", "",
             f"Made by `python experiments/quickstart.py --scale {head['scale']} --seed {head['seed']}` "
             f"at commit {head['commit']} on {machine_description()}; total wall time {total:.0f} s "
             f"(compilation cache: {head['cache']}). `statements.md` holds the statements and "
             "measurements, `mechanisms.png` the figure; each part's folder its own tables.", "",
             "| part | command | wall time | compiling | running |", "|---|---|---|---|---|"]
    for r in latest:
        command = " ".join(["python", *part_command(r["part"], head["scale"], int(head["seed"]),
                                                    Path(r["part"]))])
        lines.append(f"| `{r['part']}/` | `{command}` | {float(r['wall_seconds']):.0f} s | "
                     f"{float(r['compile_seconds']):.0f} s | {float(r['run_seconds']):.0f} s |")
    text = "\n".join(lines) + "\n"
    (out / "README.md").write_text(text)
    return text


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (default: %(default)s)")
    parser.add_argument("--scale", choices=("quick", "ci"), default="quick")
    parser.add_argument("--seed", type=int, default=0, help="first seed of each part")
    parser.add_argument("--only", choices=tuple(PARTS), action="append",
                        help="run only these parts (repeatable); the report needs all three")
    parser.add_argument("--fresh", action="store_true",
                        help="delete each part's outputs first (and take over an --out made with another "
                             "--scale or --seed)")
    parser.add_argument("--report-only", action="store_true",
                        help="only rebuild statements and the figure from the parts' outputs")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="write into results/ although the code has uncommitted edits")
    parser.add_argument("--checked", action="store_true",
                        help="passed to the VACO and old-logit parts (not the FreshPER part: its batched while "
                             f"loop cannot be checkified): {CHECKED_HELP}")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    # --only runs some parts of the same job and --report-only none: not part of its identity
    start_study(parser, args, {"study": "quickstart", "scale": args.scale, "seed": args.seed}, args.out, argv,
                fresh=args.fresh, in_process=False)
    # A scratch folder (the default runs/quickstart) takes runs of edited code; a committed
    # reference under results/ must name the commit that made it.
    committed = args.out.is_relative_to(REPOSITORY_ROOT / "results")
    allow_dirty = args.allow_dirty or not committed
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        cache = host_cache_directory()
        cache_state = "off" if cache is None else ("warm" if cache.exists() and any(cache.iterdir()) else "empty")
        run_id, commit = time.strftime("%Y-%m-%dT%H:%M:%S"), require_clean(git_commit(), allow_dirty)
        rows = []
        for part, (title, _, _) in PARTS.items():
            if args.only and part not in args.only:
                continue
            print(f"\n=== {title}", flush=True)
            if args.fresh and (args.out / part).exists():
                shutil.rmtree(args.out / part)
            times = run_part(part_command(part, args.scale, args.seed, args.out / part, args.checked), allow_dirty)
            rows.append({"run_id": run_id, "commit": commit, "scale": args.scale, "seed": args.seed,
                         "cache": cache_state, "part": part, **times})
        timings = args.out / "timings.csv"
        write_csv(timings, read_timings(timings) + rows)
        render_readme(args.out)
    if all((args.out / part).exists() for part in PARTS):
        print("\n" + report(args.out, args.scale, args.seed))
    else:
        print(f"\n(statements need all three parts under {args.out})")


if __name__ == "__main__":
    main()
