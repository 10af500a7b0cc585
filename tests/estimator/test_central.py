"""Central-DP releases: exact samplers (distribution, not just moments),
unbiasedness and stated noise scale, and empirical privacy audits with negative
controls. Fixed seeds; tolerances from the theoretical variances (docstrings)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from estimator.accounting.accountant import epsilon_pld
from estimator.accounting.central import (
    GaussianCounts,
    LaplaceCounts,
    SparseVector,
    bernoulli_exp,
    discrete_gaussian,
    discrete_laplace,
    release_above_threshold,
)
from ldp_core.errors import SpecError
from ldp_core.privacy_events import DiscreteGaussianEvent, DiscreteLaplaceEvent, PureDPEvent


def dlap_pmf(x: np.ndarray, b: float) -> np.ndarray:
    """P[x] = (1 - r)/(1 + r) r^|x|, r = e^{-1/b}."""
    r = math.exp(-1.0 / b)
    return (1 - r) / (1 + r) * r ** np.abs(x)


def dgauss_pmf(x: np.ndarray, sigma: float) -> np.ndarray:
    """P[x] = e^{-x²/2σ²} / Σ_y e^{-y²/2σ²}."""
    half = int(40 * sigma) + 40
    z = np.exp(-(np.arange(-half, half + 1) ** 2) / (2 * sigma**2)).sum()
    return np.exp(-(x.astype(float) ** 2) / (2 * sigma**2)) / z


def chi2_pvalue(samples: np.ndarray, pmf, support: int) -> float:
    """Pearson χ² of the counts in [-support, support] plus one bin for the rest."""
    x = np.arange(-support, support + 1)
    p = pmf(x)
    expected = np.append(p, 1 - p.sum()) * samples.size
    inside = np.abs(samples) <= support
    obs = np.append(np.bincount(samples[inside] + support, minlength=x.size), (~inside).sum())
    keep = expected > 5
    rest_obs, rest_exp = obs[~keep].sum(), expected[~keep].sum()
    obs, expected = np.append(obs[keep], rest_obs), np.append(expected[keep], rest_exp)
    stat = ((obs - expected) ** 2 / expected).sum()
    return float(stats.chi2.sf(stat, obs.size - 1))


# -- exact samplers --------------------------------------------------------------
@pytest.mark.parametrize("gamma_num, gamma_den", [(3, 10), (1, 1), (5, 2), (7, 3), (0, 1)])
def test_bernoulli_exp_is_exact(gamma_num, gamma_den):
    """Mean of N Bernoulli(p) draws: |mean - p| < 4 sqrt(p(1-p)/N), p = exp(-γ)."""
    rng = np.random.default_rng(11)
    n = 100_000
    draws = bernoulli_exp(np.full(n, gamma_num, dtype=np.int64), np.full(n, gamma_den, dtype=np.int64), rng)
    p = math.exp(-gamma_num / gamma_den)
    assert abs(draws.mean() - p) <= 4 * math.sqrt(p * (1 - p) / n) + 1e-12


@pytest.mark.parametrize("b", [0.4, 1.0, 6.5])
def test_discrete_laplace_has_the_exact_distribution(b):
    rng = np.random.default_rng(5)
    x = discrete_laplace(b, 100_000, rng)
    assert chi2_pvalue(x, lambda v: dlap_pmf(v, b), int(8 * b) + 3) > 1e-3
    # negative control: a 10 % wrong scale is rejected with these many samples
    assert chi2_pvalue(x, lambda v: dlap_pmf(v, 1.1 * b), int(8 * b) + 3) < 1e-6


@pytest.mark.parametrize("sigma", [0.6, 2.0, 9.3])
def test_discrete_gaussian_has_the_exact_distribution(sigma):
    rng = np.random.default_rng(6)
    x = discrete_gaussian(sigma, 100_000, rng)
    assert chi2_pvalue(x, lambda v: dgauss_pmf(v, sigma), int(5 * sigma) + 2) > 1e-3
    assert chi2_pvalue(x, lambda v: dgauss_pmf(v, 1.1 * sigma), int(5 * sigma) + 2) < 1e-6


def test_large_parameters_take_the_big_integer_path():
    """σ = 10^5 makes the acceptance test's integers exceed int64; the result must still
    have the right spread: sd of the sample sd ≈ σ / sqrt(2N)."""
    rng = np.random.default_rng(8)
    x = discrete_gaussian(1e5, 3000, rng)
    assert abs(x.std() - 1e5) < 4 * 1e5 / math.sqrt(2 * 3000)
    assert abs(x.mean()) < 4 * 1e5 / math.sqrt(3000)


# -- mechanisms: unbiasedness and stated scale -------------------------------------
def _moments(pmf, half: int) -> tuple[float, float]:
    x = np.arange(-half, half + 1)
    p = pmf(x)
    return float((x**2 * p).sum()), float((x**4 * p).sum())


@pytest.mark.parametrize("mech", [LaplaceCounts(0.5), LaplaceCounts(2.0, sensitivity=3), GaussianCounts(3.5)])
def test_release_is_unbiased_with_the_stated_variance(mech):
    """Release N copies of counts [0, 7, 1000]: the noise mean is within 4 sqrt(σ²/N) of 0,
    and its variance within 4 sqrt((μ4 - σ⁴)/N) of the stated ``variance`` (σ² and μ4
    computed here from the noise pmf)."""
    rng = np.random.default_rng(21)
    truth = np.tile(np.array([0, 7, 1000]), 40_000)
    noise = (mech.release(truth, rng) - truth).astype(np.float64)
    if isinstance(mech, LaplaceCounts):
        b = float(mech.scale)
        m2, m4 = _moments(lambda v: dlap_pmf(v, b), int(60 * b) + 20)
    else:
        m2, m4 = _moments(lambda v: dgauss_pmf(v, mech.sigma), int(40 * mech.sigma) + 20)
    n = noise.size
    assert mech.variance == pytest.approx(m2, rel=1e-6)
    assert abs(noise.mean()) < 4 * math.sqrt(m2 / n)
    assert abs(noise.var() - m2) < 4 * math.sqrt((m4 - m2**2) / n)


def test_stated_scales_and_events():
    lap = LaplaceCounts(0.3, sensitivity=2)
    assert 2 / 0.3 <= lap.scale < 2 / 0.3 + 2**-20
    assert lap.event == DiscreteLaplaceEvent(float(lap.scale), 2)
    assert lap.event.epsilon <= 0.3
    g = GaussianCounts.for_epsilon(1.0, 1e-6)
    assert g.event == DiscreteGaussianEvent(g.sigma, 1)
    assert epsilon_pld(g.event, 1e-6) <= 1.0 < epsilon_pld(DiscreteGaussianEvent(g.sigma * 0.99), 1e-6)
    assert g.variance < g.sigma**2  # the discrete Gaussian's variance is below σ² (CKS 2020)
    svt = SparseVector(1.0, threshold=10, max_answers=3)
    e1, e2 = svt.epsilon_split
    assert e1 + e2 == pytest.approx(1.0) and e2 / e1 == pytest.approx(6 ** (2 / 3))
    assert svt.event == PureDPEvent(1.0)
    b1, b2 = svt.scales
    assert b1 >= 1 / e1 and b2 >= 6 / e2


def test_invalid_parameters_are_refused():
    for bad in (
        lambda: LaplaceCounts(0),
        lambda: LaplaceCounts(1.0, sensitivity=0.5),
        lambda: GaussianCounts(-1.0),
        lambda: SparseVector(1.0, float("nan")),
        lambda: SparseVector(1.0, 3, max_answers=0),
    ):
        with pytest.raises(SpecError):
            bad()
    with pytest.raises(SpecError, match="integers"):
        LaplaceCounts(1.0).release([1.5, 2.0], np.random.default_rng(0))


def test_default_randomness_is_the_os_csprng():
    """Without a generator, releases draw from the OS CSPRNG: two releases differ."""
    a = LaplaceCounts(0.1).release(np.zeros(64, dtype=np.int64))
    b = LaplaceCounts(0.1).release(np.zeros(64, dtype=np.int64))
    assert not np.array_equal(a, b)


# -- empirical audits --------------------------------------------------------------
def _cp(k: int, n: int, alpha: float = 1e-6) -> tuple[float, float]:
    """Clopper-Pearson interval for a binomial proportion (two-sided, level 1 - alpha)."""
    lo = stats.beta.ppf(alpha / 2, k, n - k + 1) if k > 0 else 0.0
    hi = stats.beta.ppf(1 - alpha / 2, k + 1, n - k) if k < n else 1.0
    return float(lo), float(hi)


def _audit_threshold_events(x0: np.ndarray, x1: np.ndarray, eps: float, delta: float, ks) -> tuple[bool, bool]:
    """For events E_k = {output >= k}: (no violation provable, a violation proven), where a
    violation at k means P1(E_k) > e^ε P0(E_k) + δ with both probabilities replaced by their
    Clopper-Pearson bounds (lower for P1, upper for P0)."""
    sound, violated = True, False
    for k in ks:
        p1_lo, _ = _cp(int((x1 >= k).sum()), x1.size)
        _, p0_hi = _cp(int((x0 >= k).sum()), x0.size)
        if p1_lo > math.exp(eps) * p0_hi + delta:
            sound, violated = False, True
    return sound, violated


def test_laplace_audit_is_tight_and_catches_a_broken_scale():
    """Neighbouring counts 0 and 1 (sensitivity 1). For the discrete Laplace the ratio
    P[1 + X >= k] / P[X >= k] is exactly e^ε for every k >= 1, so the audit's lower bound
    on ε must approach ε but never exceed it; a mechanism with half the scale (2ε) must
    be caught."""
    rng = np.random.default_rng(31)
    eps, n = 1.0, 200_000
    mech = LaplaceCounts(eps)
    x0 = mech.release(np.zeros(n, dtype=np.int64), rng)
    x1 = mech.release(np.ones(n, dtype=np.int64), rng)
    sound, _ = _audit_threshold_events(x0, x1, eps, 0.0, range(1, 4))
    assert sound
    k = 1
    p1_lo, _ = _cp(int((x1 >= k).sum()), n)
    _, p0_hi = _cp(int((x0 >= k).sum()), n)
    assert math.log(p1_lo / p0_hi) > 0.9 * eps  # the bound is nearly attained
    broken = LaplaceCounts(2 * eps)
    b0 = broken.release(np.zeros(n, dtype=np.int64), rng)
    b1 = broken.release(np.ones(n, dtype=np.int64), rng)
    _, caught = _audit_threshold_events(b0, b1, eps, 0.0, range(1, 4))
    assert caught


def test_gaussian_audit_holds_at_its_delta_and_catches_half_the_noise():
    """Calibrated for (ε=1, δ=1e-5). Any event E_k must satisfy P1 <= e^ε P0 + δ; with σ
    halved the pair (0, 1) violates it at the k maximizing P1 - e^ε P0 of the broken pmf."""
    rng = np.random.default_rng(32)
    eps, delta, n = 1.0, 1e-5, 200_000
    mech = GaussianCounts.for_epsilon(eps, delta)
    ks = range(1, int(4 * mech.sigma))
    x0 = mech.release(np.zeros(n, dtype=np.int64), rng)
    x1 = mech.release(np.ones(n, dtype=np.int64), rng)
    assert _audit_threshold_events(x0, x1, eps, delta, ks)[0]
    broken = GaussianCounts(mech.sigma / 4)
    grid = np.arange(-200, 201)
    pmf = dgauss_pmf(grid, broken.sigma)
    tail0 = np.array([pmf[grid >= k].sum() for k in ks])
    tail1 = np.array([pmf[grid >= k - 1].sum() for k in ks])
    k_best = list(ks)[int(np.argmax(tail1 - math.exp(eps) * tail0))]
    b0 = broken.release(np.zeros(n, dtype=np.int64), rng)
    b1 = broken.release(np.ones(n, dtype=np.int64), rng)
    assert _audit_threshold_events(b0, b1, eps, delta, [k_best])[1]


def test_sparse_vector_selection_probability_matches_its_noise():
    """One query at the threshold, c = 1: P[select] = P[ν - ρ >= 0] with ν, ρ independent
    discrete Laplace of the stated scales, computed here by convolving their pmfs;
    |freq - p| < 4 sqrt(p(1-p)/N)."""
    rng = np.random.default_rng(41)
    svt = SparseVector(1.0, threshold=50, max_answers=1)
    b1, b2 = (float(b) for b in svt.scales)
    grid = np.arange(-400, 401)
    diff = np.convolve(dlap_pmf(grid, b2), dlap_pmf(grid, b1)[::-1])  # pmf of ν - ρ on [-800, 800]
    p = float(diff[800:].sum())
    n = 100_000
    hits = int(svt.select_rows(np.full((n, 1), 50), rng).sum())
    assert abs(hits / n - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_sparse_vector_behaviour_and_audit():
    rng = np.random.default_rng(42)
    counts = np.array([0, 10_000, 5, 20_000, 30_000, 7])
    svt = SparseVector(2.0, threshold=1000, max_answers=2)
    assert list(svt.select(counts, rng)) == [1, 3]  # the first two far above, in order
    rows = svt.select_rows(np.tile(counts, (50, 1)), rng)
    assert rows.shape == (50, 6) and np.all(rows.sum(axis=1) == 2) and np.all(rows[:, [1, 3]])
    assert SparseVector(2.0, threshold=1e6).select(counts, rng).size == 0
    idx, values, event = release_above_threshold(counts, 1000, 1.0, 1.0, 3, rng=rng)
    assert list(idx) == [1, 3, 4]
    assert np.all(np.abs(values - counts[idx]) < 200)
    assert event.events[0] == PureDPEvent(1.0)
    # audit: three queries at T-1 (D) vs T (D': one person added, +1 to each); the outcome is
    # the selected index or nothing. No outcome may be provably more than e^ε likelier.
    eps, n = 1.0, 100_000
    svt = SparseVector(eps, threshold=0, max_answers=1, monotonic=True)
    out = {}
    for name, q in (("D", np.array([-1, -1, -1])), ("D'", np.array([0, 0, 0]))):
        mask = svt.select_rows(np.tile(q, (n, 1)), rng)
        out[name] = np.where(mask.any(axis=1), np.argmax(mask, axis=1), -1)
    for a, b in (("D", "D'"), ("D'", "D")):
        for o in (-1, 0, 1, 2):
            lo, _ = _cp(int((out[a] == o).sum()), n)
            _, hi = _cp(int((out[b] == o).sum()), n)
            assert lo <= math.exp(eps) * hi
