"""The verdict index (fresh_rl.eval.verdicts, written by experiments/verdicts.py): rebuilt from the
committed runs it equals the committed results/VERDICTS.md; the claims files and the decision rule
(fresh_rl.eval.claims); the refusal to stamp a +dirty commit (fresh_rl.provenance.require_clean)."""
import subprocess
import sys

import numpy as np
import pytest

from fresh_rl import provenance
from fresh_rl.eval import verdicts
from fresh_rl.eval.claims import cells_of, decide_claim, load_study
from fresh_rl.provenance import ALLOW_DIRTY_ENV, REPOSITORY_ROOT, DirtyCheckoutError, require_clean


def test_the_committed_index_is_what_the_committed_runs_give():
    """Rebuild results/VERDICTS.md from experiments/claims/*.toml and the run files under
    results/; only the stamp line (the commit of the code that wrote it) may differ. On failure:
    ``python experiments/verdicts.py`` (after committing the code)."""
    committed = verdicts.INDEX.read_text()
    rebuilt = verdicts.build(stamp="(ignored)")
    assert verdicts.without_stamp(rebuilt) == verdicts.without_stamp(committed)
    assert sum(line.startswith(verdicts.STAMP) for line in committed.splitlines()) == 1


def test_every_study_has_a_claims_file_and_a_reader():
    decided = verdicts.decide_all()
    assert [s["study"] for s, _ in decided] == list(verdicts.STUDY_ORDER)
    for study, results in decided:
        if results is None:  # declared before its runs: some data file is not committed yet
            assert not all((REPOSITORY_ROOT / d).exists() for d in study["data"])
            assert study["study"] in verdicts.READERS
            continue
        assert len(results) == len(study["claims"]) > 0
        for r in results:
            assert r["verdict"] in {"reproduced", "refuted", "undecided", "not testable here"}
            if r["verdict"] == "not testable here":
                assert r["reason"]
            else:  # one pooled test over the cells that passed the gates, the same seeds in each
                assert len(r["per_cell"]) == len(r["cells"]) and len(r["seeds"]) >= r["min_seeds"]
                assert r["low"] <= r["difference"] <= r["high"]


STUDY = {"min_seeds": 3, "gates": [{"measure": "drift", "op": ">=", "threshold": 0.1, "text": "drift"}]}


def _claim(**fields):
    return {"id": "c", "metric": "m", "a": "x", "b": "y", "direction": "a > b",
            "cells": {"task": ["t1", "t2"]}, **fields}


def _series(values):
    def series(arm, claim, cell):
        return values.get((arm, cell["task"]))
    return series


def test_decide_claim_pools_the_cells_that_pass_the_gate():
    rng = np.random.default_rng(0)
    y = {t: rng.normal(size=6) for t in ("t1", "t2")}
    values = {("y", t): dict(enumerate(v)) for t, v in y.items()}
    values.update({("x", "t1"): dict(enumerate(y["t1"] + 1.0)), ("x", "t2"): dict(enumerate(y["t2"] - 5.0))})
    drift = {"t1": 0.3, "t2": 0.01}  # t2 fails the gate, so its loss does not count
    out = decide_claim(STUDY, _claim(), _series(values), lambda gate, cell: drift[cell["task"]])
    assert out["verdict"] == "reproduced" and out["cells"] == [{"task": "t1"}]
    assert out["difference"] == pytest.approx(1.0) and out["seeds"] == list(range(6))
    assert [(g[1], g[3]) for g in out["gates"]] == [({"task": "t1"}, True), ({"task": "t2"}, False)]
    # every cell gated out, too few common seeds, or a design fact that fails: not testable
    assert decide_claim(STUDY, _claim(), _series(values), lambda g, c: 0.0)["verdict"] == "not testable here"
    few = {k: {s: v[s] for s in (0, 1)} for k, v in values.items()}
    out = decide_claim(STUDY, _claim(), _series(few), lambda g, c: 1.0)
    assert out["verdict"] == "not testable here" and "≥ 3: no (2)" in out["reason"]
    fact = _claim(gates=[{"measure": "fact", "holds": False, "text": "tuning seeds disjoint from scoring seeds"}])
    out = decide_claim(STUDY, fact, _series(values), lambda g, c: 1.0)
    assert (out["verdict"], out["reason"]) == ("not testable here", "tuning seeds disjoint from scoring seeds: no")


