"""Registry of the control trainer's methods: what differs between PPO-clip, VACO, IMPALA, ….

A :class:`Method` says how a batch's advantages and value targets are made, how minibatches
are cut, which log-probability the ratio is taken against, the default advantage
normalisation and the policy loss. :func:`fresh_rl.control.train.train` reads only these
fields, so a new method is one :func:`register_method` call.

**Reference policies.** The ratio's reference is the run's old-log-prob route
(:mod:`fresh_rl.corrections.routes`, ``TrainConfig.route``); ``Method.default_route`` is the
route a method runs with when the config names none (our choices):
  * ppo_clip / ppo_kl / spo: ``behaviour``, ratio ``π_θ/β`` with the stored behaviour log-prob,
    what a naive asynchronous PPO does (VACO, arXiv 2603.01365; docs/vaco.md); at lag 0 β = π_T.
  * vaco / vaco_tv / vaco_l1 / vaco_filter_only: ``recompute_current``, π_T (forward lag only),
    passed to the loss as its π_T (``VACOConfig.reference="behaviour"`` still picks β).
    ``vaco_tv`` and ``vaco_l1`` fix the δ convention (filter when D̂ > δ, resp.
    mean|r − 1| > δ); ``vaco`` reads ``VACOConfig.threshold_convention`` (default ``"tv"``, so
    ``vaco`` ≡ ``vaco_tv``; kept for saved results).
  * vaco_align_only: VACO's loss with the TV filter off (δ = ∞): unclipped ``−mean r Â`` with
    r = π_θ/π_T and realigned Â, the literal ablation with no trust region at all.
  * vaco_filter_only: GAE advantages on V_T (no importance correction), VACO's filtered loss.
  * decoupled_ppo: ``snapshot`` (exact old log-probs); the decoupled loss of arXiv 2605.12070:
    MIS keep-mask on r_d = π_old/β (+ optional TIS weight), PPO clip on r_s = π_θ/π_old
    (:func:`fresh_rl.corrections.decoupled_ppo_loss`; ``TrainConfig.decoupled_mis``, ``tis_cap``).
  * impala: ``behaviour``; minibatches are whole env rows; V-trace (log ρ = log π_θ − log β, detached) and
    V_θ are recomputed with the current parameters at every step, one pass over each batch
    (IMPALA, arXiv 1802.01561 §4: every sample is used by one SGD step).

**Passes.** One pass = one epoch over the batch = ``num_minibatches`` SGD steps, each sample
used once. ``Method.passes_per_batch`` is the method's default (``None`` = ``num_epochs``);
``TrainConfig.passes_per_batch`` overrides it for any method.

**Advantage normalisation** (per minibatch, σ = std Â): ``"standardize"`` (Â − mean Â)/σ,
``"scale"`` Â/σ, ``"none"``, and ``"centered_ratio"`` (Â − c·b)/σ with the unbiased baseline
weight b of :func:`centring_weight`. Why centring needs b: a loss linear in Â has per-sample
gradient −Â·w·∇log π_θ(a|s), with w = π_θ/π_ref for ratio losses (``loss_form="ratio"``) and
w = 1 for −Â·log π_θ (``loss_form="log_prob"``). Replacing Â by Â − c·b adds c·b·w·∇log π_θ,
and over actions a ~ β (the data)

    E_β[b·w·∇log π_θ] = Σ_a β(a)·b(a)·w(a)·∇π_θ(a)/π_θ(a),

which vanishes for every θ when b·w = π_θ/β: then it is Σ_a ∇π_θ(a) = ∇ Σ_a π_θ(a) = ∇1 = 0.
So b = π_θ/(β·w): b = 1 for a ratio against β (plain centring is unbiased), b = π_T/β for a
ratio against π_T, b = π_θ/β for IMPALA's −Â·log π_θ; with b = 1 in the last two cases the
term is c·E_β[w·∇log π_θ] ≠ 0 once π_θ ≠ β. Defaults: ``"standardize"`` where b ≡ 1
(ppo_clip, ppo_kl, spo), ``"scale"`` elsewhere. The identity holds where the loss is
unclipped; a clip or filter that zeroes a sample's gradient drops its baseline term too, as it
does for plain centring.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Optional

import chex
import jax
import jax.numpy as jnp

from fresh_rl.control.hyperparams import HyperParams
from fresh_rl.corrections import (decoupled_ppo_loss, impala_policy_gradient_loss, ppo_clip_loss, ppo_kl_loss,
                                  spo_loss, vaco_policy_loss)
from fresh_rl.corrections.routes import ROUTES
from fresh_rl.validation import register_entry, require_choice, require_int

ADVANTAGE_SOURCES: tuple[str, ...] = ("gae", "vtrace", "vtrace_per_step")
ADVANTAGE_NORMALIZATIONS: tuple[str, ...] = ("standardize", "scale", "none", "centered_ratio")
MINIBATCH_LAYOUTS: tuple[str, ...] = ("samples", "env_rows")
LOSS_FORMS: tuple[str, ...] = ("ratio", "log_prob")
THRESHOLD_CONVENTIONS: tuple[str, ...] = ("tv", "l1")
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
        ``advantage`` (normalised), ``reference_log_prob`` (the route's old log-probs),
        ``behaviour_log_prob`` (log β) and ``learner_log_prob`` (log π_T); ``hparams`` is the
        :class:`~fresh_rl.control.hyperparams.HyperParams` with ``kl_coef`` = the current β;
        ``config`` the static ``TrainConfig``. A loss reporting a ``kl_penalty`` metric gets
        its β adapted when ``config.kl_adaptive`` is set.
      advantages: ``"gae"`` — GAE(λ) on V_T, frozen per batch; ``"vtrace"`` — V-trace with
        log ρ = log π_T − log β on V_T, frozen per batch (form: ``config.vaco_advantage``);
        ``"vtrace_per_step"`` — V-trace with log ρ = log π_θ − log β and V_θ recomputed for
        every minibatch (needs ``minibatch_layout="env_rows"``).
      default_route: the old-log-prob route (:data:`fresh_rl.corrections.routes.ROUTES`) that
        fills ``reference_log_prob`` when ``TrainConfig.route`` is ``None``.
      default_normalization: advantage normalisation when ``config.advantage_normalization``
        is ``None``: one of :data:`ADVANTAGE_NORMALIZATIONS` (see the module docstring).
      loss_form: how ``policy_loss`` depends on log π_θ, which sets the unbiased centring weight
        of ``"centered_ratio"`` (:func:`centring_weight`): ``"ratio"`` — a function of
        r·Â with r = π_θ/π_ref (π_ref = the route's old log-probs); ``"log_prob"`` — −Â·log π_θ.
      passes_per_batch: the method's passes (epochs) over each batch, one pass =
        ``num_minibatches`` SGD steps; ``None`` = ``config.num_epochs``. Overridden by
        ``config.passes_per_batch``.
      threshold_convention: VACO's δ convention fixed by this method (``"tv"`` or ``"l1"``, see
        :class:`~fresh_rl.corrections.VACOConfig`), replacing ``config.vaco.threshold_convention``;
        ``None`` = read the config.
      minibatch_layout: ``"samples"`` (shuffle all N·T samples) or ``"env_rows"`` (shuffle
        whole env rows ``[N/M, T]``; ``num_minibatches`` must divide ``num_envs``).
      loss_hyperparams: the HyperParams leaves ``policy_loss`` reads, beyond
        :data:`SHARED_HYPERPARAMS` (e.g. ``("vaco_delta",)``); a sweep over any other leaf
        would not change the run (``fresh-rl sweep`` refuses it).
      loss_config: the static ``TrainConfig`` fields ``policy_loss`` reads (e.g. ``("ppo_clip",)``),
        listed by :func:`method_table`.
    """

    name: str
    policy_loss: PolicyLoss
    advantages: str = "gae"
    default_route: str = "behaviour"
    default_normalization: str = "standardize"
    minibatch_layout: str = "samples"
    loss_hyperparams: tuple[str, ...] = ()
    loss_config: tuple[str, ...] = ()
    loss_form: str = "ratio"
    passes_per_batch: Optional[int] = None
    threshold_convention: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Method.name must be a non-empty string, got {self.name!r}")
        if not callable(self.policy_loss):
            raise ValueError(f"Method.policy_loss must be callable, got {self.policy_loss!r}")
        require_choice("Method.advantages", self.advantages, ADVANTAGE_SOURCES)
        require_choice("Method.default_route", self.default_route, tuple(ROUTES))
        require_choice("Method.default_normalization", self.default_normalization, ADVANTAGE_NORMALIZATIONS)
        require_choice("Method.minibatch_layout", self.minibatch_layout, MINIBATCH_LAYOUTS)
        require_choice("Method.loss_form", self.loss_form, LOSS_FORMS)
        if not all(isinstance(name, str) and name for name in self.loss_config):
            raise ValueError(f"Method.loss_config must hold TrainConfig field names, got {self.loss_config!r}")
        if self.passes_per_batch is not None:
            require_int("Method.passes_per_batch", self.passes_per_batch, 1)
        if self.threshold_convention is not None:
            require_choice("Method.threshold_convention", self.threshold_convention, THRESHOLD_CONVENTIONS)
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
    return register_entry(METHODS, method, Method, "method")


