"""The verdict index (results/VERDICTS.md, written by ``experiments/verdicts.py``): every claim
declared in experiments/claims/*.toml, decided from the per-seed run files committed under
results/.

One rule for every study (:mod:`fresh_rl.eval.claims`, docs/statistics.md): per cell the paired
seed differences a − b; the cells that pass the claim's gates; one pooled Student-t test over
seeds of each seed's mean difference across those cells; the cells shown Holm-corrected. The
verdict is *reproduced*, *refuted*, *undecided* (the interval spans 0) or *not testable here*
(a gate failed). Each study has a reader (:data:`READERS`) that turns its committed files into
per-seed values (``series``) and gate measurements (``measure``); nothing is trained or
recomputed. The index is stamped with the commit of the code that wrote it; a ``+dirty`` stamp
is refused unless allowed (:func:`fresh_rl.provenance.require_clean`).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from fresh_rl.eval.claims import PREVIOUS_VERDICTS, cell_label, cells_of, decide_claim, load_study
from fresh_rl.eval.scores import eval_final_score, eval_first_score, eval_initial_score
from fresh_rl.eval.statistics import VERDICTS, paired_claim, seed_interval
from fresh_rl.provenance import REPOSITORY_ROOT, last_commit, read_csv, require_clean

CLAIMS_DIR = REPOSITORY_ROOT / "experiments" / "claims"
INDEX = REPOSITORY_ROOT / "results" / "VERDICTS.md"
STAMP = "Stamped at commit "
"""Start of the index's one line that names the commit of the code that wrote it."""
STUDY_ORDER = ("vaco", "vaco_forward_lag", "vaco_llm_forward_lag", "freshper_bandit", "freshper_control_tau",
               "freshper_llm", "freshper_control", "old_logits_control", "old_logits_factorial", "old_logits_bpe",
               "old_logits_bpe_factorial", "old_logits_bpe_reset", "llm_rl_gain", "compose", "compose_acrobot")


def _series_of(table: Mapping, key) -> dict[int, float] | None:
    """``{seed: value}`` of ``table[key]`` (itself ``{seed: value}``), None if missing."""
    values = table.get(key)
    return None if not values else dict(values)


def _uniform_replay_ess(study_dir: Path, cell_keys: tuple[str, ...]) -> dict[tuple, float]:
    """Per cell: the on-policy pilot's exact (bandit) or per-step (control) ESS/n by age,
    weighted by the ages uniform replay drew (``sampled_age.csv``), over the ages whose ESS the
    pilot measured: how stale the data in the buffer is."""
    ess = {tuple(r[k] for k in cell_keys) + (int(r["age"]),): float(r["ess_fraction"])
           for r in read_csv(study_dir / "ess_vs_age.csv")}
    totals: dict[tuple, list[float]] = {}
    for r in read_csv(study_dir / "sampled_age.csv"):
        if r.get("variant", r.get("method")) != "uniform":
            continue
        cell = tuple(r[k] for k in cell_keys)
        value = ess.get(cell + (int(r["age"]),), math.nan)
        if math.isfinite(value):
            total = totals.setdefault(cell, [0.0, 0.0])
            total[0] += float(r["fraction"]) * value
            total[1] += float(r["fraction"])
    return {cell: num / den for cell, (num, den) in totals.items()}


def _lr(value) -> str:
    """A learning rate as one spelling (``"0.0003"``), whatever the file wrote."""
    return repr(float(value))


# ---------------------------------------------------------------------------------- VACO ----

VACO_LAGS = {0: "0", -1: "mixture"}


