"""The LLM trainer's policy losses as a registry (verl's policy-loss registry is the model):
a new loss is one :func:`register_loss` call.

Each entry is a plain record (:class:`PolicyLoss`) of its per-minibatch function and what it
needs; :func:`fresh_rl.llm.trainer.loss_terms` and ``update``, ``RLConfig`` validation and the
pipelines' loss × route check (:func:`check_route`) read only the registry.

* ``ppo_clip`` — :func:`~fresh_rl.corrections.policy_losses.ppo_clip_loss_sum` with the
  ratio π_θ/π_infer against the sampler's log-probs (what most LLM-RL code does when it skips
  the recompute). Reads no old log-probs.
* ``decoupled`` — :func:`~fresh_rl.corrections.decoupled.decoupled_ppo_loss_sum`: MIS/TIS on
  r_d = π_old/π_infer and the PPO clip on r_s = π_θ/π_old (docs/old_logits.md). A route's
  interpolation proxy may stand in for π_old (``proximal``); a factorial route centres the
  clip on other old log-probs than the mask's (``batch.clip_logprobs``).
* ``vaco`` — VACO (arXiv 2603.01365; docs/vaco.md): the advantages are realigned once per
  batch (:func:`vaco_realign`), then every minibatch takes the unclipped IS policy gradient
  with the TV filter (:func:`~fresh_rl.corrections.vaco_policy_loss`, δ and its convention
  in ``RLConfig.vaco``). The ratio's reference π_ref is the batch's old log-probs: the
  route's (``recompute_current`` gives π_T, the learner at batch start, VACO's own
  reference; the synchronous trainer's fp32 forward at batch start is π_T too), or π_infer
  with ``RLConfig.vaco.reference = "behaviour"``. With an exact route (``snapshot``, …) π_ref
  is the acting version's training policy π_train^(v): the realignment then corrects only the
  train–inference discrepancy r_d and the filter sees backward plus forward lag; with ``ewma``
  π_ref is π_{θ_ref}, between the two.

**VACO without a critic (our choice).** arXiv 2603.01365 pairs VACO with GRPO on GSM8K, whose
group-normalised advantages have no critic, and does not say how its V-trace realignment runs
without a value function (skipped, or a re-weighting by the truncated π_T/β; unknown to us).
Our default is the V-trace realignment itself (IMPALA, arXiv 1802.01561, §4.1, Eq. 1 and its
policy-gradient advantage of §4.2) with V ≡ 0 and no bootstrapping between tokens (γ = 0): each action token's
group-normalised advantage Â_t is its one-step return, so the IMPALA advantage
ρ_t·(r_t + γ v_{t+1} − V(s_t)) becomes

    Â'_t = min(ρ̄, π_ref(a_t|s_t)/π_infer(a_t|s_t)) · Â_t,

computed once per batch and frozen for its epochs and minibatches (VACO's "align", docs/vaco.md,
"Advantage realignment"). With π_ref = π_T this moves the backward lag β → π_T into the
advantage as VACO's ρ_t does; the filter then constrains the forward lag π_θ → π_T. ρ̄ is
``RLConfig.vaco_rho_bar`` (default 1.0, IMPALA's; the paper tunes it and does not give its
value); ``math.inf`` keeps the untruncated weight. c̄ and λ play no part at γ = 0.

**What every loss reports** (the pipelines read these keys whatever the loss): ``loss``,
``active_token_fraction`` (tokens whose gradient counts / valid action tokens: all for
``ppo_clip``, the MIS-kept ones for ``decoupled``, the TV-filter-kept ones for ``vaco``),
``clip_fraction`` (tokens whose gradient a ratio clip zeroes; 0 for ``vaco``, which clips
nothing) and the ratio diagnostics of :func:`~fresh_rl.corrections.policy_diagnostics`
(``kl_k3``, ``ess``, …) of its clipped / filtered ratio. The function returns the loss as
``(token_sum, token_count, metrics)`` (:func:`~fresh_rl.corrections.policy_losses.token_mean_loss`
of the two is the loss; the count carries no gradient), so gradient accumulation over rows is
exact for the losses whose ``splits_by_rows`` is set.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import jax.numpy as jnp

from fresh_rl.corrections import (VTraceConfig, fraction, linear_proximal_log_probs,
                                  loglinear_proximal_log_probs, masked_mean, vaco_policy_loss,
                                  vtrace)
from fresh_rl.corrections.decoupled import decoupled_ppo_loss_sum
from fresh_rl.corrections.diagnostics import valid_count
from fresh_rl.corrections.policy_losses import ppo_clip_loss_sum
from fresh_rl.corrections.routes import OldLogProbRoute, get_route
from fresh_rl.validation import register_entry, require_choice

PROXIMAL_PROXIES = {"linear": linear_proximal_log_probs,
                    "loglinear": loglinear_proximal_log_probs}
"""The interpolation proxy π_old of a route's ``proximal`` (A-3PO / AReaL ``prox_logp_method``;
docs/old_logits.md, Proposition 1), built per minibatch from π_infer and the detached π_θ."""


@dataclasses.dataclass(frozen=True)
class PolicyLoss:
    """One LLM policy loss and what it needs.

    Attributes:
      name: the ``RLConfig.loss`` value.
      fn: ``fn(logp, batch, *, config, proximal) -> (token_sum, token_count, metrics)``:
        ``logp`` = log π_θ ``[B, T]`` of ``batch`` (a :class:`fresh_rl.llm.trainer.Batch`),
        ``config`` the :class:`~fresh_rl.llm.trainer.RLConfig`, ``proximal`` the route's
        proxy (``None`` unless ``accepts_proximal``). Pure, jittable.
      reads_old_logprobs: the loss reads ``batch.old_logprobs`` (a route's or the
        synchronous trainer's fp32 forward); without it a route's work is wasted.
      accepts_proximal: a route's per-minibatch interpolation proxy may stand in for the old
        log-probs.
      accepts_clip_centre: the loss has a mask on r_d and a clip on r_s and reads the clip
        centre from ``batch.clip_logprobs`` when set, so a factorial route (``splits_clip``)
        can feed the two from different old log-probs.
      realign: ``realign(batch, config) -> (batch, metrics)``, run once per batch before its
        epochs and minibatches (``None``: none).
      splits_by_rows: the token sums of a minibatch's row parts add up to the minibatch's, so
        ``RLConfig.grad_accumulation_steps`` > 1 is exact. VACO's filter reads a statistic of
        the whole minibatch (D̂), so it does not.
    """

    name: str
    fn: Callable[..., tuple]
    reads_old_logprobs: bool = True
    accepts_proximal: bool = False
    accepts_clip_centre: bool = False
    realign: Optional[Callable[[Any, Any], tuple]] = None
    splits_by_rows: bool = True

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"PolicyLoss.name must be a non-empty string, got {self.name!r}")
        if not callable(self.fn) or not (self.realign is None or callable(self.realign)):
            raise ValueError(f"PolicyLoss {self.name!r}: fn and realign must be callable")


LOSSES: dict[str, PolicyLoss] = {}


def register_loss(loss: PolicyLoss, *, replace: bool = False) -> PolicyLoss:
    """Add ``loss`` to :data:`LOSSES` (``ValueError`` if the name is taken, unless ``replace``)."""
    return register_entry(LOSSES, loss, PolicyLoss, "LLM policy loss", replace=replace)


def unregister_loss(name: str) -> None:
    """Remove a loss from :data:`LOSSES` (no error if absent)."""
    LOSSES.pop(name, None)


def get_loss(name: str) -> PolicyLoss:
    """The registered loss ``name`` (``ValueError`` naming ``RLConfig.loss`` and the losses)."""
    require_choice("RLConfig.loss", name, tuple(LOSSES))
    return LOSSES[name]


def check_route(loss_name: str, route_name: str) -> None:
    """``ValueError`` naming ``RLConfig.loss`` and ``AsyncConfig.old_logit_route`` when the
    route cannot serve the loss:

    * a loss that reads old log-probs fixed for the whole batch (no ``accepts_proximal``, e.g.
      ``vaco``, whose realignment runs once per batch) with a proxy route, which has none (its
      old log-probs are interpolated per minibatch);
    * a loss that reads no old log-probs (``ppo_clip``) with a route that spends anything on
      them (a forward pass, collection-time scoring, a proxy, θ_ref): the work would change
      nothing. ``behaviour`` (no work) serves every loss;
    * a factorial route (``splits_clip``) with a loss that does not read a separate clip
      centre (``accepts_clip_centre``: only ``decoupled`` has a mask and a clip apart).
    """
    loss, route = get_loss(loss_name), get_route(route_name)
    if route.splits_clip and not loss.accepts_clip_centre:
        raise ValueError(f"AsyncConfig.old_logit_route={route_name!r} centres the clip apart from the mask's old "
                         f"log-probs, which RLConfig.loss={loss_name!r} does not read (losses that do: "
                         f"{', '.join(n for n, e in LOSSES.items() if e.accepts_clip_centre)}); choose another "
                         "route or loss")
    if loss.reads_old_logprobs and route.proximal is not None and not loss.accepts_proximal:
        raise ValueError(
            f"RLConfig.loss={loss.name!r} needs old log-probs fixed for the whole batch, but "
            f"AsyncConfig.old_logit_route={route.name!r} has none (its {route.proximal} proxy "
            f"is built per minibatch); choose a route without a proxy")
    if not loss.reads_old_logprobs and _costs_work(route):
        raise ValueError(
            f"RLConfig.loss={loss.name!r} reads no old log-probs, so "
            f"AsyncConfig.old_logit_route={route.name!r} would compute them for nothing; use "
            f"old_logit_route='behaviour' or a loss that reads them "
            f"({', '.join(n for n, entry in LOSSES.items() if entry.reads_old_logprobs)})")


def _costs_work(route: OldLogProbRoute) -> bool:
    return bool(route.extra_forward or route.collection_time or route.proximal is not None
                or route.uses_ewma)


# --------------------------------------------------------------------------- the losses


def _ppo_clip(logp, batch, *, config, proximal):
    del proximal
    total, count, metrics = ppo_clip_loss_sum(logp, batch.behaviour_log_probs, batch.advantages,
                                              batch.action_mask, config=config.clip)
    return total, count, dict(metrics, active_token_fraction=metrics["active_fraction"])


def _decoupled(logp, batch, *, config, proximal):
    old = batch.old_logprobs
    if proximal is not None:
        old = PROXIMAL_PROXIES[proximal](batch.behaviour_log_probs, logp, batch.proxy_alpha)
    return decoupled_ppo_loss_sum(logp, old, batch.behaviour_log_probs, batch.advantages,
                                  batch.action_mask, config=config.decoupled, clip_log_probs=batch.clip_logprobs)


def _vaco(logp, batch, *, config, proximal):
    del proximal  # refused by check_route / update
    loss, metrics = vaco_policy_loss(logp, batch.old_logprobs, batch.behaviour_log_probs,
                                     batch.advantages, batch.action_mask, config=config.vaco)
    count = valid_count(batch.action_mask)  # VACO normalises by the valid tokens
    return (loss * jnp.maximum(count, 1.0), count,
            dict(metrics, active_token_fraction=metrics["active_fraction"],
                 clip_fraction=jnp.zeros((), jnp.float32)))


def vaco_realign(batch, config):
    """VACO's once-per-batch advantage realignment without a critic (module docstring):
    ``Â'_t = min(ρ̄, π_ref/π_infer) · Â_t`` on the action tokens, as V-trace's IMPALA advantage
    (:func:`~fresh_rl.corrections.vtrace`) with V ≡ 0, γ = 0 and the per-token advantage as
    the reward; π_ref = ``batch.old_logprobs`` (``RLConfig.vaco.reference = "behaviour"``: π_infer,
    so the weight is 1). Returns ``(batch, metrics)``: ``realign_weight_mean`` (mean ρ_t) and
    ``realign_truncated_fraction`` (tokens with π_ref/π_infer > ρ̄)."""
    mask = batch.action_mask
    reference = (batch.old_logprobs if config.vaco.reference == "learner_start"
                 else batch.behaviour_log_probs)
    log_rhos = jnp.where(mask, reference - batch.behaviour_log_probs, 0.0)
    zeros = jnp.zeros_like(batch.advantages)
    out = vtrace(zeros, zeros, batch.advantages, zeros, log_rhos,
                 config=VTraceConfig(rho_bar=config.vaco_rho_bar), sample_mask=mask)
    metrics = {"realign_weight_mean": masked_mean(out.clipped_rhos, mask),
               "realign_truncated_fraction": fraction(jnp.exp(log_rhos) > config.vaco_rho_bar,
                                                      mask)}
    return batch.replace(advantages=out.impala_advantages), metrics


for _loss in (PolicyLoss("ppo_clip", _ppo_clip, reads_old_logprobs=False),
              PolicyLoss("decoupled", _decoupled, accepts_proximal=True, accepts_clip_centre=True),
              PolicyLoss("vaco", _vaco, realign=vaco_realign, splits_by_rows=False)):
    register_loss(_loss)
del _loss

BUILTIN_LOSSES: tuple[str, ...] = tuple(LOSSES)
"""The losses above, in registration order."""


__all__ = ["BUILTIN_LOSSES", "LOSSES", "PROXIMAL_PROXIES", "PolicyLoss", "check_route",
           "get_loss", "register_loss", "unregister_loss", "vaco_realign"]
