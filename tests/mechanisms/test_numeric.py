"""Numeric mechanisms: means (Duchi, PM, HM) and distributions (Square Wave), tested statistically.

Tolerances come from the stated variances: a sample mean of N draws is within 5 standard errors
(sqrt(Var/N)) of its expectation, a sample variance within 5·sqrt((μ₄ − σ⁴)/N) ≤ 5·C²/sqrt(N) of the true
variance (the outputs are bounded by C). With fixed seeds a correct implementation passes; a wrong
constant (checked as negative controls below) moves the statistic far outside the band.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimator.mechanisms.numeric import MeanAccumulator, SquareWaveAccumulator, SquareWaveOperator, ems, quantiles_of
from ldp_core.errors import DomainError, FrameError, SpecError
from ldp_core.mechanisms.numeric import (
    EPSILON_STAR,
    SCALE,
    DuchiSpec,
    HybridSpec,
    MeanSpec,
    PiecewiseSpec,
    best_mean_mechanism,
    pm_variance,
)
from ldp_core.mechanisms.square_wave import SquareWaveSpec, square_wave_b
from tests.mechanisms.test_privacy_audit import ALPHA, cp_lower, cp_upper

MEANS = [DuchiSpec, PiecewiseSpec, HybridSpec]
N = 200_000


def outputs(spec: MeanSpec, value: float, n: int, rng: np.random.Generator) -> np.ndarray:
    return spec.values_of(spec.encode(np.full(n, value), rng))


@pytest.mark.parametrize("cls", MEANS, ids=lambda c: c.name)
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0])
@pytest.mark.parametrize("t", [-1.0, 0.0, 0.3, 1.0])
def test_one_report_is_unbiased_with_the_stated_variance(cls: type[MeanSpec], epsilon: float, t: float) -> None:
    spec = cls(epsilon=epsilon, low=-1, high=1)
    rng = np.random.default_rng([11, MEANS.index(cls), int(epsilon * 10), int(t * 10) + 10])
    y = outputs(spec, t, N, rng)
    c = spec.output_bound()
    var = float(spec.output_variance(t))
    assert np.abs(y).max() <= c * (1 + 1e-9)
    assert abs(y.mean() - t) < 5 * math.sqrt(var / N)
    # the fixed-point rounding adds at most (C/S)²/4 (ldp_core/mechanisms/numeric.py)
    assert abs(y.var() - var) < 5 * c * c / math.sqrt(N) + (c / SCALE) ** 2


def test_a_wrong_pm_constant_is_caught() -> None:
    """Negative control: PM's variance with e^ε in place of e^{ε/2} is outside the band above."""
    spec = PiecewiseSpec(epsilon=1.0, low=-1, high=1)
    y = outputs(spec, 0.3, N, np.random.default_rng(3))
    wrong = float(pm_variance(0.3, 2.0))  # the ε/2 of the formula evaluated at 2ε/2 = ε
    c = spec.output_bound()
    assert abs(y.var() - wrong) > 5 * c * c / math.sqrt(N)


@pytest.mark.parametrize("cls", MEANS, ids=lambda c: c.name)
def test_several_attributes_with_sampling(cls: type[MeanSpec]) -> None:
    """d = 6 attributes, k = 2 sampled at ε = 6 (ε/k = 3 each): each attribute's mean is unbiased and a
    user's summand has Var = (d/k)(Var₁(t; ε/k) + t²) − t²."""
    d, k, n = 6, 2, 150_000
    spec = cls(epsilon=6.0, low=0, high=10, dims=d, sample=k)
    assert spec.k == 2 and spec.epsilon_each == 3.0
    rng = np.random.default_rng(5)
    values = np.tile(np.linspace(0.5, 9.5, d), (n, 1))
    rec = spec.encode(values, rng)
    spec.check_records(rec)
    assert rec["attr"].shape == (n, k) and np.all(rec["attr"][:, 0] != rec["attr"][:, 1])
    acc = MeanAccumulator(spec)
    acc.update(rec)
    est = acc.estimate()
    t = spec.normalize(values[0])
    sd = np.sqrt(spec.summand_variance(t) / n) * spec.half_width
    assert np.all(np.abs(est.mean - values[0]) < 5 * sd)
    assert np.allclose(np.sqrt(est.variance), sd, rtol=0.05)  # the estimated variance matches the formula