def vaco_reader(root: Path):
    """results/vaco/runs/*.npz: the learner's deterministic evaluations of every run.

    Normalised score per task ``(R − R_init)/(R_best − R_init)``, both ends deterministic
    learner evaluation: R_init the mean first evaluation of all the task's runs, R_best the best
    final score (:func:`eval_final_score`); a diverged run scores R_init. Arms ``variant``
    (one swept value), ``variant@δ`` or ``variant@tuned`` (the value with the best lag-0 mean on
    the claim's ``tuning.select_seeds``, scored on the other seeds only)."""
    runs = {}
    for path in sorted((root / "results" / "vaco" / "runs").glob("*.npz")):
        task, variant = path.stem.split("__")
        task = "brax/" + task.removeprefix("brax_") if task.startswith("brax_") else task
        with np.load(path) as d:
            values, valid = d["eval__return_deterministic"], d["eval__valid"] > 0
            runs[task, variant] = {
                "final": eval_final_score(values, valid), "first": eval_first_score(values, valid),
                "initial": eval_initial_score(values, valid),
                "tv": np.nanmean(d["lag__tv"], axis=-1) if "lag__tv" in d else None,
                "lags": [VACO_LAGS.get(int(x), str(int(x))) for x in d["lags"]],
                "deltas": [float(x) for x in d["deltas"]]}
    bounds = {}
    for task in {t for t, _ in runs}:
        mine = [r for (t, _), r in runs.items() if t == task]
        bounds[task] = (float(np.nanmean([np.nanmean(r["first"]) for r in mine])),
                        float(max(np.nanmax(r["final"]) for r in mine)))
    for (task, _), r in runs.items():
        low, high = bounds[task]
        r["score"] = (np.nan_to_num(r["final"], nan=low) - low) / (high - low)

    def delta_index(run, which: str, claim) -> tuple[int, list[int]]:
        """(δ index, seeds to score) of ``variant@which``."""
        seeds = list(range(run["score"].shape[-1]))
        if which == "":
            if len(run["deltas"]) != 1:
                raise ValueError(f"arm needs @δ or @tuned: swept values {run['deltas']}")
            return 0, seeds
        if which != "tuned":
            return run["deltas"].index(float(which)), seeds
        tuning = claim["tuning"]
        select = [s for s in seeds if s in tuning["select_seeds"]]
        at = run["lags"].index(tuning["at_lag"])
        best = int(np.argmax(run["score"][at][:, select].mean(axis=-1)))
        return best, [s for s in seeds if s not in select]

    def series(arm, claim, cell):
        variant, _, which = arm.partition("@")
        run = runs.get((cell["task"], variant))
        if run is None:
            return None
        di, seeds = delta_index(run, which, claim)
        score = run["score"][:, di]  # [lags, seeds]
        if claim["metric"] == "normalized_score":
            values = score[run["lags"].index(cell["lag"])]
        elif claim["metric"] == "score_drop_0_to_64":
            values = score[run["lags"].index("0")] - score[run["lags"].index("64")]
        else:
            raise ValueError(f"vaco: unknown metric {claim['metric']!r}")
        return {s: float(values[s]) for s in seeds}

    def measure(gate, cell):
        task = cell["task"]
        if gate["measure"] == "task_learns":
            best = max(((r, di) for (t, _), r in runs.items() if t == task for di in range(len(r["deltas"]))
                        if np.isfinite(r["final"][0, di]).all()),
                       key=lambda rd: float(rd[0]["final"][0, rd[1]].mean()))
            run, di = best
            return float(seed_interval(run["final"][0, di] - run["initial"][0, di])[1])
        lag = "64" if gate["measure"] == "vaco_backward_tv_at_64" else cell["lag"]
        run = runs[task, "vaco"]
        return float(np.mean(run["tv"][run["lags"].index(lag), run["deltas"].index(0.2)]))

    return series, measure


def vaco_forward_lag_reader(root: Path):
    """results/vaco_forward_lag/runs.csv: one row per scoring run (task, method, knob, backward lag,
    M, seed; mean learner return, VACO's filter masked fraction). Arm ``<method>`` is the method at
    its tuned knob, ``vaco_delta<δ>`` VACO at δ (the δ curve); metric ``lag_drop`` is a method's
    per-seed return at lag 0 minus at lag 16 at the cell's task and M."""
    table: dict[tuple, dict[int, float]] = {}
    masked: dict[tuple, list[float]] = {}
    for r in read_csv(root / "results" / "vaco_forward_lag" / "runs.csv"):
        cell, seed, value = (r["task"], r["backward"], r["updates"]), int(r["seed"]), float(r["mean_return"])
        if r["tuned_knob"] == "True":
            table.setdefault((r["method"], *cell), {})[seed] = value
            if r["method"] == "vaco":
                masked.setdefault(cell, []).append(float(r["masked_fraction"]))
        if r["method"] == "vaco":
            table.setdefault((f"vaco_delta{float(r['knob']):g}", *cell), {})[seed] = value

    def series(arm, claim, cell):
        if claim["metric"] == "lag_drop":
            lag0, lag16 = (table.get((arm, cell["task"], lag, cell["updates"])) for lag in ("0", "16"))
            return {s: lag0[s] - lag16[s] for s in lag0 if s in lag16} if lag0 and lag16 else None
        return _series_of(table, (arm, cell["task"], cell["backward"], cell["updates"]))

    def measure(gate, cell):
        if gate["measure"] == "ppo_clip_lag_drop_low":
            drop = series("ppo_clip", {"metric": "lag_drop"}, cell)
            return float(seed_interval(np.array([drop[s] for s in sorted(drop)]))[1]) if drop else math.nan
        if gate["measure"] == "vaco_masked_fraction":
            return float(np.mean(masked.get((cell["task"], cell["backward"], cell["updates"]), [math.nan])))
        raise ValueError(f"vaco_forward_lag: unknown gate {gate['measure']!r}")

    return series, measure


