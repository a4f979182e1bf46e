"""Registry of the control trainer's data sources: where the batches of the updates come from.

Every source rolls out ``num_envs`` actors for T steps per iteration, each actor group acting
with the version its lag draw picks (``TrainConfig.delay``: fixed, uniform, geometric or a
mixture of lags; lag 0 is on-policy acting). What differs is what the updates see:

* ``lagged_actors`` — the fresh batch only: ``passes × minibatches`` updates per iteration.
* ``replay_uniform``, ``replay_per``, ``replay_per_authors``, ``replay_freshper`` — the same
  fresh updates, then each env row of the batch (T steps) is one item of a trajectory buffer
  holding ``ReplaySettings.buffer_iterations`` iterations of data, and K =
  ``ReplaySettings.extra_updates`` more full-batch updates follow, each on N rows sampled from
  it (FreshPER, arXiv 2604.16918 §3; PER, arXiv 1511.05952): uniform; PER on the given base
  priorities (τ = ∞); PER as the FreshPER authors run it (new items at the running max priority,
  sampled items refreshed); the age-decayed priorities p·exp(−age/τ).

The replay entries differ only in the defaults of the traced replay leaves of
:class:`~fresh_rl.control.hyperparams.HyperParams` (:class:`fresh_rl.replay.methods.ReplayHParams`:
what the K extra updates are, priority rule, τ, IS exponent, replay optimiser), so every
replay method of a study, on-policy and matched-epoch controls included, is a row of one
compiled program.

**Replay updates (our choices where FreshPER, an LLM method without a critic, is silent).**
An item is one env row of T steps with its acting log-probs, clean log-probs and version. Its
base priority is the row's mean |Â| of the fresh update (``priority="advantage"``, PER's TD
error magnitude) or |Σ_t r_t| (``"return"``, the authors' REINFORCE++ choice). A replayed row's
advantages and value targets are recomputed with V-trace under the current θ (log ρ = log π_θ −
log β, detached), in the method's advantage form; its old log-probs come from the run's route
(see :mod:`fresh_rl.control.old_log_probs`); the PER weight w_i multiplies the row's normalised
advantages and its value loss. The ``"epochs"`` kind (the matched-update control) repeats
full-batch updates on the fresh batch with its batch-start targets.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

from fresh_rl.replay.methods import REPLAY_METHODS
from fresh_rl.validation import register_entry, require_choice, require_in_range, require_int

PRIORITY_SOURCES: tuple[str, ...] = ("advantage", "return")
WEIGHT_NORMALIZATIONS: tuple[str, ...] = ("buffer", "batch")
DEFAULT_AGE_DECAY_TAU: float = 500.0
"""τ of ``replay_freshper`` in iterations (policy versions): the FreshPER authors' default
(arXiv 2604.16918, README: 500; FrozenLake 1000); a study sets it from the measured drift."""


@dataclasses.dataclass(frozen=True)
class ReplaySettings:
    """Static settings of the replay sources (ignored by ``lagged_actors``).

    Attributes:
      extra_updates: K, full-batch updates after the fresh ones, each on N sampled rows.
      buffer_iterations: H, iterations of data the FIFO buffer holds (capacity N·H rows).
      priority: base priority, ``"advantage"`` (mean |Â| of the row) or ``"return"`` (|Σ r|).
      priority_exponent: PER's α ∈ [0, 1].
      importance_exponent: PER's β ∈ [0, 1] of the sources with IS weights.
      age_decay_tau: τ > 0 of ``replay_freshper``, in iterations (:data:`DEFAULT_AGE_DECAY_TAU`).
      min_decayed_priority: floor of the decayed priority (the authors' 1e-8), ≥ 0.
      importance_weight_normalization: IS weights divided by their ``"buffer"``-wide or
        ``"batch"`` maximum.
      drift_every: every ``drift_every`` iterations the learner scores every stored row:
        ``drift/ess`` and ``drift/kl`` by age (0 = off; else a divisor of the iterations).
    """

    extra_updates: int = 2
    buffer_iterations: int = 256
    priority: str = "advantage"
    priority_exponent: float = 0.6
    importance_exponent: float = 0.4
    age_decay_tau: float = DEFAULT_AGE_DECAY_TAU
    min_decayed_priority: float = 1e-8
    importance_weight_normalization: str = "buffer"
    drift_every: int = 0

    def __post_init__(self):
        require_int("ReplaySettings.extra_updates", self.extra_updates, 0)
        require_int("ReplaySettings.buffer_iterations", self.buffer_iterations, 1)
        require_int("ReplaySettings.drift_every", self.drift_every, 0)
        require_choice("ReplaySettings.priority", self.priority, PRIORITY_SOURCES)
        require_choice("ReplaySettings.importance_weight_normalization",
                       self.importance_weight_normalization, WEIGHT_NORMALIZATIONS)
        for name in ("priority_exponent", "importance_exponent"):
            require_in_range(f"ReplaySettings.{name}", getattr(self, name), 0.0, 1.0)
        require_in_range("ReplaySettings.age_decay_tau", self.age_decay_tau, 0.0, math.inf,
                         low_inclusive=False)
        require_in_range("ReplaySettings.min_decayed_priority", self.min_decayed_priority, 0.0, math.inf,
                         high_inclusive=False)


@dataclasses.dataclass(frozen=True)
class DataSource:
    """One data source of :func:`fresh_rl.control.train.train`.

    Attributes:
      name: the ``TrainConfig.data_source`` value.
      replay_method: ``None`` (no buffer) or the :data:`fresh_rl.replay.methods.REPLAY_METHODS`
        entry whose settings are the defaults of the traced replay leaves.
      description: one line for the docs' table.
    """

    name: str
    replay_method: Optional[str] = None
    description: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"DataSource.name must be a non-empty string, got {self.name!r}")
        if self.replay_method is not None:
            require_choice("DataSource.replay_method", self.replay_method, tuple(REPLAY_METHODS))

    @property
    def buffered(self) -> bool:
        """Whether the source keeps a replay buffer."""
        return self.replay_method is not None


DATA_SOURCES: dict[str, DataSource] = {}


def register_data_source(source: DataSource) -> DataSource:
    """Add ``source`` to :data:`DATA_SOURCES` (``ValueError`` if the name is taken); returns it."""
    return register_entry(DATA_SOURCES, source, DataSource, "data source")


for _source in (
        DataSource("lagged_actors", description="the fresh batch of the (lagged) actors only"),
        DataSource("replay_uniform", "uniform", "fresh updates + K updates on uniformly replayed rows"),
        DataSource("replay_per", "per_given", "fresh updates + K PER updates on the given priorities"),
        DataSource("replay_per_authors", "per_authors",
                   "fresh updates + K PER updates, new rows at max priority, sampled rows refreshed"),
        DataSource("replay_freshper", "freshper_1",
                   "fresh updates + K updates on age-decayed priorities p·exp(−age/τ)"),
        DataSource("replay_freshper_authors", "freshper_authors",
                   "replay_per_authors' pipeline + the age decay p·exp(−age/τ) (FreshPER as its "
                   "authors run it)")):
    register_data_source(_source)
del _source

def data_source_table_markdown() -> str:
    """One row per registered data source (docs/control.md): name, buffer, default replay method,
    description."""
    lines = ["| data source | buffer | replay method (defaults of the traced leaves) | what the updates see |",
             "|---|---|---|---|"]
    lines += [f"| `{s.name}` | {'yes' if s.buffered else 'no'} | {f'`{s.replay_method}`' if s.buffered else '—'} | "
              f"{s.description} |" for s in DATA_SOURCES.values()]
    return "\n".join(lines)


__all__ = ["DATA_SOURCES", "DEFAULT_AGE_DECAY_TAU", "DataSource", "PRIORITY_SOURCES", "ReplaySettings",
           "WEIGHT_NORMALIZATIONS", "data_source_table_markdown", "register_data_source"]
