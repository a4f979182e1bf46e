"""The one control trainer reproduces the three trainers it replaced.

``tests/fixtures/recorded_trainers/`` holds 3 iterations of every preset a committed study ran
(the VACO study's variants, the FreshPER control study's replay methods, the old-logit control
study's routes), recorded with a fixed key by the previous ``train``, ``replay_train`` and
``old_logits_train`` (README there: commit, machine, format). Each case is rebuilt here as a
(method, data source, route) configuration of :func:`fresh_rl.control.train.train` and its
metrics and final parameters are compared with the recorded values.

**Tolerance.** The new trainer runs the same operations in the same order: on the recording
set-up the outputs are bit-equal (replay's fresh update now passes through the minibatch
shuffle, a permuted mean: ≲ 1e-7 relative). The suite compiles differently (LLVM level 0 here,
other vector widths and fusions on other x86 CPUs), which changes float32 round-off (≈ 6e-8
relative per operation), and the comparison has to hold through that:

* integer metrics (episode counts, versions, updates, valid flags): exactly — they change only
  if a sampled action flips, which needs a uniform draw within ~1e-7 of a category boundary
  (≲ 1e-7 per step, ≲ 1e-3 over the ≈ 10⁴ actions of a case);
* continuous metrics: rtol 1e-3 — round-off of 1e-6 relative carried through three iterations
  of ≤ 48 Adam steps, whose normalised step lr·m̂/(√v̂ + ε) passes gradient round-off on
  unchanged except for components with |g| ≲ ε, is far below it, while an algorithmic change
  (an advantage, a ratio, a mask) moves these metrics by percents;
* the deterministic evaluation: rtol 2/eval_episodes — at iteration 3 the policies are still
  near uniform, so an argmax between logits closer than round-off can flip; a flip changes the
  episode it happens in, and we allow two of the ``eval_episodes`` episodes to change;
* parameters: each of the first 8 entries of every leaf within 1% of lr·steps (Adam moves an
  entry by at most ≈ lr per step, so lr·steps is the largest displacement a run can make; the
  round-off effects above stay orders of magnitude below 1% of it, a changed update rule does
  not), and the leaf's sum and |·|-sum within that bound times the leaf's size.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fresh_rl.control import HyperParams, ReplaySettings, TrainConfig, train
from fresh_rl.control.hyperparams import replay_grid
from fresh_rl.corrections import (AdaptiveKLConfig, MISConfig, PPOClipConfig, PPOKLConfig, SPOConfig,
                                  VACOConfig)
from fresh_rl.lag import DelayConfig
from fresh_rl.sweep.keys import seed_key

FIXTURES = Path(__file__).parent / "fixtures" / "recorded_trainers"
CASES = {case["case"]: case for case in json.loads((FIXTURES / "index.json").read_text())}
DEFAULT_LANE = ("freshper_control", "old_logits_control")
"""The two replaced trainers in the default suite (every replay method; every old-logit route,
the inference engine and random staleness); the VACO study's 19 presets, whose code path is the
previous ``train``'s, run in the slow lane."""
_TYPES = {cls.__name__: cls for cls in (TrainConfig, PPOClipConfig, PPOKLConfig, SPOConfig, VACOConfig,
                                        DelayConfig, AdaptiveKLConfig, MISConfig)}
_INTEGER_METRICS = ("episodes_completed", "eval/valid", "updates", "num_updates", "sampled_age_counts",
                    "adam_count", "old_logits/forwards", "old_logits/reset", "ewma_reset_count",
                    "lag/version_gap_max")


def _build(value):
    """A recorded config value back as the object: dataclasses by ``__type__``, lists as tuples."""
    if isinstance(value, dict) and "__type__" in value:
        fields = {k: _build(v) for k, v in value.items() if k != "__type__"}
        if value["__type__"] in ("ReplayTrainConfig", "OldLogitTrainConfig"):
            return value["__type__"], fields
        return _TYPES[value["__type__"]](**fields)
    if isinstance(value, list):
        return tuple(_build(v) for v in value)
    return float("inf") if value == "inf" else value


def _replay_config(fields: dict) -> TrainConfig:
    return dataclasses.replace(fields["train"], data_source="replay_freshper", replay=ReplaySettings(
        extra_updates=fields["extra_updates"], buffer_iterations=fields["buffer_iterations"],
        priority=fields["priority"], priority_exponent=fields["priority_exponent"],
        importance_exponent=fields["importance_exponent_default"],
        min_decayed_priority=fields["min_decayed_priority"],
        importance_weight_normalization=fields["importance_weight_normalization"], drift_every=fields["log_every"]))


