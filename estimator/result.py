"""The result type of every estimation: frequency estimates with their variances and confidence intervals.

An :class:`Estimate` holds, for each domain item, the unbiased count
estimate, the estimated variance of that estimate (the spec's theoretical
variance with the estimated counts plugged in, clipped to ``[0, n]``) and a
normal-approximation confidence interval. Post-processing (Norm-Sub) and
heavy-hitter selection are methods on it.
"""

from __future__ import annotations

import dataclasses
from statistics import NormalDist
from typing import Any

import numpy as np

from ldp_core.mechanisms.base import MechanismSpec

__all__ = ["NOISE_RULE", "Estimate", "estimate_from_counts", "noise_test", "norm_sub", "simultaneous_z", "z_value"]

#: How ranked outputs decide ``could_be_noise`` (docs/ESTIMATE.md, *Could be noise*): Bonferroni over the
#: items (or candidates) that were ranked.
NOISE_RULE = "bonferroni"


def z_value(confidence: float) -> float:
    """Two-sided standard normal quantile for ``confidence`` (0.95 -> 1.95996...)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def simultaneous_z(confidence: float, m: int) -> float:
    """The z of ``m`` simultaneous two-sided ``confidence`` intervals (Bonferroni): Φ⁻¹(1 − (1 − confidence)/(2m))."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(1.0 - (1.0 - confidence) / (2.0 * max(1, int(m))))


def noise_test(
    estimate: np.ndarray, std_error: np.ndarray, m: int, confidence: float = 0.95
) -> tuple[np.ndarray, np.ndarray]:
    """``(adjusted_ci_low, could_be_noise)`` of ranked estimates, one of ``m`` compared (docs/ESTIMATE.md).

    ``adjusted_ci_low`` is the lower end of the Bonferroni-widened interval, estimate − z_m·std_error with
    z_m = :func:`simultaneous_z` (``confidence``, m); an item *could be noise* when it is ≤ 0, i.e. the
    one-sided z-test of "count ≤ 0" at level α/(2m), α = 1 − confidence, does not reject. Over all m items,
    the chance that any item nobody holds is *not* flagged is at most α/2 (normal approximation)."""
    est = np.asarray(estimate, dtype=np.float64)
    low = est - simultaneous_z(confidence, m) * np.asarray(std_error, dtype=np.float64)
    return low, ~(low > 0)


def norm_sub(counts: np.ndarray, n: float) -> np.ndarray:
    """Norm-Sub consistency (Wang et al., "Locally Differentially Private Frequency
    Estimation with Consistency", NDSS 2020): the closest non-negative vector
    that sums to ``n``, found by subtracting a common δ from the positive
    entries and zeroing the rest. O(d log d)."""
    c = np.asarray(counts, dtype=np.float64)
    if n <= 0 or c.size == 0:
        return np.zeros_like(c)
    srt = np.sort(c)[::-1]
    csum = np.cumsum(srt)
    k = np.arange(1, c.size + 1)
    delta = (csum - n) / k
    # the largest k whose k-th largest entry stays positive after subtracting delta_k
    valid = srt - delta > 0
    kk = int(np.nonzero(valid)[0][-1]) if valid.any() else 0
    out = np.maximum(c - delta[kk], 0.0)
    return out


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Per-item count estimates of one spec over ``n`` reports."""

    counts: np.ndarray
    variance: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray
    n: int
    confidence: float = 0.95
    postprocessing: str = "none"
    #: the unbiased counts when ``counts`` are post-processed (Norm-Sub), else ``None``
    unbiased: np.ndarray | None = None

    @property
    def frequencies(self) -> np.ndarray:
        return self.counts / self.n if self.n else np.zeros_like(self.counts)

    @property
    def std_error(self) -> np.ndarray:
        return np.sqrt(self.variance)

    def norm_sub(self) -> Estimate:
        """Consistent counts (non-negative, summing to n). Variances and intervals
        stay those of the unbiased estimate: Norm-Sub trades bias for lower MSE."""
        base = self.counts if self.unbiased is None else self.unbiased
        return dataclasses.replace(self, counts=norm_sub(base, self.n), postprocessing="norm-sub", unbiased=base)

    def noise(self) -> tuple[np.ndarray, np.ndarray]:
        """``(adjusted_ci_low, could_be_noise)`` per item, Bonferroni over the d items (:func:`noise_test`), from
        the unbiased counts whatever the post-processing (its intervals are theirs)."""
        base = self.counts if self.unbiased is None else self.unbiased
        return noise_test(base, self.std_error, base.size, self.confidence)

    def heavy_hitters(self, alpha: float = 0.05, threshold: float = 0.0) -> np.ndarray:
        """Indices whose count exceeds ``threshold`` at significance ``alpha``.

        A one-sided z-test per item, ``(count - threshold) / std_error >
        z_{1 - alpha/d}``, with a Bonferroni correction over the d items, so
        the chance that any item at or below the threshold is reported is at
        most ``alpha``. Sorted by decreasing estimate."""
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        d = self.counts.size
        z = NormalDist().inv_cdf(1.0 - alpha / d)
        se = np.sqrt(np.maximum(self.variance, 1e-300))
        idx = np.nonzero((self.counts - threshold) / se > z)[0]
        return idx[np.argsort(-self.counts[idx], kind="stable")]

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "confidence": self.confidence,
            "postprocessing": self.postprocessing,
            "counts": self.counts.tolist(),
            "variance": self.variance.tolist(),
            "ci_low": self.ci_low.tolist(),
            "ci_high": self.ci_high.tolist(),
        }


def estimate_from_counts(
    spec: MechanismSpec, counts: np.ndarray, n: int, confidence: float = 0.95, variance: np.ndarray | None = None
) -> Estimate:
    """Wrap unbiased ``counts`` with plug-in variances and normal intervals.

    The variance is ``spec.count_variance`` evaluated at the estimated counts
    clipped to ``[0, n]`` and rescaled to sum to ``n`` (the plug-in estimate of
    the theoretical variance), unless ``variance`` is given."""
    counts = np.asarray(counts, dtype=np.float64)
    if variance is None:
        if n > 0:
            plug = np.clip(counts, 0.0, float(n))
            total = plug.sum()
            plug = plug * (n / total) if total > 0 else np.full_like(plug, n / plug.size)
            variance = spec.count_variance(plug)
        else:
            variance = np.zeros_like(counts)
    variance = np.asarray(variance, dtype=np.float64)
    half = z_value(confidence) * np.sqrt(variance)
    return Estimate(counts, variance, counts - half, counts + half, int(n), confidence)
