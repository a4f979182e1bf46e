"""Registry of the control trainer's methods: what differs between PPO-clip, VACO, IMPALA, ….

A :class:`Method` says how a batch's advantages and value targets are made, how minibatches
are cut, which log-probability the ratio is taken against, the default advantage
normalisation and the policy loss. :func:`fresh_rl.control.train.train` reads only these
fields, so a new method is one :func:`register_method` call.

**Reference policies (our choices).**
  * ppo_clip / ppo_kl / spo: ratio ``π_θ/β`` with the stored behaviour log-prob, what a naive
    asynchronous PPO does (VACO, arXiv 2603.01365; docs/vaco.md, "behaviour" reference); at lag 0 β = π_T.
  * vaco / vaco_filter_only: ``VACOConfig.reference`` (default π_T, forward lag only).
  * vaco_align_only: VACO's loss with the TV filter off (δ = ∞): unclipped ``−mean r Â`` with
    r = π_θ/π_T and realigned Â, the literal ablation with no trust region at all.
  * vaco_filter_only: GAE advantages on V_T (no importance correction), VACO's filtered loss.
  * impala: minibatches are whole env rows; V-trace (log ρ = log π_θ − log β, detached) and
    V_θ are recomputed with the current parameters at every step (IMPALA, arXiv 1802.01561 §4).

**Advantage normalisation** defaults: ``"scale"`` (Â/std, no centring) when the ratio's
reference is not β, ``"standardize"`` otherwise: subtracting c from Â adds ``c·mean(r)`` to
the loss, whose expected gradient vanishes only when E_β[r] = 1, i.e. r = π_θ/β.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax

from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.corrections import impala_policy_gradient_loss, ppo_clip_loss, ppo_kl_loss, spo_loss, vaco_policy_loss
from fresh_rl.validation import require_choice

ADVANTAGE_SOURCES: tuple[str, ...] = ("gae", "vtrace", "vtrace_per_step")
REFERENCES: tuple[str, ...] = ("behaviour", "learner_start")
ADVANTAGE_NORMALIZATIONS: tuple[str, ...] = ("standardize", "scale", "none")
MINIBATCH_LAYOUTS: tuple[str, ...] = ("samples", "env_rows")
SHARED_HYPERPARAMS: tuple[str, ...] = ("lag", "learning_rate", "entropy_coef", "value_coef", "gamma")
"""The :class:`~fresh_rl.control.hyperparams.HyperParams` leaves every method reads (``lag``
only with ``delay.kind="fixed"``)."""

PolicyLoss = Callable[[jax.Array, dict, Any, Any], tuple[jax.Array, dict]]


@dataclasses.dataclass(frozen=True)
class Method:
    """One training method of :func:`fresh_rl.control.train.train`.

    Attributes:
      name: the ``TrainConfig.method`` string.
      policy_loss: ``policy_loss(logp, mb, hparams, config) -> (loss, metrics)``. ``logp`` =
        log π_θ(a|s) of the minibatch ``mb``, a dict of equally shaped arrays with
        ``advantage`` (normalised), ``reference_log_prob`` (see ``reference``),
        ``behaviour_log_prob`` (log β) and ``learner_log_prob`` (log π_T); ``hparams`` is the
        :class:`~fresh_rl.control.hyperparams.HyperParams` with ``kl_coef`` = the current β;
        ``config`` the static ``TrainConfig``. A loss reporting a ``kl_penalty`` metric gets
        its β adapted when ``config.kl_adaptive`` is set.
      advantages: ``"gae"`` — GAE(λ) on V_T, frozen per batch; ``"vtrace"`` — V-trace with
        log ρ = log π_T − log β on V_T, frozen per batch (form: ``config.vaco_advantage``);
        ``"vtrace_per_step"`` — V-trace with log ρ = log π_θ − log β and V_θ recomputed for
        every minibatch (needs ``minibatch_layout="env_rows"``).
      reference: ``"behaviour"`` (β) or ``"learner_start"`` (π_T): what ``reference_log_prob``
        holds.
      default_normalization: advantage normalisation when ``config.advantage_normalization``
        is ``None``: ``"standardize"``, ``"scale"`` or ``"none"``.
      minibatch_layout: ``"samples"`` (shuffle all N·T samples) or ``"env_rows"`` (shuffle
        whole env rows ``[N/M, T]``; ``num_minibatches`` must divide ``num_envs``).
      loss_hyperparams: the HyperParams leaves ``policy_loss`` reads, beyond
        :data:`SHARED_HYPERPARAMS` (e.g. ``("vaco_delta",)``); a sweep over any other leaf
        would not change the run (``fresh-rl sweep`` refuses it).
    """

    name: str
    policy_loss: PolicyLoss
    advantages: str = "gae"
    reference: str = "behaviour"
    default_normalization: str = "standardize"
    minibatch_layout: str = "samples"
    loss_hyperparams: tuple[str, ...] = ()

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Method.name must be a non-empty string, got {self.name!r}")
        if not callable(self.policy_loss):
            raise ValueError(f"Method.policy_loss must be callable, got {self.policy_loss!r}")
        require_choice("Method.advantages", self.advantages, ADVANTAGE_SOURCES)
        require_choice("Method.reference", self.reference, REFERENCES)
        require_choice("Method.default_normalization", self.default_normalization, ADVANTAGE_NORMALIZATIONS)
        require_choice("Method.minibatch_layout", self.minibatch_layout, MINIBATCH_LAYOUTS)
        for name in self.loss_hyperparams:
            require_choice("every entry of Method.loss_hyperparams", name, HyperParams.field_names())
        if self.advantages == "vtrace_per_step" and self.minibatch_layout != "env_rows":
            raise ValueError("Method.minibatch_layout must be 'env_rows' for advantages='vtrace_per_step' "
                             f"(V-trace runs along whole rows), got {self.minibatch_layout!r}")

    @property
    def hyperparams(self) -> tuple[str, ...]:
        """Every HyperParams leaf a run of this method reads."""
        return SHARED_HYPERPARAMS + tuple(self.loss_hyperparams)


METHODS: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Add ``method`` to :data:`METHODS` (``ValueError`` if the name is taken); returns it."""
    if not isinstance(method, Method):
        raise ValueError(f"register_method takes a Method, got {method!r}")
    if method.name in METHODS:
        raise ValueError(f"method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def _ppo_clip(logp, mb, hparams, config):
    return ppo_clip_loss(logp, mb["reference_log_prob"], mb["advantage"], config=config.ppo_clip)


def _ppo_kl(logp, mb, hparams, config):
    return ppo_kl_loss(logp, mb["reference_log_prob"], mb["advantage"], kl_coef=hparams.kl_coef,
                       config=config.ppo_kl)


def _spo(logp, mb, hparams, config):
    return spo_loss(logp, mb["reference_log_prob"], mb["advantage"], config=config.spo)


def _impala(logp, mb, hparams, config):
    return impala_policy_gradient_loss(logp, mb["reference_log_prob"], mb["advantage"])


def _vaco(logp, mb, hparams, config):
    return vaco_policy_loss(logp, mb["learner_log_prob"], mb["behaviour_log_prob"], mb["advantage"],
                            config=config.vaco, delta=hparams.vaco_delta)


def _vaco_unfiltered(logp, mb, hparams, config):
    return vaco_policy_loss(logp, mb["learner_log_prob"], mb["behaviour_log_prob"], mb["advantage"],
                            config=config.vaco, delta=math.inf)


for _method in (
    Method("ppo_clip", _ppo_clip),
    Method("ppo_kl", _ppo_kl, loss_hyperparams=("kl_coef",)),
    Method("spo", _spo),
    Method("impala", _impala, advantages="vtrace_per_step", minibatch_layout="env_rows"),
    Method("vaco", _vaco, advantages="vtrace", reference="learner_start", default_normalization="scale",
           loss_hyperparams=("vaco_delta",)),
    Method("vaco_align_only", _vaco_unfiltered, advantages="vtrace", reference="learner_start",
           default_normalization="scale"),
    Method("vaco_filter_only", _vaco, reference="learner_start", default_normalization="scale",
           loss_hyperparams=("vaco_delta",)),
):
    register_method(_method)
