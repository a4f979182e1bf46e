"""fresh_rl.studies.priority_staleness: the aging-buffer simulation against what uniform replay must give."""
from __future__ import annotations

import numpy as np
import pytest

from fresh_rl.studies.priority_staleness import StalenessConfig, run_samplers, summary_lines, version_rows

CONFIG = StalenessConfig(num_versions=120, insert_batch=16, sample_batch=16, capacity=256, reward_scale_decay=50.0,
                         num_seeds=2)
FULL = slice(CONFIG.capacity // CONFIG.insert_batch, None)  # versions at which the FIFO buffer is full


@pytest.fixture(scope="module")
def results():
    return run_samplers(CONFIG, {"uniform": dict(sampling="uniform"), "PER": dict(sampling="per"),
                                 "FreshPER τ=2": dict(sampling="freshper", age_decay_tau=2.0)})


def test_uniform_replay_of_a_full_buffer_draws_every_held_version_alike(results):
    """A full buffer holds versions v − 15 … v (16 items each), so a uniform draw's age is uniform on
    {0, …, 15}: mean 7.5, and P(age > 8) = 7/16. Over 104 versions × 16 draws × 2 seeds (3,328 draws,
    age std 4.6) the mean's standard error is 0.08 and the share's 0.009: the bounds are ≥ 5 of them."""
    m = results["uniform"]
    assert m["mean_age"][:, FULL].mean() == pytest.approx(7.5, abs=0.4)
    assert m["stale_share"][:, FULL].mean() == pytest.approx(7 / 16, abs=0.05)


def test_the_batch_ess_is_at_least_that_of_its_mean_age(results):
    """exp(−κ·age) is convex in age, so a batch's mean ESS fraction is ≥ exp(−κ · its mean age)
    (Jensen); the slack 1e-6 covers float32 averaging of 16 terms."""
    for m in results.values():
        assert np.all(m["ess_fraction"] >= np.exp(-CONFIG.drift_kl_per_version * m["mean_age"]) - 1e-6)


def test_age_decay_replays_younger_data_than_per(results):
    """Early rewards are larger, so PER keeps replaying old items; p·exp(−age/τ) with τ = 2 versions
    weights an item 16 versions old by e^−8 against a new one, so its draws are far younger."""
    per, fresh = (results[name]["mean_age"][:, FULL].mean() for name in ("PER", "FreshPER τ=2"))
    assert fresh < per - 2.0 and fresh < 7.5


def test_rows_and_summary_name_every_sampler(results):
    rows = version_rows(results, seed=3)
    assert len(rows) == 3 * CONFIG.num_seeds * CONFIG.num_versions and {r["seed"] for r in rows} == {3, 4}
    text = "\n".join(summary_lines(results, CONFIG))
    assert all(f"| {name} |" in text for name in results)