def test_default_sampling_follows_the_paper() -> None:
    assert PiecewiseSpec(epsilon=1.0, low=0, high=1, dims=10).k == 1
    assert PiecewiseSpec(epsilon=8.0, low=0, high=1, dims=10).k == 3  # ⌊8/2.5⌋
    assert PiecewiseSpec(epsilon=30.0, low=0, high=1, dims=4).k == 4  # capped at d


@pytest.mark.parametrize("cls", MEANS, ids=lambda c: c.name)
def test_confidence_intervals_cover(cls: type[MeanSpec]) -> None:
    """200 trials of 2,000 users (beta(2,5) values on [0, 60]): the 95% interval covers the true mean of the
    users' values in [0.904, 0.996] of them (0.95 ± 3 binomial standard deviations)."""
    spec = cls(epsilon=1.0, low=0, high=60)
    rng = np.random.default_rng(17)
    hits = 0
    trials = 200
    for _ in range(trials):
        v = rng.beta(2, 5, 2000) * 60
        acc = MeanAccumulator(spec)
        acc.update(spec.encode(v, rng))
        e = acc.estimate()
        hits += int(e.ci_low[0] <= v.mean() <= e.ci_high[0])
    assert 0.904 <= hits / trials <= 0.996


@pytest.mark.parametrize("cls", MEANS, ids=lambda c: c.name)
def test_merging_is_exact_in_any_order(cls: type[MeanSpec]) -> None:
    rng = np.random.default_rng(9)
    for dims in (1, 5):
        spec = cls(epsilon=2.0, low=0, high=1, dims=dims)
        vals = rng.random((9_000, dims)) if dims > 1 else rng.random(9_000)
        rec = spec.encode(vals, rng)
        whole = MeanAccumulator(spec)
        whole.update(rec)
        parts = [MeanAccumulator(spec) for _ in range(3)]
        for i, chunk in enumerate(np.array_split(rec, 7)):
            parts[i % 3].update(chunk)
        merged = parts[2].merge(parts[0]).merge(parts[1])
        assert merged.n == whole.n
        for key in whole.sums:
            assert np.array_equal(merged.sums[key], whole.sums[key])
        restored = MeanAccumulator.from_state(spec, whole.state())
        assert np.array_equal(restored.estimate().mean, whole.estimate().mean)


def test_bad_values_and_records_are_refused() -> None:
    spec = PiecewiseSpec(epsilon=1.0, low=0, high=10)
    rng = np.random.default_rng(0)
    with pytest.raises(DomainError, match="outside"):
        spec.encode([11.0], rng)
    with pytest.raises(DomainError, match="finite"):
        spec.encode([math.nan], rng)
    bad = spec.encode([1.0, 2.0], rng)
    bad["value"][1] = -32768
    with pytest.raises(FrameError, match="record 1"):
        spec.check_records(bad)
    duchi = DuchiSpec(epsilon=1.0, low=0, high=1)
    rec = duchi.encode([0.5], rng)
    rec["bit"] = 2
    with pytest.raises(FrameError):
        duchi.check_records(rec)
    multi = HybridSpec(epsilon=5.0, low=0, high=1, dims=4, sample=2)
    rec = multi.encode(rng.random((3, 4)), rng)
    rec["attr"][0] = [1, 1]
    with pytest.raises(FrameError, match="twice"):
        multi.check_records(rec)
    rec["attr"][0] = [4, 1]
    with pytest.raises(FrameError, match="below 4"):
        multi.check_records(rec)
    with pytest.raises(SpecError, match="below high"):
        PiecewiseSpec(epsilon=1.0, low=1, high=1)
    with pytest.raises(SpecError, match="sample"):
        PiecewiseSpec(epsilon=1.0, low=0, high=1, dims=3, sample=4)


