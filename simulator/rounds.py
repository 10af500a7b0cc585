"""Running federated rounds in one process (simulation and tests).

Each round: sample clients, publish the strategy's configuration, let every
sampled client train (:func:`ldp_core.fl.client_round.train_client`), aggregate
the uploads with the aggregator stack, apply the result. Running rounds over
the collector and a topic is the pipeline's job; this loop is the same logic
without transport.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from estimator.fl.aggregators import Aggregator, RoundContext
from estimator.fl.sampling import Sampling
from estimator.fl.strategies import Strategy
from ldp_core.fl.client_round import train_client
from ldp_core.fl.models import Model, accuracy
from ldp_core.fl.training import ClientState, ClientUpdate

__all__ = ["FederatedClient", "RoundRecord", "run_rounds"]


@dataclasses.dataclass
class FederatedClient:
    """A simulated device: its id, its data and its persistent state."""

    client_id: str
    X: np.ndarray
    y: np.ndarray
    state: ClientState = dataclasses.field(default_factory=ClientState)


@dataclasses.dataclass(frozen=True)
class RoundRecord:
    round: int
    sampled: int
    test_accuracy: float | None
    info: dict[str, Any]


def run_rounds(
    model: Model,
    strategy: Strategy,
    aggregator: Aggregator,
    clients: Sequence[FederatedClient],
    sampling: Sampling,
    rounds: int,
    rng: np.random.Generator,
    params: np.ndarray | None = None,
    test: tuple[np.ndarray, np.ndarray] | None = None,
    tamper: Callable[[int, list[ClientUpdate]], list[ClientUpdate]] | None = None,
    client_rng: Callable[[int, str], np.random.Generator] | None = None,
    on_round: Callable[[RoundRecord], None] | None = None,
) -> tuple[np.ndarray, list[RoundRecord]]:
    """Run ``rounds`` rounds; return the final parameters and one record per round.

    ``tamper`` (tests of robustness) may replace the round's uploads before aggregation.
    ``client_rng(round, client_id)``, if given, is the generator a client trains with
    (each device has its own, as over the pipeline); otherwise every client draws from ``rng``.
    Either way sampling and the aggregator's noise draw from ``rng``.
    ``on_round(record)``, if given, is called once after each round (progress display); it draws no randomness."""
    x = model.init_params(rng) if params is None else np.asarray(params, np.float32)
    history: list[RoundRecord] = []
    for r in range(rounds):
        chosen = sampling.sample(list(clients), rng)
        config = strategy.configure(r, x)
        ups = [
            train_client(
                model, config, c.X, c.y, rng if client_rng is None else client_rng(r, c.client_id), c.client_id, c.state
            )
            for c in chosen
        ]
        if tamper is not None:
            ups = tamper(r, ups)
        expected = sampling.expected_clients(len(clients))
        ctx = RoundContext(r, strategy.payload_size(model.num_params), rng, expected, params=x)
        res = aggregator.aggregate(ups, ctx)
        x = strategy.apply(x, res, expected / len(clients))
        acc = accuracy(model, x, *test) if test is not None else None
        history.append(RoundRecord(r, len(chosen), acc, res.info))
        if on_round is not None:
            on_round(history[-1])
    return x, history
