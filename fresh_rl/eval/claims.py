"""Claims declared before the runs (``experiments/claims/<study>.toml``) and their verdicts.

A study file names the study (``study``, ``title``, ``paper``, ``readme``, ``data``: the run
files the claims are decided on), says how and when it was declared (``declared``), how the
README decided before (``previous_rule``), the minimum seeds (``min_seeds``), optional notes
(``tuning``, ``normalisation``), default ``gates`` and the ``claims``. A claim: ``id``,
``statement``, ``section`` (where the paper says it), ``metric``, arms ``a`` and ``b`` (``b`` may
list arms: their per-seed mean), ``direction`` (``"a > b"`` or ``"a < b"``), optional ``margin``
(the claim is a − b > margin, or a − b < −margin), ``cells`` (axis → values; the cells are their
product), optional ``gates`` (replacing the study's), ``min_seeds``, ``tuning``, ``note``, and
what the README said before (``previous``, ``previous_verdict``).

A gate is a measured precondition, ``{measure, op, threshold, text}``, checked per cell: a cell
that fails it cannot test the claim and is left out. ``{measure = "fact", holds = false, text}``
is a precondition the study's design fails (no measurement can pass it). The verdict is *not
testable here* when no cell passes or fewer than ``min_seeds`` seeds remain; otherwise one
pooled test decides (:func:`fresh_rl.eval.pooled_claim`, docs/statistics.md).
"""
from __future__ import annotations

import itertools
import operator
import tomllib
from pathlib import Path
from typing import Callable, Mapping, Optional

import numpy as np

from fresh_rl.eval.statistics import VERDICTS, pooled_claim

DIRECTIONS = {"a > b": True, "a < b": False}
"""direction → whether the claim is a positive difference a − b."""
OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
PREVIOUS_VERDICTS = VERDICTS + ("mixed", "none")
"""Words a README used before: the four verdicts, "mixed" (cells decided both ways) and "none"
(a claim of a study declared before its first run: nothing was decided before)."""
_STUDY_KEYS = ("study", "title", "paper", "readme", "data", "declared", "previous_rule", "min_seeds", "claims")
_CLAIM_KEYS = ("id", "statement", "section", "metric", "a", "b", "direction", "cells", "previous",
               "previous_verdict")

SeriesFn = Callable[[str, Mapping, Mapping[str, str]], Optional[Mapping[int, float]]]
"""``series(arm, claim, cell)``: the arm's value per seed of the claim's metric in the cell, or
None if the cell did not run the arm."""
MeasureFn = Callable[[Mapping, Mapping[str, str]], float]
"""``measure(gate, cell)``: the gate's measured value in the cell."""


def load_study(path) -> dict:
    """The study file at ``path``, checked: every required key, known directions, gate
    operators and previous verdicts, unique claim ids. ``ValueError`` naming the problem."""
    path = Path(path)
    with open(path, "rb") as f:
        study = tomllib.load(f)
    missing = [k for k in _STUDY_KEYS if k not in study]
    if missing:
        raise ValueError(f"{path.name}: missing {missing}")
    ids = [c.get("id") for c in study["claims"]]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path.name}: claim ids repeat: {ids}")
    for claim in study["claims"]:
        where = f"{path.name} claim {claim.get('id')!r}"
        missing = [k for k in _CLAIM_KEYS if k not in claim]
        if missing:
            raise ValueError(f"{where}: missing {missing}")
        if claim["direction"] not in DIRECTIONS:
            raise ValueError(f"{where}: direction must be one of {list(DIRECTIONS)}, got {claim['direction']!r}")
        if claim["previous_verdict"] not in PREVIOUS_VERDICTS:
            raise ValueError(f"{where}: previous_verdict must be one of {PREVIOUS_VERDICTS}")
        for gate in gates_of(study, claim):
            if gate.get("measure") != "fact" and gate.get("op") not in OPS:
                raise ValueError(f"{where}: gate {gate.get('measure')!r} needs op one of {list(OPS)}")
    return study


