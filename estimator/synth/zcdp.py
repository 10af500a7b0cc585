"""ρ-zero-concentrated DP (Bun & Steinke 2016): the budget of MST and AIM, and its (ε, δ).

* The Gaussian mechanism with L2 sensitivity Δ and noise σ is (Δ²/2σ²)-zCDP; a marginal's counts have
  Δ = 1 when one record is added or removed.
* The exponential mechanism with parameter ε (score sensitivity Δ, picking r with probability
  ∝ exp(ε·score(r) / 2Δ)) is ε²/8-zCDP (Cesar & Rogers 2021, bounded range).
* zCDP composes by adding ρ.
* ρ-zCDP implies (ε, δ)-DP with ε = inf over α > 1 of ρα + (log(1/δ) + (α−1)·log(1−1/α) − log α)/(α−1)
  (Canonne, Kamath & Steinke 2020, Prop. 12; the same conversion ``dp_accounting``'s RDP accountant makes on
  its grid of orders, which the tests use as the independent figure).
"""

from __future__ import annotations

import math

from estimator.synth.data import SynthError

__all__ = ["epsilon_of_rho", "rho_for_epsilon", "gaussian_rho", "exponential_rho"]


def _check_delta(delta: float) -> None:
    if not 0.0 < delta < 1.0:
        raise SynthError(f"delta must be in (0, 1), got {delta!r}")


def epsilon_of_rho(rho: float, delta: float) -> float:
    """The smallest ε the conversion above gives for ρ-zCDP at ``delta`` (a golden-section search over log α:
    the bound is convex in α)."""
    _check_delta(delta)
    if rho < 0:
        raise SynthError(f"rho must be >= 0, got {rho!r}")
    if rho == 0:
        return 0.0

    def bound(log_a: float) -> float:
        a = 1.0 + math.exp(log_a)
        return rho * a + (math.log(1.0 / delta) + (a - 1.0) * math.log1p(-1.0 / a) - math.log(a)) / (a - 1.0)

    lo, hi = -12.0, 12.0
    g = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = hi - g * (hi - lo), lo + g * (hi - lo)
    fc, fd = bound(c), bound(d)
    for _ in range(200):
        if fc < fd:
            hi, d, fd = d, c, fc
            c = hi - g * (hi - lo)
            fc = bound(c)
        else:
            lo, c, fc = c, d, fd
            d = lo + g * (hi - lo)
            fd = bound(d)
    return max(0.0, min(fc, fd))


def rho_for_epsilon(epsilon: float, delta: float) -> float:
    """The largest ρ whose (ε, δ) conversion is at most ``epsilon`` (bisection on the monotone
    :func:`epsilon_of_rho`)."""
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise SynthError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    _check_delta(delta)
    lo, hi = 0.0, max(1.0, float(epsilon))
    while epsilon_of_rho(hi, delta) < epsilon:
        hi *= 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if epsilon_of_rho(mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def gaussian_rho(sigma: float, sensitivity: float = 1.0) -> float:
    """ρ of one Gaussian measurement: Δ²/(2σ²)."""
    return sensitivity**2 / (2.0 * sigma**2)


def exponential_rho(epsilon: float) -> float:
    """ρ of one exponential-mechanism selection with parameter ε: ε²/8."""
    return epsilon**2 / 8.0
