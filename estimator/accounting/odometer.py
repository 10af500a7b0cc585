"""Privacy filters for an analyst's releases under fully adaptive composition.

An analyst publishes estimates metric by metric and day by day, repeats
queries and picks the next release (and its noise, hence its privacy cost)
after seeing the previous ones. Composition theorems with parameters fixed
in advance do not cover that. A *privacy filter* (Rogers, Roth, Ullman,
Vadhan, "Privacy Odometers and Filters: Pay-as-you-Go Composition", NeurIPS
2016) is a stopping rule: it admits a release only if the total stays
within a budget fixed in advance, and then the whole interaction, however
adaptive, satisfies the budget's (ε, δ). Each filter here

* answers after every release how much has been spent (:attr:`PrivacyFilter.spent`,
  :meth:`PrivacyFilter.status`),
* refuses a release that would cross the budget, atomically: the check and
  the charge happen under one lock, and a refused release spends nothing
  (:meth:`PrivacyFilter.try_spend` returns False, :meth:`PrivacyFilter.spend`
  raises :class:`~ldp_core.errors.BudgetError`).

Two filters:

:class:`BasicFilter`
    Σ ε_i <= ε and Σ δ_i <= δ (basic composition is a valid filter, Rogers et
    al. 2016). Every release is charged its own (ε_i, δ_i): pure
    releases their ε, Gaussian releases their PLD ε at a per-release δ_i you
    choose. Simple and valid, loose for many releases. With pure releases only
    (δ = 0) the spent Σ ε_i is also a valid odometer reading at every moment,
    because each release's privacy loss is bounded by its ε_i pointwise.
:class:`ZCDPFilter`
    Σ ρ_i <= ρ_B in zero-concentrated DP (Bun and Steinke, TCC 2016): the Rényi
    filter of Feldman and Zrnic ("Individual Privacy Accounting via a Rényi
    Filter", NeurIPS 2021) at every order α at once with budget αρ_B,
    which Whitehouse, Ramdas, Rogers and Wu ("Fully-Adaptive Composition in
    Differential Privacy", ICML 2023) show matches advanced composition's rate
    *with its constants* under full adaptivity. The interaction is ρ_B-zCDP,
    hence (ε, δ)-DP with ε from the RDP-to-DP conversion of
    ``dp_accounting`` (Canonne, Kamath, Steinke 2020; Asoodeh et al. 2021) on
    the curve α ρ_B; ρ_B is the largest budget whose conversion is <= ε. Costs:
    ρ = 1/(2 z²) for a Gaussian release with multiplier z, Δ²/(2σ²) for the
    discrete Gaussian (Canonne et al. 2020), ε²/2 for every ε-DP
    release (Bun and Steinke 2016, Prop. 3.3). Poisson subsampling is *not*
    credited (a subsampled Gaussian is charged as unsampled): a valid upper
    bound, and the price of a filter that is valid under full adaptivity.

The spent amount of a :class:`ZCDPFilter` is in its own currency (ρ). Its
(ε, δ) guarantee is that of the *budget*: converting the ρ spent so far into
an ε at a moment the analyst picks after seeing results would be a privacy
odometer, which needs a larger bound (Rogers et al. 2016; Whitehouse
et al. 2023), so this module never prints such a figure.

Totals are kept exactly (as rationals of the charged floats) and compared
after one correct rounding, like :func:`math.fsum`: ten charges of ε = 0.1
fill a budget of ε = 1.

The neighbouring relation is the accountant's: ``"add_or_remove"`` (default)
or ``"replace"`` (which doubles every per-contribution sensitivity, and is
the only one under which local reports can be charged).

From the command line: ``ldp privacy budget`` charges a sequence of central
releases to a :class:`ZCDPFilter` or :class:`BasicFilter` and says which fit.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from abc import ABC, abstractmethod
from fractions import Fraction
from typing import Any

import numpy as np
from dp_accounting.rdp import compute_epsilon

from estimator.accounting.accountant import (
    DEFAULT_DISCRETIZATION,
    AccountingError,
    Neighbors,
    _check_delta,
    basic_epsilon,
    epsilon_pld,
    sensitivity_factor,
)
from ldp_core.errors import BudgetError
from ldp_core.privacy_events import (
    ComposedEvent,
    DiscreteGaussianEvent,
    DiscreteLaplaceEvent,
    GaussianEvent,
    LaplaceEvent,
    LocalReportEvent,
    PoissonSampledEvent,
    PrivacyEvent,
    PureDPEvent,
    SelfComposedEvent,
)

__all__ = [
    "Release",
    "PrivacyFilter",
    "BasicFilter",
    "ZCDPFilter",
    "zcdp_rho",
    "zcdp_epsilon",
    "zcdp_budget",
]

#: RDP orders used to convert ρ-zCDP to (ε, δ): fine near 1, then up to 10^4.
_ORDERS = np.concatenate([1.0 + np.arange(1, 100) / 10.0, np.arange(11.0, 64.0), np.geomspace(64, 1e4, 40)])


@dataclasses.dataclass(frozen=True)
class Release:
    """One admitted release: its label, its event and what it was charged."""

    label: str
    event: PrivacyEvent
    cost: tuple[float, ...]


class PrivacyFilter(ABC):
    """A budget fixed in advance and a thread-safe, atomic spending rule."""

    #: names of the cost components (for messages and :meth:`status`)
    units: tuple[str, ...] = ()

    def __init__(self, epsilon: float, delta: float, neighbors: Neighbors = "add_or_remove") -> None:
        eps = float(epsilon)
        if not math.isfinite(eps) or eps <= 0:
            raise AccountingError(f"the budget's epsilon must be a finite number > 0, got {epsilon!r}")
        self.epsilon = eps
        self.delta = float(delta)
        self.neighbors = neighbors
        self._factor = sensitivity_factor(neighbors)
        self._lock = threading.Lock()
        self._releases: list[Release] = []
        self._exact: list[Fraction] = [Fraction(0) for _ in self.units]
        self._spent: tuple[float, ...] = tuple(0.0 for _ in self.units)

    # -- what subclasses define ------------------------------------------------
    @property
    @abstractmethod
    def budget(self) -> tuple[float, ...]:
        """The budget in the filter's currency (one number per unit)."""

    @abstractmethod
    def cost(self, event: PrivacyEvent) -> tuple[float, ...]:
        """What ``event`` would be charged (raises :class:`AccountingError` if it cannot be)."""

    # -- spending ---------------------------------------------------------------
    def _fits(self, total: tuple[Fraction, ...]) -> bool:
        # the exact sum of the charged floats, correctly rounded once (as math.fsum would)
        return all(float(t) <= b for t, b in zip(total, self.budget))

    def _after(self, cost: tuple[float, ...]) -> tuple[Fraction, ...]:
        return tuple(e + Fraction(c) for e, c in zip(self._exact, cost))

    def _commit(self, release: Release, total: tuple[Fraction, ...]) -> None:
        self._releases.append(release)
        self._exact = list(total)
        self._spent = tuple(float(t) for t in total)

    def _checked_cost(self, event: PrivacyEvent) -> tuple[float, ...]:
        cost = tuple(float(c) for c in self.cost(event))
        if not all(math.isfinite(c) and c >= 0.0 for c in cost):
            raise AccountingError(f"invalid cost {cost} for {event!r}")
        return cost

    def can_spend(self, event: PrivacyEvent) -> bool:
        """Whether ``event`` would be admitted now (a dry run: nothing is spent)."""
        cost = self._checked_cost(event)
        with self._lock:
            return self._fits(self._after(cost))

    def try_spend(self, event: PrivacyEvent, label: str = "") -> bool:
        """Charge ``event`` if it fits the remaining budget; otherwise spend nothing
        and return False. The check and the charge are one atomic step."""
        cost = self._checked_cost(event)
        with self._lock:
            total = self._after(cost)
            if not self._fits(total):
                return False
            self._commit(Release(label, event, cost), total)
            return True

    def spend(self, event: PrivacyEvent, label: str = "") -> Release:
        """Like :meth:`try_spend`, but raise :class:`BudgetError` on refusal."""
        cost = self._checked_cost(event)
        with self._lock:
            total = self._after(cost)
            if not self._fits(total):
                left = ", ".join(f"{u} {max(b - s, 0.0):.6g}" for u, b, s in zip(self.units, self.budget, self._spent))
                need = ", ".join(f"{u} {c:.6g}" for u, c in zip(self.units, cost))
                raise BudgetError(
                    f"release {label or event!r} refused: it costs {need} but only {left} is left of the "
                    f"(ε={self.epsilon:g}, δ={self.delta:g}) budget; nothing was spent. Use more noise or fewer releases."
                )
            release = Release(label, event, cost)
            self._commit(release, total)
            return release

    # -- reading ----------------------------------------------------------------
    @property
    def spent(self) -> tuple[float, ...]:
        with self._lock:
            return self._spent

    @property
    def remaining(self) -> tuple[float, ...]:
        """Per unit, the largest float that a release may still cost: the exact rest ``budget − Σ costs``
        rounded *down*, so spending exactly what this reports is always admitted (``budget - spent`` in
        floating point can round up by half an ulp, and such a spend would then be refused)."""
        with self._lock:
            out = []
            for b, e in zip(self.budget, self._exact):
                rest = Fraction(b) - e
                r = float(rest)
                if Fraction(r) > rest:
                    r = math.nextafter(r, -math.inf)
                out.append(max(r, 0.0))
            return tuple(out)

    @property
    def releases(self) -> tuple[Release, ...]:
        with self._lock:
            return tuple(self._releases)

    @property
    def guarantee(self) -> tuple[float, float]:
        """(ε, δ) of the whole interaction, however adaptive: the budget's."""
        return self.epsilon, self.delta

    def status(self) -> dict[str, Any]:
        with self._lock:
            spent, n = self._spent, len(self._releases)
        return {
            "filter": type(self).__name__,
            "neighbors": self.neighbors,
            "guarantee": {"epsilon": self.epsilon, "delta": self.delta},
            "releases": n,
            "spent": dict(zip(self.units, spent)),
            "remaining": {u: max(b - s, 0.0) for u, b, s in zip(self.units, self.budget, spent)},
            "budget": dict(zip(self.units, self.budget)),
        }