def test_spec_ids_are_canonical() -> None:
    """0 and 0.0 are one range (RFC 8785 writes both as 0), so they give one id."""
    assert PiecewiseSpec(epsilon=1.0, low=0, high=60).spec_id == PiecewiseSpec(epsilon=1, low=0.0, high=60.0).spec_id
    assert PiecewiseSpec(epsilon=1.0, low=0, high=60).spec_id != HybridSpec(epsilon=1.0, low=0, high=60).spec_id


def test_the_best_mechanism_is_duchi_below_epsilon_star_and_hm_above() -> None:
    """Wang et al. 2019: ε* ≈ 0.61; HM's worst-case variance is the lowest above it, Duchi's below."""
    assert 0.60 < EPSILON_STAR < 0.62
    assert best_mean_mechanism(0.3) == "duchi" and best_mean_mechanism(0.6) == "duchi"
    for eps in (0.62, 1.0, 2.0, 5.0):
        assert best_mean_mechanism(eps) == "hm"
        worst = {c.name: c(epsilon=eps, low=0, high=1).worst_case_variance() for c in MEANS}
        assert worst["hm"] <= min(worst.values())


# -- privacy audits (see tests/mechanisms/test_privacy_audit.py for the method) ---------------------


def _ratio_bounds(k1: int, k2: int, n: int) -> tuple[float, float]:
    """Lower and upper confidence bounds on P[E|x]/P[E|x'] (each bound at ALPHA/4, union bound)."""
    a = ALPHA / 4
    l1, u1, l2, u2 = cp_lower(k1, n, a), cp_upper(k1, n, a), cp_lower(k2, n, a), cp_upper(k2, n, a)
    return (l1 / u2 if u2 > 0 else math.inf), (u1 / l2 if l2 > 0 else math.inf)


def _pm_centre_event(spec: MeanSpec, x: float) -> tuple[float, float]:
    """The centre piece [ℓ(t), r(t)] of PM for the normalized input t."""
    h = math.exp(spec.epsilon_each / 2)
    c = (h + 1) / (h - 1)
    left = (c + 1) / 2 * x - (c - 1) / 2
    return left, left + c - 1


AUDIT_N = 400_000


@pytest.mark.parametrize("cls", MEANS, ids=lambda c: c.name)
@pytest.mark.parametrize("pair", [(-1.0, 1.0), (0.0, 1.0), (-0.37, 0.52)])
def test_mean_mechanisms_pass_the_privacy_audit(cls: type[MeanSpec], pair: tuple[float, float]) -> None:
    """Event E: the output lies in PM's centre piece for x (for Duchi: t* > 0 when x > x'). No ratio of
    P[E|x], P[E|x'] (or of their complements) is provably above e^ε; for the pair (−1, 1) the PM and Duchi
    events attain e^ε, so the two-sided interval must contain it."""
    eps = 1.0
    spec = cls(epsilon=eps, low=-1, high=1)
    x, xp = pair
    rng = np.random.default_rng([23, MEANS.index(cls), int(100 * x) + 200])
    yx, yxp = outputs(spec, x, AUDIT_N, rng), outputs(spec, xp, AUDIT_N, rng)
    if cls is DuchiSpec:
        ex, exp_ = yx > 0, yxp > 0
        if x < xp:
            ex, exp_ = ~ex, ~exp_
    else:
        lo, hi = _pm_centre_event(spec, x)
        ex, exp_ = (yx >= lo) & (yx <= hi), (yxp >= lo) & (yxp <= hi)
    for e1, e2 in ((ex, exp_), (~ex, ~exp_)):
        k1, k2 = int(e1.sum()), int(e2.sum())
        low, _ = _ratio_bounds(k1, k2, AUDIT_N)
        low_rev, _ = _ratio_bounds(k2, k1, AUDIT_N)
        assert max(low, low_rev) <= math.exp(eps), (k1, k2)
    if pair == (-1.0, 1.0) and cls is not HybridSpec:
        k1, k2 = int(ex.sum()), int(exp_.sum())
        low, high = _ratio_bounds(k1, k2, AUDIT_N)
        assert low <= math.exp(eps) <= high * 1.0001  # fixed-point rounding at the piece's edge