def vaco_llm_forward_lag_reader(root: Path):
    """results/vaco_llm_forward_lag/runs.csv: one row per run (method, M, seed; the final learner's
    held-out and training-prompt success, VACO's mean masked fraction). Metric ``drop_held_out`` is a
    method's per-seed held-out success at the smallest M minus at the cell's M."""
    table: dict[tuple, dict[int, float]] = {}
    masked: dict[str, list[float]] = {}
    for r in read_csv(root / "results" / "vaco_llm_forward_lag" / "runs.csv"):
        for metric in ("success_held_out", "success_training"):
            table.setdefault((r["method"], metric, r["updates"]), {})[int(r["seed"])] = float(r[metric])
        if r["method"] == "vaco":
            masked.setdefault(r["updates"], []).append(float(r["masked_fraction"]))
    smallest = str(min(int(m) for _, _, m in table))

    def series(arm, claim, cell):
        if claim["metric"] == "drop_held_out":
            low, high = (table.get((arm, "success_held_out", m)) for m in (smallest, cell["updates"]))
            return {s: low[s] - high[s] for s in low if s in high} if low and high else None
        return _series_of(table, (arm, claim["metric"], cell["updates"]))

    def measure(gate, cell):
        if gate["measure"] == "vaco_masked_fraction":
            return float(np.mean(masked.get(cell["updates"], [math.nan])))
        if gate["measure"] == "ppo_clip_drop_low":
            drop = series("ppo_clip", {"metric": "drop_held_out"}, cell)
            return float(seed_interval(np.array([drop[s] for s in sorted(drop)]))[1]) if drop else math.nan
        raise ValueError(f"vaco_llm_forward_lag: unknown gate {gate['measure']!r}")

    return series, measure


# -------------------------------------------------------------------------------- FreshPER --

def freshper_tau_reader(root: Path, name: str, metrics: tuple[str, ...]):
    """results/<name>/ of a τ-grid FreshPER study (``freshper_bandit``: no task column;
    ``freshper_control_tau``: one cell per task): ``runs.csv`` (one row per scoring run: task,
    arm, τ, tuned lr, seed, the ``metrics``, mean sampled age), ``tuning.csv`` (the picked lr per
    arm and its tuning-seed score: τ* of the finite-τ claim, among the τ the claim's cells use),
    ``ess_vs_age.csv`` and ``sampled_age.csv`` (the staleness gate). A τ cell's FreshPER arm is
    ``freshper_authors_tau<τ>``."""
    study = root / "results" / name
    table: dict[tuple, dict[int, float]] = {}
    ages: dict[tuple, list[float]] = {}
    for r in read_csv(study / "runs.csv"):
        task = r.get("task", "")
        for metric in metrics:
            table.setdefault((r["arm"], task, metric), {})[int(r["seed"])] = float(r[metric])
        ages.setdefault((r["arm"], task), []).append(float(r["mean_sampled_age"]))
    picked = [r for r in read_csv(study / "tuning.csv") if r["picked"] == "True"]
    score = next(k for k in picked[0] if k.startswith("mean_"))  # the tuning score column
    cell_taus = {str(t) for c in load_study(CLAIMS_DIR / f"{name}.toml")["claims"]
                 for t in c["cells"].get("tau", [])}
    best_tau = {}
    for task in {r.get("task", "") for r in picked}:
        fresh = [r for r in picked if r.get("task", "") == task and r["method"] == "freshper_authors"
                 and f"{float(r['tau']):g}" in cell_taus]
        best_tau[task] = max(fresh, key=lambda r: float(r[score]))["arm"]
    cell_keys = ("task", "learning_rate") if "task" in picked[0] else ("learning_rate",)
    ess_by_cell = _uniform_replay_ess(study, cell_keys)
    uniform_lr = {r.get("task", ""): r["learning_rate"] for r in picked if r["arm"] == "uniform"}
    ess = {task: ess_by_cell[(task, lr) if "task" in picked[0] else (lr,)] for task, lr in uniform_lr.items()}

    def arm_of(arm, cell):
        if arm == "freshper_authors":
            return f"freshper_authors_tau{float(cell['tau']):g}"
        return best_tau.get(cell.get("task", ""), "") if arm == "freshper_authors_best_tau" else arm

    def series(arm, claim, cell):
        return _series_of(table, (arm_of(arm, cell), cell.get("task", ""), claim["metric"]))

    def measure(gate, cell):
        task = cell.get("task", "")
        if gate["measure"] == "uniform_replay_ess":
            return ess.get(task, math.nan)  # nan (a task that did not run): the cell fails its gate
        if gate["measure"] == "sampled_age_gap":
            fresh = arm_of("freshper_authors" if "tau" in cell else "freshper_authors_best_tau", cell)
            per, got = ages.get(("per_authors", task)), ages.get((fresh, task))
            return abs(float(np.mean(got)) - np.mean(per)) / float(np.mean(per)) if got and per else math.nan
        raise ValueError(f"{name}: unknown gate {gate['measure']!r}")

    return series, measure


