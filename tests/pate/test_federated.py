"""Federated teachers: their votes summed with the project's SecAgg equal the plain histogram, and the
server, played here as the adversary it is (it records everything it receives), sees only masked vectors."""

from __future__ import annotations

import numpy as np
import pytest

from estimator.fl.secagg_server import SecAggServer
from estimator.pate.accounting import PateAccountingError
from estimator.pate.aggregators import vote_histograms
from estimator.pate.federated import (
    distributed_gnmax_epsilon,
    one_hot_votes,
    secagg_noisy_histograms,
    secagg_vote_histograms,
)


def test_the_secagg_sum_equals_the_plain_histogram_and_the_server_sees_only_masks(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    teachers, queries, classes = 8, 40, 10
    preds = rng.integers(0, classes, size=(teachers, queries))
    seen: list[np.ndarray] = []
    original = SecAggServer.receive_masked

    def recording(self: SecAggServer, u: int, y: np.ndarray) -> None:  # everything the server is sent
        seen.append(np.array(y, copy=True))
        original(self, u, y)

    monkeypatch.setattr(SecAggServer, "receive_masked", recording)
    out = secagg_vote_histograms(list(preds), classes, rng)
    assert np.array_equal(out.histograms, vote_histograms(preds, classes))
    assert len(seen) == teachers
    for u, y in enumerate(seen, 1):
        vote = one_hot_votes(preds[u - 1], classes)
        assert not np.array_equal(y, vote)
        # a one-hot vote is 0/1 in every word; a masked word is uniform on 2^32 values, so among 400 words
        # the chance that even one is 0 or 1 is 400·2/2^32 < 2e-7: seeing any would mean the vote shows through
        assert np.count_nonzero(y <= 1) == 0
        # and no single masked vector reveals the vote's argmax structure: its words are spread over the ring
        assert y.min() < 2**30 and y.max() > 3 * 2**30


def test_dropped_teachers_are_left_out_of_the_sum() -> None:
    rng = np.random.default_rng(4)
    preds = rng.integers(0, 3, size=(6, 15))
    out = secagg_vote_histograms(list(preds), 3, rng, drop=frozenset({2, 5}))
    assert out.survivors == frozenset({1, 3, 4, 6})
    assert np.array_equal(out.histograms, vote_histograms(preds[[0, 2, 3, 5]], 3))


def test_too_few_teachers_or_mismatched_votes_are_refused() -> None:
    with pytest.raises(PateAccountingError, match="at least 3"):
        secagg_vote_histograms([np.array([0]), np.array([1])], 2, np.random.default_rng(0))
    with pytest.raises(PateAccountingError, match="same queries"):
        secagg_vote_histograms([np.array([0]), np.array([1]), np.array([0, 1])], 2, np.random.default_rng(0))


def test_with_noise_added_by_the_teachers_the_server_unmasks_only_the_noised_histograms(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The unmasked sum is the histogram plus exactly the teachers' discrete Gaussian shares (regenerated
    from the same seeded generators), the server is sent no vote nor noised vote in the clear, and the
    total noise has variance σ² (sample variance of N = 3,000 words within 5.4·σ²·√(2/N), false alarm < 1e-7)."""
    from ldp_core.noise import discrete_gaussian

    teachers, queries, classes, sigma = 6, 300, 10, 4.0
    rng = np.random.default_rng(8)
    preds = rng.integers(0, classes, size=(teachers, queries))
    seen: list[np.ndarray] = []
    original = SecAggServer.receive_masked

    def recording(self: SecAggServer, u: int, y: np.ndarray) -> None:
        seen.append(np.array(y, copy=True))
        original(self, u, y)

    monkeypatch.setattr(SecAggServer, "receive_masked", recording)
    gens = [np.random.default_rng([9, i]) for i in range(teachers)]
    out = secagg_noisy_histograms(list(preds), classes, sigma, rng, gens)
    share = sigma / np.sqrt(teachers)
    shares = [
        discrete_gaussian(float(share), queries * classes, np.random.default_rng([9, i])) for i in range(teachers)
    ]
    plain = vote_histograms(preds, classes)
    assert np.array_equal(out.histograms, plain + np.sum(shares, axis=0).reshape(queries, classes))
    for u, y in enumerate(seen, 1):
        noised = (one_hot_votes(preds[u - 1], classes).astype(np.int64) + shares[u - 1]).astype(np.uint32)
        assert np.count_nonzero(y == noised) < 5  # a uniform word equals the noised vote with chance 2^-32 each
    noise = (out.histograms - plain).ravel()
    n = noise.size
    assert abs(noise.var() - sigma**2) <= 5.4 * sigma**2 * np.sqrt(2 / n)


def test_the_distributed_epsilon_pays_for_the_discrete_sum_and_for_colluders() -> None:
    from estimator.pate.accounting import data_independent

    central = data_independent(4.0, 400, 1e-5)["epsilon"]
    all_honest = distributed_gnmax_epsilon(4.0, 25, 400, 1e-5, 10)["epsilon"]
    half = distributed_gnmax_epsilon(4.0, 25, 400, 1e-5, 10, honest=13)["epsilon"]
    assert central < all_honest < 1.25 * central  # KLS21's τ term: a sum of discrete Gaussians
    assert half > 1.5 * all_honest  # only the honest shares' noise counts against the server
    with pytest.raises(PateAccountingError, match="must be >= 1/2"):
        secagg_noisy_histograms([np.array([0])] * 100, 2, 4.0, np.random.default_rng(0))
