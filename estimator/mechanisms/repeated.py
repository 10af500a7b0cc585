r"""Server side of the repeated counters: 1BitMean (a mean) and dBitFlip (a histogram).

Both keep exact integer sums (:class:`~estimator.oracles.base.LinearState`), so partitions merge exactly in
any order. The mechanisms and their variances are derived in :mod:`ldp_core.mechanisms.repeated`.

**1BitMean.** State: ``ones``, the number of reports with bit 1. With ``e = e^ε`` each report's unbiased
summand is ``Y = (b(e + 1) − 1)/(e − 1)``, so ``Σ Y = (ones·(e + 1) − n)/(e − 1)`` and the mean is
``low + (high − low)·ΣY/n``. Its variance is estimated by the sample variance of the ``Y_i`` (two values,
``e/(e − 1)`` ``ones`` times and ``−1/(e − 1)`` the rest) over ``n``: whatever the rounding contributes (nothing,
for one collection of distinct devices: see the mechanism module) is in the summands and so in the estimate.
The interval is normal, ``± z·sd``.

**dBitFlip.** State per bucket ``v``: ``sampled_v`` (reports that sampled ``v``) and ``ones_v`` (of those, bit
1). The share estimate is ``h_v = (k/(n d))(ones_v (e + 1) − sampled_v)/(e − 1)`` with ``e = e^{ε/2}``,
unbiased and possibly slightly negative (it is not projected). Its variance is the exact
:meth:`~ldp_core.mechanisms.repeated.DBitFlipSpec.share_variance` with the estimated counts
``n·clip(h, 0, 1)`` plugged in; the bands are ``h ± z·sd``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from estimator.mechanisms.numeric import QUANTILE_LEVELS, DistributionEstimate, MeanEstimate, quantiles_of
from estimator.oracles.base import LinearState
from estimator.result import z_value
from ldp_core.mechanisms.repeated import DBitFlipSpec, OneBitMeanSpec

__all__ = ["OneBitMeanAccumulator", "DBitFlipAccumulator", "cdf_quantiles"]


class OneBitMeanAccumulator(LinearState):
    """The count of 1 bits of 1BitMean reports (module docstring)."""

    spec_type = OneBitMeanSpec
    spec: OneBitMeanSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        return {"ones": np.zeros(1, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        self.spec.check_records(records)
        self.sums["ones"][0] += int(np.count_nonzero(records["bit"]))

    def estimate(self, confidence: float = 0.95) -> MeanEstimate:
        n = self.n
        if n == 0:
            nan = np.full(1, math.nan)
            return MeanEstimate(nan, nan, nan, nan, 0, confidence)
        e = self.spec.exp_epsilon
        ones = float(self.sums["ones"][0])
        hi, lo = e / (e - 1.0), -1.0 / (e - 1.0)
        mean_t = (ones * hi + (n - ones) * lo) / n
        if n > 1:
            s2 = (ones * (hi - mean_t) ** 2 + (n - ones) * (lo - mean_t) ** 2) / (n - 1)
        else:
            s2 = self.spec.worst_case_variance()
        width = float(self.spec.high) - float(self.spec.low)
        mean = np.array([float(self.spec.low) + width * mean_t])
        var = np.array([s2 / n * width * width])
        sd = np.sqrt(var)
        z = z_value(confidence)
        return MeanEstimate(mean, var, mean - z * sd, mean + z * sd, n, confidence)


class DBitFlipAccumulator(LinearState):
    r"""Per-bucket sample and 1-bit counts of dBitFlip reports (module docstring).

    **Different buckets' estimates are uncorrelated.** ``h_u`` and ``h_v`` are sums over independent devices
    of ``Z_u = (k/d) S_u Y_u`` and ``Z_v = (k/d) S_v Y_v`` (``S`` whether the bucket was sampled, ``Y`` its
    unbiased bit). For one device and ``u ≠ v``: ``E[Z_u Z_v] = (k/d)² P[S_u S_v = 1] E[Y_u Y_v | both
    sampled]``, and given both are sampled the two bits are drawn independently given ``x`` (each with its
    own coin), so ``E[Y_u Y_v | ·] = E[Y_u | ·] E[Y_v | ·] = 1[x ∈ u] 1[x ∈ v] = 0``; and
    ``E[Z_u] E[Z_v] = 1[x ∈ u] 1[x ∈ v] = 0``. So ``Cov(Z_u, Z_v) = 0`` per device and, summing over
    independent devices, ``Cov(h_u, h_v) = 0``. (Uncorrelated, not independent: the sampling couples them;
    by the multivariate CLT the vector is asymptotically normal with this diagonal covariance, hence
    asymptotically independent.)

    **Quantiles.** Read from the estimated CDF ``F(edge_i) = Σ_{j<i} h_j / Σ_j h_j`` (the running sums of the
    *unbiased* shares, so unbiased at each edge up to the normalization), made monotone by a running maximum
    and clipped to ``[0, 1]``, linear within a bucket. (Projecting the histogram first, negative shares to 0,
    would bias the tail quantiles outwards: the clipped noise of the empty buckets beyond the data adds
    mass there.) Their intervals are Monte Carlo: ``draws`` histograms ``h + N(0, diag(Var))`` (independent
    normal bin errors, as justified above), each read the same way, and the ``(1 ∓ confidence)/2``
    percentiles of their quantiles. ``iterations`` is 0 (no EM) and ``bootstrap`` the number of draws.
    """

    spec_type = DBitFlipSpec
    spec: DBitFlipSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        k = self.spec.k
        return {"sampled": np.zeros(k, dtype=np.int64), "ones": np.zeros(k, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        spec = self.spec
        spec.check_records(records)
        b = records["bucket"].reshape(records.shape[0], -1).astype(np.intp).reshape(-1)
        bits = spec.bits_of(records).reshape(-1).astype(bool)
        self.sums["sampled"] += np.bincount(b, minlength=spec.k)
        self.sums["ones"] += np.bincount(b[bits], minlength=spec.k)

    def shares(self) -> np.ndarray:
        """The unbiased share estimates ``h`` (may be slightly negative; they sum to about 1)."""
        spec = self.spec
        if self.n == 0:
            return np.full(spec.k, math.nan)
        e = spec.e_half
        s = self.sums["sampled"].astype(np.float64)
        o = self.sums["ones"].astype(np.float64)
        return (spec.k / (self.n * spec.d)) * (o * (e + 1.0) - s) / (e - 1.0)

    def estimate(
        self,
        confidence: float = 0.95,
        *,
        quantiles: Sequence[float] = QUANTILE_LEVELS,
        draws: int = 200,
        rng: np.random.Generator | None = None,
    ) -> DistributionEstimate:
        """The histogram with normal bands and quantiles with Monte Carlo intervals (class docstring);
        ``rng`` defaults to one seeded from the counts (one state, one answer)."""
        spec = self.spec
        n = self.n
        edges = spec.bin_edges()
        qs = tuple(float(q) for q in quantiles)
        if n == 0:
            nan = np.full(spec.k, math.nan)
            qn = np.full(len(qs), math.nan)
            return DistributionEstimate(nan, nan, nan, edges, qs, qn, qn, qn, 0, 0, 0, confidence)
        h = self.shares()
        var = spec.share_variance(n * np.clip(h, 0.0, 1.0), n)
        sd = np.sqrt(var)
        z = z_value(confidence)
        qv = cdf_quantiles(h, edges, qs)
        if rng is None:
            seed = np.frombuffer(self.sums["ones"].tobytes(), dtype=np.uint32)[:64].tolist()
            rng = np.random.default_rng([*seed, n & 0xFFFFFFFF])
        if draws:
            sims = h[None, :] + rng.standard_normal((draws, spec.k)) * sd[None, :]
            qq = np.array([cdf_quantiles(x, edges, qs) for x in sims])
            lo_p, hi_p = 50.0 * (1.0 - confidence), 50.0 * (1.0 + confidence)
            # the point is the centre of the same draws the interval comes from, so it lies inside it
            q_lo, q, q_hi = np.percentile(qq, [lo_p, 50.0, hi_p], axis=0)
        else:
            q = q_lo = q_hi = qv.copy()
        return DistributionEstimate(
            h, h - z * sd, h + z * sd, edges, qs, q, q_lo, q_hi, n, 0, draws, confidence, quantiles_ems=qv
        )


def cdf_quantiles(h: np.ndarray, edges: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """The ``qs`` quantiles of unbiased (possibly negative) shares ``h`` over ``edges``: the running sums,
    normalized, made monotone and clipped (class docstring of :class:`DBitFlipAccumulator`)."""
    total = float(np.sum(h))
    if not total > 0:
        return quantiles_of(np.full(h.size, 1.0 / h.size), edges, qs)
    cdf = np.clip(np.maximum.accumulate(np.concatenate(([0.0], np.cumsum(h))) / total), 0.0, 1.0)
    cdf[-1] = 1.0
    q = np.asarray(qs, dtype=np.float64)
    # the first edge where the CDF reaches q, linear within the bucket (flat stretches are skipped)
    i = np.clip(np.searchsorted(cdf, q, side="left"), 1, cdf.size - 1)
    lo, hi = cdf[i - 1], cdf[i]
    frac = np.where(hi > lo, (q - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
    return np.asarray(edges[i - 1] + np.clip(frac, 0.0, 1.0) * (edges[i] - edges[i - 1]))