def _ppo_clip(logp, mb, hparams, config):
    return ppo_clip_loss(logp, mb["reference_log_prob"], mb["advantage"], config=config.ppo_clip)


def _ppo_kl(logp, mb, hparams, config):
    return ppo_kl_loss(logp, mb["reference_log_prob"], mb["advantage"], kl_coef=hparams.kl_coef,
                       config=config.ppo_kl)


def _spo(logp, mb, hparams, config):
    return spo_loss(logp, mb["reference_log_prob"], mb["advantage"], config=config.spo)


def _impala(logp, mb, hparams, config):
    return impala_policy_gradient_loss(logp, mb["reference_log_prob"], mb["advantage"])


def _vaco_config(config):
    """``config.vaco`` with the method's fixed δ convention, if it fixes one."""
    fixed = config.method_spec.threshold_convention
    return config.vaco if fixed is None else dataclasses.replace(config.vaco, threshold_convention=fixed)


def _decoupled_ppo(logp, mb, hparams, config):
    def row(x):  # the loss takes [B, T]: every sample of the minibatch (or replayed rows) as one row
        return x.reshape(1, -1)

    clip = mb.get("clip_log_prob")  # present with a factorial route (mask and clip from two routes)
    loss, metrics = decoupled_ppo_loss(row(logp), row(mb["reference_log_prob"]), row(mb["behaviour_log_prob"]),
                                       row(mb["advantage"]), config=config.decoupled_config,
                                       clip_log_probs=None if clip is None else row(clip))
    return loss, {name: metrics[name] for name in ("loss", "active_token_fraction", "clip_fraction")}


