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
vectorized over numpy arrays (they live in :mod:`ldp_core.noise`, shared with the
devices' distributed discrete Gaussian, and are re-exported here): every random choice is a uniform integer drawn
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
:func:`ldp_core.randomness.secure_generator` (every word from the OS
CSPRNG): numpy's PCG64 is predictable from its outputs, and predictable noise
can be subtracted.

Sensitivity is the per-contribution bound C of :mod:`ldp_core.privacy_events`:
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

from estimator.accounting.accountant import Neighbors, epsilon_pld
from ldp_core.errors import SpecError
from ldp_core.noise import LAPLACE_SCALE_DENOMINATOR, bernoulli_exp, discrete_gaussian, discrete_laplace
from ldp_core.noise import laplace_scale_used as _laplace_scale
from ldp_core.noise import sigma2_used as _sigma2
from ldp_core.privacy_events import ComposedEvent, DiscreteGaussianEvent, DiscreteLaplaceEvent, PureDPEvent
from ldp_core.randomness import secure_generator

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