class BasicFilter(PrivacyFilter):
    """Σ ε_i <= ε and Σ δ_i <= δ (see the module docstring). Releases that are not
    pure DP are charged their PLD ε at ``per_release_delta``, which must then be given."""

    units = ("epsilon", "delta")

    def __init__(
        self,
        epsilon: float,
        delta: float = 0.0,
        neighbors: Neighbors = "add_or_remove",
        per_release_delta: float | None = None,
        discretization: float = DEFAULT_DISCRETIZATION,
    ) -> None:
        if not 0.0 <= float(delta) < 1.0:
            raise AccountingError(f"the budget's delta must be in [0, 1), got {delta!r}")
        super().__init__(epsilon, delta, neighbors)
        if per_release_delta is not None:
            _check_delta(per_release_delta)
        self.per_release_delta = per_release_delta
        self.discretization = discretization

    @property
    def budget(self) -> tuple[float, ...]:
        return (self.epsilon, self.delta)

    def cost(self, event: PrivacyEvent) -> tuple[float, ...]:
        eps = basic_epsilon(event, self.neighbors)
        if eps is not None:
            return (eps, 0.0)
        if self.per_release_delta is None:
            raise AccountingError(
                f"{type(event).__name__} is not pure DP; give BasicFilter a per_release_delta, or use ZCDPFilter"
            )
        d = self.per_release_delta
        return (epsilon_pld(event, d, self.neighbors, self.discretization), d)


