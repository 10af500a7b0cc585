"""The central ε per person of an estimate over several days of shuffled batches.

A person reporting a metric daily is in one shuffled batch a day, so an
estimate over days A..B is a composition over the days of the range: the
one-day central ε of :mod:`estimator.accounting.shuffle` (what each batch's
footer carries) protects one day of one person, not the person.
:func:`person_guarantee` composes the days:

* **PLD** (the figure used when it is the smaller): each day whose batch was
  bounded by the clone reduction of Feldman, McMillan and Talwar (the
  shuffler's bound, evaluated at a known n and ε₀) contributes the privacy
  loss distribution of its clone pair (P, Q), built here exactly
  (pessimistically discretized; the truncated tails go to the infinite-loss
  mass, so they count in δ); a day whose batch carries only an (ε, δ) pair
  contributes the PLD of a generic (ε, δ)-DP mechanism. The PLDs are composed
  with ``dp_accounting`` and read at the total δ. A dominating pair of each
  day composes to a dominating pair of the days (Zhu, Dong and Wang, AISTATS
  2022), and the clone pair dominates a day's shuffled batch (FMT21's
  reduction is a post-processing).
* **basic** (always, as a check): Σ ε_d at Σ δ_d.

The total δ is Σ δ_d, the δ of basic composition. Each day counts with its
worst batch (the largest central ε): the person's one report that day is in
one of them.

Who this protects: one person's reports on every day of the range, under
replace-one neighbours (the batches' sizes are public), against the analyzer
who sees the shuffled batches only; it assumes at most one report per person
per day in this metric's batches, as the shuffler's own bound does.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from estimator.accounting.shuffle import PROTECTS

__all__ = ["DayBound", "PERSON_NEIGHBOURS", "clone_pld", "day_bound", "person_guarantee"]

#: The neighbouring relation of the per-person figure.
PERSON_NEIGHBOURS = (
    "replace-one person: all of one person's reports in the day range (at most one a day, in that day's "
    "shuffled batch) replaced by another person's"
)
#: the shuffler's bound string (collector/shuffler/processor.py): evaluated at n people of r report(s) each
_FMT = re.compile(
    r"^Feldman, McMillan, Talwar 2021 .*numerical bound, evaluated at n=(\d+)"
    r"(?:; per person: \d+ people of up to (\d+) report\(s\) each)?$"
)
#: The PLD's loss grid and the largest clone pair built exactly (points (c, k)); above it a day counts by (ε, δ).
INTERVAL = 1e-4
MAX_POINTS = 4_000_000


@dataclasses.dataclass(frozen=True)
class DayBound:
    """One day's worst shuffled batch: its (ε, δ) and, when the clone bound made them, the ε₀ of one person's
    day (r·ε₀ for r reports a person) and the number of people n it was evaluated at."""

    day: int
    epsilon: float
    delta: float
    epsilon0: float | None = None
    n: int | None = None


def day_bound(day: int, shuffle: Mapping[str, Any]) -> DayBound | None:
    """The :class:`DayBound` of a footer's shuffle entry (None without a central ε)."""
    ce, cd = shuffle.get("central_epsilon"), shuffle.get("central_delta")
    if ce is None or cd is None:
        return None
    m = _FMT.match(str(shuffle.get("bound") or ""))
    e0 = shuffle.get("epsilon0")
    if m is None or e0 is None:
        return DayBound(day, float(ce), float(cd))
    r = int(m.group(2) or 1)  # each person's day is one r·ε₀-LDP randomizer, as the shuffler bounded it
    return DayBound(day, float(ce), float(cd), r * float(e0), int(m.group(1)))


