"""Server side of the numeric mechanisms: means (Duchi, PM, HM) and distributions (Square Wave).

Both are :class:`~estimator.oracles.base.LinearState` accumulators: integer
sums that merge exactly in any order (the records are fixed point or bin
indices, see :mod:`ldp_core.mechanisms.numeric` and
:mod:`ldp_core.mechanisms.square_wave`).

**Means.** Per attribute ``j``: ``S_j = Σ value`` and ``Q_j = Σ value²`` over
the reports that sampled ``j`` (Duchi 1-D: ``S`` from the count of ``+``
bits). With ``r = d/k`` and the fixed-point step ``u = C/32767``, each
user's summand is ``y_j = r u value`` (0 if ``j`` was not sampled), so

    mean_t = r u S_j / n,          estimate = low + (mean_t + 1)(high − low)/2,

unbiased. Its variance is estimated from the same reports, with the sample
variance of the ``y_j``: ``s² = (r² u² Q_j − n mean_t²)/(n − 1)``, and
``Var[estimate] = s²/n`` (the summands are independent), times
``((high − low)/2)²``. The interval is the normal one, ``± z·sd``. (The
theoretical variance at known values is ``Σ_i Var[y_ij]/n²``, from
:meth:`~ldp_core.mechanisms.numeric.MeanSpec.summand_variance`; the
simulator reports it as ``mean_variance``.)

**Distributions** (Li et al., SIGMOD 2020, Sec. 5): the counts ``y`` of the
reported output bins and the exact transition matrix ``M``
(:meth:`~ldp_core.mechanisms.square_wave.SquareWaveSpec.transition_matrix`)
give the histogram ``x`` over the input bins as the maximum of the
likelihood ``Σ_j y_j log (M x)_j``, by EM with smoothing (EMS): each step is
``x ← S(x ⊙ Mᵀ(y / M x) / n)`` with ``S`` the binomial smoothing
``[1, 2, 1]/4`` (the ends reflect, so mass is kept), until the
log-likelihood improves by less than a relative ``tol`` (``10⁻⁹``) or after
``max_iter`` steps.
Quantiles are read from the estimated CDF, linear within a bin. Their
intervals, and the histogram's confidence bands, come from a **parametric
bootstrap**: ``R`` report-count vectors ``y* ~ Multinomial(n, M x̂)`` are
drawn, EMS is rerun from ``x̂`` on each, and each bin's and quantile's
interval is the *basic* (reverse-percentile) one, ``[2θ̂ − θ*₊, 2θ̂ − θ*₋]``
with ``θ*₋, θ*₊`` the ``(1 ∓ confidence)/2`` percentiles of the resampled
``θ*`` (Davison and Hinkley 1997, Sec. 5.2). The resampled estimates are
smoothed once more than ``x̂``, so their shift from ``x̂`` estimates EMS's
own bias (it flattens peaks and fattens thin tails), and the basic interval
moves against it; the percentile interval would move with it. It is still
a first-order correction: at small ε the tail quantiles (p99) stay biased
towards the middle of the range by more than the interval covers, which
the tests and docs/NUMERIC.md measure.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from estimator.oracles.base import LinearState
from estimator.result import z_value
from ldp_core.mechanisms.numeric import SCALE, DuchiSpec, MeanSpec
from ldp_core.mechanisms.square_wave import SquareWaveSpec

__all__ = [
    "MeanEstimate",
    "MeanAccumulator",
    "DistributionEstimate",
    "SquareWaveAccumulator",
    "ems",
    "quantiles_of",
    "SquareWaveOperator",
    "numeric_accumulator_for",
]


@dataclasses.dataclass(frozen=True)
class MeanEstimate:
    """Per attribute: the mean in the value's units, its estimated variance and a normal interval."""

    mean: np.ndarray
    variance: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    n: int
    confidence: float = 0.95

    @property
    def std_error(self) -> np.ndarray:
        return np.sqrt(self.variance)

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "confidence": self.confidence,
            "mean": self.mean.tolist(),
            "variance": self.variance.tolist(),
            "ci_low": self.ci_low.tolist(),
            "ci_high": self.ci_high.tolist(),
        }