def test_the_audit_catches_a_pm_that_leaks() -> None:
    """Power: PM run at 2ε while claiming ε gives a centre-piece ratio provably above e^ε."""

    class LeakyPM(PiecewiseSpec):
        def _perturb(self, t: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
            return super()._perturb(t, 2 * epsilon, rng)

        def output_bound(self) -> float:
            h = math.exp(self.epsilon_each)
            return (h + 1) / (h - 1)

    spec = LeakyPM(epsilon=1.0, low=-1, high=1)
    rng = np.random.default_rng(29)
    h = math.exp(1.0)
    c = (h + 1) / (h - 1)
    lo, hi = (c + 1) / 2 - (c - 1) / 2, c
    yx, yxp = outputs(spec, 1.0, AUDIT_N, rng), outputs(spec, -1.0, AUDIT_N, rng)
    k1 = int(((yx >= lo) & (yx <= hi)).sum())
    k2 = int(((yxp >= lo) & (yxp <= hi)).sum())
    low, _ = _ratio_bounds(k1, k2, AUDIT_N)
    assert low > math.exp(1.0)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_square_wave_passes_the_privacy_audit(epsilon: float) -> None:
    """Event E: output bins lying wholly inside x's wave and wholly outside x''s. Its probability ratio is
    p/q = e^ε (times the bins' share), so the interval must contain e^ε and no bound may exceed it."""
    spec = SquareWaveSpec(epsilon=epsilon, low=0, high=1, bins=32)
    rng = np.random.default_rng([31, int(epsilon * 10)])
    b = spec.b
    edges = -b + np.arange(spec.n_out + 1) * ((1 + 2 * b) / spec.n_out)
    for x, xp in ((0.01, 0.99), (0.3, 0.8)):
        cx, cxp = (np.floor(np.array([x, xp]) * 32) + 0.5) / 32
        inside = (edges[:-1] >= cx - b) & (edges[1:] <= cx + b)
        outside = (edges[1:] <= cxp - b) | (edges[:-1] >= cxp + b)
        event = inside & outside
        assert event.any()
        kx = int(event[spec.encode(np.full(AUDIT_N, x), rng)["bin"]].sum())
        kxp = int(event[spec.encode(np.full(AUDIT_N, xp), rng)["bin"]].sum())
        low, high = _ratio_bounds(kx, kxp, AUDIT_N)
        assert low <= math.exp(epsilon) <= high
        low_c, _ = _ratio_bounds(AUDIT_N - kxp, AUDIT_N - kx, AUDIT_N)
        assert low_c <= math.exp(epsilon)


# -- Square Wave's model and estimator ----------------------------------------------------------------


def test_square_wave_width_matches_the_paper() -> None:
    """b = (εe^ε − e^ε + 1)/(2e^ε(e^ε − 1 − ε)); at ε = 1: 1/(2e(e − 2)) ≈ 0.2561."""
    assert square_wave_b(1.0) == pytest.approx(1 / (2 * math.e * (math.e - 2)), rel=1e-12)
    s = SquareWaveSpec(epsilon=1.0, low=0, high=1, bins=100)
    assert s.p / s.q == pytest.approx(math.e)
    assert s.n_out == math.ceil((1 + 2 * s.b) * 100)


def test_the_transition_matrix_is_what_the_encoder_does() -> None:
    """For three inputs, the encoder's output-bin frequencies over 300,000 draws fit M's column (chi-square
    test at level 1e-6), and M's columns sum to 1."""
    from scipy import stats

    spec = SquareWaveSpec(epsilon=1.5, low=0, high=1, bins=16)
    m = spec.transition_matrix()
    assert np.allclose(m.sum(axis=0), 1.0, atol=1e-12)
    rng = np.random.default_rng(37)
    for i in (0, 7, 15):
        x = (i + 0.3) / 16
        counts = np.bincount(spec.encode(np.full(300_000, x), rng)["bin"], minlength=spec.n_out)
        expected = m[:, i] * 300_000
        chi2 = float(((counts - expected) ** 2 / expected).sum())
        assert stats.chi2.sf(chi2, spec.n_out - 1) > 1e-6


def test_the_fast_operator_equals_the_matrix() -> None:
    rng = np.random.default_rng(41)
    for eps, bins in ((0.3, 10), (1.0, 257), (5.0, 64)):
        spec = SquareWaveSpec(epsilon=eps, low=0, high=1, bins=bins)
        m, op = spec.transition_matrix(), SquareWaveOperator(spec)
        x, z = rng.random(bins), rng.random(spec.n_out)
        assert np.allclose(op.matvec(x), m @ x, rtol=0, atol=1e-12)
        assert np.allclose(op.rmatvec(z), m.T @ z, rtol=0, atol=1e-12)


def test_squarem_reaches_the_plain_em_fixed_point() -> None:
    spec = SquareWaveSpec(epsilon=1.0, low=0, high=1, bins=128)
    rng = np.random.default_rng(43)
    acc = SquareWaveAccumulator(spec)
    acc.update(spec.encode(rng.beta(2, 5, 100_000), rng))
    op = SquareWaveOperator(spec)
    fast, fast_steps = ems(acc.sums["bins"], op, tol=1e-10)
    plain, plain_steps = ems(acc.sums["bins"], spec.transition_matrix(), tol=1e-10, accelerate=False)
    assert np.abs(fast - plain).sum() < 1e-5
    assert fast_steps < plain_steps / 3


def test_square_wave_recovers_a_distribution_and_its_quantiles() -> None:
    """200,000 users, beta(2, 5) on [0, 60], ε = 2, B = 64 bins: the EMS histogram is within 0.08 in total
    variation of the users' true histogram, and the basic bootstrap intervals of the median and p90, widened
    by one bin width (the histogram's resolution), contain the true quantiles."""
    spec = SquareWaveSpec(epsilon=2.0, low=0, high=60, bins=64)
    rng = np.random.default_rng(47)
    v = rng.beta(2, 5, 200_000) * 60
    acc = SquareWaveAccumulator(spec)
    acc.update(spec.encode(v, rng))
    est = acc.estimate(bootstrap=30, rng=np.random.default_rng(1), quantiles=(0.5, 0.9))
    truth = np.histogram(v, bins=spec.bin_edges())[0] / v.size
    assert 0.5 * np.abs(est.hist - truth).sum() < 0.08
    width = 60 / 64
    for q, lo, hi in zip(np.quantile(v, [0.5, 0.9]), est.quantiles_low, est.quantiles_high):
        assert lo - width <= q <= hi + width
    assert np.all(est.hist_low <= est.hist_high) and np.all(est.hist_low >= 0)
    assert np.mean((est.hist_low <= truth) & (truth <= est.hist_high)) > 0.5  # bands about the truth
    assert quantiles_of(np.array([0.5, 0.5]), np.array([0.0, 1.0, 2.0]), [0.5])[0] == pytest.approx(1.0)


def test_square_wave_merges_exactly_and_refuses_bad_bins() -> None:
    spec = SquareWaveSpec(epsilon=1.0, low=0, high=1, bins=50)
    rng = np.random.default_rng(53)
    rec = spec.encode(rng.random(5000), rng)
    a, b, whole = SquareWaveAccumulator(spec), SquareWaveAccumulator(spec), SquareWaveAccumulator(spec)
    a.update(rec[:1234])
    b.update(rec[1234:])
    whole.update(rec)
    assert np.array_equal(a.merge(b).sums["bins"], whole.sums["bins"])
    rec["bin"][3] = spec.n_out
    with pytest.raises(FrameError, match="record 3"):
        spec.check_records(rec)
