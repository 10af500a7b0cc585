"""Server-side aggregation of client updates: the interface, FedAvg's weighted
mean, and input validation as a wrapper.

An :class:`Aggregator` turns the round's client uploads (flat vectors, see
:class:`ldp_core.fl.training.ClientUpdate`) into one vector, the aggregate
update Δ̄, plus counters in ``info``. Clipping and noise
(:mod:`estimator.fl.dp`), robust statistics (:mod:`estimator.fl.robust`) and
validation (:class:`ValidatingAggregator`) are *wrappers* around an inner
aggregator (the design of Flower's DP strategy wrappers): each adds one
concern and delegates the rest, so they stack in any order that makes sense.

An aggregator is ``linear`` when its output is Σ wᵢΔᵢ / Σ wᵢ for weights that
do not depend on the updates: only linear aggregators can sit under the DP
wrappers, whose sensitivity argument needs a sum.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import numpy as np

from ldp_core.fl.errors import FLError, UpdateRejected
from ldp_core.fl.training import ClientUpdate, upload_digest

__all__ = [
    "RoundContext",
    "AggregateResult",
    "Aggregator",
    "WeightedMean",
    "ValidatingAggregator",
    "REJECTION_REASONS",
]

#: The reasons :class:`ValidatingAggregator` counts.
REJECTION_REASONS = (
    "wrong_shape",
    "wrong_dtype",
    "non_finite",
    "stale_round",
    "replayed",
    "duplicate_client",
    "bad_weight",
)


@dataclasses.dataclass(frozen=True)
class RoundContext:
    """What an aggregator knows about the round besides the uploads.

    ``expected_clients`` is the number of clients the sampling scheme selects
    in expectation (q·N for Poisson sampling, m for a fixed count): the DP
    wrappers divide by it, never by the realized count, which is itself private
    under Poisson sampling (McMahan et al., "Learning differentially private
    recurrent language models", ICLR 2018, the fixed-denominator estimator).

    ``params`` is the global model the round's clients started from (None where the caller does not
    give it): FLTrust's root update trains from it (:mod:`estimator.fl.fltrust_root`)."""

    round: int
    num_params: int
    rng: np.random.Generator
    expected_clients: float
    params: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.expected_clients > 0:
            raise FLError(f"expected_clients must be > 0, got {self.expected_clients}")


@dataclasses.dataclass(frozen=True)
class AggregateResult:
    """The aggregate update Δ̄ (float64), the total weight it averages over, the
    number of clients it used and counters/figures from every wrapper."""

    delta: np.ndarray
    total_weight: float
    num_clients: int
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


class Aggregator(Protocol):
    """Combines a round's client updates into one update."""

    @property
    def linear(self) -> bool:
        """Whether the output is Σ wᵢΔᵢ / Σ wᵢ with weights independent of the updates."""
        ...

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult: ...


@dataclasses.dataclass
class WeightedMean:
    """FedAvg's aggregate: Σ nᵢΔᵢ / Σ nᵢ with nᵢ the client's example count
    (McMahan et al. 2017), or the plain mean with ``weighting="uniform"``."""

    weighting: Literal["examples", "uniform"] = "examples"
    linear: bool = dataclasses.field(default=True, init=False)

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        if not updates:
            return AggregateResult(np.zeros(ctx.num_params), 0.0, 0, {})
        w = np.array([u.num_examples if self.weighting == "examples" else 1.0 for u in updates], dtype=np.float64)
        total = float(w.sum())
        if total <= 0:
            return AggregateResult(np.zeros(ctx.num_params), 0.0, 0, {})
        stack = np.stack([np.asarray(u.delta, dtype=np.float64) for u in updates])
        return AggregateResult(w @ stack / total, total, len(updates), {})


@dataclasses.dataclass
class ValidatingAggregator:
    """Rejects and counts bad uploads, then delegates the rest to ``inner``.

    Refused: a vector whose shape is not (num_params,) or whose dtype is not a
    float; NaN or ±inf values; an update for another round than the current
    one (stale); an ``upload_id`` already seen in any round, or one that does
    not match the content (a replayed or tampered upload); a second upload from
    the same client in a round; a negative or non-integer example count.
    ``rejected`` counts every refusal by reason over the aggregator's life.
    The id binds the round, so only the current round's ids need keeping: an
    old upload is stale, and one with its round rewritten no longer matches its id."""

    inner: Aggregator
    rejected: Counter = dataclasses.field(default_factory=Counter)
    _seen: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def linear(self) -> bool:
        return self.inner.linear

    def check(self, u: ClientUpdate, ctx: RoundContext, clients: set[str]) -> None:
        """Raise :class:`UpdateRejected` if ``u`` must be refused."""
        d = np.asarray(u.delta)
        if d.shape != (ctx.num_params,):
            raise UpdateRejected(
                "wrong_shape", f"update of {u.client_id}: shape {d.shape}, expected ({ctx.num_params},)"
            )
        if d.dtype.kind != "f":
            raise UpdateRejected("wrong_dtype", f"update of {u.client_id}: dtype {d.dtype}, expected a float vector")
        if not np.isfinite(d).all():
            raise UpdateRejected("non_finite", f"update of {u.client_id} holds NaN or infinite values")
        if u.round != ctx.round:
            raise UpdateRejected(
                "stale_round", f"update of {u.client_id} is for round {u.round}, current is {ctx.round}"
            )
        if isinstance(u.num_examples, bool) or not isinstance(u.num_examples, (int, np.integer)) or u.num_examples < 0:
            raise UpdateRejected("bad_weight", f"update of {u.client_id}: num_examples {u.num_examples!r}")
        if u.upload_id in self._seen.get(ctx.round, ()) or u.upload_id != upload_digest(u.client_id, u.round, d):
            raise UpdateRejected(
                "replayed", f"upload {u.upload_id} of {u.client_id} was already received or does not match its content"
            )
        if u.client_id in clients:
            raise UpdateRejected("duplicate_client", f"{u.client_id} already uploaded in round {ctx.round}")

    def aggregate(self, updates: Sequence[ClientUpdate], ctx: RoundContext) -> AggregateResult:
        accepted: list[ClientUpdate] = []
        clients: set[str] = set()
        this_round: Counter = Counter()
        for r in [r for r in self._seen if r < ctx.round]:
            del self._seen[r]  # an old round's upload is refused as stale before its id is looked up
        seen = self._seen.setdefault(ctx.round, set())
        for u in updates:
            try:
                self.check(u, ctx, clients)
            except UpdateRejected as exc:
                this_round[exc.reason] += 1
                continue
            seen.add(u.upload_id)
            clients.add(u.client_id)
            accepted.append(u)
        self.rejected.update(this_round)
        res = self.inner.aggregate(accepted, ctx)
        info = dict(res.info)
        info["rejected"] = dict(this_round)
        return dataclasses.replace(res, info=info)