class MeanAccumulator(LinearState):
    """Exact integer sums of mean reports (module docstring)."""

    spec_type = MeanSpec
    spec: MeanSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        d = self.spec.dims
        return {"sum": np.zeros(d, dtype=np.int64), "sumsq": np.zeros(d, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        spec = self.spec
        if spec.dims == 1:
            if isinstance(spec, DuchiSpec):
                plus = int(np.count_nonzero(records["bit"]))
                self.sums["sum"][0] += SCALE * (2 * plus - records.size)
                self.sums["sumsq"][0] += SCALE * SCALE * records.size
                return
            v = records["value"].astype(np.int64)
            self.sums["sum"][0] += int(v.sum())
            self.sums["sumsq"][0] += int(np.dot(v, v))
            return
        attr = records["attr"].reshape(-1).astype(np.intp)
        v = records["value"].reshape(-1).astype(np.int64)
        # bincount sums in float64: exact while a chunk's partial sums stay below 2**53
        step = max(1, (1 << 53) // (SCALE * SCALE) // 2)
        for start in range(0, v.size, step):
            a, w = attr[start : start + step], v[start : start + step]
            self.sums["sum"] += np.bincount(a, weights=w, minlength=spec.dims).astype(np.int64)
            self.sums["sumsq"] += np.bincount(a, weights=w * w, minlength=spec.dims).astype(np.int64)

    def estimate(self, confidence: float = 0.95) -> MeanEstimate:
        spec = self.spec
        n = self.n
        d = spec.dims
        if n == 0:
            nan = np.full(d, math.nan)
            return MeanEstimate(nan, nan, nan, nan, 0, confidence)
        ru = (spec.dims / spec.k) * spec.output_bound() / SCALE
        s = self.sums["sum"].astype(np.float64)
        q = self.sums["sumsq"].astype(np.float64)
        mean_t = ru * s / n
        if n > 1:
            sample_var = np.maximum(ru * ru * q - n * mean_t**2, 0.0) / (n - 1)
        else:
            sample_var = np.full(d, spec.worst_case_variance())
        h = spec.half_width
        var = sample_var / n * h * h
        mean = spec.denormalize(mean_t)
        z = z_value(confidence)
        sd = np.sqrt(var)
        return MeanEstimate(mean, var, mean - z * sd, mean + z * sd, n, confidence)


# -- distributions ------------------------------------------------------------------------------


def _smooth(x: np.ndarray) -> np.ndarray:
    """Binomial smoothing ``[1, 2, 1]/4`` with reflecting ends (keeps the total)."""
    padded = np.concatenate(([x[0]], x, [x[-1]]))
    return (padded[:-2] + 2.0 * padded[1:-1] + padded[2:]) / 4.0


class SquareWaveOperator:
    """``M x`` and ``Mᵀ z`` for Square Wave's transition matrix in ``O(B log B)``, never forming ``M``.

    ``M = q·w 1ᵀ + (p − q)·O`` with ``O[j, i] = |J_j ∩ [c_i − b, c_i + b]|``. With
    ``H(u) = Σ_i x_i · clip(u − c_i + b, 0, 2b)``, ``(O x)_j = H(hi_j) − H(lo_j)``, and ``H`` is read off two
    prefix sums over the sorted centres (``Σ x_i`` and ``Σ x_i c_i``). ``(Oᵀ z)_i`` is the integral of the
    step function ``Σ_j z_j 1[J_j]`` over ``[c_i − b, c_i + b]``: a difference of its (piecewise-linear)
    running integral, interpolated. The tests check both against the dense matrix.
    """

    def __init__(self, spec: SquareWaveSpec) -> None:
        self.b, self.p, self.q = spec.b, spec.p, spec.q
        self.edges = -self.b + np.arange(spec.n_out + 1) * ((1.0 + 2.0 * self.b) / spec.n_out)
        self.widths = np.diff(self.edges)
        self.centres = (np.arange(spec.bins) + 0.5) / spec.bins
        self.shape = (spec.n_out, spec.bins)

    def _h(self, u: np.ndarray, p0: np.ndarray, p1: np.ndarray) -> np.ndarray:
        b, c = self.b, self.centres
        below = np.searchsorted(c, u - b, side="right")  # centres ≤ u − b: fully covered
        within = np.searchsorted(c, u + b, side="right")  # centres < u + b (ties have measure zero)
        s0_b, s0_w = p0[below], p0[within]
        s1_b, s1_w = p1[below], p1[within]
        return 2.0 * b * s0_b + (u + b) * (s0_w - s0_b) - (s1_w - s1_b)

    def matvec(self, x: np.ndarray) -> np.ndarray:
        p0 = np.concatenate(([0.0], np.cumsum(x)))
        p1 = np.concatenate(([0.0], np.cumsum(x * self.centres)))
        h = self._h(self.edges, p0, p1)
        return self.q * self.widths * p0[-1] + (self.p - self.q) * np.diff(h)

    def rmatvec(self, z: np.ndarray) -> np.ndarray:
        k = np.concatenate(([0.0], np.cumsum(z * self.widths)))
        c, b = self.centres, self.b
        integral = np.interp(c + b, self.edges, k) - np.interp(c - b, self.edges, k)
        return self.q * float(np.dot(self.widths, z)) + (self.p - self.q) * integral


def ems(
    counts: np.ndarray,
    matrix: np.ndarray | SquareWaveOperator,
    *,
    start: np.ndarray | None = None,
    smoothing: bool = True,
    tol: float = 1e-7,
    max_iter: int = 50_000,
    accelerate: bool = True,
) -> tuple[np.ndarray, int]:
    """The EM (with ``smoothing``: EMS) estimate of the input distribution from output ``counts``.

    Returns the distribution (sums to 1) and the number of EM steps taken. ``matrix`` is a dense
    transition matrix or an operator with ``matvec``/``rmatvec``. The iteration stops when one EM step
    moves the distribution by less than ``tol`` in L1. With ``accelerate`` the steps are extrapolated by
    SQUAREM (Varadhan and Roland, Scand. J. Statist. 2008, scheme S3: from ``x``, ``F(x)`` and
    ``F(F(x))``, step ``x − 2αr + α²v`` with ``r = F(x) − x``, ``v = F(F(x)) − 2F(x) + x``,
    ``α = min(−1, −‖r‖/‖v‖)``, projected back onto the simplex and followed by one EM step), which
    reaches the same fixed point in about a tenth of the steps (the tests compare both).
    """
    y = np.asarray(counts, dtype=np.float64)
    n = float(y.sum())
    mv: Callable[[np.ndarray], np.ndarray]
    rmv: Callable[[np.ndarray], np.ndarray]
    if isinstance(matrix, np.ndarray):
        dense = np.asarray(matrix, dtype=np.float64)
        dense_t = np.ascontiguousarray(dense.T)
        cols = dense.shape[1]
        mv, rmv = dense.__matmul__, dense_t.__matmul__
    else:
        mv, rmv, cols = matrix.matvec, matrix.rmatvec, matrix.shape[1]
    if n <= 0:
        return np.full(cols, 1.0 / cols), 0
    nz = y > 0

    def step(x: np.ndarray) -> np.ndarray:
        mx = mv(x)
        x = x * rmv(np.where(nz, y / np.maximum(mx, 1e-300), 0.0)) / n
        if smoothing:
            x = _smooth(x)
        x = np.maximum(x, 0.0)
        return x / x.sum()

    x = np.full(cols, 1.0 / cols) if start is None else np.asarray(start, dtype=np.float64) / np.sum(start)
    steps = 0
    while steps < max_iter:
        x1 = step(x)
        steps += 1
        if float(np.abs(x1 - x).sum()) < tol:
            return x1, steps
        if not accelerate:
            x = x1
            continue
        x2 = step(x1)
        steps += 1
        if float(np.abs(x2 - x1).sum()) < tol:
            return x2, steps
        r = x1 - x
        v = x2 - x1 - r
        nv = float(np.linalg.norm(v))
        alpha = min(-1.0, -float(np.linalg.norm(r)) / nv) if nv > 0 else -1.0
        jump = np.maximum(x - 2.0 * alpha * r + alpha * alpha * v, 0.0)
        x = step(jump / jump.sum()) if jump.sum() > 0 else x2
        steps += 1
    return x, steps


#: the quantiles a distribution reports by default (p10, p25, p50, p75, p90, p99)
QUANTILE_LEVELS = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)


def quantiles_of(hist: np.ndarray, edges: np.ndarray, qs: Sequence[float]) -> np.ndarray:
    """The ``qs`` quantiles of a histogram (probabilities per bin between ``edges``), linear within a bin."""
    cdf = np.concatenate(([0.0], np.cumsum(hist)))
    cdf /= cdf[-1]
    return np.interp(np.asarray(qs, dtype=np.float64), cdf, edges)


@dataclasses.dataclass(frozen=True)
class DistributionEstimate:
    """A histogram over ``edges`` (probabilities per bin) with bootstrap bands, and quantiles with intervals."""

    hist: np.ndarray
    hist_low: np.ndarray
    hist_high: np.ndarray
    edges: np.ndarray
    quantile_levels: tuple[float, ...]
    quantiles: np.ndarray
    quantiles_low: np.ndarray
    quantiles_high: np.ndarray
    n: int
    iterations: int
    bootstrap: int
    confidence: float = 0.95
    #: Square Wave: EMS's own histogram and quantiles, before the bootstrap's bias correction (else None)
    hist_ems: np.ndarray | None = None
    quantiles_ems: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "confidence": self.confidence,
            "edges": self.edges.tolist(),
            "hist": self.hist.tolist(),
            "hist_low": self.hist_low.tolist(),
            "hist_high": self.hist_high.tolist(),
            "quantiles": {
                f"p{round(q * 100, 6):g}": {"value": float(v), "ci_low": float(lo), "ci_high": float(hi)}
                for q, v, lo, hi in zip(self.quantile_levels, self.quantiles, self.quantiles_low, self.quantiles_high)
            },
            "iterations": self.iterations,
            "bootstrap": self.bootstrap,
        }


class SquareWaveAccumulator(LinearState):
    """Counts of reported output bins; :meth:`estimate` runs EMS and the bootstrap (module docstring)."""

    spec_type = SquareWaveSpec
    spec: SquareWaveSpec

    def _empty_sums(self) -> dict[str, np.ndarray]:
        return {"bins": np.zeros(self.spec.n_out, dtype=np.int64)}

    def _add(self, records: np.ndarray) -> None:
        self.sums["bins"] += np.bincount(records["bin"].astype(np.intp), minlength=self.spec.n_out)

    def estimate(
        self,
        confidence: float = 0.95,
        *,
        quantiles: Sequence[float] = QUANTILE_LEVELS,
        bootstrap: int = 50,
        rng: np.random.Generator | None = None,
        smoothing: bool = True,
    ) -> DistributionEstimate:
        """EMS, then ``bootstrap`` parametric resamples (``rng``: their randomness; default seeded from the
        counts, so one state gives one answer).

        Point estimates and intervals come from the same bootstrap: the interval is the basic one,
        [2θ̂ − θ*₀.₉₇₅, 2θ̂ − θ*₀.₀₂₅], and the point is its bias-corrected centre 2θ̂ − median(θ*), which lies
        inside it by construction (EMS's smoothing bias moves the resamples, and the basic interval moves
        against it; the uncorrected EMS point could fall outside). The histogram's points and bands are
        clipped at 0 and scaled together so that the points sum to 1 (a common positive factor keeps every
        point inside its band). Without resamples the point is EMS's."""
        spec = self.spec
        y = self.sums["bins"]
        m = SquareWaveOperator(spec)
        edges = spec.bin_edges()
        x, iters = ems(y, m, smoothing=smoothing)
        qs = tuple(float(q) for q in quantiles)
        qv = quantiles_of(x, edges, qs)
        if rng is None:
            rng = np.random.default_rng(np.frombuffer(y.tobytes(), dtype=np.uint32)[:64].tolist() or [0])
        n = int(y.sum())
        lo_p, hi_p = 50.0 * (1.0 - confidence), 50.0 * (1.0 + confidence)
        if bootstrap and n:
            probs = np.maximum(m.matvec(x), 0.0)
            probs /= probs.sum()
            hs = np.empty((bootstrap, x.size))
            qq = np.empty((bootstrap, len(qs)))
            for r in range(bootstrap):
                yb = rng.multinomial(n, probs)
                xb, _ = ems(yb, m, start=x, smoothing=smoothing)
                hs[r], qq[r] = xb, quantiles_of(xb, edges, qs)
            # basic (reverse-percentile) intervals: [2θ̂ − θ*_hi, 2θ̂ − θ*_lo], and their centre 2θ̂ − median θ*
            b_lo, b_mid, b_hi = np.percentile(hs, [lo_p, 50.0, hi_p], axis=0)
            h_lo, h_hi = np.maximum(2 * x - b_hi, 0.0), np.maximum(2 * x - b_lo, 0.0)
            h = np.maximum(2 * x - b_mid, 0.0)
            total = h.sum()
            if total > 0:
                h, h_lo, h_hi = h / total, h_lo / total, h_hi / total
            else:
                h = x.copy()
                h_lo, h_hi = np.minimum(h_lo, h), np.maximum(h_hi, h)
            c_lo, c_mid, c_hi = np.percentile(qq, [lo_p, 50.0, hi_p], axis=0)
            q_lo, q_hi = 2 * qv - c_hi, 2 * qv - c_lo
            q = 2 * qv - c_mid
        else:
            h, q = x.copy(), qv.copy()
            h_lo = h_hi = x.copy()
            q_lo = q_hi = qv.copy()
        return DistributionEstimate(
            h, h_lo, h_hi, edges, qs, q, q_lo, q_hi, n, iters, bootstrap, confidence, hist_ems=x, quantiles_ems=qv
        )


def numeric_accumulator_for(spec: MeanSpec | SquareWaveSpec) -> MeanAccumulator | SquareWaveAccumulator:
    """A fresh accumulator for a numeric spec."""
    if isinstance(spec, SquareWaveSpec):
        return SquareWaveAccumulator(spec)
    return MeanAccumulator(spec)
