"""Amplification by shuffling (Feldman, McMillan, Talwar 2021): the published
figures, soundness against an exactly computed shuffled randomizer, and shape."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from estimator.accounting.accountant import AccountingError
from estimator.accounting.shuffle import (
    closed_form_epsilon,
    local_epsilon_for_target,
    numerical_delta,
    numerical_epsilon,
    shuffle_guarantee,
)


def test_published_example_of_the_paper():
    """The example documented with the authors' reference implementation that
    accompanies arXiv:2012.12803 (Feldman, McMillan, Talwar; github.com/apple/
    ml-shuffling-amplification, README): n = 100,000 reports of 4-DP randomizers,
    δ = 1e-6. Their stepped numerical analysis brackets ε between 0.1675 (lower)
    and 0.1728 (upper), each from a 10-step bisection on [0, 0.5378] (resolution
    0.5378 / 2^10 ≈ 5.3e-4); their closed form gives 0.5378040242374512."""
    g = shuffle_guarantee(4.0, 100_000, 1e-6)
    assert g.epsilon_closed_form == pytest.approx(0.5378040242374512, rel=1e-12)
    assert 0.1675 - 5.3e-4 <= g.epsilon <= 0.1728
    assert g.epsilon0 == 4.0 and g.users == 100_000 and g.delta == 1e-6


def _exact_shuffled_rr_epsilon(eps0: float, n: int, delta: float) -> float:
    """ε of n shuffled binary randomized-response reports for the neighbouring pair
    'everyone holds 0' vs 'the first person holds 1'. The analyzer sees S, the number
    of 1-reports: S ~ Bin(n, q) vs Bern(1 - q) + Bin(n - 1, q), q = 1/(1 + e^ε₀).
    δ(ε) = max over both orders of Σ_s max(0, P(s) - e^ε Q(s)), computed from the pmfs.
    This is a lower bound on the true ε of shuffled ε₀-LDP reports (one randomizer,
    one pair), so every valid upper bound must be at least this."""
    q = 1.0 / (1.0 + math.exp(eps0))
    s = np.arange(n + 1)
    p0 = stats.binom.pmf(s, n, q)
    rest = stats.binom.pmf(s, n - 1, q)  # pmf at s for n-1 others (0 at s = n)
    p1 = (1 - q) * np.concatenate(([0.0], rest[:-1])) + q * rest

    def dlt(e: float) -> float:
        return max(np.maximum(p1 - math.exp(e) * p0, 0).sum(), np.maximum(p0 - math.exp(e) * p1, 0).sum())

    lo, hi = 0.0, eps0
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if dlt(mid) <= delta else (mid, hi)
    return hi


@pytest.mark.parametrize(
    "eps0, n, delta", [(1.0, 1000, 1e-6), (3.0, 5000, 1e-6), (0.5, 20000, 1e-8), (6.0, 20000, 1e-5)]
)
def test_bound_is_sound_against_an_exact_shuffled_randomizer(eps0, n, delta):
    exact = _exact_shuffled_rr_epsilon(eps0, n, delta)
    g = shuffle_guarantee(eps0, n, delta)
    assert exact <= g.epsilon
    if g.epsilon_closed_form is not None:
        assert g.epsilon <= g.epsilon_closed_form
    # and not vacuous: "nearly optimal" (FMT21) -- within a small factor of this lower bound
    assert g.epsilon <= 4.0 * exact


def test_numerical_bound_is_the_smallest_that_meets_delta():
    eps0, n, delta = 2.0, 50_000, 1e-7
    eps = numerical_epsilon(eps0, n, delta)
    assert numerical_delta(eps0, n, eps) <= delta
    assert numerical_delta(eps0, n, eps - 1e-4) > delta


def test_shape_in_n_and_eps0():
    d = 1e-6
    by_n = [numerical_epsilon(2.0, n, d) for n in (1_000, 10_000, 100_000, 1_000_000)]
    assert all(a > b for a, b in zip(by_n, by_n[1:]))
    # ε ~ sqrt(e^ε₀ log(1/δ) / n) for large n: 100x the users -> about 10x smaller ε
    assert by_n[1] / by_n[3] == pytest.approx(10.0, rel=0.25)
    by_e0 = [numerical_epsilon(e0, 100_000, d) for e0 in (0.5, 1.0, 2.0, 4.0, 8.0)]
    assert all(a < b for a, b in zip(by_e0, by_e0[1:]))
    assert all(e <= e0 for e, e0 in zip(by_e0, (0.5, 1.0, 2.0, 4.0, 8.0)))


def test_small_batches_get_little_or_no_amplification():
    assert closed_form_epsilon(2.0, 100, 1e-5) is None  # outside the closed form's range
    eps = numerical_epsilon(2.0, 100, 1e-5)
    assert 1.5 < eps <= 2.0
    # one report, nothing to hide among: the randomized-response pair itself, whose ε at δ
    # solves α - e^ε (1 - α) = δ with α = e^ε₀ / (1 + e^ε₀)
    alpha = math.exp(1.0) / (1.0 + math.exp(1.0))
    assert numerical_epsilon(1.0, 1, 1e-5) == pytest.approx(math.log((alpha - 1e-5) / (1 - alpha)), abs=2e-6)


def test_local_epsilon_for_target_inverts_the_bound():
    n, delta, target = 100_000, 1e-6, 0.5
    e0 = local_epsilon_for_target(target, n, delta)
    assert numerical_epsilon(e0, n, delta) <= target
    assert numerical_epsilon(e0 + 2e-3, n, delta) > target


def test_guarantee_record_says_what_it_protects():
    g = shuffle_guarantee(1.0, 10_000, 1e-6)
    d = g.to_dict()
    assert {"epsilon0", "users", "delta", "epsilon", "epsilon_closed_form", "method", "protects"} <= set(d)
    assert "analyzer" in d["protects"] and "shuffler" in d["protects"]
    assert "ε₀ = 1" in g.describe()
    assert shuffle_guarantee(1.0, 10_000, 1e-6) is g  # cached for the shuffler


@pytest.mark.parametrize("args", [(0.0, 10, 1e-6), (1.0, 0, 1e-6), (1.0, 10, 0.0), (1.0, 2.5, 1e-6)])
def test_bad_arguments(args):
    with pytest.raises(AccountingError):
        shuffle_guarantee(*args)
