"""PATE's accounting: the data-independent ε against dp_accounting, the data-dependent ε against it and
against unanimity, and the smooth sensitivity against a brute-force search over small vote histograms."""

from __future__ import annotations

import itertools
import math

import dp_accounting
import numpy as np
import pytest

from estimator.pate import accounting as A


def _dp_accounting_epsilon(events: list[tuple[float, int]], delta: float) -> float:
    """ε from dp_accounting's RDP accountant over our order grid: ``events`` are (noise multiplier of a
    sensitivity-1 Gaussian, count)."""
    acc = dp_accounting.rdp.RdpAccountant(list(A.ORDERS))
    for z, count in events:
        if count:
            acc.compose(dp_accounting.GaussianDpEvent(z), count)
    return float(acc.get_epsilon(delta))


@pytest.mark.parametrize(("sigma", "queries", "delta"), [(40.0, 300, 1e-5), (2.0, 10, 1e-6), (100.0, 5000, 1e-5)])
def test_data_independent_gnmax_equals_dp_accounting(sigma: float, queries: int, delta: float) -> None:
    """GNMax's histogram moves by √2 in L2, so Q answers are Q Gaussian mechanisms of noise multiplier σ/√2."""
    ours = A.data_independent(sigma, queries, delta)["epsilon"]
    theirs = _dp_accounting_epsilon([(sigma / math.sqrt(2.0), queries)], delta)
    assert ours == pytest.approx(theirs, rel=1e-9)


def test_data_independent_confident_gnmax_equals_dp_accounting() -> None:
    """Every query pays the check (sensitivity 1, σ₁), the answered ones the answer (σ₂/√2)."""
    ours = A.data_independent(40.0, 120, 1e-5, queries=500, sigma1=150.0)["epsilon"]
    theirs = _dp_accounting_epsilon([(150.0, 500), (40.0 / math.sqrt(2.0), 120)], 1e-5)
    assert ours == pytest.approx(theirs, rel=1e-9)
    # the refused queries cost little: far below answering all 500
    assert ours < 0.6 * A.data_independent(40.0, 500, 1e-5)["epsilon"]


def test_lnmax_rdp_is_below_basic_composition_of_its_pure_epsilon() -> None:
    eps, _ = A.rdp_to_epsilon(50 * A.rdp_lnmax(20.0), 1e-5)
    assert 0 < eps < 50 * 2 / 20.0


def _random_votes(rng: np.random.Generator, queries: int, teachers: int, classes: int, agree: float) -> np.ndarray:
    """Votes of ``teachers`` who each pick the query's true class with probability ``agree``."""
    truth = rng.integers(0, classes, size=queries)
    picks = np.where(rng.random((teachers, queries)) < agree, truth, rng.integers(0, classes, size=(teachers, queries)))
    from estimator.pate.aggregators import vote_histograms

    return vote_histograms(picks, classes)


@pytest.mark.parametrize("agree", [0.3, 0.6, 0.9])
def test_data_dependent_never_exceeds_data_independent(agree: float) -> None:
    rng = np.random.default_rng(7)
    votes = _random_votes(rng, 200, 250, 10, agree)
    dd = A.data_dependent(votes, 40.0, 1e-5)["epsilon"]
    assert dd <= A.data_independent(40.0, 200, 1e-5)["epsilon"] + 1e-12
    answered = rng.random(200) < 0.5
    ddc = A.data_dependent(votes, 40.0, 1e-5, answered, threshold=150.0, sigma1=100.0)["epsilon"]
    assert ddc <= A.data_independent(40.0, int(answered.sum()), 1e-5, 200, 100.0)["epsilon"] + 1e-12


def test_near_unanimous_votes_cost_far_less_than_split_ones() -> None:
    unanimous = np.zeros((300, 10))
    unanimous[:, 0], unanimous[:, 1] = 245, 5
    split = np.zeros((300, 10))
    split[:, 0], split[:, 1] = 130, 120
    di = A.data_independent(40.0, 300, 1e-5)["epsilon"]
    dd_u = A.data_dependent(unanimous, 40.0, 1e-5)["epsilon"]
    dd_s = A.data_dependent(split, 40.0, 1e-5)["epsilon"]
    assert dd_s == pytest.approx(di, rel=1e-9)  # no gap: the data-independent bound stands
    assert dd_u < di / 5


def test_the_per_query_cost_grows_as_the_gap_shrinks_and_stays_below_lambda_over_sigma2() -> None:
    lam = np.array([2.0, 8.0, 32.0])
    prev = np.zeros(3)
    for gap in (200, 150, 100, 60, 30, 0):
        n = np.array([125 + gap / 2, 125 - gap / 2, 0, 0], float)
        c = A.rdp_gnmax_dependent(n, 40.0, lam)
        assert np.all(c >= prev - 1e-15) and np.all(c <= lam / 1600.0 + 1e-15)
        prev = c