def gates_of(study: Mapping, claim: Mapping) -> list[dict]:
    """The claim's gates: its own, else the study's."""
    return list(claim.get("gates", study.get("gates", [])))


def cells_of(claim: Mapping) -> list[dict[str, str]]:
    """The claim's cells: the product of its ``cells`` axes, in declared order (values as text)."""
    axes = list(claim["cells"])
    return [dict(zip(axes, map(str, values))) for values in itertools.product(*(claim["cells"][a] for a in axes))]


def cell_label(cell: Mapping[str, str]) -> str:
    """``"task CartPole-v1, lag 8"``."""
    return ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in cell.items())


def _arm_values(series: SeriesFn, arms, claim: Mapping, cell) -> Optional[dict[int, float]]:
    """One arm's per-seed values, or the per-seed mean of several arms (their common seeds)."""
    got = [series(arm, claim, cell) for arm in ([arms] if isinstance(arms, str) else arms)]
    if any(g is None for g in got):
        return None
    seeds = set.intersection(*(set(g) for g in got))
    return {s: float(np.mean([g[s] for g in got])) for s in seeds}


def decide_claim(study: Mapping, claim: Mapping, series: SeriesFn, measure: MeasureFn) -> dict:
    """One claim's verdict from the per-seed values and the gates.

    Returns ``{"verdict", "reason", "gates": [(text, cell, value, passed)], "cells": [cells
    tested], "seeds": [...], "difference", "low", "high", "p_value", "per_cell": [...]}``:
    the pooled a − b with its 95% interval (the verdict compares it with ±``margin``) and the
    Holm-corrected cells; the numbers are absent when the claim is not testable here."""
    claim_positive = DIRECTIONS[claim["direction"]]
    margin = float(claim.get("margin", 0.0))
    min_seeds = int(claim.get("min_seeds", study["min_seeds"]))
    gates = gates_of(study, claim)
    out = {"gates": [], "cells": [], "seeds": [], "min_seeds": min_seeds}
    facts = [g for g in gates if g.get("measure") == "fact"]
    for g in facts:
        out["gates"].append((g["text"], None, None, bool(g["holds"])))
    if not all(g["holds"] for g in facts):
        return {**out, "verdict": VERDICTS[3], "reason": "; ".join(f"{g['text']}: no" for g in facts if not g["holds"])}
    measured = [g for g in gates if g.get("measure") != "fact"]
    tested = []
    for cell in cells_of(claim):
        passed = True
        for g in measured:
            value = float(measure(g, cell))
            ok = bool(OPS[g["op"]](value, float(g["threshold"])))
            out["gates"].append((g["text"], cell, value, ok))
            passed &= ok
        if not passed:
            continue
        a = _arm_values(series, claim["a"], claim, cell)
        b = _arm_values(series, claim["b"], claim, cell)
        if a is not None and b is not None:
            tested.append((cell, a, b))
    if not tested:
        return {**out, "verdict": VERDICTS[3], "reason": "no cell passes the gate"
                + ("" if measured else "s (no cell has both arms)")}
    seeds = sorted(set.intersection(*(set(a) & set(b) for _, a, b in tested)))
    out.update(cells=[cell for cell, _, _ in tested], seeds=seeds)
    if len(seeds) < min_seeds:
        return {**out, "verdict": VERDICTS[3],
                "reason": f"seeds common to every cell ≥ {min_seeds}: no ({len(seeds)})"}
    shift = margin if claim_positive else -margin  # the claim: a − b beyond ±margin
    result = pooled_claim(np.array([[a[s] - b[s] for _, a, b in tested] for s in seeds]) - shift, claim_positive)
    back = {k: result[k] + shift for k in ("difference", "low", "high")}  # reported as a − b
    per_cell = [{**c, **{k: c[k] + shift for k in ("difference", "low", "high")}} for c in result["per_cell"]]
    return {**out, **back, "p_value": result["p_value"], "verdict": result["verdict"], "per_cell": per_cell,
            "reason": ""}


__all__ = ["DIRECTIONS", "OPS", "PREVIOUS_VERDICTS", "cell_label", "cells_of", "decide_claim", "gates_of",
           "load_study"]
