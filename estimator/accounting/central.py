"""Central-DP releases of aggregate counts: Laplace, Gaussian, sparse vector.

When the analyst publishes counts computed by a trusted aggregator (or over
securely aggregated data), central noise protects the people behind them
from everyone who sees the published figures. Every mechanism here is a
frozen value with its privacy :attr:`event` (charge it to a
:class:`~estimator.accounting.odometer.PrivacyFilter` before releasing) and a
``release``/``select`` method that takes the randomness as an argument.

Noise is integer and exact. Counts are integers, so the Laplace mechanism
adds *discrete* Laplace noise (P[x] ∝ exp(-|x|/b); the geometric mechanism of
Ghosh, Roughgarden, Sundararajan 2009) and the Gaussian mechanism adds
*discrete* Gaussian noise (P[x] ∝ exp(-x²/2σ²)), both sampled with the exact
integer-arithmetic rejection samplers of Canonne, Kamath and Steinke ("The
Discrete Gaussian for Differential Privacy", NeurIPS 2020, Algorithms 1-3),
vectorized over numpy arrays: every random choice is a uniform integer drawn
from the generator and compared with an integer, so no floating-point number
takes part in sampling. This is what defeats Mironov's attack on
floating-point Laplace noise ("On Significance of the Least Significant Bits
for Differential Privacy", CCS 2012): textbook samplers (``-b log U``) produce
doubles whose pattern of representable values depends on the true count, so a
single output can reveal it; the snapping mechanism was his fix, integer
noise on integer data is ours. To keep the arithmetic exact, the Laplace
scale is rounded *up* to a multiple of 2^-20 and σ² up to a multiple of
2^-k (relative change below 1e-6); rounding up only adds privacy, and the
events state the parameters actually used (Laplace) or the smaller requested
one (Gaussian), so the accounting stays valid.

Randomness: pass a :class:`numpy.random.Generator`. Seeded generators are for
tests and simulation only. Without one, a release draws from
:func:`client_sdk.randomness.secure_generator` (every word from the OS
CSPRNG): numpy's PCG64 is predictable from its outputs, and predictable noise
can be subtracted.

Sensitivity is the per-contribution bound C of :mod:`client_sdk.privacy_events`:
how much one person can move the released vector (L1 for Laplace and the
sparse vector technique, L2 for Gaussian) by being added or removed; a
histogram where each person counts once has C = 1.

From the command line: ``ldp privacy central`` calibrates :class:`LaplaceCounts`
or :class:`GaussianCounts` to a target ε and, with ``--counts``, releases.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction
from typing import Any

import numpy as np

from client_sdk.errors import SpecError
from client_sdk.privacy_events import ComposedEvent, DiscreteGaussianEvent, DiscreteLaplaceEvent, PureDPEvent
from client_sdk.randomness import secure_generator
from estimator.accounting.accountant import Neighbors, epsilon_pld

__all__ = [
    "discrete_laplace",
    "discrete_gaussian",
    "bernoulli_exp",
    "LaplaceCounts",
    "GaussianCounts",
    "SparseVector",
    "release_above_threshold",
    "LAPLACE_SCALE_DENOMINATOR",
]

#: The Laplace scale is rounded up to a multiple of 1 / this.
LAPLACE_SCALE_DENOMINATOR = 1 << 20
_INT64_SAFE = 1 << 62
#: Integers below this are handled in int64 (products with small factors cannot overflow).
_SMALL = 1 << 40


# -- exact samplers (Canonne, Kamath, Steinke 2020) -----------------------------------
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


def _default_rng(rng: np.random.Generator | None) -> np.random.Generator:
    return secure_generator() if rng is None else rng


def _check_counts(counts: Any) -> np.ndarray:
    arr = np.asarray(counts)
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)):
            arr = arr.astype(np.int64)
        else:
            raise SpecError(f"counts must be integers (got dtype {arr.dtype}); these mechanisms release integer counts")
    return arr.astype(np.int64)


def _epsilon(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise SpecError(f"{what} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise SpecError(f"{what} must be a finite number > 0, got {value!r}")
    return v


def _sensitivity(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise SpecError(f"sensitivity must be a positive integer (integer counts), got {value!r}")
    return int(value)


# -- mechanisms ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LaplaceCounts:
    """Release integer counts with discrete Laplace noise of scale b >= sensitivity / ε:
    ε-DP under add/remove neighbours (2ε under replace), unbiased, with variance
    2 e^{-1/b} / (1 - e^{-1/b})² per count."""

    epsilon: float
    sensitivity: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _epsilon(self.epsilon, "epsilon"))
        object.__setattr__(self, "sensitivity", _sensitivity(self.sensitivity))

    @property
    def scale(self) -> Fraction:
        """The scale actually used: sensitivity / ε rounded up to a multiple of 2^-20."""
        return _laplace_scale(self.sensitivity / self.epsilon)

    @property
    def event(self) -> DiscreteLaplaceEvent:
        return DiscreteLaplaceEvent(float(self.scale), self.sensitivity)

    @property
    def variance(self) -> float:
        r = math.exp(-1.0 / float(self.scale))
        return 2.0 * r / (1.0 - r) ** 2

    def release(self, counts: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        c = _check_counts(counts)
        noise = discrete_laplace(self.scale, c.size, _default_rng(rng))
        return c + noise.reshape(c.shape)


@dataclasses.dataclass(frozen=True)
class GaussianCounts:
    """Release integer counts with discrete Gaussian noise of parameter σ (Canonne,
    Kamath, Steinke 2020): unbiased, variance slightly below σ², privacy by its PLD
    (use :meth:`for_epsilon` to calibrate σ to an (ε, δ) target)."""

    sigma: float
    sensitivity: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", _epsilon(self.sigma, "sigma"))
        object.__setattr__(self, "sensitivity", _sensitivity(self.sensitivity))

    @classmethod
    def for_epsilon(
        cls, epsilon: float, delta: float, sensitivity: int = 1, neighbors: Neighbors = "add_or_remove"
    ) -> GaussianCounts:
        """The smallest σ (to 0.1 %, rounded up) whose release is (ε, δ)-DP by the PLD
        of the discrete Gaussian (``dp_accounting``)."""
        epsilon = _epsilon(epsilon, "epsilon")

        def eps(s: float) -> float:
            return epsilon_pld(DiscreteGaussianEvent(s, sensitivity), delta, neighbors, discretization=1e-3)

        lo, hi = 0.0, float(sensitivity)
        while eps(hi) > epsilon:
            lo, hi = hi, 2.0 * hi
        while hi - lo > 1e-3 * hi:
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if eps(mid) > epsilon else (lo, mid)
        while epsilon_pld(DiscreteGaussianEvent(hi, sensitivity), delta, neighbors) > epsilon:
            hi *= 1.001
        return cls(hi, sensitivity)

    @property
    def event(self) -> DiscreteGaussianEvent:
        return DiscreteGaussianEvent(self.sigma, self.sensitivity)

    @property
    def variance(self) -> float:
        """Exact variance of the noise: Σ x² e^{-x²/2σ²} / Σ e^{-x²/2σ²} over the integers."""
        s2 = float(_sigma2(self.sigma))
        half = int(40 * math.sqrt(s2)) + 40
        x = np.arange(-half, half + 1, dtype=np.float64)
        w = np.exp(-(x**2) / (2 * s2))
        return float(np.sum(x**2 * w) / np.sum(w))

    def release(self, counts: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        c = _check_counts(counts)
        noise = discrete_gaussian(self.sigma, c.size, _default_rng(rng))
        return c + noise.reshape(c.shape)


@dataclasses.dataclass(frozen=True)
class SparseVector:
    """The sparse vector technique: report which counts exceed ``threshold``, stopping
    after ``max_answers`` of them, for ε in total (Lyu, Su, Li, "Understanding the
    Sparse Vector Technique for Differential Privacy", VLDB 2017, Alg. 1).

    A noisy threshold T + ρ, ρ ~ Lap(Δ/ε₁), is drawn once; each count q_i is
    compared as q_i + ν_i >= T + ρ with ν_i ~ Lap(2cΔ/ε₂) (cΔ/ε₂ when the counts
    are monotonic, i.e. adding a person moves them all in the same direction, as in
    a histogram; set ``monotonic=True`` only then). The split ε₁ : ε₂ = 1 : (2c)^{2/3} (1 : c^{2/3} if monotonic) is
    the one Lyu et al. recommend (Sec. 4.2). The noise is discrete Laplace: the
    privacy proof (ibid., Thm. 2) uses only that shifting a noise variable by an
    integer k changes probabilities by at most e^{k/b}, which the discrete
    Laplace satisfies on integer counts. Only the *indices* are released; their
    counts cost a separate release (see :func:`release_above_threshold`)."""

    epsilon: float
    threshold: float
    max_answers: int = 1
    sensitivity: int = 1
    monotonic: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _epsilon(self.epsilon, "epsilon"))
        object.__setattr__(self, "sensitivity", _sensitivity(self.sensitivity))
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float, np.integer, np.floating)) or not math.isfinite(t):
            raise SpecError(f"threshold must be a finite number, got {t!r}")
        c = self.max_answers
        if isinstance(c, bool) or not isinstance(c, (int, np.integer)) or c < 1:
            raise SpecError(f"max_answers must be a positive integer, got {c!r}")
        object.__setattr__(self, "max_answers", int(c))

    @property
    def epsilon_split(self) -> tuple[float, float]:
        """(ε₁ for the threshold, ε₂ for the comparisons)."""
        c = self.max_answers
        ratio = (c if self.monotonic else 2 * c) ** (2.0 / 3.0)
        e1 = self.epsilon / (1.0 + ratio)
        return e1, self.epsilon - e1

    @property
    def scales(self) -> tuple[Fraction, Fraction]:
        """Discrete Laplace scales (threshold, comparisons), rounded up."""
        e1, e2 = self.epsilon_split
        c, d = self.max_answers, self.sensitivity
        q_scale = (c if self.monotonic else 2 * c) * d / e2
        return _laplace_scale(d / e1), _laplace_scale(q_scale)

    @property
    def event(self) -> PureDPEvent:
        return PureDPEvent(self.epsilon)

    def select(self, counts: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        """Indices (in order) of the first ``max_answers`` counts found above the threshold."""
        q = _check_counts(counts).reshape(1, -1)
        return np.nonzero(self.select_rows(q, rng)[0])[0]

    def select_rows(self, counts: Any, rng: np.random.Generator | None = None) -> np.ndarray:
        """Run the technique independently on each row of a 2-D array of counts (fresh
        noise per row, as for separate datasets); returns a boolean mask of the
        selected entries (at most ``max_answers`` per row, the first ones found)."""
        q = _check_counts(counts)
        if q.ndim != 2:
            raise SpecError(f"select_rows needs a 2-D array of counts, got shape {q.shape}")
        r = _default_rng(rng)
        b1, b2 = self.scales
        rho = discrete_laplace(b1, q.shape[0], r)
        nu = discrete_laplace(b2, q.size, r).reshape(q.shape)
        above = (q + nu - rho[:, None]) >= self.threshold
        return above & (np.cumsum(above, axis=1) <= self.max_answers)


def release_above_threshold(
    counts: Any,
    threshold: float,
    epsilon_select: float,
    epsilon_release: float,
    max_items: int,
    sensitivity: int = 1,
    rng: np.random.Generator | None = None,
    monotonic: bool = False,
) -> tuple[np.ndarray, np.ndarray, ComposedEvent]:
    """Select up to ``max_items`` counts above ``threshold`` with :class:`SparseVector`
    (ε_select; ``monotonic`` as there), then release the selected counts with :class:`LaplaceCounts`
    (ε_release; one person moves the selected sub-vector by at most
    ``sensitivity`` in L1). Returns (indices, noisy counts, the composed event)."""
    r = _default_rng(rng)
    svt = SparseVector(epsilon_select, threshold, max_items, sensitivity, monotonic)
    idx = svt.select(counts, r)
    lap = LaplaceCounts(epsilon_release, sensitivity)
    values = lap.release(_check_counts(counts).reshape(-1)[idx], r)
    return idx, values, ComposedEvent((svt.event, lap.event))
