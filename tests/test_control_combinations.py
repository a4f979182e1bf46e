"""Every (method × data source × old-log-prob route) triple of the control trainer runs or is
refused at config time naming both parts.

The routes of a (method, data source) pair are one program: ``TrainConfig.routes`` lists every
route the pair accepts and ``HyperParams.route`` is vmapped over them, so each route really runs
(batched, every branch is evaluated and selected per row). The slow lane runs every pair with
every route it accepts. The default lane runs the pair that exercises the most seams at once,
VACO on the age-decayed buffer, with one route of each source kind (stored log-probs, a
forward pass, collection-time log-probs, a proxy) and the composition's ``ewma``; the other
routes run in the default lane through the recorded old-logit study
(tests/test_recorded_trainers.py).
"""
from __future__ import annotations

import itertools
import re

import jax
import numpy as np
import pytest

from fresh_rl.control import DATA_SOURCES, METHODS, HyperParams, ReplaySettings, TrainConfig, combination_error, train
from fresh_rl.corrections.routes import ROUTES
from fresh_rl.lag import DelayConfig

TINY = TrainConfig(num_envs=4, rollout_length=8, total_env_steps=4 * 8 * 2, num_epochs=1, num_minibatches=2,
                   hidden_sizes=(8,), delay=DelayConfig.uniform(0, 1, 3), num_actor_groups=2,
                   inference_discrepancy=0.05, replay=ReplaySettings(extra_updates=1, buffer_iterations=2))
DEFAULT_PAIRS = (("vaco", "replay_freshper"),)
PAIRS = list(itertools.product(METHODS, DATA_SOURCES))


def accepted_routes(method: str, source: str) -> tuple[str, ...]:
    return tuple(r for r in ROUTES if not combination_error(METHODS[method], DATA_SOURCES[source], ROUTES[r]))


def test_every_triple_builds_or_names_both_parts():
    refused = 0
    for method, source, route in itertools.product(METHODS, DATA_SOURCES, ROUTES):
        problem = combination_error(METHODS[method], DATA_SOURCES[source], ROUTES[route])
        make = lambda: TrainConfig(**{**TINY.__dict__, "method": method, "data_source": source,  # noqa: E731
                                      "route": route})
        if not problem:
            assert make().route_used == route
            continue
        refused += 1
        with pytest.raises(ValueError) as err:
            make()
        parts = [p for p in (method, source, route) if re.search(rf"\b{p}\b", str(err.value))]
        assert len(parts) >= 2, (method, source, route, str(err.value))
    # most triples run: the refusals are the few rules of combination_error, the widest being the two
    # factorial routes (one method, unbuffered sources only)
    assert 0 < refused < len(METHODS) * len(DATA_SOURCES) * len(ROUTES) // 2


DEFAULT_ROUTES = ("behaviour", "recompute_current", "old_logit_model", "linear_proxy", "ewma")


def run_pair(method: str, source: str, routes: tuple[str, ...] = ()) -> dict:
    routes = routes or accepted_routes(method, source)
    config = TrainConfig(**{**TINY.__dict__, "method": method, "data_source": source, "route": routes[0],
                            "routes": routes})
    hparams = HyperParams.from_grid(config, {"route": list(range(len(routes)))})
    out = jax.jit(jax.vmap(train, (None, None, 0)), static_argnums=0)(config, jax.random.PRNGKey(0), hparams)
    metrics = {k: np.asarray(v) for k, v in out.metrics.items()}
    assert all(np.all(np.isfinite(v)) for v in metrics.values()), method
    assert metrics["loss/value_loss"].shape == (len(routes), 2)
    # the routes differ: the ones with an extra forward spend it, the others do not
    forwards = metrics["old_logits/forwards"][:, -1]
    for i, name in enumerate(routes):
        spec = ROUTES[name]
        if spec.extra_forward and source == "lagged_actors":
            assert forwards[i] >= 1, name
        if name in ("behaviour", "linear_proxy", "loglinear_proxy"):
            assert forwards[i] == 0, name
    expected_updates = config.passes_per_batch_used * config.num_minibatches
    if DATA_SOURCES[source].buffered:
        expected_updates += config.replay.extra_updates
    np.testing.assert_array_equal(metrics["updates"], expected_updates)
    return metrics


@pytest.mark.parametrize("method, source", DEFAULT_PAIRS)
def test_the_composition_pair_runs_one_route_of_each_kind(method, source):
    run_pair(method, source, DEFAULT_ROUTES)


@pytest.mark.slow
@pytest.mark.parametrize("method, source", [p for p in PAIRS if accepted_routes(*p)])
def test_every_pair_runs_every_route(method, source):
    run_pair(method, source)


def test_docs_tables_are_the_registries():
    """docs/control.md's generated tables equal what the registries give now."""
    from pathlib import Path

    from fresh_rl.control.config import combination_table_markdown
    from fresh_rl.control.data_sources import data_source_table_markdown
    from fresh_rl.control.methods import method_table_markdown

    text = (Path(__file__).parents[1] / "docs" / "control.md").read_text()
    for make in (combination_table_markdown, data_source_table_markdown, method_table_markdown):
        block = re.search(rf"<!-- generated: {make.__name__} -->\n(.*?)\n<!-- end generated -->", text, re.S)
        assert block is not None and block.group(1) == make(), make.__name__
