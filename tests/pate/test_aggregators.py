"""PATE's aggregators: what they answer, their output distributions against the formulas (seeded, with
tolerances from the binomial variance), and an empirical privacy audit of GNMax on neighbouring votes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from estimator.pate.accounting import PateAccountingError, data_independent
from estimator.pate.aggregators import ABSTAIN, confident_gnmax, gnmax, lnmax, vote_histograms
from simulator.scenarios.fl.attacks import clopper_pearson

#: z of a two-sided false alarm below 1e-7 (so several checks together stay below 1e-6)
Z = 5.4


def test_vote_histograms_count_each_teachers_vote() -> None:
    preds = np.array([[0, 1, 2], [0, 2, 2], [1, 2, 2]])
    assert vote_histograms(preds, 3).tolist() == [[2, 1, 0], [0, 1, 2], [0, 0, 3]]
    with pytest.raises(PateAccountingError, match="labels"):
        vote_histograms(np.array([[3]]), 3)


def test_aggregators_take_their_randomness_from_the_generator() -> None:
    votes = np.random.default_rng(0).integers(0, 20, size=(50, 10))
    for agg in (lambda r: gnmax(votes, 3.0, r), lambda r: lnmax(votes, 3.0, r)):
        assert np.array_equal(agg(np.random.default_rng(5)), agg(np.random.default_rng(5)))
    a = confident_gnmax(votes, 15.0, 2.0, 3.0, np.random.default_rng(5))
    b = confident_gnmax(votes, 15.0, 2.0, 3.0, np.random.default_rng(5))
    assert np.array_equal(a.labels, b.labels) and np.array_equal(a.answered, b.answered)


def test_confident_gnmax_abstains_below_the_threshold_and_answers_above() -> None:
    votes = np.array([[50, 0, 0], [20, 15, 15], [10, 40, 0]])
    ans = confident_gnmax(votes, 30.0, 1e-3, 1e-3, np.random.default_rng(1))
    assert ans.labels.tolist() == [0, ABSTAIN, 1] and ans.count == 2


def test_gnmax_and_lnmax_answer_the_top_class_as_often_as_the_formula_says() -> None:
    """Two classes with gap g: GNMax answers the top with probability Φ(g/(σ√2)); LNMax with
    1 − ½e^{−g/b}(1 + g/(2b)) (the difference of two Laplace variables). Tolerance Z·√(p(1−p)/N)."""
    n, g, s = 200_000, 3.0, 2.0
    votes = np.tile([10.0 + g, 10.0], (n, 1))
    p_g = norm.cdf(g / (s * math.sqrt(2)))
    p_l = 1 - 0.5 * math.exp(-g / s) * (1 + g / (2 * s))
    rng = np.random.default_rng(11)
    for got, p in ((np.mean(gnmax(votes, s, rng) == 0), p_g), (np.mean(lnmax(votes, s, rng) == 0), p_l)):
        assert abs(got - p) <= Z * math.sqrt(p * (1 - p) / n)


def test_confident_gnmax_answers_at_the_threshold_checks_rate() -> None:
    n, top, t, s1 = 200_000, 40.0, 45.0, 6.0
    votes = np.tile([top, 10.0, 0.0], (n, 1))
    p = norm.sf((t - top) / s1)
    got = confident_gnmax(votes, t, s1, 4.0, np.random.default_rng(12)).answered.mean()
    assert abs(got - p) <= Z * math.sqrt(p * (1 - p) / n)


def _audit(sigma_run: float, trials: int, seed: int) -> float:
    """ε lower bound from telling GNMax on n = (10, 9, 0, ...) from n' = (9, 10, 0, ...) (one teacher moved
    its vote from class 0 to class 1: neighbours) by the event "the answer is 0": ε ≥ log((p_lo − δ)/p'_hi)
    with Clopper–Pearson bounds at total level 1e-7 (the test's false alarm)."""
    rng = np.random.default_rng(seed)
    n = np.zeros((trials, 10))
    n[:, 0], n[:, 1] = 10, 9
    m = n[:, [1, 0, 2, 3, 4, 5, 6, 7, 8, 9]]
    k = int(np.sum(gnmax(n, sigma_run, rng) == 0))
    k2 = int(np.sum(gnmax(m, sigma_run, rng) == 0))
    p_lo = clopper_pearson(k, trials, 1e-7)[0]
    q_hi = clopper_pearson(k2, trials, 1e-7)[1]
    return math.log(max(p_lo - 1e-5, 1e-300) / q_hi)


def test_an_empirical_audit_of_gnmax_stays_below_the_claimed_epsilon_and_catches_too_little_noise() -> None:
    """The claim: one GNMax answer at σ = 2 is (ε, 1e-5)-DP for ε from λ/σ². The audit's lower bound must
    not exceed it (false alarm < 1e-7); a GNMax that drew a tenth of the noise is caught."""
    claimed = data_independent(2.0, 1, 1e-5)["epsilon"]
    honest = _audit(2.0, 400_000, 21)
    assert 0.3 < honest <= claimed
    broken = _audit(0.2, 400_000, 22)
    assert broken > claimed