def freshper_llm_reader(root: Path):
    """results/freshper_llm/: ``runs.csv`` (one row per run: arm, τ, seed, held-out success of
    the final policy, mean replayed age) and ``ess_vs_age.csv`` (token ESS/n of PER's final
    buffers by age: the staleness gate at PER's mean replayed age). A τ cell's FreshPER arm is
    ``freshper_authors_tau<τ>``."""
    study = root / "results" / "freshper_llm"
    table: dict[tuple, dict[int, float]] = {}
    ages: dict[str, list[float]] = {}
    for r in read_csv(study / "runs.csv"):
        table.setdefault((r["arm"], "held_out_success"), {})[int(r["seed"])] = float(r["held_out_success"])
        ages.setdefault(r["arm"], []).append(float(r["mean_sampled_age"]))
    ess = {int(r["age"]): float(r["ess_fraction"]) for r in read_csv(study / "ess_vs_age.csv")}
    per_age = float(np.mean(ages["per_authors"]))

    def arm_of(arm, cell):
        return f"freshper_authors_tau{float(cell['tau']):g}" if arm == "freshper_authors" else arm

    def series(arm, claim, cell):
        return _series_of(table, (arm_of(arm, cell), claim["metric"]))

    def measure(gate, cell):
        if gate["measure"] == "per_replayed_ess":
            return ess[min(ess, key=lambda a: abs(a - per_age))]
        if gate["measure"] == "sampled_age_gap":
            got = ages.get(arm_of("freshper_authors", cell))
            return abs(float(np.mean(got)) - per_age) / per_age if got else math.nan
        raise ValueError(f"freshper_llm: unknown gate {gate['measure']!r}")

    return series, measure


def freshper_control_reader(root: Path):
    """results/freshper_control/runs.csv (one row per run of the main study) and
    short_tau_runs.csv (one row per run of the short-τ stage: arm ``freshper_short_tau``)."""
    study = root / "results" / "freshper_control"
    table: dict[tuple, dict[int, float]] = {}
    for r in read_csv(study / "runs.csv"):
        for metric in ("final_return", "mean_eval_return"):
            key = (r["variant"], r["task"], _lr(r["learning_rate"]), "", metric)
            table.setdefault(key, {})[int(r["seed"])] = float(r[metric])
    for r in read_csv(study / "short_tau_runs.csv"):
        for metric in ("final_return", "mean_eval_return"):
            key = ("freshper_short_tau", r["task"], _lr(r["learning_rate"]), repr(float(r["tau"])), metric)
            table.setdefault(key, {})[int(r["seed"])] = float(r[metric])
    ess = {(task, _lr(lr)): v for (task, lr), v in _uniform_replay_ess(study, ("task", "learning_rate")).items()}

    def series(arm, claim, cell):
        tau = repr(float(cell["tau"])) if arm == "freshper_short_tau" else ""
        return _series_of(table, (arm, cell["task"], _lr(cell["learning_rate"]), tau, claim["metric"]))

    def measure(gate, cell):
        if gate["measure"] != "uniform_replay_ess":
            raise ValueError(f"freshper_control: unknown gate {gate['measure']!r}")
        return ess[cell["task"], _lr(cell["learning_rate"])]

    return series, measure


# ---------------------------------------------------------------------------- old logits --

OLD_LOGITS_CONTROL_THRESHOLD = 0.9  # the EWMA reset threshold of the route comparison
OLD_LOGITS_METRICS = {"return": "mean", "active": "active_fraction"}


def old_logits_control_reader(root: Path):
    """results/old_logits_control/runs.csv: one row per run (task, W, route, reset threshold, lr,
    seed; learner return averaged over evaluations, mean ρ_active)."""
    table: dict[tuple, dict[int, float]] = {}
    for r in read_csv(root / "results" / "old_logits_control" / "runs.csv"):
        if float(r["threshold"]) != OLD_LOGITS_CONTROL_THRESHOLD:
            continue
        for metric, column in OLD_LOGITS_METRICS.items():
            key = (r["route"], r["task"], int(r["window"]), _lr(r["learning_rate"]), metric)
            table.setdefault(key, {})[int(r["seed"])] = float(r[column])

    def get(route, metric, cell):
        return _series_of(table, (route, cell["task"], int(cell["window"]), _lr(cell["learning_rate"]), metric))

    def series(arm, claim, cell):
        return get(arm, claim["metric"], cell)

    def measure(gate, cell):
        if gate["measure"] == "recompute_current_masked_fraction":
            return 1.0 - float(np.mean(list(get("recompute_current", "active", cell).values())))
        if gate["measure"] == "snapshot_gain_low":
            snapshot, current = get("snapshot", "return", cell), get("recompute_current", "return", cell)
            seeds = sorted(set(snapshot) & set(current))
            return paired_claim([snapshot[s] for s in seeds], [current[s] for s in seeds], True)["low"]
        raise ValueError(f"old_logits_control: unknown gate {gate['measure']!r}")

    return series, measure