def _old_logit_config(fields: dict, routes: tuple[str, ...]) -> TrainConfig:
    return dataclasses.replace(
        fields["train"], method="decoupled_ppo", route=fields["route"], routes=routes,
        inference_discrepancy=fields["discrepancy"], max_logit_noise=fields["max_logit_noise"],
        decoupled_mis=fields["mis"], tis_cap=fields["tis_cap"], ewma_beta_rule=fields["ewma_beta_rule"],
        ewma_reset_threshold=fields["ewma_reset_threshold"])


def rebuild(case: dict) -> tuple[TrainConfig, HyperParams, bool]:
    """``(config, hparams, vmapped)`` of the one trainer that stands for the recorded case."""
    built = _build(case["config"])
    recorded = case["hparams"]
    if case["trainer"] == "train":
        config = built
        base = HyperParams.from_config(config)
        return config, base.replace(**{k: jnp.asarray(v, HyperParams.dtype(k)) for k, v in recorded.items()}), False
    kind, fields = built
    if kind == "ReplayTrainConfig":
        config = _replay_config(fields)
        values = {k.split("/", 1)[1]: v for k, v in recorded.items() if k.startswith("control/")}
        replay = {k.split("/", 1)[1]: v for k, v in recorded.items() if k.startswith("replay/")}
        rows = [{field: column[i] for field, column in replay.items()} for i in range(len(case["rows"]))]
        return config, replay_grid(config, rows, values), True
    else:
        config = _old_logit_config(fields, tuple(case["rows"]))
        values = {k.split("/", 1)[1]: v for k, v in recorded.items() if k.startswith("control/")}
        values.update(route=[config.routes_used.index(name) for name in case["rows"]],
                      ewma_beta=recorded["ewma_beta"], ewma_reset_threshold=recorded["ewma_reset_threshold"])
    return config, HyperParams.from_grid(config, values), True


def _outputs(config: TrainConfig, hparams: HyperParams, vmapped: bool, seed: int) -> tuple[dict, object]:
    run = jax.vmap(train, (None, None, 0)) if vmapped else train
    out = jax.jit(run, static_argnums=0)(config, seed_key(seed), hparams)
    metrics = {k: np.asarray(v) for k, v in out.metrics.items()}
    state = out.state
    if state.replay is not None:
        metrics["sampled_age_counts"] = np.asarray(state.replay.sampled_age_counts)
    metrics["num_updates"] = np.asarray(state.num_updates)
    if state.ewma is not None:
        metrics["ewma_reset_count"] = np.asarray(state.ewma.reset_count)
    (adam,) = [s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda s: hasattr(s, "nu")) if hasattr(s, "nu")]
    metrics["adam_count"] = np.asarray(adam.count)
    return metrics, out.params


def check_case(name: str) -> None:
    case = CASES[name]
    config, hparams, vmapped = rebuild(case)
    recorded = dict(np.load(FIXTURES / f"{name}.npz"))
    metrics, params = _outputs(config, hparams, vmapped, case["seed"])
    lr = float(np.max(np.asarray(hparams.learning_rate)))
    steps = 3 * (config.passes_per_batch_used * config.num_minibatches + config.replay.extra_updates)
    param_atol = 0.01 * lr * steps  # the Adam bound of the module docstring
    for key, want in recorded.items():
        kind, _, field = key.partition("/")
        if kind == "metric":
            got = metrics[field]
            if field in _INTEGER_METRICS or not np.issubdtype(want.dtype, np.floating):
                np.testing.assert_array_equal(got, want, err_msg=f"{name}: {field}")
            elif field == "eval/return_deterministic":
                np.testing.assert_allclose(got, want, rtol=2 / config.eval_episodes, err_msg=f"{name}: {field}")
            else:
                np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6, err_msg=f"{name}: {field}")
            continue
        leaf_path, _, summary = field.rpartition("/")
        leaf = np.asarray(_leaf(params, leaf_path), np.float64)
        rows = leaf.reshape((leaf.shape[0], -1) if vmapped else (1, -1))
        value = {"sum": rows.sum(1), "abs_sum": np.abs(rows).sum(1), "head": rows[:, :8]}[summary]
        value = value if vmapped else value[0]
        size = rows.shape[1] if summary != "head" else 1
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=param_atol * size, err_msg=f"{name}: {field}")


def _leaf(params, path: str):
    node = params
    for part in path.split("/"):
        node = node[part]
    return node


@pytest.mark.parametrize("name", DEFAULT_LANE)
def test_the_one_trainer_reproduces_the_recorded_trainer(name):
    check_case(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CASES if n not in DEFAULT_LANE])
def test_every_recorded_preset_is_reproduced(name):
    check_case(name)
