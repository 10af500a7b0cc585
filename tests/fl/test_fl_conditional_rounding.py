"""Conditional (rejection) stochastic rounding (issue 18; Kairouz, Liu, Steinke, ICML 2021): the norm bound B
holds for every output, one draw is rejected with probability ≤ β, and the bias stays within its bound."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from ldp_core.fl.compress import MAX_ROUNDING_DRAWS, RingQuantization, StochasticQuantizer
from ldp_core.fl.errors import ModelError

# (bits, coordinate bound c, length, clip norm C): the scenario's unrotated b = 4 and b = 8, its rotated b = 4
# (c = 4C/√D), and a coarse small case where one draw's norm varies most relative to B
CONFIGS = [(4, 2.0, 210, 2.0), (8, 2.0, 210, 2.0), (4, 0.5, 256, 2.0), (2, 1.0, 16, 1.0)]


def _adversarial(q: StochasticQuantizer, d: int, clip_norm: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Inputs at or near the worst case: random directions at ‖x‖ = C, coordinates on the grid's midpoints
    (±kΔ: the largest two-point range of q_i², at the most coordinates ‖x‖ ≤ C allows), exact grid points,
    all of C on one coordinate, the flat vector C/√d, zero, and ‖x‖ = 3C (a device told a larger clip norm)."""
    out = []
    for _ in range(3):
        v = rng.normal(size=d)
        out.append(v * clip_norm / np.linalg.norm(v))
    for k in (1, 2):
        m = min(d, int((clip_norm / (k * q.step)) ** 2))  # m coordinates of ±kΔ: norm kΔ√m ≤ C
        v = np.zeros(d)
        v[:m] = k * q.step * rng.choice([-1.0, 1.0], size=m)
        out.append(v)
    grid = q.dequantize(rng.integers(0, q.levels, size=d))
    out.append(grid * min(1.0, clip_norm / np.linalg.norm(grid)))  # scaled: off the grid unless the factor is 1
    on = np.full(d, q.step / 2)  # the grid points ±Δ/2 nearest zero: q = x, the smallest norm on the grid
    out.append(on * min(1.0, clip_norm / np.linalg.norm(on)))
    one = np.zeros(d)
    one[0] = min(clip_norm, q.clip)
    out.append(one)
    out.append(np.full(d, clip_norm / math.sqrt(d)))
    out.append(np.zeros(d))
    v = rng.normal(size=d)
    out.append(3 * clip_norm * v / np.linalg.norm(v))
    return out


@pytest.mark.parametrize(("bits", "c", "d", "clip_norm"), CONFIGS)
def test_the_norm_bound_holds_for_every_output(bits: int, c: float, d: int, clip_norm: float) -> None:
    q = StochasticQuantizer(bits, c)
    rng = np.random.default_rng([bits, d])
    for beta in (0.01, 0.5):
        bound = q.conditional_bound(clip_norm, d, beta)
        assert bound <= q.norm_bound(clip_norm, d)
        for x in _adversarial(q, d, clip_norm, rng):
            for _ in range(60):
                codes, draws = q.quantize_conditional(x, rng, bound)
                assert 1 <= draws <= MAX_ROUNDING_DRAWS + 1
                assert np.linalg.norm(q.dequantize(codes)) <= bound
                assert codes.max() < q.levels


def test_the_fallback_meets_a_bound_that_almost_every_draw_misses() -> None:
    # B just above the grid's smallest norm √d·Δ/2: a random draw almost never meets it, the fallback does
    q = StochasticQuantizer(3, 1.0)
    d = 16
    floor = q.step * math.sqrt(d) / 2
    rng = np.random.default_rng(5)
    fallbacks = 0
    for _ in range(300):
        x = rng.normal(size=d)
        x *= rng.uniform(1, 3) / np.linalg.norm(x)  # far above the floor: a random draw rarely lands there
        codes, draws = q.quantize_conditional(x, rng, floor * 1.01)
        assert np.linalg.norm(q.dequantize(codes)) <= floor * 1.01
        fallbacks += draws > MAX_ROUNDING_DRAWS
    assert fallbacks > 250
    with pytest.raises(ModelError, match="smallest norm"):
        q.quantize_conditional(np.ones(d), rng, floor * 0.99)
    with pytest.raises(ModelError, match="max_draws"):
        q.quantize_conditional(np.ones(d), rng, 10.0, max_draws=0)
    with pytest.raises(ModelError, match="beta"):
        q.conditional_bound(1.0, d, 1.0)