def old_logits_bpe_reader(root: Path, folder: str = "old_logits_bpe"):
    """results/<folder>/ (``old_logits_bpe``, ``old_logits_bpe_factorial``): eval.csv (each finished run's learner success on the training
    pool and on held-out prompts, per seed), runs/<route>_W<W>_seed<s>.csv (per step: ρ_active,
    averaged over the steps with a full ring, step ≥ W) and summary.csv (per route and W: the
    gate measurements)."""
    study = root / "results" / folder
    success: dict[tuple, dict[int, float]] = {}
    for r in read_csv(study / "eval.csv"):
        if r["route"] and r["partial"] == "False":
            success.setdefault((r["route"], int(r["window"]), r["prompts"]), {})[int(r["seed"])] = float(r["success"])
    summary = {(r["route"], int(r["window"])): r for r in read_csv(study / "summary.csv") if r["partial"] == "False"}

    def active(route, window):
        out = {}
        for path in sorted((study / "runs").glob(f"{route}_W{window}_seed*.csv")):
            steps = [float(r["active_token_fraction"]) for r in read_csv(path)]
            out[int(path.stem.rsplit("seed", 1)[1])] = float(np.mean(steps[min(window, len(steps) - 1):]))
        return out or None

    def series(arm, claim, cell):
        window = int(cell["window"])
        if claim["metric"] == "active":
            return active(arm, window)
        prompts = {"success_training": "training", "success_held_out": "held_out"}[claim["metric"]]
        return _series_of(success, (arm, window, prompts))

    def measure(gate, cell):
        row = summary["recompute_current", int(cell["window"])]
        if gate["measure"] == "recompute_current_masked_fraction":
            return 1.0 - float(row["active_fraction"])
        if gate["measure"] == "mean_version_gap":
            return float(row["version_gap_mean"])
        raise ValueError(f"{folder}: unknown gate {gate['measure']!r}")

    return series, measure


def old_logits_factorial_reader(root: Path):
    """results/old_logits_factorial/runs.csv: one row per scoring run (task, staleness setting,
    arm, seed; mean learner return over the evaluations, mean ρ_active, the fraction of
    iterations whose EWMA reset fired)."""
    table: dict[tuple, dict[int, float]] = {}
    resets: dict[tuple, list[float]] = {}
    for r in read_csv(root / "results" / "old_logits_factorial" / "runs.csv"):
        for metric, column in (("return", "mean_return"), ("active", "active_fraction")):
            table.setdefault((r["arm"], r["task"], r["setting"], metric), {})[int(r["seed"])] = float(r[column])
        if r["arm"] == "ewma":
            resets.setdefault((r["task"], r["setting"]), []).append(float(r["reset_rate"]))

    def series(arm, claim, cell):
        return _series_of(table, (arm, cell["task"], cell["setting"], claim["metric"]))

    def measure(gate, cell):
        if gate["measure"] == "recompute_current_masked_fraction":
            active = table[("recompute_current", cell["task"], cell["setting"], "active")]
            return 1.0 - float(np.mean(list(active.values())))
        if gate["measure"] == "reset_rate":
            return float(np.mean(resets[cell["task"], cell["setting"]]))
        raise ValueError(f"old_logits_factorial: unknown gate {gate['measure']!r}")

    return series, measure


def old_logits_bpe_reset_reader(root: Path):
    """results/old_logits_bpe_reset/runs.csv: one row per scoring run (route, seed; the final
    learner's training-prompt and held-out success, mean ρ_active and the reset rate over the
    iterations with a full ring). Its one cell is W = 16."""
    table: dict[tuple, dict[int, float]] = {}
    resets = []
    for r in read_csv(root / "results" / "old_logits_bpe_reset" / "runs.csv"):
        for metric, column in (("success_training", "success_training"), ("success_held_out", "success_held_out"),
                               ("active", "active_fraction")):
            table.setdefault((r["route"], metric), {})[int(r["seed"])] = float(r[column])
        if r["route"] == "ewma":
            resets.append(float(r["reset_rate"]))

    def series(arm, claim, cell):
        return _series_of(table, (arm, claim["metric"]))

    def measure(gate, cell):
        if gate["measure"] == "reset_rate":
            return float(np.mean(resets))
        raise ValueError(f"old_logits_bpe_reset: unknown gate {gate['measure']!r}")

    return series, measure


