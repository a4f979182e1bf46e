"""experiments/vaco_llm_forward_lag.py run as a user runs it (``--scale ci``, the random-weight BPE
stand-in): both methods at every M on the same seeds, the filter's and the clip's measurements on
the method they belong to, the realignment weight near 1 on-policy, resumption. Slow lane: four
vmapped LLM programs compile (≈ 2–3 min on 2 cores)."""
from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ci_run(tmp_path_factory, run_study):
    out = tmp_path_factory.mktemp("vaco_llm_forward_lag")
    return out, run_study("vaco_llm_forward_lag", "ci", out)


def test_both_methods_run_every_cell_on_the_same_seeds(ci_run, csv_rows):
    out, _ = ci_run
    runs = csv_rows(out / "runs.csv")
    assert sorted((r["method"], int(r["updates"]), int(r["seed"])) for r in runs) == sorted(
        (m, u, s) for m in ("ppo_clip", "vaco") for u in (2, 8) for s in (0, 1))
    for r in runs:
        assert 0.0 <= float(r["success_held_out"]) <= 1.0 and 0.0 <= float(r["success_training"]) <= 1.0
        assert 0.0 <= float(r["clip_fraction"]) <= 1.0 and float(r["kl_k3"]) >= 0.0
        if r["method"] == "vaco":  # the filter's measurements; VACO clips nothing
            assert 0.0 <= float(r["masked_fraction"]) <= 1.0 and float(r["tv_estimate"]) >= 0.0
            assert float(r["clip_fraction"]) == 0.0
            # on-policy π_T and π_infer are the same fp32 weights evaluated twice (the sampler's cached
            # decode, the learner's full forward): they differ by float32 rounding, ~1e-6 relative per
            # op over a few layers, i.e. log-prob gaps ~1e-5 and a mean weight within ~1e-5 of 1;
            # 1e-3 leaves two orders of margin
            assert abs(float(r["realign_weight"]) - 1.0) < 1e-3
        else:  # PPO-clip has no filter and no realignment
            assert all(math.isnan(float(r[k])) for k in ("masked_fraction", "tv_estimate", "realign_weight"))
    assert (out / "success_vs_updates.png").stat().st_size > 0


def test_rerun_loads_the_saved_arms(ci_run, run_study):
    out, _ = ci_run
    runs = (out / "runs.csv").read_text()
    again = run_study("vaco_llm_forward_lag", "ci", out)
    assert "iteration" not in again.stdout.split("# VACO")[0]  # nothing trained again
    assert (out / "runs.csv").read_text() == runs
