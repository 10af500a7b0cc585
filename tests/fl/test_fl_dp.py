"""Client-level DP wrappers: clipping, noise scale, adaptive clipping, per-round accounting."""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimator.accounting.accountant import exact_gaussian_epsilon
from estimator.fl.aggregators import RoundContext, WeightedMean
from estimator.fl.dp import AdaptiveClippingDP, ClientLevelAccountant, FixedClippingDP, update_noise_multiplier
from estimator.fl.robust import CoordinateMedian
from estimator.fl.sampling import PoissonSampling
from ldp_core.fl import ClientUpdate, FLError
from ldp_core.privacy_events import ComposedEvent, GaussianEvent


def _ctx(n, seed=0, expected=4.0, round=0):
    return RoundContext(round, n, np.random.default_rng(seed), expected)


def test_fixed_clipping_without_noise_is_sum_of_clipped_over_expected_count() -> None:
    ups = [
        ClientUpdate("a", 0, np.array([3.0, 4.0], np.float32), 100),  # norm 5 -> clipped to norm 1
        ClientUpdate("b", 0, np.array([0.6, 0.0], np.float32), 1),
    ]  # norm 0.6 kept
    dp = FixedClippingDP(WeightedMean(), clip_norm=1.0, noise_multiplier=0.0)
    res = dp.aggregate(ups, _ctx(2, expected=4.0))
    np.testing.assert_allclose(res.delta, (np.array([0.6, 0.8]) + np.array([0.6, 0.0])) / 4.0, rtol=1e-6)
    assert res.info["clipped_fraction"] == 0.5 and res.num_clients == 2


def test_noise_on_the_sum_has_stddev_sigma_times_c() -> None:
    """With no updates the output is N(0, (σC)²)/m̄ per coordinate. Over d = 40,000
    coordinates the sample variance has relative sd sqrt(2/d) ≈ 0.7 %; tolerance 4 %."""
    d, sigma, C, m = 40_000, 1.3, 0.7, 5.0
    dp = FixedClippingDP(WeightedMean(), clip_norm=C, noise_multiplier=sigma)
    res = dp.aggregate([], _ctx(d, seed=1, expected=m))
    assert abs(res.delta.mean() * m) < 5 * sigma * C / math.sqrt(d)
    assert np.var(res.delta * m) == pytest.approx((sigma * C) ** 2, rel=0.04)
    assert res.info["noise_stddev"] == pytest.approx(sigma * C)


def test_accountant_reports_after_every_round() -> None:
    acc = ClientLevelAccountant(PoissonSampling(0.2), 50, 1e-5)
    dp = FixedClippingDP(WeightedMean(), 1.0, 1.0, accountant=acc)
    eps = []
    for r in range(4):
        res = dp.aggregate([ClientUpdate("a", r, np.ones(3, np.float32), 1)], _ctx(3, seed=r, expected=10.0, round=r))
        eps.append(res.info["epsilon"])
        assert res.info["delta"] == 1e-5 and res.info["rounds_accounted"] == r + 1
    assert all(b > a > 0 for a, b in zip(eps, eps[1:]))


def test_dp_wrappers_refuse_nonlinear_inner() -> None:
    with pytest.raises(FLError, match="linear"):
        FixedClippingDP(CoordinateMedian(WeightedMean(), f=1), 1.0, 1.0)
    with pytest.raises(FLError, match="linear"):
        AdaptiveClippingDP(CoordinateMedian(WeightedMean(), f=1), 1.0, 1.0)


def test_count_noise_is_paid_for_by_the_update_noise() -> None:
    """Releasing the update sum with multiplier σ_Δ and the centred count (sensitivity ½)
    with noise σ_b is exactly one Gaussian release of multiplier z: checked by the exact
    Gaussian accountant on the composition of the two releases (the count release is a
    Gaussian of multiplier σ_b / ½ = 2σ_b)."""
    for z, sb in [(1.0, 2.5), (0.8, 0.5), (2.0, 5.0)]:
        zd = update_noise_multiplier(z, sb)
        assert zd > z  # the updates carry a little more noise than z
        pair = ComposedEvent((GaussianEvent(zd), GaussianEvent(2 * sb)))
        assert exact_gaussian_epsilon(pair, 1e-5) == pytest.approx(
            exact_gaussian_epsilon(GaussianEvent(z), 1e-5), rel=1e-9
        )
    with pytest.raises(FLError, match="σ_b"):
        update_noise_multiplier(1.0, 0.4)


def test_adaptive_clip_tracks_target_quantile() -> None:
    """Update norms are exp(N(0, 1)) (median 1, 0.3-quantile e^{-0.524} ≈ 0.59). With 100
    clients per round, σ_b = 5 gives b̄ noise sd 0.05; the geometric update with η = 0.2
    settles within a few percent of the quantile. Tolerance: the clip norm averaged over
    the last 80 of 200 rounds lies between the (γ ∓ 0.05)-quantiles."""
    rng = np.random.default_rng(9)
    for gamma in (0.5, 0.3):
        dp = AdaptiveClippingDP(WeightedMean(), initial_clip=10.0, noise_multiplier=1.0, target_quantile=gamma)
        clips = []
        for r in range(200):
            norms = np.exp(rng.normal(size=100))
            dirs = rng.normal(size=(100, 8))
            dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
            ups = [ClientUpdate(f"c{i}", r, (norms[i] * dirs[i]).astype(np.float32), 1) for i in range(100)]
            res = dp.aggregate(ups, RoundContext(r, 8, rng, 100.0))
            clips.append(res.info["clip_norm"])
        c = float(np.mean(clips[-80:]))
        lo, hi = np.exp(np.quantile(rng.normal(size=200_000), [gamma - 0.05, gamma + 0.05]))
        assert lo < c < hi, (gamma, c, lo, hi)
        assert res.info["count_stddev"] == 5.0