# ------------------------------------------------------------------------------ RL gain --

def llm_rl_gain_reader(root: Path):
    """results/llm_rl_gain/runs/<setting>_seed<s>.json: held-out success before (the warm start)
    and after RL, on the same episodes, per seed."""
    table: dict[tuple, dict[int, float]] = {}
    for path in sorted((root / "results" / "llm_rl_gain" / "runs").glob("*.json")):
        setting, _, seed = path.stem.rpartition("_seed")
        record = json.loads(path.read_text())
        for arm in ("before", "after"):
            table.setdefault((setting, arm), {})[int(seed)] = float(record[arm])

    def series(arm, claim, cell):
        if claim["metric"] != "held_out_success":
            raise ValueError(f"llm_rl_gain: unknown metric {claim['metric']!r}")
        return _series_of(table, (cell["setting"], arm))

    def measure(gate, cell):
        raise ValueError(f"llm_rl_gain: unknown gate {gate['measure']!r}")

    return series, measure


# ---------------------------------------------------------------------------- composition --

def compose_reader(root: Path, folder: str = "compose"):
    """results/<folder>/runs.json: per arm and seed the final learner return and the gate
    measurements (batch-start TV, EWMA reset rate, replayed ESS/n), one cell (the task)."""
    path = root / "results" / folder / "runs.json"
    data = json.loads(path.read_text()) if path.exists() else {"arms": {}, "task": None}

    def per_seed(arm, key):
        record = data["arms"].get(arm)
        if record is None or key not in record:
            return None
        return dict(zip(record["seeds"], record[key]))

    def series(arm, claim, cell):
        if claim["metric"] != "final_eval_return":
            raise ValueError(f"compose: unknown metric {claim['metric']!r}")
        return per_seed(arm, "final_eval_return") if cell["task"] == data["task"] else None

    def measure(gate, cell):
        arms = {"lag_tv_ppo_clip": ("ppo_clip", "lag_tv"), "replayed_ess_freshper": ("freshper", "replayed_ess"),
                "ewma_reset_rate_composed": ("composed", "ewma_reset_rate")}
        if gate["measure"] not in arms:
            raise ValueError(f"compose: unknown gate {gate['measure']!r}")
        values = per_seed(*arms[gate["measure"]])
        return math.nan if values is None or cell["task"] != data["task"] else float(np.mean(list(values.values())))

    return series, measure


READERS: dict[str, Callable] = {"compose": compose_reader, "vaco_forward_lag": vaco_forward_lag_reader,
                                "vaco_llm_forward_lag": vaco_llm_forward_lag_reader,
                                "compose_acrobot": lambda root: compose_reader(root, "compose_acrobot"), "vaco": vaco_reader,
                                "freshper_bandit": lambda root: freshper_tau_reader(
                                    root, "freshper_bandit", ("final_expected_reward", "mean_expected_reward")),
                                "freshper_control_tau": lambda root: freshper_tau_reader(
                                    root, "freshper_control_tau", ("final_return", "mean_eval_return")),
                                "freshper_control": freshper_control_reader, "freshper_llm": freshper_llm_reader,
                                "old_logits_control": old_logits_control_reader,
                                "old_logits_factorial": old_logits_factorial_reader,
                                "old_logits_bpe": old_logits_bpe_reader,
                                "old_logits_bpe_factorial": lambda root: old_logits_bpe_reader(
                                    root, "old_logits_bpe_factorial"),
                                "old_logits_bpe_reset": old_logits_bpe_reset_reader,
                                "llm_rl_gain": llm_rl_gain_reader}


# ------------------------------------------------------------------------------ the index --

def decide_all(claims_dir: Path = CLAIMS_DIR, root: Path = REPOSITORY_ROOT) -> list[tuple[dict, list[dict]]]:
    """``[(study, [result per claim])]`` for every study file, in :data:`STUDY_ORDER`; each
    result is :func:`fresh_rl.eval.claims.decide_claim`'s with the claim under ``"claim"``.
    A study declared before its runs whose data files are not committed yet gets ``None``."""
    studies = [load_study(p) for p in sorted(Path(claims_dir).glob("*.toml"))]
    order = {name: i for i, name in enumerate(STUDY_ORDER)}
    out = []
    for study in sorted(studies, key=lambda s: (order.get(s["study"], len(order)), s["study"])):
        if not all((Path(root) / d).exists() for d in study["data"]):
            out.append((study, None))
            continue
        series, measure = READERS[study["study"]](Path(root))
        out.append((study, [{"claim": c, **decide_claim(study, c, series, measure)} for c in study["claims"]]))
    return out


