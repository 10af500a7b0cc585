"""Federated teachers: their votes summed with the project's SecAgg equal the plain histogram, and the
server, played here as the adversary it is (it records everything it receives), sees only masked vectors."""

from __future__ import annotations

import numpy as np
import pytest

from estimator.fl.secagg_server import SecAggServer
from estimator.pate.accounting import PateAccountingError
from estimator.pate.aggregators import vote_histograms
from estimator.pate.federated import one_hot_votes, secagg_vote_histograms


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
