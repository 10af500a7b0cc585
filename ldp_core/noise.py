"""Exact integer noise: discrete Laplace and discrete Gaussian samplers (Canonne, Kamath, Steinke 2020).

Shared by the server's central releases (:mod:`estimator.accounting.central`) and the devices'
distributed discrete Gaussian (:mod:`ldp_core.fl.ddg`), which is why they live in the SDK: a
device adds its share of the noise itself, before secure aggregation, so the server never holds
the un-noised sum.

The samplers are the integer-arithmetic rejection samplers of Canonne, Kamath and Steinke ("The
Discrete Gaussian for Differential Privacy", NeurIPS 2020, Algorithms 1-3), vectorized over numpy
arrays: every random choice is a uniform integer drawn from the generator and compared with an
integer, so no floating-point number takes part in sampling (which is what defeats Mironov's
attack on floating-point noise, CCS 2012). The Laplace scale is rounded *up* to a multiple of
2^-20 and σ² up to a multiple of 2^-k (relative change below 1e-6): rounding up only adds noise.

Randomness is an argument: on a device pass :func:`ldp_core.randomness.secure_generator` (an
adversary who could predict the noise could subtract it); seeded generators are for simulation.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

from ldp_core.errors import SpecError

__all__ = [
    "discrete_laplace",
    "discrete_gaussian",
    "discrete_gaussian_variance",
    "bernoulli_exp",
    "sigma2_used",
    "laplace_scale_used",
    "LAPLACE_SCALE_DENOMINATOR",
]

#: The Laplace scale is rounded up to a multiple of 1 / this.
LAPLACE_SCALE_DENOMINATOR = 1 << 20
_INT64_SAFE = 1 << 62
#: Integers below this are handled in int64 (products with small factors cannot overflow).
_SMALL = 1 << 40


def _small(arr: np.ndarray, limit: int = _SMALL) -> np.ndarray | None:
    """``arr`` as int64 if all its entries are in [0, limit), else None."""
    if arr.dtype == np.int64:
        return arr if (arr.size == 0 or (int(arr.max()) < limit and int(arr.min()) >= 0)) else None
    if arr.size == 0 or all(0 <= int(v) < limit for v in arr):
        return arr.astype(np.int64)
    return None


def _uniform_below(high: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform integers in [0, high_i) for each positive integer high_i (int64 or Python ints)."""
    small = _small(high, _INT64_SAFE)
    if small is not None:
        return rng.integers(0, small) if small.size else np.zeros(0, dtype=np.int64)
    out = np.empty(high.size, dtype=object)
    for i, h in enumerate(high):
        h = int(h)
        bits = h.bit_length()
        words = (bits + 62) // 63
        while True:
            v = 0
            for w in rng.integers(0, 1 << 63, size=words, dtype=np.int64):
                v = (v << 63) | int(w)
            v &= (1 << bits) - 1
            if v < h:
                out[i] = v
                break
    return out