def _digits(values) -> int:
    """Decimals that show ``values`` to about three significant figures (1 to 5)."""
    finite = [abs(v) for v in values if v is not None and math.isfinite(v) and v != 0]
    if not finite:
        return 3
    return int(min(5, max(1, 2 - math.floor(math.log10(max(finite))))))


def _interval(mean, low, high, digits: int) -> str:
    return f"{mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def _arm(arms) -> str:
    return arms if isinstance(arms, str) else "mean of " + " and ".join(arms)


def _seeds(seeds: list[int]) -> str:
    if seeds and seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 2:
        return f"{len(seeds)} ({seeds[0]}–{seeds[-1]})"
    return f"{len(seeds)} ({', '.join(map(str, seeds))})" if seeds else "0"


def _why(study: Mapping, result: Mapping) -> str:
    """Why a verdict differs from what the README said."""
    claim = result["claim"]
    if "why" in claim:
        return claim["why"]
    if result["verdict"] == VERDICTS[3]:
        return f"gate: {result['reason']}"
    reasons = []
    if isinstance(claim.get("tuning"), Mapping):
        seeds = claim["tuning"]["select_seeds"]
        reasons.append(f"the tuned value is now chosen on seeds {seeds[0]}–{seeds[-1]} and scored on the "
                       "others (before: chosen on the scoring seeds)")
    declared = len(cells_of(claim))
    if len(result["cells"]) < declared:
        reasons.append(f"the gate keeps {len(result['cells'])} of {declared} cells")
    if claim["previous_verdict"] == "mixed":
        reasons.append("one pooled test over the cells replaces cells read one by one, which decided both ways")
    else:
        reasons.append(f"one pooled Student-t test over {len(result['cells'])} cell(s) replaces {study['previous_rule']}")
    return "; ".join(reasons)


def _gate_lines(result: Mapping) -> list[str]:
    by_text: dict[str, list[str]] = {}
    for text, cell, value, ok in result["gates"]:
        mark = "passes" if ok else "fails"
        entry = mark if cell is None else f"{cell_label(cell)}: {value:.3g} ({mark})"
        by_text.setdefault(text, []).append(entry)
    return [f"- Gate — {text}: {'; '.join(entries)}." for text, entries in by_text.items()]