def test_round_toward_zero_never_adds_more_than_the_grid_floor() -> None:
    # ‖q‖² ≤ ‖x‖² + d·Δ²/4 for every x (the fallback's guarantee), and |q_i| ≤ |x_i| where |x_i| ≥ Δ/2
    rng = np.random.default_rng(6)
    for bits, c in ((1, 1.0), (2, 1.0), (5, 0.3), (8, 2.0)):
        q = StochasticQuantizer(bits, c)
        x = rng.uniform(-1.2 * c, 1.2 * c, size=(2000, 32))
        x[:10] = q.dequantize(rng.integers(0, q.levels, size=(10, 32)))  # exactly on the grid
        y = q.dequantize(q.round_toward_zero(x))
        xc = np.clip(x, -c, c)
        assert np.all((y**2).sum(axis=1) <= (xc**2).sum(axis=1) + 32 * q.step**2 / 4 + 1e-12)
        big = np.abs(xc) >= q.step / 2
        assert np.all(np.abs(y[big]) <= np.abs(xc[big]) + 1e-12)
        assert np.allclose(y[:10], x[:10])


@pytest.mark.parametrize(("bits", "c", "d", "clip_norm"), CONFIGS)
def test_one_draw_is_rejected_with_probability_at_most_beta(bits: int, c: float, d: int, clip_norm: float) -> None:
    """Per-draw rejection on the adversarial inputs with ‖x‖ ≤ C over n seeded draws: the one-sided 99.9 %
    Clopper-Pearson lower bound of the rejection rate must stay below β (the Hoeffding bound of
    :meth:`conditional_bound`). And without the slack (B₀² = C² + Σ Var[q_i], the mean of ‖q‖²) a draw is
    rejected far more often than β: the slack term is what the acceptance rests on."""
    q = StochasticQuantizer(bits, c)
    rng = np.random.default_rng([bits, d, 1])
    n = 4000
    worst_slackless = 0.0
    for beta in (0.01, 0.1, math.exp(-0.5)):
        bound = q.conditional_bound(clip_norm, d, beta)
        for x in _adversarial(q, d, clip_norm, rng)[:-1]:  # not the 3C input
            norms = np.linalg.norm(q.dequantize(q.quantize(np.tile(x, (n, 1)), rng)), axis=1)
            k = int((norms > bound).sum())
            lower = stats.beta.ppf(0.001, k, n - k + 1) if k else 0.0
            assert lower <= beta, (beta, k)
            if beta == 0.01:
                slackless = math.sqrt(float(np.sum(np.clip(x, -c, c) ** 2)) + float(q.variance(x).sum()))
                worst_slackless = max(worst_slackless, float((norms > slackless * (1 + 1e-12)).mean()))
    assert worst_slackless > 0.3


def test_conditional_rounding_is_biased_within_its_bound() -> None:
    """A bound at the mean of ‖q‖² rejects about half the draws, so the bias is measurable: ‖E[q] − x‖ from
    20,000 seeded calls is nonzero (the error's projection on x is below −5 standard errors: the conditioning
    shrinks q) and below :meth:`conditional_bias_bound` at the measured rejection rate (plus 5 standard errors
    of the mean, √(tr Cov/n)). The fallbacks' count is binomial with p^K, K = MAX_ROUNDING_DRAWS."""
    q = StochasticQuantizer(3, 1.0)
    d, n = 16, 20_000
    rng = np.random.default_rng(7)
    x = rng.normal(size=d)
    x /= np.linalg.norm(x)  # C = 1, every coordinate inside c = 1
    bound = math.sqrt(float(x @ x) + float(q.variance(x).sum()))
    outs = np.empty((n, d))
    draws = np.empty(n, dtype=int)
    for i in range(n):
        codes, draws[i] = q.quantize_conditional(x, rng, bound)
        outs[i] = q.dequantize(codes)
    assert np.all(np.linalg.norm(outs, axis=1) <= bound)
    accepted = draws <= MAX_ROUNDING_DRAWS
    p = float((draws - 1).sum() / (draws - 1 + accepted).sum())  # rejected draws over all random draws
    assert 0.3 < p < 0.7
    fb = int((~accepted).sum())
    mean_fb = n * p**MAX_ROUNDING_DRAWS
    assert abs(fb - mean_fb) <= 5 * math.sqrt(mean_fb * (1 - p**MAX_ROUNDING_DRAWS))
    err = outs.mean(axis=0) - x
    se = math.sqrt(float(np.trace(np.cov(outs.T))) / n)
    proj_se = float(np.std(outs @ x)) / math.sqrt(n)
    assert err @ x < -5 * proj_se  # biased towards zero
    p_hi = p + 5 * math.sqrt(p * (1 - p) / draws.sum())
    assert np.linalg.norm(err) <= q.conditional_bias_bound(x, p_hi) + 5 * se


def test_the_bias_bound_at_the_default_beta_is_small() -> None:
    # the scenario's settings at β = 0.01, ‖x‖ = C = 2: the linear form β·Δ√d/(1 − β) decides, below 2 % of C
    # for 4 bits and 0.2 % for 8 bits (the figures docs/fl/COMPRESSION.md quotes)
    rng = np.random.default_rng(9)
    for bits, c, d, share in ((4, 2.0, 210, 0.02), (8, 2.0, 210, 0.002), (4, 0.5, 256, 0.006)):
        q = StochasticQuantizer(bits, c)
        x = rng.normal(size=d)
        x *= 2.0 / np.linalg.norm(x)
        b = q.conditional_bias_bound(np.clip(x, -c, c), 0.01)
        assert b == pytest.approx(0.01 * q.step * math.sqrt(d) / 0.99, rel=1e-6)
        assert b < share * 2.0