def _bernoulli_exp_frac(num: np.ndarray, den: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Bernoulli(exp(-num/den)) for integers 0 <= num <= den (CKS 2020, Alg. 1, γ <= 1):
    draw A_k ~ Bernoulli(γ/k) for k = 1, 2, ... until one is 0; return whether that k is odd."""
    n_small, d_small = _small(num), _small(den)
    if n_small is not None and d_small is not None:
        num, den = n_small, d_small  # den * k stays far below 2^63
    else:
        num, den = num.astype(object), den.astype(object)
    k = np.ones(num.size, dtype=np.int64)
    active = np.ones(num.size, dtype=bool)
    while active.any():
        idx = np.nonzero(active)[0]
        kk = k[idx] if den.dtype == np.int64 else k[idx].astype(object)
        a = _uniform_below(den[idx] * kk, rng) < num[idx]
        k[idx[a]] += 1
        active[idx[~a]] = False
    return (k % 2) == 1


def _count_exp_minus_one_successes(size: int, rng: np.random.Generator, cap: np.ndarray | None = None) -> np.ndarray:
    """For each of ``size`` slots, the number of Bernoulli(exp(-1)) successes before the
    first failure, stopping early once it reaches ``cap`` (when given)."""
    v = np.zeros(size, dtype=np.int64)
    alive = np.ones(size, dtype=bool) if cap is None else cap > 0
    one = np.ones(size, dtype=np.int64)
    while alive.any():
        idx = np.nonzero(alive)[0]
        b = _bernoulli_exp_frac(one[idx], one[idx], rng)
        v[idx[b]] += 1
        alive[idx[~b]] = False
        if cap is not None:
            alive &= v < cap
    return v


def bernoulli_exp(num: Any, den: Any, rng: np.random.Generator) -> np.ndarray:
    """Exact Bernoulli(exp(-num/den)) for non-negative integer arrays ``num``, ``den`` > 0:
    floor(γ) draws of Bernoulli(exp(-1)) must all succeed, then one Bernoulli(exp(-frac(γ)))."""
    num = np.atleast_1d(np.asarray(num))
    den = np.broadcast_to(np.atleast_1d(np.asarray(den)), num.shape)
    if num.dtype == np.int64 and den.dtype == np.int64:
        whole, frac = np.divmod(num, den)
    else:
        num, den = num.astype(object), den.astype(object)
        whole = num // den
        frac = num - whole * den
        whole = np.array([min(int(w), _INT64_SAFE) for w in whole], dtype=np.int64)
    out = _count_exp_minus_one_successes(num.size, rng, cap=whole) >= whole
    idx = np.nonzero(out)[0]
    if idx.size:
        out[idx] = _bernoulli_exp_frac(frac[idx], den[idx], rng)
    return out


def _discrete_laplace_rational(t: int, s: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` draws from the discrete Laplace with scale t/s (CKS 2020, Alg. 2)."""
    if t >= _SMALL:
        raise SpecError(f"discrete Laplace: scale numerator {t} is too large for exact sampling")
    out = np.empty(size, dtype=np.int64)
    pending = np.arange(size)
    while pending.size:
        n = pending.size
        u = rng.integers(0, t, size=n, dtype=np.int64)
        keep = bernoulli_exp(u, np.full(n, t, dtype=np.int64), rng)
        u = u[keep]
        v = _count_exp_minus_one_successes(u.size, rng)
        y = (u + t * v) // s
        neg = rng.integers(0, 2, size=u.size).astype(bool)
        valid = ~(neg & (y == 0))
        kept = np.nonzero(keep)[0][valid]
        out[pending[kept]] = np.where(neg, -y, y)[valid]
        done = np.zeros(n, dtype=bool)
        done[kept] = True
        pending = pending[~done]
    return out


def _laplace_scale(scale: float) -> Fraction:
    """``scale`` rounded up to a multiple of 1 / LAPLACE_SCALE_DENOMINATOR."""
    return Fraction(math.ceil(Fraction(scale) * LAPLACE_SCALE_DENOMINATOR), LAPLACE_SCALE_DENOMINATOR)


def discrete_laplace(scale: float | Fraction, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` exact draws with P[x] ∝ exp(-|x| / scale); a float scale is first rounded
    up to a multiple of 2^-20 (a Fraction is used as given)."""
    b = scale if isinstance(scale, Fraction) else _laplace_scale(scale)
    if b <= 0:
        raise SpecError(f"discrete Laplace: scale must be > 0, got {scale}")
    return _discrete_laplace_rational(b.numerator, b.denominator, int(size), rng)


def _sigma2(sigma: float) -> Fraction:
    """σ² rounded up to a multiple of 2^-k, k chosen for a relative change below 2^-20."""
    s2 = Fraction(sigma) ** 2
    e = math.floor(math.log2(float(s2)))
    q = 1 << max(0, 20 - e)
    return Fraction(math.ceil(s2 * q), q)


def discrete_gaussian(sigma: float | Fraction, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` exact draws with P[x] ∝ exp(-x²/(2σ²)) (CKS 2020, Alg. 3): propose
    Y from the discrete Laplace with scale t = floor(σ) + 1 and accept with probability
    exp(-(|Y| - σ²/t)² / (2σ²)). A float σ has σ² rounded up (relative change < 1e-6);
    a Fraction is taken as σ² itself."""
    s2 = sigma if isinstance(sigma, Fraction) else _sigma2(float(sigma))
    if s2 <= 0:
        raise SpecError(f"discrete Gaussian: sigma must be > 0, got {sigma}")
    p, q = s2.numerator, s2.denominator
    t = math.isqrt(p // q) + 1
    out = np.empty(int(size), dtype=np.int64)
    pending = np.arange(int(size))
    den = 2 * p * q * t * t
    while pending.size:
        y = _discrete_laplace_rational(t, 1, pending.size, rng)
        a = np.abs(y)
        if den < _SMALL and int(a.max()) * t * q + p < (1 << 31):
            num = (a * (t * q) - p) ** 2
            dens = np.full(y.size, den, dtype=np.int64)
        else:
            num = (a.astype(object) * (t * q) - p) ** 2
            dens = np.full(y.size, den, dtype=object)
        c = bernoulli_exp(num, dens, rng)
        out[pending[c]] = y[c]
        pending = pending[~c]
    return out


def laplace_scale_used(scale: float) -> Fraction:
    """The scale :func:`discrete_laplace` uses for a float ``scale`` (rounded up to a multiple of 2^-20)."""
    return _laplace_scale(float(scale))


def sigma2_used(sigma: float) -> Fraction:
    """σ² as :func:`discrete_gaussian` uses it for a float σ (rounded up, relative change < 2^-20)."""
    return _sigma2(float(sigma))


def discrete_gaussian_variance(sigma2: float | Fraction) -> float:
    """Exact variance of N_Z(0, σ²): Σ x² e^{-x²/2σ²} / Σ e^{-x²/2σ²} over the integers (slightly below σ²)."""
    s2 = float(sigma2)
    if s2 > 1e6:  # the deficit is below e^{-2π²σ²}: nothing a double can show
        return s2
    half = int(40 * math.sqrt(s2)) + 40
    x = np.arange(-half, half + 1, dtype=np.float64)
    w = np.exp(-(x**2) / (2 * s2))
    return float(np.sum(x**2 * w) / np.sum(w))