def render(decided: list[tuple[dict, list[dict]]], data_commits: Mapping[str, str], stamp: str) -> str:
    """The Markdown of results/VERDICTS.md. ``stamp``: the commit of the code that wrote it."""
    lines = ["# Verdict index", "",
             "Generated by `python experiments/verdicts.py` from the claims declared in "
             "`experiments/claims/<study>.toml` and the per-seed run files committed under `results/`; "
             "do not edit by hand (`python experiments/verdicts.py --check` says whether it is current). "
             "The study READMEs link here instead of keeping verdict tables of their own.", "",
             f"{STAMP}{stamp}.", "",
             "**The rule** (docs/statistics.md). For each claim, each cell (a task, lag, window, learning "
             "rate …) gives the per-seed paired differences a − b of the declared metric. The cells that fail "
             "a gate (a measured precondition) are left out. Each seed's differences are averaged over the "
             "remaining cells and one Student-t interval over seeds (95%) decides: **reproduced** when it "
             "excludes 0 on the claimed side, **refuted** on the other, **undecided** when it spans 0, "
             "**not testable here** when no cell passes the gates or fewer than the declared minimum of "
             "seeds remain. The per-cell rows are Holm-corrected over the claim's cells and do not decide "
             "the claim.", "",
             "## Verdicts per study", "",
             "| study | claims | " + " | ".join(VERDICTS) + " | README before: " + " / ".join(PREVIOUS_VERDICTS) + " |",
             "|---|---|" + "---|" * len(VERDICTS) + "---|"]
    awaiting = [study for study, results in decided if results is None]
    decided = [(study, results) for study, results in decided if results is not None]
    for study, results in decided:
        now = [sum(r["verdict"] == v for r in results) for v in VERDICTS]
        before = [sum(r["claim"]["previous_verdict"] == v for r in results) for v in PREVIOUS_VERDICTS]
        lines.append(f"| [{study['study']}](#{study['study']}) | {len(results)} | "
                     + " | ".join(map(str, now)) + " | " + " / ".join(map(str, before)) + " |")
    if awaiting:
        lines += ["", "Declared before their runs, results not committed yet: " + ", ".join(
            f"`{s['study']}` ({len(s['claims'])} claims, experiments/claims/{s['study']}.toml)" for s in awaiting) + "."]
    lines += ["", "## What changed against the study READMEs", "",
              "Every claim whose verdict differs from what its README said before this index, and why.", "",
              "| study | claim | README said | now | why |", "|---|---|---|---|---|"]
    for study, results in decided:
        for r in results:
            if r["claim"]["previous_verdict"] not in (r["verdict"], "none"):
                lines.append(f"| {study['study']} | `{r['claim']['id']}` | {r['claim']['previous_verdict']} | "
                             f"**{r['verdict']}** | {_why(study, r)} |")
    for study, results in decided:
        lines += ["", f"## {study['study']}", "", f"**{study['title']}.** Paper: {study['paper']}. "
                  f"README: `{study['readme']}`. Data: {', '.join(f'`{d}`' for d in study['data'])} at commit "
                  f"{data_commits[study['study']]}. Minimum seeds: {study['min_seeds']}.", "",
                  f"- Declared: {study['declared']}",
                  f"- Before this index: {study['previous_rule']}."]
        lines += [f"- {key.capitalize()}: {study[key]}" for key in ("tuning", "normalisation") if key in study]
        for r in results:
            claim = r["claim"]
            lines += ["", f"### `{claim['id']}`", "", f"{claim['statement']}.", "",
                      f"- **Verdict: {r['verdict']}.**"]
            margin = float(claim.get("margin", 0.0))
            target = f"a − b {claim['direction'][2]} {'+' if claim['direction'][2] == '>' else '−'}{margin:g}" \
                if margin else claim["direction"]
            if r["verdict"] == VERDICTS[3]:
                lines.append(f"- Not testable: {r['reason']}.")
            else:
                digits = _digits([r["low"], r["high"]] + [c["low"] for c in r["per_cell"]])
                lines.append(f"- Pooled a − b: {_interval(r['difference'], r['low'], r['high'], digits)} "
                             f"(95% Student-t), p = {r['p_value']:.2g}; seeds {_seeds(r['seeds'])}; "
                             f"{len(r['cells'])} of {len(cells_of(claim))} declared cells.")
            lines += [f"- Claim: {target}, with a = `{_arm(claim['a'])}`, b = `{_arm(claim['b'])}`, metric "
                      f"`{claim['metric']}`. Paper: {claim['section']}."]
            if "note" in claim:
                lines.append(f"- Note: {claim['note']}.")
            if isinstance(claim.get("tuning"), Mapping):
                t = claim["tuning"]
                lines.append(f"- Tuning apart from scoring: the `@tuned` value ({t['what']}) is picked per task at lag "
                             f"{t['at_lag']} on seeds {', '.join(map(str, t['select_seeds']))} (best seed-mean score) "
                             "and scored on the other seeds only.")
            lines += _gate_lines(r)
            lines.append(f"- README before: {claim['previous']}" + (
                "." if claim["previous_verdict"] == "none" else f" (**{claim['previous_verdict']}**)."))
            if r["verdict"] != VERDICTS[3]:
                lines += ["", "| cell | a − b [95%] | p | p (Holm) | cell at Holm 5% |", "|---|---|---|---|---|"]
                lines += [f"| {cell_label(cell)} | {_interval(c['difference'], c['low'], c['high'], digits)} | "
                          f"{c['p_value']:.2g} | {c['p_holm']:.2g} | {c['verdict']} |"
                          for cell, c in zip(r["cells"], r["per_cell"])]
    return "\n".join(lines) + "\n"


def build(claims_dir: Path = CLAIMS_DIR, root: Path = REPOSITORY_ROOT, stamp: str = "") -> str:
    """The index from the claims files and the committed runs (``stamp``: the code's commit)."""
    decided = decide_all(claims_dir, root)
    commits = {s["study"]: last_commit(s["data"]) for s, results in decided if results is not None}
    return render(decided, commits, stamp)


def without_stamp(text: str) -> str:
    """``text`` without its :data:`STAMP` line (the one line that names the writer's commit)."""
    return "\n".join(line for line in text.splitlines() if not line.startswith(STAMP))


def write_index(out: Path, commit: str, allow_dirty: bool = False) -> None:
    """Write the index to ``out``, stamped with ``commit`` (the code's); a ``+dirty`` commit is
    refused unless ``allow_dirty`` (:func:`fresh_rl.provenance.require_clean`)."""
    text = build(stamp=require_clean(commit, allow_dirty))
    Path(out).write_text(text)


def is_current(path: Path) -> bool:
    """Whether the index at ``path`` equals a rebuild, the stamp line aside (a missing file is not)."""
    current = Path(path).read_text() if Path(path).exists() else ""
    return without_stamp(build()) == without_stamp(current)