def _vaco(logp, mb, hparams, config, delta=None):
    return vaco_policy_loss(logp, mb["reference_log_prob"], mb["behaviour_log_prob"], mb["advantage"],
                            config=_vaco_config(config), delta=hparams.vaco_delta if delta is None else delta)


_vaco_unfiltered = functools.partial(_vaco, delta=math.inf)


def centring_weight(method: Method, log_prob: jax.Array, reference_log_prob: jax.Array,
                    behaviour_log_prob: jax.Array) -> jax.Array:
    """The unbiased baseline weight b = π_θ/(β·w) of ``"centered_ratio"``, detached.

    ``w`` is the loss's weight on Â·∇log π_θ (module docstring): for ``loss_form="ratio"``
    w = π_θ/π_ref, so b = π_ref/β (``exp(reference_log_prob − behaviour_log_prob)``; 1 when the
    reference is β); for ``"log_prob"`` w = 1, so b = π_θ/β = ``exp(log_prob − behaviour_log_prob)``.
    Then E_β[b·w·∇log π_θ] = Σ_a ∇π_θ(a) = 0, so subtracting c·b from Â adds no bias.
    π_ref is the route's old log-prob: a VACO run with ``VACOConfig.reference="behaviour"``
    (ratio against β, so b should be 1) still gets b = π_ref/β here.
    """
    chex.assert_equal_shape([log_prob, reference_log_prob, behaviour_log_prob])
    numerator = log_prob if method.loss_form == "log_prob" else reference_log_prob
    return jnp.exp(jax.lax.stop_gradient(numerator - behaviour_log_prob))


