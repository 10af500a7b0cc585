"""PATE's labelling runs as privacy events, debited to a shared budget session before they run.

A configuration's *planned* event is data-independent: it depends on the aggregator, its noise and the
number of public inputs the student will ask about, never on the votes, so it can be charged before any
teacher is trained (:func:`estimator.accounting.ledger.debit_before_run`, kind ``pate``).

* GNMax with σ: each query is the Gaussian mechanism on a vote histogram of L2 sensitivity √2
  (:mod:`estimator.pate.accounting`), i.e. ``GaussianEvent(σ/√2)`` (noise multiplier relative to
  sensitivity 1); ``queries`` of them.
* Confident-GNMax (T, σ₁, σ₂): the threshold check on every query (the top count has sensitivity 1:
  ``GaussianEvent(σ₁)``) and, planned as the worst case, the GNMax answer on every query as well
  (``GaussianEvent(σ₂/√2)``): which queries pass the check depends on the data, so the debit assumes
  they all do. The data-dependent ε is never what is charged.
* LNMax with Laplace scale b: report-noisy-max with per-count sensitivity 1 is (2/b)-DP per query,
  ``PureDPEvent(2/b)``.

The configurations of one study reuse the same teachers, hence the same sensitive records: their
events compose (:class:`~ldp_core.privacy_events.ComposedEvent`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Protocol

from ldp_core.privacy_events import (
    ComposedEvent,
    GaussianEvent,
    PrivacyEvent,
    PureDPEvent,
    SelfComposedEvent,
)


class Config(Protocol):
    """What an event needs of :class:`estimator.pate.experiment.Config` (not imported: no circle)."""

    @property
    def kind(self) -> str: ...
    @property
    def sigma(self) -> float: ...
    @property
    def queries(self) -> int: ...
    @property
    def sigma1(self) -> float | None: ...


__all__ = ["config_event", "planned_event", "BUDGET_KIND", "WITHHELD"]

#: the kind of query a PATE run is debited as
BUDGET_KIND = "pate"

#: the result keys a debited run leaves out (None): figures computed from the sensitive data without noise
#: (the teachers' sizes and accuracies, the noise-free ensemble, the non-private model, the raw
#: data-dependent ε) and the DP-SGD comparison (a second training on the sensitive data whose noise is
#: chosen from the labelling results), none of which the debit pays for
WITHHELD = (
    "teacher_sizes",
    "teacher_accuracy_mean",
    "ensemble_accuracy",
    "non_private_accuracy",
    "epsilon_data_dependent",
    "dpsgd_same_epsilon",
)


def config_event(cfg: Config) -> PrivacyEvent:
    """The data-independent event of ``cfg``'s planned queries (module docstring)."""
    q = int(cfg.queries)
    if cfg.kind == "lnmax":
        return SelfComposedEvent(PureDPEvent(2.0 / cfg.sigma), q)
    answer = SelfComposedEvent(GaussianEvent(cfg.sigma / math.sqrt(2.0)), q)
    if cfg.kind == "gnmax":
        return answer
    if cfg.kind == "confident" and cfg.sigma1 is not None:
        return ComposedEvent((SelfComposedEvent(GaussianEvent(cfg.sigma1), q), answer))
    raise ValueError(f"no privacy event for the PATE setting {cfg!r}")


def planned_event(configs: Iterable[Config]) -> PrivacyEvent:
    """Every configuration's planned queries on the same teachers, composed."""
    events = tuple(config_event(c) for c in configs)
    if not events:
        raise ValueError("a PATE run with no configuration asks nothing: there is nothing to debit")
    return events[0] if len(events) == 1 else ComposedEvent(events)
