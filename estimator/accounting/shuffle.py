"""Privacy amplification by shuffling: the central (ε, δ) of a shuffled batch.

When n people each send one report from an ε₀-LDP randomizer and a shuffler
hands the analyzer only the uniformly permuted batch (no order, no
timing, no sender), the analyzer's view is (ε, δ)-DP with ε much smaller
than ε₀. The bounds here are those of Feldman, McMillan and Talwar, "Hiding
Among the Clones: A Simple and Nearly Optimal Analysis of Privacy
Amplification by Shuffling" (FOCS 2021; arXiv:2012.12803, revised 2023):

* **numerical** (their reduction to two distributions; App. E): every other person's report is,
  with probability e^{-ε₀}, a "clone" distributed as the target's report on
  one of two inputs, so the analyzer's view is a post-processing of one draw
  from P or Q, where, with C ~ Bin(n-1, e^{-ε₀}), A ~ Bin(C, 1/2) and
  Δ ~ Bernoulli(e^{ε₀}/(e^{ε₀}+1)),

      P = (A + Δ, C - A + 1 - Δ),        Q = (A + 1 - Δ, C - A + Δ).

  δ(ε) is the hockey-stick divergence of P from Q. Given C = c the first
  coordinate determines the second, and the likelihood ratio P_c(k)/Q_c(k)
  decreases in k, so the divergence given c is a difference of two binomial
  CDFs at one cut-off; summing over c with Bin(n-1, e^{-ε₀}) weights gives
  δ(ε) (Q and P are mirror images, so the two directions agree). The mass of
  c outside the summed range is added to δ, so the figure stays an upper
  bound; ε is found by bisection. This is computed exactly per c (no
  step-coarsening), so it lies between the lower and upper figures of the
  authors' stepped computation.
* **closed form** (their main theorem, in the form evaluated by the authors'
  reference implementation): for ε₀ <= log(n / (16 log(4/δ))),

      ε <= log(1 + (1 - e^{-ε₀}) / (1 + e^{-(ε₀ + ε₁)}) · (a + b)),
      a = 8 √(e^{ε₀} log(4/δ) / n),  b = 8 e^{ε₀} / n,  ε₁ = log(1 + a + b).

  Outside that range the closed form does not apply and is reported as None.

The "stronger clone" analysis of the same authors (SODA 2023) is not used:
its published errata restricts its general bound to a class of randomizers.

Who this protects against: the analyzer (and anyone downstream) who sees only
the shuffled batch, under replace-one neighbours (the batch size n is
public; the bound hides which value one person holds). It relies on the
shuffler being honest and on the other n-1 reports being produced by the
same randomizer (reports the adversary injected or knows do not count in n).
It does not protect against the shuffler itself, the collector, or a network
observer, who see reports with their metadata: for them the guarantee is the
local ε₀.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import stats

from estimator.accounting.accountant import AccountingError

__all__ = [
    "ShuffleGuarantee",
    "closed_form_epsilon",
    "numerical_delta",
    "numerical_epsilon",
    "shuffle_guarantee",
    "local_epsilon_for_target",
    "shuffler_guarantee",
    "grid_floor",
]

#: Who a shuffle figure protects against (shown next to every figure).
PROTECTS = (
    "the analyzer and anyone who sees only the shuffled batch (replace-one neighbours, batch size public); "
    "not the shuffler, the collector or network observers, for whom the local epsilon0 holds"
)


def _check(epsilon0: float, n: int, delta: float) -> tuple[float, int, float]:
    e0 = float(epsilon0)
    if not math.isfinite(e0) or e0 <= 0:
        raise AccountingError(f"epsilon0 must be a finite number > 0, got {epsilon0!r}")
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise AccountingError(f"the number of users must be a positive integer, got {n!r}")
    d = float(delta)
    if not 0.0 < d < 1.0:
        raise AccountingError(f"delta must be in (0, 1), got {delta!r}")
    return e0, int(n), d


def closed_form_epsilon(epsilon0: float, n: int, delta: float) -> float | None:
    """The closed-form bound (module docstring), or None when
    ε₀ > log(n / (16 log(4/δ))), where it does not apply."""
    e0, n, d = _check(epsilon0, n, delta)
    if n < 16 * math.log(4.0 / d) or e0 > math.log(n / (16.0 * math.log(4.0 / d))):
        return None
    a = 8.0 * math.sqrt(math.exp(e0) * math.log(4.0 / d) / n)
    b = 8.0 * math.exp(e0) / n
    eps1 = math.log1p(a + b)
    ratio = -math.expm1(-e0) / (1.0 + math.exp(-(e0 + eps1)))
    return min(e0, math.log1p(ratio * (a + b)))


class _CloneDivergence:
    """δ(ε) of the clone pair for fixed (ε₀, n), reusing the Bin(n-1, e^{-ε₀}) weights."""

    def __init__(self, epsilon0: float, n: int, tail: float) -> None:
        self.e0 = epsilon0
        self.alpha = 1.0 / (1.0 + math.exp(-epsilon0))  # e^ε₀ / (e^ε₀ + 1)
        p_clone = math.exp(-epsilon0)
        m = n - 1
        if m == 0:
            self.c = np.zeros(1, dtype=np.float64)
            self.w = np.ones(1)
            self.outside = 0.0
            return
        lo = int(stats.binom.ppf(tail / 2.0, m, p_clone))
        hi = int(stats.binom.isf(tail / 2.0, m, p_clone))
        lo, hi = max(lo, 0), min(hi, m)
        c = np.arange(lo, hi + 1, dtype=np.float64)
        self.c = c
        self.w = stats.binom.pmf(c, m, p_clone)
        # mass of C outside [lo, hi]: the divergence given c is at most 1 there
        below = stats.binom.cdf(lo - 1, m, p_clone) if lo > 0 else 0.0
        above = stats.binom.sf(hi, m, p_clone)
        self.outside = float(below + above)

    def delta(self, eps: float) -> float:
        if eps >= self.e0:
            return 0.0
        a = self.alpha
        ee = math.exp(eps)
        # P_c(k) > e^ε Q_c(k)  <=>  k < (c + 1) / (1 + r*),  r* = (e^{ε+ε₀} - 1) / (e^{ε₀} - e^ε)
        r_star = math.expm1(eps + self.e0) / (math.exp(self.e0) - ee)
        cut = np.ceil((self.c + 1.0) / (1.0 + r_star)) - 1.0
        f_k = stats.binom.cdf(cut, self.c, 0.5)
        f_km1 = np.where(cut >= 1.0, stats.binom.cdf(cut - 1.0, self.c, 0.5), 0.0)
        f_k = np.where(cut >= 0.0, f_k, 0.0)
        d_c = (a * f_k + (1.0 - a) * f_km1) - ee * ((1.0 - a) * f_k + a * f_km1)
        return float(np.dot(self.w, np.maximum(d_c, 0.0)) + self.outside)


def numerical_delta(epsilon0: float, n: int, epsilon: float) -> float:
    """δ at ``epsilon`` of the numerical bound (an upper bound; the truncated tail of
    the clone count, at most 1e-12, is included)."""
    e0, n, _ = _check(epsilon0, n, 0.5)
    return _CloneDivergence(e0, n, 1e-12).delta(float(epsilon))


def numerical_epsilon(epsilon0: float, n: int, delta: float, tolerance: float = 1e-6) -> float:
    """The smallest ε (to ``tolerance``, rounded up) with numerical δ(ε) <= ``delta``.
    Never above ε₀: a shuffled batch of ε₀-LDP reports is always ε₀-DP."""
    e0, n, d = _check(epsilon0, n, delta)
    div = _CloneDivergence(e0, n, tail=d * 1e-3)
    if div.outside >= d:
        return e0
    lo, hi = 0.0, e0
    if div.delta(0.0) <= d:
        return 0.0
    while hi - lo > tolerance:
        mid = 0.5 * (lo + hi)
        if div.delta(mid) <= d:
            hi = mid
        else:
            lo = mid
    return hi


@dataclasses.dataclass(frozen=True)
class ShuffleGuarantee:
    """The central guarantee of one shuffled batch: what the shuffler attaches to
    a released batch and the estimator shows next to the local ε₀.

    ``users`` counts the reports in the batch and ``epsilon0`` is each
    report's local ε. When one person may contribute up to
    ``reports_per_user`` (r) of them, the neighbouring datasets differ in a
    person, not a report: the bound is evaluated for ``people = ⌈users / r⌉``
    randomizers of ``r·ε₀`` each (a person's r reports compose to r·ε₀),
    which is what ``epsilon`` is.
    """

    epsilon0: float
    users: int
    delta: float
    epsilon: float
    epsilon_closed_form: float | None
    method: str = "Feldman, McMillan, Talwar 2021 (Hiding Among the Clones), numerical bound"
    protects: str = PROTECTS
    reports_per_user: int = 1
    people: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        cf = "n/a" if self.epsilon_closed_form is None else f"{self.epsilon_closed_form:.4g}"
        who = (
            f"{self.users} reports"
            if self.reports_per_user == 1
            else f"{self.users} reports (at least {self.people} people of up to {self.reports_per_user} each)"
        )
        return (
            f"local ε₀ = {self.epsilon0:g} per report; after shuffling {who}: "
            f"(ε = {self.epsilon:.4g}, δ = {self.delta:g})-DP (closed form: {cf}) against {self.protects}"
        )


@functools.lru_cache(maxsize=1024)
def shuffle_guarantee(epsilon0: float, users: int, delta: float, reports_per_user: int = 1) -> ShuffleGuarantee:
    """The amplified guarantee for ``users`` shuffled ε₀-LDP reports, per person when each person sends up
    to ``reports_per_user`` of them (cached: a shuffler asks the same question for every batch of a size)."""
    e0, n, d = _check(epsilon0, users, delta)
    r = int(reports_per_user)
    if isinstance(reports_per_user, bool) or r != reports_per_user or r < 1:
        raise AccountingError(f"reports_per_user must be a positive integer, got {reports_per_user!r}")
    people = -(-n // r)
    e_person = r * e0
    return ShuffleGuarantee(
        epsilon0=e0,
        users=n,
        delta=d,
        epsilon=numerical_epsilon(e_person, people, d),
        epsilon_closed_form=closed_form_epsilon(e_person, people, d),
        reports_per_user=r,
        people=people,
    )


def local_epsilon_for_target(target_epsilon: float, users: int, delta: float, tolerance: float = 1e-4) -> float:
    """The largest ε₀ (to ``tolerance``, rounded down) whose shuffled batch of
    ``users`` reports meets (``target_epsilon``, ``delta``) by the numerical bound."""
    t = float(target_epsilon)
    if not t > 0:
        raise AccountingError(f"target epsilon must be > 0, got {target_epsilon!r}")
    _check(t, users, delta)
    lo, hi = t, max(2.0 * t, 1.0)  # ε₀ = target always meets it (amplification only helps)
    while numerical_epsilon(hi, users, delta) <= t:
        lo, hi = hi, hi * 2.0
        if hi > 60.0:
            return lo
    while hi - lo > tolerance:
        mid = 0.5 * (lo + hi)
        if numerical_epsilon(mid, users, delta) <= t:
            lo = mid
        else:
            hi = mid
    return lo


def grid_floor(n: int) -> int:
    """The largest ``b * 2**k <= n`` with ``8 <= b <= 15`` (``n`` itself below 16)."""
    if n < 16:
        return int(n)
    k = int(n).bit_length() - 4
    return (int(n) >> k) << k


def shuffler_guarantee(delta: float) -> Callable[[int, float], tuple[float, float, str]]:
    """The shuffler's ``guarantee(n, epsilon0) -> (epsilon, delta, bound)``: the FMT21 numerical
    bound at :func:`grid_floor` ``(n)``.

    To keep the bound's cache warm it is evaluated at ``n`` rounded down to
    three significant bits (at most 12.5 % below the batch size): a bound for
    fewer reports also holds for more, because in the clone reduction each
    extra report only adds an independent clone-or-not draw to both
    distributions, a post-processing that cannot increase their hockey-stick
    divergence.
    """

    def guarantee(n: int, epsilon0: float) -> tuple[float, float, str]:
        m = grid_floor(n)
        g = shuffle_guarantee(float(epsilon0), m, float(delta))
        return g.epsilon, g.delta, f"{g.method}, evaluated at n={m}"

    return guarantee
