"""Post-processing and inference on estimates: Norm-Sub, heavy hitters, z_value.

Norm-Sub (Wang et al., NDSS 2020) returns max(c - δ, 0) with the δ for which the
result sums to n; that is the Euclidean projection of c onto the scaled simplex
{x ≥ 0, Σx = n} (Duchi et al., ICML 2008). It is checked against a bisection on
δ (an independent algorithm) and against random feasible points, none of which
may be closer to c.

Heavy hitters: a one-sided z-test per item with the Bonferroni level α/d, so
the family-wise error rate (any item whose true count is at most the threshold
reported) is at most α up to the normal approximation. Over S seeded
collections the number of collections with a false report is then at most
Binomial(S, α); the test rejects above that binomial's 1 - 1e-4 quantile.
Without the Bonferroni correction the error rate on the null data below would
be close to 1 - (1 - α)^24 ≈ 1, so a missing or wrong correction fails.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import stats

from estimator.oracles import accumulator_for
from estimator.result import Estimate, estimate_from_counts, norm_sub, z_value
from ldp_core.mechanisms import FREQUENCY_MECHANISMS, make_spec
from tests.support.profiles import profile

NAMES = sorted(FREQUENCY_MECHANISMS)
PROPERTY = settings(max_examples=200, deadline=None, derandomize=True)


# -- z_value ------------------------------------------------------------------------
@pytest.mark.parametrize("confidence", [0.5, 0.8, 0.9, 0.95, 0.99, 0.999, 1 - 1e-9])
def test_z_value_matches_normal_quantile(confidence: float) -> None:
    assert z_value(confidence) == pytest.approx(stats.norm.ppf(0.5 + confidence / 2), rel=1e-12)


def test_z_value_known_constants() -> None:
    assert z_value(0.95) == pytest.approx(1.959963984540054, abs=1e-12)
    assert z_value(0.99) == pytest.approx(2.5758293035489004, abs=1e-12)


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.5, 1.5, math.nan])
def test_z_value_rejects_bad_confidence(confidence: float) -> None:
    with pytest.raises(ValueError, match="confidence"):
        z_value(confidence)


# -- Norm-Sub -----------------------------------------------------------------------
def norm_sub_by_bisection(c: np.ndarray, n: float) -> np.ndarray:
    """max(c - δ, 0) with Σ = n, δ found by bisection (f(δ) = Σ max(c - δ, 0) decreases)."""
    lo, hi = float(c.min()) - n, float(c.max())  # f(lo) ≥ n, f(hi) = 0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if np.maximum(c - mid, 0.0).sum() > n:
            lo = mid
        else:
            hi = mid
    return np.maximum(c - 0.5 * (lo + hi), 0.0)


def check_projection(c: np.ndarray, n: float, out: np.ndarray, rng: np.random.Generator) -> None:
    scale = n + float(np.abs(c).sum()) + 1.0
    assert out.shape == c.shape
    assert np.all(out >= 0.0)
    assert out.sum() == pytest.approx(n, abs=1e-9 * scale)
    np.testing.assert_allclose(out, norm_sub_by_bisection(c, n), rtol=0, atol=1e-7 * scale)
    best = float(np.sum((out - c) ** 2))
    for y in rng.dirichlet(np.ones(c.size), size=50) * n:
        assert float(np.sum((y - c) ** 2)) >= best - 1e-9 * scale**2


@PROPERTY
@given(
    c=hnp.arrays(np.float64, st.integers(1, 40), elements=st.floats(-1e5, 1e5)),
    n=st.floats(1.0, 1e5),
)
def test_norm_sub_is_the_simplex_projection(c: np.ndarray, n: float) -> None:
    check_projection(c, n, norm_sub(c, n), np.random.default_rng(0))


def test_norm_sub_on_real_estimates() -> None:
    rng = np.random.default_rng(5)
    spec = make_spec("grr", epsilon=0.5, domain_size=50)
    acc = accumulator_for(spec)
    values = rng.zipf(1.5, size=5000) % 50
    acc.update(spec.encode(values, rng))
    est = acc.estimate()
    assert est.counts.min() < 0  # the unbiased estimate has negative entries here
    out = est.norm_sub()
    assert out.postprocessing == "norm-sub"
    np.testing.assert_array_equal(out.variance, est.variance)
    check_projection(est.counts, est.n, out.counts, rng)


def test_norm_sub_cases() -> None:
    consistent = np.array([3.0, 0.0, 7.0])
    np.testing.assert_allclose(norm_sub(consistent, 10), consistent)
    np.testing.assert_allclose(norm_sub(np.array([5.0, -2.0, 1.0]), 4), [4.0, 0.0, 0.0])
    np.testing.assert_allclose(norm_sub(np.array([-5.0, -1.0, -3.0]), 6), [0.0, 4.0, 2.0])  # δ = -5 < 0 lifts entries
    np.testing.assert_allclose(norm_sub(np.array([2.0, 2.0]), 2), [1.0, 1.0])
    np.testing.assert_array_equal(norm_sub(np.array([1.0, 2.0]), 0), [0.0, 0.0])
    assert norm_sub(np.array([]), 5).size == 0
    c = np.array([10.0, -3.0, 4.0, 0.5])
    once = norm_sub(c, 8)
    np.testing.assert_allclose(norm_sub(once, 8), once)


# -- heavy hitters -------------------------------------------------------------------
def _spec(name: str, trial: int | None = None):
    spec = make_spec("rr", epsilon=2.0) if name == "rr" else make_spec(name, epsilon=2.0, domain_size=32)
    if trial is not None:
        fresh = getattr(profile(name), "fresh_trial_spec", None)
        if fresh is not None:
            spec = fresh(spec, trial)
    return spec


def _estimate(spec, counts: np.ndarray, rng: np.random.Generator) -> Estimate:
    acc = accumulator_for(spec)
    acc.update(spec.encode(np.repeat(np.arange(counts.size), counts), rng))
    return acc.estimate()


FWER_SEEDS = 400
FWER_ALPHA = 0.2


def _null_population(d: int, threshold_zero: bool = False) -> tuple[np.ndarray, float]:
    """True counts and a threshold: a quarter of the items heavy (200 users), the
    others null, exactly at the threshold (25 users, or 0 with threshold 0)."""
    null_count = 0 if threshold_zero else 25
    if d == 2:
        return np.array([1500, null_count]), float(null_count)
    counts = np.full(d, null_count, dtype=np.int64)
    counts[: d // 4] = 200
    return counts, float(null_count)


def _family_wise_failures(name: str, threshold_zero: bool) -> int:
    counts, threshold = _null_population(_spec(name).domain_size, threshold_zero)
    null = counts <= threshold
    rng = np.random.default_rng([99, zlib.crc32(name.encode()), int(threshold_zero)])
    failures = 0
    for trial in range(FWER_SEEDS):
        hh = _estimate(_spec(name, trial), counts, rng).heavy_hitters(alpha=FWER_ALPHA, threshold=threshold)
        failures += bool(null[hh].any())
    return failures


@pytest.mark.parametrize("name", NAMES)
def test_heavy_hitters_fwer(name: str) -> None:
    """Over seeded collections, the number with any false report stays within Binomial(S, α)."""
    failures = _family_wise_failures(name, threshold_zero=False)
    limit = stats.binom.isf(1e-4, FWER_SEEDS, FWER_ALPHA)
    assert failures <= limit, f"{name}: {failures}/{FWER_SEEDS} collections reported a null item (limit {limit:.0f})"


@pytest.mark.parametrize("name", ["grr", "rr"])
def test_heavy_hitters_fwer_threshold_zero(name: str) -> None:
    """The same with null items of true count 0 and the default threshold 0."""
    failures = _family_wise_failures(name, threshold_zero=True)
    assert failures <= stats.binom.isf(1e-4, FWER_SEEDS, FWER_ALPHA), failures


@pytest.mark.parametrize("name", NAMES)
def test_heavy_hitters_finds_large_items(name: str) -> None:
    """Items far above the threshold are all found, in decreasing order, and items
    far below it are not. "Far" is measured in the mechanism's own standard
    deviation sd = max sqrt(count_variance): the threshold sits 5 sd above the
    empty items and the heavy items 7-10 sd above the threshold, well past the
    Bonferroni critical value Φ⁻¹(1 - 0.05/d) < 3.5 (so a miss or a false
    report has probability below 1e-4). The variances depend on the counts, so
    the population is found by fixed-point iteration."""
    spec = _spec(name, 0)
    d = spec.domain_size
    big = np.arange(min(4, d - 1))
    counts = np.zeros(d, dtype=np.int64)
    counts[big] = 1000
    sd = 0.0
    for _ in range(60):
        new_sd = float(np.sqrt(spec.count_variance(counts).max()))
        if abs(new_sd - sd) <= 1e-3 * new_sd:
            break
        sd = new_sd
        threshold = 5.0 * sd
        counts[big] = np.ceil(threshold + sd * np.array([10.0, 9.0, 8.0, 7.0])[: big.size])
    else:
        pytest.fail(f"{name}: no population is large enough for its own noise (sd {sd:.0f} for n {counts.sum()})")
    rng = np.random.default_rng([7, zlib.crc32(name.encode())])
    est = _estimate(spec, counts, rng)
    hh = est.heavy_hitters(alpha=0.05, threshold=threshold)
    assert sorted(hh.tolist()) == big.tolist(), (hh, counts[big], threshold, est.counts[: big.size + 2])
    assert np.all(np.diff(est.counts[hh]) <= 0)
    assert est.heavy_hitters(alpha=0.05, threshold=float(counts.sum())).size == 0


def test_heavy_hitters_rule_and_validation() -> None:
    """The selection rule on a hand-made estimate: (count - t) / se > Φ⁻¹(1 - α/d)."""
    counts = np.array([100.0, 30.0, 22.0, 60.0, -5.0])
    variance = np.full(5, 100.0)
    est = estimate_from_counts(make_spec("grr", epsilon=1.0, domain_size=5), counts, 200, variance=variance)
    z = stats.norm.isf(0.05 / 5)  # 2.326
    assert 22 < z * 10 < 30
    assert est.heavy_hitters(alpha=0.05).tolist() == [0, 3, 1]  # 30/10 > 2.326 > 22/10
    assert est.heavy_hitters(alpha=0.05, threshold=10.0).tolist() == [0, 3]
    assert est.heavy_hitters(alpha=0.5).tolist() == [0, 3, 1, 2]  # z = Φ⁻¹(0.9) = 1.28
    for alpha in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="alpha"):
            est.heavy_hitters(alpha=alpha)


def test_interval_is_normal_interval_around_estimate() -> None:
    spec = make_spec("grr", epsilon=1.0, domain_size=4)
    est = estimate_from_counts(spec, np.array([50.0, 30.0, 15.0, 5.0]), 100, confidence=0.9)
    half = stats.norm.ppf(0.95) * np.sqrt(est.variance)
    np.testing.assert_allclose(est.ci_high - est.counts, half)
    np.testing.assert_allclose(est.counts - est.ci_low, half)
    np.testing.assert_allclose(est.variance, spec.count_variance(est.counts))