def _clone_losses(epsilon0: float, n: int, tail: float) -> tuple[np.ndarray, np.ndarray, float] | None:
    """Privacy losses log(P/Q) of the clone pair's outcomes (c, k), their P-probabilities, and the P-mass
    left out (tails of C and of k given c), or None when the pair has more than MAX_POINTS outcomes."""
    m = n - 1
    p_clone = math.exp(-epsilon0)
    alpha = 1.0 / (1.0 + math.exp(-epsilon0))
    if m == 0:
        cs = np.zeros(1, dtype=np.int64)
        wc = np.ones(1)
    else:
        lo = max(int(stats.binom.ppf(tail / 4, m, p_clone)), 0)
        hi = min(int(stats.binom.isf(tail / 4, m, p_clone)), m)
        cs = np.arange(lo, hi + 1, dtype=np.int64)
        wc = stats.binom.pmf(cs, m, p_clone)
    left = 1.0 - float(wc.sum())
    half = int(math.ceil(9.0 * math.sqrt(max(int(cs[-1]), 1)) / 2.0)) + 2  # ±9σ of Bin(c, 1/2), σ = √c/2
    if len(cs) * (2 * half + 2) > MAX_POINTS:
        return None
    losses, probs = [], []
    for c_, w in zip(cs.tolist(), wc.tolist()):
        c = int(c_)
        k = np.arange(max(0, c // 2 - half), min(c + 1, c // 2 + half) + 1)
        b_k = stats.binom.pmf(k, c, 0.5)  # A = k
        b_km1 = np.where(k >= 1, stats.binom.pmf(k - 1, c, 0.5), 0.0)  # A = k - 1
        p = alpha * b_km1 + (1 - alpha) * b_k  # first coordinate A + Δ = k
        q = (1 - alpha) * b_km1 + alpha * b_k  # first coordinate A + 1 − Δ = k
        # the first coordinate can also be c + 1 (A = c and the extra report counted)
        top = stats.binom.pmf(c, c, 0.5)
        if k[-1] == c:
            p, q = np.append(p, alpha * top), np.append(q, (1 - alpha) * top)
        ok = (p > 0) & (q > 0)
        losses.append(np.log(p[ok]) - np.log(q[ok]))
        probs.append(w * p[ok])
        left += float(w * (1.0 - p[ok].sum()))
    return np.concatenate(losses), np.concatenate(probs), max(left, 0.0)


@functools.lru_cache(maxsize=64)
def clone_pld(epsilon0: float, n: int, tail: float = 1e-12) -> Any:
    """The ``dp_accounting`` PLD of the clone pair (P, Q) for n shuffled ε₀-LDP reports (pessimistic:
    losses rounded up to the grid, left-out mass at infinite loss), or None when it is too large to build."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    built = _clone_losses(float(epsilon0), int(n), tail)
    if built is None:
        return None
    losses, probs, left = built
    idx = np.ceil(losses / INTERVAL - 1e-9).astype(np.int64)
    base = int(idx.min())
    mass = np.bincount(idx - base, weights=probs)
    rounded = {base + i: float(v) for i, v in enumerate(mass) if v > 0}
    return pld.PrivacyLossDistribution.create_from_rounded_probability(
        rounded, left, INTERVAL, pessimistic_estimate=True
    )


def _generic_pld(epsilon: float, delta: float) -> Any:
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_privacy_parameters(
        common.DifferentialPrivacyParameters(epsilon, delta), value_discretization_interval=INTERVAL
    )


def person_guarantee(bounds: Sequence[DayBound]) -> dict[str, Any] | None:
    """The per-person (ε, δ) over the days of ``bounds`` (one per day: its worst batch), with how it was
    composed; None without any bound. Keys: ``epsilon``, ``delta``, ``days``, ``composition``
    (``"pld"`` or ``"basic"``), ``epsilon_basic``, ``epsilon_pld`` (None if not computed),
    ``epsilon_per_day`` (the largest one-day ε), ``neighbours``, ``protects``."""
    if not bounds:
        return None
    delta = float(sum(b.delta for b in bounds))
    basic = float(sum(b.epsilon for b in bounds))
    eps_pld: float | None = None
    if len(bounds) == 1:
        eps_pld = bounds[0].epsilon
    else:
        total = None
        for b in bounds:
            d = clone_pld(b.epsilon0, b.n) if b.epsilon0 is not None and b.n is not None else None
            d = d if d is not None else _generic_pld(b.epsilon, b.delta)
            total = d if total is None else total.compose(d)
        assert total is not None
        e = float(total.get_epsilon_for_delta(delta))
        eps_pld = e if math.isfinite(e) else None
    use_pld = eps_pld is not None and eps_pld < basic
    return {
        "epsilon": eps_pld if use_pld else basic,
        "delta": delta,
        "days": len(bounds),
        "composition": "pld" if use_pld else "basic",
        "epsilon_pld": eps_pld,
        "epsilon_basic": basic,
        "epsilon_per_day": max(b.epsilon for b in bounds),
        "neighbours": PERSON_NEIGHBOURS,
        "protects": f"one person's reports over {len(bounds)} day(s), against {PROTECTS}",
    }
