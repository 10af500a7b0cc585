"""Federated teachers: devices (or organisations) vote, and the server sees only the sum of their votes.

Each teacher is an FL device holding its own sensitive data (it never leaves the device) and its own
model. For a batch of Q public queries over K classes it turns its predictions into a one-hot vote vector
x_u ∈ {0, 1}^{Q·K} (uint32 words) and sends it through the project's secure aggregation
(:mod:`ldp_core.fl.secagg` on the device, :class:`estimator.fl.secagg_server.SecAggServer` on the server):
the server receives y_u = x_u + masks, uniform words that say nothing about u's votes alone, and after
unmasking learns Σ_u x_u mod 2^32, the vote histograms and nothing else (exact: n ≤ 2^32 teachers).
Dropped teachers are handled by SecAgg's recovery: the histogram then counts the survivors only.

What this adds to PATE: no party, the aggregator included, sees any one teacher's vote (an honest-but-
curious server, fewer than t colluding neighbours per client: docs/fl/SECAGG.md). What it does not: with
:func:`secagg_vote_histograms` the server still sees the exact histograms before it adds the GNMax noise,
so the ε of :mod:`estimator.pate.accounting` holds against everyone *except* the aggregating server.

:func:`secagg_noisy_histograms` removes that residual with the distributed discrete Gaussian (Kairouz,
Liu and Steinke, ICML 2021): each of the n teachers adds N_Z(0, σ²/n) to every word of its vote vector
before masking (noise from the OS CSPRNG on each device unless a test passes generators), so the server
only ever unmasks the noised histograms n + Σ_u Z_u, and takes their argmax (GNMax with the sum of n
discrete Gaussians in place of N(0, σ²)). The server sees the whole noised histogram, not only its argmax,
so only the data-independent analysis applies: per query, KLS21 Prop. 14's bound for a sum of h honest
shares with the histogram's sensitivities (L2 √2, L1 2, K coordinates), composed over the Q queries
(:func:`distributed_gnmax_epsilon`; h < n when some teachers' noise is known to the server).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

import numpy as np

from estimator.fl.secagg_server import SecAggServer, honest_unmask, make_config
from estimator.pate.accounting import PateAccountingError
from ldp_core.fl.secagg import SecAggClient

__all__ = [
    "one_hot_votes",
    "SecAggVotes",
    "secagg_vote_histograms",
    "secagg_noisy_histograms",
    "distributed_gnmax_epsilon",
]


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


def _vectors(predictions: Sequence[np.ndarray], n_classes: int) -> list[np.ndarray]:
    if len(predictions) < 3:
        raise PateAccountingError(f"secure aggregation needs at least 3 teachers, got {len(predictions)}")
    vectors = [one_hot_votes(p, n_classes) for p in predictions]
    if any(v.size != vectors[0].size for v in vectors):
        raise PateAccountingError("every teacher must vote on the same queries")
    return vectors


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
    return _secagg_sum(_vectors(predictions, n_classes), n_classes, rng, round, drop, random_bytes)


def _secagg_sum(
    vectors: list[np.ndarray],
    n_classes: int,
    rng: np.random.Generator,
    round: int,
    drop: frozenset[int],
    random_bytes: Callable[[int], bytes],
) -> SecAggVotes:
    n, d = len(vectors), vectors[0].size
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
    centred = total.view(np.int32).astype(np.int64)  # the sum mod 2^32 read as a signed 32-bit integer
    return SecAggVotes(centred.reshape(-1, n_classes), masked, frozenset(survivors))


def secagg_noisy_histograms(
    predictions: Sequence[np.ndarray],
    n_classes: int,
    sigma: float,
    rng: np.random.Generator,
    noise_rngs: Sequence[np.random.Generator] | None = None,
    round: int = 0,
    random_bytes: Callable[[int], bytes] = os.urandom,
) -> SecAggVotes:
    """The vote histograms plus discrete Gaussian noise of total variance about σ², added in shares of
    N_Z(0, σ²/n) by the n teachers before SecAgg (module docstring); ``noise_rngs[i]`` is teacher i's
    generator (default: the OS CSPRNG on each). Argmax per row = the distributed GNMax labels."""
    from ldp_core.noise import discrete_gaussian
    from ldp_core.randomness import secure_generator

    vectors = _vectors(predictions, n_classes)
    n = len(vectors)
    share = sigma / np.sqrt(n)
    if not share >= 0.5:
        raise PateAccountingError(f"each teacher's noise share σ/√n = {share:.3g} must be >= 1/2 (KLS21's bound)")
    gens = [secure_generator() for _ in range(n)] if noise_rngs is None else list(noise_rngs)
    if len(gens) != n:
        raise PateAccountingError(f"one noise generator per teacher: {len(gens)} for {n} teachers")
    noisy = [
        (v.astype(np.int64) + discrete_gaussian(float(share), v.size, g)).astype(np.int64).astype(np.uint32)
        for v, g in zip(vectors, gens)
    ]  # two's complement mod 2^32: the masked sum wraps back to the signed total
    return _secagg_sum(noisy, n_classes, rng, round, frozenset(), random_bytes)


def distributed_gnmax_epsilon(
    sigma: float, teachers: int, queries: int, delta: float, classes: int, honest: int | None = None
) -> dict[str, float]:
    """ε at δ of ``queries`` noised histograms released to the server, each the sum of ``honest`` (default:
    all) teachers' N_Z(0, σ²/n) shares: KLS21 Prop. 14 with L2 √2, L1 2 over ``classes`` coordinates."""
    from estimator.fl.ddg_accounting import ORDERS, rdp_to_epsilon, sum_dg_rdp
    from ldp_core.noise import sigma2_used

    h = teachers if honest is None else honest
    if not 1 <= h <= teachers:
        raise PateAccountingError(f"honest shares must be in [1, {teachers}], got {h}")
    s2 = float(sigma2_used(sigma / np.sqrt(teachers)))
    rdp = queries * sum_dg_rdp(ORDERS, np.sqrt(2.0), 2.0, h, s2, classes)
    return {"epsilon": rdp_to_epsilon(rdp, delta), "share_sigma2": s2, "honest_shares": float(h)}