_VACO = dict(advantages="vtrace", default_route="recompute_current", default_normalization="scale",
             loss_config=("vaco",))

for _method in (
    Method("ppo_clip", _ppo_clip, loss_config=("ppo_clip",)),
    Method("ppo_kl", _ppo_kl, loss_hyperparams=("kl_coef",), loss_config=("ppo_kl", "kl_adaptive")),
    Method("spo", _spo, loss_config=("spo",)),
    Method("impala", _impala, advantages="vtrace_per_step", minibatch_layout="env_rows",
           default_normalization="scale", loss_form="log_prob", passes_per_batch=1),
    Method("vaco", _vaco, **_VACO, loss_hyperparams=("vaco_delta",)),
    Method("vaco_tv", _vaco, **_VACO, loss_hyperparams=("vaco_delta",), threshold_convention="tv"),
    Method("vaco_l1", _vaco, **_VACO, loss_hyperparams=("vaco_delta",), threshold_convention="l1"),
    Method("vaco_align_only", _vaco_unfiltered, **_VACO),
    Method("vaco_filter_only", _vaco, default_route="recompute_current", default_normalization="scale",
           loss_hyperparams=("vaco_delta",), loss_config=("vaco",)),
    Method("decoupled_ppo", _decoupled_ppo, default_route="snapshot",
           loss_config=("ppo_clip", "decoupled_mis", "tis_cap")),
):
    register_method(_method)

_ADVANTAGE_NAMES = {"gae": "GAE(λ) on V_T, per batch", "vtrace": "V-trace on V_T (π_T/β), per batch",
                    "vtrace_per_step": "V-trace on V_θ (π_θ/β), every step"}
METHOD_TABLE_COLUMNS: tuple[str, ...] = ("method", "advantages", "default route", "loss form", "normalisation",
                                         "passes per batch", "minibatch layout", "loss hyperparameters")


def method_table() -> list[dict[str, str]]:
    """One row per registered method (columns :data:`METHOD_TABLE_COLUMNS`, values as text):
    advantage source, default old-log-prob route (the ratio's reference), loss form, default
    normalisation, passes per batch
    (``num_epochs`` when the method has no default), minibatch layout and the loss's
    hyperparameters: traced HyperParams leaves ("traced …"), static TrainConfig fields
    ("config …") and a fixed δ convention."""
    rows = []
    for m in METHODS.values():
        loss_hp = [f"{kind} {', '.join(names)}" for kind, names in
                   (("traced", m.loss_hyperparams), ("config", m.loss_config)) if names]
        if m.threshold_convention is not None:
            loss_hp.append(f"δ convention {m.threshold_convention}")
        rows.append(dict(zip(METHOD_TABLE_COLUMNS, (
            m.name, _ADVANTAGE_NAMES[m.advantages], f"`{m.default_route}`",
            "−Â·log π_θ" if m.loss_form == "log_prob" else "ratio r·Â", m.default_normalization,
            "num_epochs" if m.passes_per_batch is None else str(m.passes_per_batch),
            m.minibatch_layout, "; ".join(loss_hp) or "—"))))
    return rows


def method_table_markdown() -> str:
    """:func:`method_table` as a Markdown table (printed in docs/vaco.md and results READMEs)."""
    lines = ["| " + " | ".join(METHOD_TABLE_COLUMNS) + " |", "|" + "---|" * len(METHOD_TABLE_COLUMNS)]
    lines += ["| " + " | ".join(f"`{v}`" if k == "method" else v for k, v in row.items()) + " |"
              for row in method_table()]
    return "\n".join(lines)