def test_a_margin_moves_the_bar_and_the_reported_difference_stays_a_minus_b():
    values = {("x", "t1"): dict(enumerate([1.1, 1.2, 1.0, 1.15])), ("y", "t1"): dict(enumerate([1.0] * 4))}
    claim = _claim(cells={"task": ["t1"]}, margin=0.5)
    out = decide_claim(STUDY, claim, _series(values), lambda g, c: 1.0)
    assert out["verdict"] == "refuted" and out["difference"] == pytest.approx(0.1125)
    assert out["high"] < 0.5


def test_study_files_are_checked(tmp_path):
    for path in sorted(verdicts.CLAIMS_DIR.glob("*.toml")):
        study = load_study(path)
        assert all(cells_of(c) for c in study["claims"])
    bad = tmp_path / "bad.toml"
    text = (verdicts.CLAIMS_DIR / "llm_rl_gain.toml").read_text()
    bad.write_text(text.replace('direction = "a > b"', 'direction = "a >= b"', 1))
    with pytest.raises(ValueError, match="direction"):
        load_study(bad)


def test_a_dirty_commit_is_refused_unless_allowed(tmp_path, monkeypatch):
    monkeypatch.delenv(ALLOW_DIRTY_ENV, raising=False)
    assert require_clean("0123abc") == "0123abc"
    with pytest.raises(DirtyCheckoutError, match="uncommitted"):
        require_clean("0123abc+dirty")
    assert require_clean("0123abc+dirty", allow_dirty=True) == "0123abc+dirty"
    # every writer that stamps through provenance() gets the refusal
    monkeypatch.setattr(provenance, "COMMIT_AT_START", "0123abc+dirty")
    monkeypatch.setattr(provenance, "git_commit", lambda: "0123abc+dirty")
    with pytest.raises(DirtyCheckoutError):
        provenance.provenance(command="python x.py")
    assert provenance.provenance(command="python x.py", allow_dirty=True)["commit"] == "0123abc+dirty"
    monkeypatch.setenv(ALLOW_DIRTY_ENV, "1")
    assert provenance.provenance(command="python x.py")["commit"] == "0123abc+dirty"
    monkeypatch.delenv(ALLOW_DIRTY_ENV)
    # the index writer: refuses, then writes when allowed
    out = tmp_path / "VERDICTS.md"
    with pytest.raises(DirtyCheckoutError):
        verdicts.write_index(out, "0123abc+dirty")
    assert not out.exists()
    verdicts.write_index(out, "0123abc+dirty", allow_dirty=True)
    assert f"{verdicts.STAMP}0123abc+dirty." in out.read_text()
    assert verdicts.is_current(out)
    out.write_text(out.read_text().replace("reproduced", "refuted", 1))
    assert not verdicts.is_current(out)


def test_the_script_writes_and_checks_the_index(tmp_path):
    """``experiments/verdicts.py --allow-dirty`` writes --out stamped with the checkout's commit;
    ``--check`` then finds it current (exit 0)."""
    def script(*flags):
        return subprocess.run([sys.executable, str(REPOSITORY_ROOT / "experiments" / "verdicts.py"), *flags],
                              capture_output=True, text=True, cwd=REPOSITORY_ROOT, timeout=300)
    out = tmp_path / "VERDICTS.md"
    written = script("--out", str(out), "--allow-dirty")
    assert (written.returncode, written.stdout.strip()) == (0, f"wrote {out}"), written.stderr[-3000:]
    assert f"{verdicts.STAMP}{provenance.git_commit()}." in out.read_text()
    current = script("--out", str(out), "--check")
    assert (current.returncode, current.stdout.strip()) == (0, f"{out} is current")