def _neighbours(n: tuple[int, ...]) -> set[tuple[int, ...]]:
    """Histograms one vote move away (one teacher changes its vote)."""
    out = set()
    for a, b in itertools.permutations(range(len(n)), 2):
        if n[a] > 0:
            m = list(n)
            m[a] -= 1
            m[b] += 1
            out.add(tuple(m))
    return out


def _ball(n: tuple[int, ...], r: int) -> set[tuple[int, ...]]:
    seen, frontier = {n}, {n}
    for _ in range(r):
        frontier = {m for x in frontier for m in _neighbours(x)} - seen
        seen |= frontier
    return seen


@pytest.mark.parametrize(("n", "sigma"), [((9, 1, 0), 1.0), ((7, 2, 1), 1.5), ((10, 0, 0), 2.0), ((5, 5, 0), 1.0)])
def test_local_sensitivity_bound_covers_a_brute_force_search(n: tuple[int, ...], sigma: float) -> None:
    """For each distance r, the largest change of one query's cost between a histogram within r moves and
    its neighbour, found by enumeration, is at most the bound smooth_sensitivity uses."""
    order, threshold, sigma1 = 4.0, 7.0, 1.5
    lam = np.array([order])
    gn = A._gnmax_neighbour_table(sigma, len(n), order)
    thr = A._threshold_neighbour_table(threshold, sigma1, sum(n), order)
    for r in range(4):
        worst_g = worst_t = 0.0
        for m in _ball(n, r):
            cm = A.rdp_gnmax_dependent(np.array(m, float), sigma, lam)[0]
            tm = A.rdp_threshold_dependent(np.array(m, float), threshold, sigma1, lam)[0]
            for x in _neighbours(m):
                worst_g = max(worst_g, abs(cm - A.rdp_gnmax_dependent(np.array(x, float), sigma, lam)[0]))
                worst_t = max(
                    worst_t, abs(tm - A.rdp_threshold_dependent(np.array(x, float), threshold, sigma1, lam)[0])
                )
        v = np.array([n], float)
        bound_g = A._local_sensitivity(v, np.array([True]), r, sigma, gn, None)
        bound_both = A._local_sensitivity(v, np.array([True]), r, sigma, gn, thr)
        assert worst_g <= bound_g + 1e-12
        assert worst_g + worst_t <= bound_both + 1e-12


def test_smooth_sensitivity_release_is_seeded_and_pays_for_itself() -> None:
    votes = np.zeros((100, 10))
    votes[:, 0], votes[:, 1] = 240, 10
    one = A.release_data_dependent(votes, 40.0, 1e-5, np.random.default_rng(1))
    again = A.release_data_dependent(votes, 40.0, 1e-5, np.random.default_rng(1))
    other = A.release_data_dependent(votes, 40.0, 1e-5, np.random.default_rng(2))
    assert one == again and one.epsilon != other.epsilon
    assert one.release_rdp == pytest.approx(A.gnss_rdp(one.beta, one.sigma_s, one.order))
    assert 0 < one.smooth_sensitivity < 100 * one.order / 1600.0
    with pytest.raises(A.PateAccountingError, match="order"):
        A.gnss_rdp(0.1, 1.0, 6.0)


def test_bad_votes_are_refused() -> None:
    with pytest.raises(A.PateAccountingError, match="whole numbers"):
        A.data_dependent(np.array([[1.5, 2.0]]), 1.0, 1e-5)
    with pytest.raises(A.PateAccountingError, match="both threshold and sigma1"):
        A.data_dependent(np.array([[1, 2]]), 1.0, 1e-5, threshold=3.0)
    with pytest.raises(A.PateAccountingError, match="delta"):
        A.data_independent(1.0, 3, 1.5)


def test_the_published_figure_adds_smooth_sensitivity_times_sigma_s_gaussian_noise() -> None:
    """rdp_noisy = RDP(λ) + SS·σ_s·Z with Z the generator's next standard normal (seeded: the same Z)."""
    votes = np.zeros((60, 10))
    votes[:, 0], votes[:, 1] = 200, 50
    exact = A.data_dependent(votes, 40.0, 1e-5)
    for seed in (3, 4, 5):
        pub = A.release_data_dependent(votes, 40.0, 1e-5, np.random.default_rng(seed))
        z = float(np.random.default_rng(seed).standard_normal())
        rdp_at = float(exact["rdp"][int(np.argmin(np.abs(A.ORDERS - pub.order)))])
        assert pub.rdp_noisy == pytest.approx(max(0.0, rdp_at + pub.smooth_sensitivity * pub.sigma_s * z))