def test_ring_quantization_enforces_its_signed_bound_for_any_rotation_seed() -> None:
    rq = RingQuantization.for_task({"kind": "quantize", "bits": 4, "rotate": True, "beta": 0.5}, 1.0, 8, 100)
    assert rq.rounding == "conditional" and rq.norm_bound == rq.sensitivity(1.0, 100)
    rng = np.random.default_rng(10)
    for seed in range(100):
        x = rng.normal(size=100)
        x *= rng.choice([1.0, 2.0]) / np.linalg.norm(x)  # at the clip norm, or twice it (a server's lie)
        codes = rq.encode(x, seed, rng)
        assert np.linalg.norm(rq.quantizer.dequantize(codes)) <= rq.norm_bound


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ε(δ) of a Gaussian mechanism whose shift is μ noise standard deviations (Balle & Wang,
    ICML 2018): δ(ε) = Φ(μ/2 − ε/μ) − e^ε·Φ(−μ/2 − ε/μ), solved for ε."""
    from scipy.optimize import brentq

    def gap(e: float) -> float:
        return float(stats.norm.cdf(mu / 2 - e / mu) - math.exp(e) * stats.norm.cdf(-mu / 2 - e / mu)) - delta

    return float(brentq(gap, 0.0, 50.0))


def _released_projections(rq: RingQuantization, xs: list[np.ndarray], sd: float, u: np.ndarray, n: int) -> np.ndarray:
    """n releases of the job's path on the cohort xs, projected on u: each device's conditionally rounded
    codes (a fresh rotation seed each time), the ring sum decoded (masks cancel exactly, so they are left
    out), plus N(0, sd²) per coordinate."""
    rng = np.random.default_rng([len(xs), int(sd * 1e6)])
    d = u.size
    out = np.empty(n)
    for k in range(n):
        total = sum((rq.encode(x, k, rng).astype(np.uint64) for x in xs), np.zeros(rq.length(d), np.uint64))
        s = rq.decode_sum(total % (1 << rq.ring_bits), len(xs), k, d) if xs else np.zeros(d)
        out[k] = float((s + rng.normal(0.0, sd, size=d)) @ u)
    return out


def test_audit_the_release_with_noise_sigma_b_on_neighbouring_cohorts() -> None:
    """Empirical privacy audit of the job's release with conditional rounding (add/remove neighbours): world
    1 holds the target x (‖x‖ = C, its direction u known to the adversary) and two other devices, world 0
    only the two. The adversary's best test projects the release on u. With noise σ·B and ‖q‖ ≤ B the shift
    is at most 1/σ noise deviations: μ̂ must stay below 1/σ + 5 standard errors (√(2/n)), and the likelihood
    ratio of the events T > τ (Clopper–Pearson 99.9 % bounds) below e^ε + δ, ε the exact Gaussian figure for
    σ at δ = 1e-5, the accountant's per-round charge. The same audit with the noise halved (σ·B/2: a job that
    understated S) finds μ̂ above 1/σ: the test can tell."""
    sigma, clip_norm, d, n, delta = 1.0, 1.0, 16, 3000, 1e-5
    rq = RingQuantization.for_task({"kind": "quantize", "bits": 4, "rotate": True}, clip_norm, 4, d)
    rng = np.random.default_rng(31)
    x = np.linspace(1.0, 2.0, d)
    x *= clip_norm / np.linalg.norm(x)
    u = x / np.linalg.norm(x)
    others = [v * 0.8 * clip_norm / np.linalg.norm(v) for v in rng.normal(size=(2, d))]
    eps = _gaussian_epsilon(1.0 / sigma, delta)
    for scale, honest in ((1.0, True), (0.5, False)):
        sd = sigma * rq.norm_bound * scale
        t0 = _released_projections(rq, others, sd, u, n)
        t1 = _released_projections(rq, [*others, x], sd, u, n)
        pooled = math.sqrt((t0.var(ddof=1) + t1.var(ddof=1)) / 2)
        mu_hat = (t1.mean() - t0.mean()) / pooled
        if not honest:
            assert mu_hat > 1.0 / sigma + 5 * math.sqrt(2 / n)
            continue
        assert mu_hat < 1.0 / sigma + 5 * math.sqrt(2 / n)
        for tau in np.quantile(t0, np.linspace(0.05, 0.999, 30)):
            k1, k0 = int((t1 > tau).sum()), int((t0 > tau).sum())
            lo1 = stats.beta.ppf(0.0005, k1, n - k1 + 1) if k1 else 0.0
            hi0 = stats.beta.ppf(0.9995, k0 + 1, n - k0) if k0 < n else 1.0
            assert lo1 <= math.exp(eps) * hi0 + delta, (tau, lo1, hi0, eps)
