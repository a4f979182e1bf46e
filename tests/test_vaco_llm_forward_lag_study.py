"""fresh_rl.llm.vaco_forward_lag_study without an LLM: the slice's two methods are registered losses
that their old-logit routes can serve (PPO-clip's ratio to π_infer needs no old-logit forward, VACO's
reads π_T), and VACO's realigns once per batch while PPO-clip's does not."""
from __future__ import annotations

import dataclasses

import pytest

from fresh_rl.llm.policy_losses import check_route, get_loss
from fresh_rl.llm.presets import OLD_LOGITS_SCALES
from fresh_rl.llm.vaco_forward_lag_study import ROUTES, Scale


@pytest.mark.parametrize("method", sorted(ROUTES))
def test_each_method_is_a_loss_its_route_can_serve(method):
    check_route(method, ROUTES[method])  # raises naming RLConfig.loss / AsyncConfig.old_logit_route if not
    loss = get_loss(method)
    assert loss.reads_old_logprobs == (ROUTES[method] != "behaviour")  # PPO-clip's ratio is to π_infer itself
    assert (loss.realign is not None) == (method == "vaco")  # realign once per batch: VACO only


def test_the_scale_s_overrides_reach_its_bed():
    scale = Scale(OLD_LOGITS_SCALES["bpe-ci"], (2, 8), (0, 1))
    changed = scale.overridden(["updates=4,16", "bed.iterations=3"])
    assert (changed.updates, changed.bed.iterations, changed.seeds) == ((4, 16), 3, (0, 1))
    assert dataclasses.replace(changed, overrides=()) != scale
