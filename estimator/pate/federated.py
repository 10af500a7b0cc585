"""Federated teachers: devices (or organisations) vote, and the server sees only the sum of their votes.

Each teacher is an FL device holding its own sensitive data (it never leaves the device) and its own
model. For a batch of Q public queries over K classes it turns its predictions into a one-hot vote vector
x_u ∈ {0, 1}^{Q·K} (uint32 words) and sends it through the project's secure aggregation
(:mod:`ldp_core.fl.secagg` on the device, :class:`estimator.fl.secagg_server.SecAggServer` on the server):
the server receives y_u = x_u + masks, uniform words that say nothing about u's votes alone, and after
unmasking learns Σ_u x_u mod 2^32, the vote histograms and nothing else (exact: n ≤ 2^32 teachers).
Dropped teachers are handled by SecAgg's recovery: the histogram then counts the survivors only.

What this adds to PATE: no party, the aggregator included, sees any one teacher's vote (an honest-but-
curious server, fewer than t colluding neighbours per client: docs/fl/SECAGG.md). What it does not: the
server still sees the exact histograms before it adds the GNMax noise, so the ε printed by
:mod:`estimator.pate.accounting` holds against everyone *except* the aggregating server, which learns the
histograms (far less than the votes, more than the noisy labels). Adding the noise inside SecAgg (the
distributed discrete Gaussian of :mod:`ldp_core.fl.ddg`) would remove that residual; not done here.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

import numpy as np

from estimator.fl.secagg_server import SecAggServer, honest_unmask, make_config
from estimator.pate.accounting import PateAccountingError
from ldp_core.fl.secagg import SecAggClient

__all__ = ["one_hot_votes", "SecAggVotes", "secagg_vote_histograms"]


def one_hot_votes(predictions: np.ndarray, n_classes: int) -> np.ndarray:
    """One teacher's Q predicted labels as the flat uint32 vote vector of length Q·K."""
    p = np.asarray(predictions, dtype=np.int64)
    if p.ndim != 1 or (p.size and (p.min() < 0 or p.max() >= n_classes)):
        raise PateAccountingError(f"predictions must be a vector of labels in [0, {n_classes})")
    out = np.zeros((p.size, n_classes), dtype=np.uint32)
    out[np.arange(p.size), p] = 1
    return out.reshape(-1)


@dataclasses.dataclass(frozen=True)
class SecAggVotes:
    """The unmasked histograms (queries × classes), the masked vectors the server received (by client
    index) and who survived."""

    histograms: np.ndarray
    masked: dict[int, np.ndarray]
    survivors: frozenset[int]


def secagg_vote_histograms(
    predictions: Sequence[np.ndarray],
    n_classes: int,
    rng: np.random.Generator,
    round: int = 0,
    drop: frozenset[int] = frozenset(),
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> SecAggVotes:
    """One SecAgg round over the teachers' vote vectors (teacher i is client i + 1); ``drop`` lists the
    clients that vanish after sharing their keys (their votes are then not counted); ``rng`` draws the
    server's neighbour graph, ``random_bytes`` every device secret (os.urandom unless a test fixes it)."""
    n = len(predictions)
    if n < 3:
        raise PateAccountingError(f"secure aggregation needs at least 3 teachers, got {n}")
    vectors = [one_hot_votes(p, n_classes) for p in predictions]
    d = vectors[0].size
    if any(v.size != d for v in vectors):
        raise PateAccountingError("every teacher must vote on the same queries")
    config = make_config(round, n, d, rng)
    server = SecAggServer(config)
    clients = {u: SecAggClient(u, config, random_bytes) for u in range(1, n + 1)}
    routed_adverts = server.collect_adverts([c.advertise_keys() for c in clients.values()])
    shares = {u: clients[u].share_keys(routed_adverts[u]) for u in clients}
    inbox = server.route_shares(shares)
    masked: dict[int, np.ndarray] = {}
    for u, c in clients.items():
        if u in drop:
            continue
        y = c.masked_input(vectors[u - 1], inbox.get(u, {}))
        masked[u] = y
        server.receive_masked(u, y)
    survivors, dropped = server.unmask_request()
    total = server.finish(honest_unmask({u: clients[u] for u in survivors}, survivors, dropped))
    return SecAggVotes(total.astype(np.int64).reshape(-1, n_classes), masked, frozenset(survivors))
