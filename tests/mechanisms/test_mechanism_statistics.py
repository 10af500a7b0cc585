"""Seeded statistical checks of every mechanism: unbiasedness, exact variance, intervals.

Setup. For each spec of each mechanism's profile, a fixed population of
``n = N_USERS`` users holds deterministic Zipf(1.1)-shaped true counts
``c_1..c_D``. In each of ``T = TRIALS`` independent trials their values are
privatized with ``spec.encode`` (under the profile's ``fresh_trial_spec(spec, t)``
when it defines one, so hash-based mechanisms are averaged over their hash
choice), aggregated with ``estimator.oracles.accumulator_for`` and estimated.
The standardized errors are

    z[t, j] = (ĉ[t, j] - c_j) / sqrt(V_j),     V_j = spec.count_variance(c)_j.

If the estimate is unbiased and ``count_variance`` is the exact variance,
E z = 0 and Var z = 1 for every item. ``ĉ`` is a sum of n independent bounded
per-user terms, so z is close to normal (CLT); that is the only approximation.

Checks (each may fail a correct mechanism with probability at most about
``ALPHA``; the seeds are fixed, so results are reproducible):

* unbiasedness: the per-item mean over trials m_j = mean_t z[t, j] is
  N(0, 1/T). Reject if max_j sqrt(T) |m_j| > Φ⁻¹(1 - α / (2D)) (Bonferroni
  over the D items, valid whatever the correlation between items).
* variance, per item: s_j² = Σ_t (z[t, j] - m_j)² / (T - 1) is
  χ²_{T-1} / (T - 1). Reject if some s_j² leaves
  [χ²_{T-1}(α/(4D)), χ²_{T-1}(1 - α/(4D))] / (T - 1) (Bonferroni over items).
* variance, pooled across trials: items of one trial are correlated (GRR's
  estimates sum to n; binary RR's two errors are exact negatives), so pooling
  over items as if independent would be wrong. Trials are independent, so pool
  the per-trial statistic Q_t = mean_j z[t, j]², i.i.d. over t with E Q_t = 1.
  With correlated normal z, Q_t is approximately (Satterthwaite) χ²_k / k with
  k = 2 (E Q)² / Var Q (k = D for independent items, k = 1 for perfectly
  correlated ones); k is estimated from the sample moments of Q_t (it does not
  change if z is rescaled). Then T k Q̄ ~ χ²_{Tk}: reject if Q̄ leaves
  [χ²_{Tk}(α/4), χ²_{Tk}(1 - α/4)] / (Tk).
* interval coverage: the share of (trial, item) pairs whose ``ci_low..ci_high``
  holds c_j. Per-trial shares are i.i.d. in [0, 1] with mean μ = 0.95 (nominal);
  a [0, 1] variable with mean μ is at most as spread as Bernoulli(μ) (convex
  order), so T × coverage is at most as spread as Binomial(T, 0.95): reject
  outside that binomial's [α/2, 1 - α/2] quantiles.

Power (negative controls, run on every mechanism from the same z): dividing z
by sqrt(1.25) or sqrt(0.8) (a count_variance off by that factor) moves every
s_j² by 20-25 %, about 8 standard deviations sqrt(2 / (T-1)) = 0.026 at
T = 3000, so the variance check must reject; adding 0.3 to z (a bias of 0.3
standard errors, in every item or in one item only) moves sqrt(T) m_j by
0.3 sqrt(3000) = 16, far beyond Φ⁻¹(1 - α/(2D)) < 6, so the unbiasedness
check must reject.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
from scipy import stats

from estimator.oracles import accumulator_for
from tests.support.spec_cases import optional, profile_spec, spec_cases

N_USERS = 1000
TRIALS = 3000
ALPHA = 1e-5
NOMINAL = 0.95
SEED = 20240611

pytestmark = pytest.mark.slow
CASES = spec_cases()


def zipf_counts(n: int, d: int, exponent: float = 1.1) -> np.ndarray:
    """Deterministic counts proportional to 1 / rank^exponent, summing to n."""
    w = 1.0 / np.arange(1, d + 1, dtype=np.float64) ** exponent
    c = np.floor(n * w / w.sum()).astype(np.int64)
    c[0] += n - int(c.sum())
    return c


@dataclasses.dataclass(frozen=True)
class Trials:
    true: np.ndarray  # (D,)
    z: np.ndarray  # (T, D) standardized errors
    covered: np.ndarray  # (T, D) whether the estimate's interval holds the truth
    confidence: float


def run_trials(name: str, index: int) -> Trials:
    """T seeded trials of one spec."""
    prof, spec = profile_spec(name, index)
    fresh = optional(prof, "fresh_trial_spec", None)
    true = zipf_counts(N_USERS, spec.domain_size)
    values = np.repeat(np.arange(spec.domain_size, dtype=np.int64), true)
    rng = np.random.default_rng([SEED, zlib.crc32(name.encode()), index])
    z = np.empty((TRIALS, spec.domain_size))
    covered = np.empty((TRIALS, spec.domain_size), dtype=bool)
    confidence = NOMINAL
    for t in range(TRIALS):
        s = fresh(spec, t) if fresh is not None else spec
        acc = accumulator_for(s)
        acc.update(s.encode(values, rng))
        est = acc.estimate()
        var = np.asarray(s.count_variance(true), dtype=np.float64)
        assert var.shape == true.shape and np.all(np.isfinite(var)) and np.all(var > 0), (
            f"{name}: count_variance must be finite and positive, got {var}"
        )
        z[t] = (est.counts - true) / np.sqrt(var)
        covered[t] = (est.ci_low <= true) & (true <= est.ci_high)
        confidence = est.confidence
    return Trials(true, z, covered, confidence)


def mean_check(z: np.ndarray, alpha: float = ALPHA) -> str | None:
    """Unbiasedness (see the module docstring); a message if rejected."""
    t, d = z.shape
    stat = np.sqrt(t) * np.abs(z.mean(axis=0))
    bound = stats.norm.isf(alpha / (2 * d))
    j = int(np.argmax(stat))
    if stat[j] > bound:
        return f"item {j}: sqrt(T)|mean z| = {stat[j]:.2f} > {bound:.2f} (mean z = {z[:, j].mean():+.4f})"
    return None


def variance_check(z: np.ndarray, alpha: float = ALPHA) -> str | None:
    """Per-item χ² check and pooled-across-trials check (module docstring); a message if rejected."""
    t, d = z.shape
    problems = []
    s2 = z.var(axis=0, ddof=1)
    lo = stats.chi2.ppf(alpha / (4 * d), t - 1) / (t - 1)
    hi = stats.chi2.isf(alpha / (4 * d), t - 1) / (t - 1)
    bad = np.nonzero((s2 < lo) | (s2 > hi))[0]
    if bad.size:
        problems.append(
            f"per-item variance of z outside [{lo:.3f}, {hi:.3f}] for items {bad[:5].tolist()}: "
            f"{np.round(s2[bad[:5]], 3).tolist()}"
        )
    q = (z**2).mean(axis=1)
    k = 2.0 * q.mean() ** 2 / q.var(ddof=1)
    dof = t * k
    q_lo = stats.chi2.ppf(alpha / 4, dof) / dof
    q_hi = stats.chi2.isf(alpha / 4, dof) / dof
    if not q_lo <= q.mean() <= q_hi:
        problems.append(f"pooled mean of z² {q.mean():.4f} outside [{q_lo:.4f}, {q_hi:.4f}] (k = {k:.1f})")
    return "; ".join(problems) or None


def coverage_check(covered: np.ndarray, nominal: float, alpha: float = ALPHA) -> str | None:
    """Interval coverage against Binomial(T, nominal) (module docstring); a message if rejected."""
    t = covered.shape[0]
    share = covered.mean(axis=1)
    lo = stats.binom.ppf(alpha / 2, t, nominal) / t
    hi = stats.binom.isf(alpha / 2, t, nominal) / t
    cov = float(share.mean())
    if not lo <= cov <= hi:
        worst = int(np.argmin(covered.mean(axis=0)))
        return f"coverage {cov:.4f} outside [{lo:.4f}, {hi:.4f}] (lowest item {worst}: {covered[:, worst].mean():.3f})"
    return None


@pytest.mark.parametrize("name,index", CASES)
def test_mechanism_statistics(name: str, index: int) -> None:
    """Unbiasedness, variance and interval coverage, then the negative controls:
    the same checks, on the same trials, must reject a variance off by a factor
    1.25 or 0.8 (in all items, or in the first or last item alone) and a bias of
    0.3 standard errors (in all items, or in the rarest item alone). One test per
    spec, so parallel workers never repeat the trials."""
    r = run_trials(name, index)
    assert r.confidence == NOMINAL
    failures = [
        f"{label}: {msg}"
        for label, msg in [
            ("unbiasedness", mean_check(r.z)),
            ("variance", variance_check(r.z)),
            ("interval coverage", coverage_check(r.covered, r.confidence)),
        ]
        if msg is not None
    ]
    controls: list[tuple[str, np.ndarray, object]] = []
    for factor in (1.25, 0.8):
        controls.append((f"variance scaled by {factor}", r.z / np.sqrt(factor), variance_check))
    for j in (0, r.z.shape[1] - 1):
        off = r.z.copy()
        off[:, j] /= np.sqrt(1.25)
        controls.append((f"variance of item {j} alone scaled by 1.25", off, variance_check))
    controls.append(("bias of 0.3 standard errors in every item", r.z + 0.3, mean_check))
    one = r.z.copy()
    one[:, -1] += 0.3
    controls.append(("bias of 0.3 standard errors in the rarest item", one, mean_check))
    failures += [f"negative control not detected: {label}" for label, z, check in controls if check(z) is None]  # type: ignore[operator]
    assert not failures, "\n".join(failures)