def zcdp_rho(event: PrivacyEvent, neighbors: Neighbors = "add_or_remove") -> float:
    """ρ such that ``event`` is ρ-zCDP (Bun and Steinke 2016): see the module docstring."""
    f = sensitivity_factor(neighbors)
    if isinstance(event, LocalReportEvent):
        basic_epsilon(event, neighbors)  # raises under add/remove
        return event.epsilon**2 / 2.0
    if isinstance(event, (PureDPEvent, LaplaceEvent, DiscreteLaplaceEvent)):
        eps = basic_epsilon(event, neighbors)
        assert eps is not None
        return eps**2 / 2.0
    if isinstance(event, GaussianEvent):
        return (f / event.noise_multiplier) ** 2 / 2.0
    if isinstance(event, DiscreteGaussianEvent):
        return (f * event.sensitivity) ** 2 / (2.0 * event.sigma**2)
    if isinstance(event, PoissonSampledEvent):
        return zcdp_rho(event.event, neighbors)
    if isinstance(event, SelfComposedEvent):
        return event.count * zcdp_rho(event.event, neighbors)
    if isinstance(event, ComposedEvent):
        return math.fsum(zcdp_rho(e, neighbors) for e in event.events)
    raise AccountingError(f"no zCDP cost for {event!r}")


def zcdp_epsilon(rho: float, delta: float) -> float:
    """ε at ``delta`` of ρ-zCDP: dp_accounting's RDP conversion on the curve α ρ."""
    d = _check_delta(delta)
    if rho <= 0:
        return 0.0
    eps, _ = compute_epsilon(_ORDERS, rho * _ORDERS, d)
    return float(eps)


def zcdp_budget(epsilon: float, delta: float) -> float:
    """The largest ρ (rounded down) with :func:`zcdp_epsilon` (ρ, δ) <= ``epsilon``."""
    lo, hi = 0.0, max(epsilon, 1.0)
    while zcdp_epsilon(hi, delta) <= epsilon:
        lo, hi = hi, 2.0 * hi
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if zcdp_epsilon(mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return lo


class ZCDPFilter(PrivacyFilter):
    """Σ ρ_i <= ρ_B, with ρ_B the largest zCDP budget within (ε, δ) (module docstring)."""

    units = ("rho",)

    def __init__(self, epsilon: float, delta: float, neighbors: Neighbors = "add_or_remove") -> None:
        super().__init__(epsilon, _check_delta(delta), neighbors)
        # a relative margin of 1e-9 absorbs the rounding of costs computed in floating point
        self.rho_budget = zcdp_budget(self.epsilon, self.delta) * (1.0 - 1e-9)

    @property
    def budget(self) -> tuple[float, ...]:
        return (self.rho_budget,)

    def cost(self, event: PrivacyEvent) -> tuple[float, ...]:
        return (zcdp_rho(event, self.neighbors),)

    @property
    def fraction_spent(self) -> float:
        return self.spent[0] / self.rho_budget

    def status(self) -> dict[str, Any]:
        out = super().status()
        out["fraction_spent"] = out["spent"]["rho"] / self.rho_budget
        return out
