"""(ε, δ) accounting of privacy events, built on Google's ``dp_accounting``.

Two accountants answer every question, as in ``dp_accounting``:

* the **PLD accountant** (privacy loss distributions; Koskela, Jälkö, Honkela
  2020; Doroshenko et al., "Connect the dots", PETS 2022) gives tight
  figures: its discretization is pessimistic, so the ε it prints is an upper
  bound within about the discretization interval (1e-4) of the exact one;
* the **RDP accountant** (Mironov 2017; Mironov, Talwar, Zhang 2019) gives a
  second, looser opinion. Its series for the subsampled Gaussian at
  fractional orders can fail to converge (q >= 0.1 with small noise):
  ``dp_accounting`` then drops those orders, which leaves a *valid but
  looser* bound. :class:`EpsilonReport` lists the dropped orders and says
  the RDP figure is incomplete instead of passing it off as tight.

What ``dp_accounting`` lacks is added here, by subclassing its accountants
(its documented extension point, ``_maybe_compose``), never by re-deriving
what it already computes:

* :class:`PureDpEvent` / :class:`LocalRandomizerDpEvent`: an ε-DP central
  mechanism and an ε-LDP report. Both are accounted as their worst case,
  binary randomized response with parameter ε, of which every ε-DP
  mechanism is a post-processing (Kairouz, Oh, Viswanath, "The composition
  theorem for differential privacy", ICML 2015): PLD ``from_privacy_parameters(ε, 0)`` and the Rényi divergence
  of that pair, D_α = [log(e^{αε} + e^{(1-α)ε}) - log(1 + e^ε)] / (α - 1).
* :class:`DiscreteGaussianDpEvent`: the discrete Gaussian (Canonne, Kamath,
  Steinke 2020): PLD from ``from_discrete_gaussian_mechanism``; RDP from its
  zCDP bound ρ = Δ²/(2σ²) (ibid.).
* Replace-one neighbours for the Laplace events in the PLD accountant, and a
  correction: ``dp_accounting``'s RDP accountant ignores the neighbouring
  relation for (unsampled) Gaussian and Laplace events while its PLD
  accountant doubles the sensitivity under replace-one. Here both double it
  (replacing a person moves a sum by up to 2C; the convention is in
  :mod:`ldp_core.privacy_events`).

Neighbouring relations. ``"add_or_remove"`` (the default; the DP-SGD
literature and the reference figures below use it) protects whether a person
took part; ``"replace"`` protects what a person's data is. A local report
(:class:`~ldp_core.privacy_events.LocalReportEvent`) only makes sense under
``"replace"``: ε-LDP hides the value, not the presence of a report, and the
accountant refuses it under add/remove rather than print a figure that does
not hold.

Reference figures (δ = 1e-5, Poisson rate q = 0.01, 100 steps): noise
multiplier 1.0 gives ε ≈ 0.718 by PLD and ≈ 1.214 by RDP; 0.5 gives ≈ 6.48
and ≈ 8.03; q = 1, multiplier 2.0, 100 steps gives ≈ 33.10, which is exact:
T Gaussian releases with noise multiplier z are one Gaussian release with
multiplier z/√T, whose ε is given in closed form by the analytic Gaussian
mechanism (Balle and Wang, ICML 2018, Thm. 8; ``dp_accounting.get_epsilon_gaussian``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal, TypeAlias

import attr
import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant

from estimator.errors import AccountingError
from ldp_core.fl.dpsgd_accounting import quiet_rdp_warnings
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
    sampled_gaussian_event,
)

__all__ = [
    "AccountingError",
    "Neighbors",
    "NEIGHBORS",
    "PureDpEvent",
    "LocalRandomizerDpEvent",
    "DiscreteGaussianDpEvent",
    "PLDAccountant",
    "RdpAccountant",
    "to_dp_event",
    "sensitivity_factor",
    "EpsilonReport",
    "account",
    "epsilon_pld",
    "delta_pld",
    "exact_gaussian_epsilon",
    "basic_epsilon",
    "rr_rdp",
    "gaussian_noise_for_epsilon",
    "max_steps_for_epsilon",
    "DEFAULT_DISCRETIZATION",
]

Neighbors = Literal["add_or_remove", "replace"]
NEIGHBORS: dict[str, dp_accounting.NeighboringRelation] = {
    "add_or_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace": dp_accounting.NeighboringRelation.REPLACE_ONE,
}
_REPLACE = dp_accounting.NeighboringRelation.REPLACE_ONE
_ADD_REMOVE = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE

#: The PLD accountant's value discretization interval (dp_accounting's default).
DEFAULT_DISCRETIZATION = 1e-4

_Details: TypeAlias = dp_accounting.PrivacyAccountant.CompositionErrorDetails


# -- events dp_accounting lacks -------------------------------------------------
@attr.s(frozen=True, slots=True, auto_attribs=True)
class PureDpEvent(dp_event.DpEvent):
    """A central ε-DP mechanism (ε stated for add/remove neighbours, where one
    person moves each query by at most C). Under replace-one the accountants
    charge 2ε (group privacy: a replacement is a removal and an addition)."""

    epsilon: float


@attr.s(frozen=True, slots=True, auto_attribs=True)
class LocalRandomizerDpEvent(dp_event.DpEvent):
    """One output of an ε-LDP randomizer: ε-DP with respect to replacing the
    person's input. Meaningless under add/remove (the report's presence shows)."""

    epsilon: float


@attr.s(frozen=True, slots=True, auto_attribs=True)
class DiscreteGaussianDpEvent(dp_event.DpEvent):
    """Discrete Gaussian noise with parameter ``sigma`` (P[x] ∝ exp(-x²/2σ²)) on an
    integer quantity whose L2 change per contribution is at most ``sensitivity``."""

    sigma: float
    sensitivity: int


def _factor(relation: dp_accounting.NeighboringRelation) -> int:
    """How many contributions two neighbouring datasets differ by."""
    return 2 if relation == _REPLACE else 1


def sensitivity_factor(neighbors: Neighbors) -> int:
    """How many contributions two neighbouring datasets differ by, which multiplies
    every per-contribution sensitivity: 2 under ``"replace"`` (one contribution
    swapped for another), 1 under ``"add_or_remove"``. Other names raise
    :class:`AccountingError`."""
    return _factor(_relation(neighbors))


def rr_rdp(epsilon: float, orders: np.ndarray) -> np.ndarray:
    """Rényi divergence of binary randomized response with parameter ε at each order:
    D_α = [log(e^{αε} + e^{(1-α)ε}) - log(1 + e^ε)] / (α - 1), the largest Rényi
    divergence of any ε-DP pair (it dominates them all; Kairouz et al. 2015)."""
    a = np.asarray(orders, dtype=np.float64)
    num = np.logaddexp(a * epsilon, (1.0 - a) * epsilon) - np.logaddexp(0.0, epsilon)
    return num / (a - 1.0)


class PLDAccountant(pld_privacy_accountant.PLDAccountant):
    """``dp_accounting``'s PLD accountant, extended with the events above and with
    Laplace events under replace-one neighbours."""

    _pld: Any  # the composed privacy loss distribution, set by dp_accounting's __init__

    def _maybe_compose(self, event: dp_event.DpEvent, count: int, do_compose: bool) -> _Details | None:
        rel = self.neighboring_relation
        vdi = self._value_discretization_interval
        if isinstance(event, (PureDpEvent, LocalRandomizerDpEvent)):
            if isinstance(event, LocalRandomizerDpEvent):
                if rel != _REPLACE:
                    return _Details(event, _LOCAL_NEEDS_REPLACE)
                eps = event.epsilon
            else:
                eps = event.epsilon * _factor(rel)
            if do_compose and count > 0:
                params = pld_common.DifferentialPrivacyParameters(eps, 0.0)
                self._pld = self._pld.compose(pld_lib.from_privacy_parameters(params, vdi).self_compose(count))
            return None
        if isinstance(event, DiscreteGaussianDpEvent):
            if do_compose and count > 0:
                pld = pld_lib.from_discrete_gaussian_mechanism(
                    event.sigma, sensitivity=event.sensitivity * _factor(rel), value_discretization_interval=vdi
                )
                self._pld = self._pld.compose(pld.self_compose(count))
            return None
        if rel == _REPLACE and isinstance(event, dp_event.LaplaceDpEvent):
            if do_compose and count > 0:
                pld = pld_lib.from_laplace_mechanism(
                    event.noise_multiplier, sensitivity=2, value_discretization_interval=vdi
                )
                self._pld = self._pld.compose(pld.self_compose(count))
            return None
        if rel == _REPLACE and isinstance(event, dp_event.DiscreteLaplaceDpEvent):
            if do_compose and count > 0:
                pld = pld_lib.from_discrete_laplace_mechanism(
                    event.noise_parameter, sensitivity=2 * event.sensitivity, value_discretization_interval=vdi
                )
                self._pld = self._pld.compose(pld.self_compose(count))
            return None
        return super()._maybe_compose(event, count, do_compose)


class RdpAccountant(rdp_privacy_accountant.RdpAccountant):
    """``dp_accounting``'s RDP accountant, extended with the events above, with the
    sensitivity doubled under replace-one, and with :attr:`dropped_orders`."""

    _rdp: np.ndarray  # the composed RDP curve at each order, set by dp_accounting's __init__

    def _add(self, curve: np.ndarray, count: int, do_compose: bool) -> None:
        if do_compose:
            self._rdp = self._rdp + count * curve

    def _maybe_compose(self, event: dp_event.DpEvent, count: int, do_compose: bool) -> _Details | None:
        rel = self.neighboring_relation
        if isinstance(event, LocalRandomizerDpEvent):
            if rel != _REPLACE:
                return _Details(event, _LOCAL_NEEDS_REPLACE)
            self._add(rr_rdp(event.epsilon, self._orders), count, do_compose)
            return None
        if isinstance(event, PureDpEvent):
            self._add(rr_rdp(event.epsilon * _factor(rel), self._orders), count, do_compose)
            return None
        if isinstance(event, dp_event.DiscreteLaplaceDpEvent):
            eps = event.noise_parameter * event.sensitivity * _factor(rel)
            self._add(rr_rdp(eps, self._orders), count, do_compose)
            return None
        if isinstance(event, DiscreteGaussianDpEvent):
            rho = (event.sensitivity * _factor(rel)) ** 2 / (2.0 * event.sigma**2)
            self._add(rho * self._orders, count, do_compose)
            return None
        if rel == _REPLACE and isinstance(event, dp_event.GaussianDpEvent):
            return super()._maybe_compose(dp_event.GaussianDpEvent(event.noise_multiplier / 2.0), count, do_compose)
        if rel == _REPLACE and isinstance(event, dp_event.LaplaceDpEvent):
            return super()._maybe_compose(dp_event.LaplaceDpEvent(event.noise_multiplier / 2.0), count, do_compose)
        return super()._maybe_compose(event, count, do_compose)

    def compose(self, event: dp_event.DpEvent, count: int = 1) -> RdpAccountant:
        with quiet_rdp_warnings():
            super().compose(event, count)
        return self

    @property
    def orders(self) -> np.ndarray:
        return np.array(self._orders, dtype=np.float64)

    @property
    def dropped_orders(self) -> tuple[float, ...]:
        """Orders whose RDP could not be computed (``dp_accounting`` set them to +inf
        after its series failed to converge) although other orders are finite."""
        bad = ~np.isfinite(self._rdp)
        if bad.all() or not bad.any():
            return ()
        return tuple(float(a) for a in np.asarray(self._orders)[bad])


_LOCAL_NEEDS_REPLACE = (
    "a local report is ε-DP with respect to replacing the user's value; it does not hide whether "
    "the user reported. Account it with neighbors='replace'."
)


# -- conversion -----------------------------------------------------------------
def to_dp_event(event: PrivacyEvent) -> dp_event.DpEvent:
    """The ``dp_accounting`` event of a project event (see the module docstring for
    the three event types added here)."""
    if isinstance(event, LocalReportEvent):
        return LocalRandomizerDpEvent(event.epsilon)
    if isinstance(event, PureDPEvent):
        return PureDpEvent(event.epsilon)
    if isinstance(event, LaplaceEvent):
        return dp_event.LaplaceDpEvent(event.noise_multiplier)
    if isinstance(event, DiscreteLaplaceEvent):
        return dp_event.DiscreteLaplaceDpEvent(1.0 / event.scale, event.sensitivity)
    if isinstance(event, GaussianEvent):
        return dp_event.GaussianDpEvent(event.noise_multiplier)
    if isinstance(event, DiscreteGaussianEvent):
        return DiscreteGaussianDpEvent(event.sigma, event.sensitivity)
    if isinstance(event, PoissonSampledEvent):
        return dp_event.PoissonSampledDpEvent(event.sampling_probability, to_dp_event(event.event))
    if isinstance(event, ComposedEvent):
        return dp_event.ComposedDpEvent([to_dp_event(e) for e in event.events])
    if isinstance(event, SelfComposedEvent):
        return dp_event.SelfComposedDpEvent(to_dp_event(event.event), event.count)
    raise AccountingError(f"no dp_accounting event for {event!r}")


def _relation(neighbors: str) -> dp_accounting.NeighboringRelation:
    try:
        return NEIGHBORS[neighbors]
    except KeyError:
        raise AccountingError(f"neighbors must be one of {sorted(NEIGHBORS)}, got {neighbors!r}") from None


def _check_delta(delta: float) -> float:
    d = float(delta)
    if not 0.0 < d < 1.0:
        raise AccountingError(f"delta must be in (0, 1), got {delta!r}; a typical choice is below 1/population")
    return d


def _compose(accountant: dp_accounting.PrivacyAccountant, event: PrivacyEvent) -> None:
    try:
        accountant.compose(to_dp_event(event))
    except dp_accounting.UnsupportedEventError as exc:
        raise AccountingError(str(exc)) from None


# -- answers --------------------------------------------------------------------
def epsilon_pld(
    event: PrivacyEvent,
    delta: float,
    neighbors: Neighbors = "add_or_remove",
    discretization: float = DEFAULT_DISCRETIZATION,
) -> float:
    """Tight ε at ``delta`` by the PLD accountant (an upper bound within about
    ``discretization`` of the exact value)."""
    acc = PLDAccountant(_relation(neighbors), value_discretization_interval=discretization)
    _compose(acc, event)
    return float(acc.get_epsilon(_check_delta(delta)))


def delta_pld(
    event: PrivacyEvent,
    epsilon: float,
    neighbors: Neighbors = "add_or_remove",
    discretization: float = DEFAULT_DISCRETIZATION,
) -> float:
    """δ at ``epsilon`` by the PLD accountant (an upper bound)."""
    acc = PLDAccountant(_relation(neighbors), value_discretization_interval=discretization)
    _compose(acc, event)
    return float(acc.get_delta(float(epsilon)))


def _gaussian_mu2(event: PrivacyEvent, factor: int) -> float | None:
    """Σ (sensitivity / σ)² over an event made only of unsampled Gaussian releases, else None."""
    if isinstance(event, GaussianEvent):
        return (factor / event.noise_multiplier) ** 2
    if isinstance(event, SelfComposedEvent):
        inner = _gaussian_mu2(event.event, factor)
        return None if inner is None else event.count * inner
    if isinstance(event, ComposedEvent):
        parts = [_gaussian_mu2(e, factor) for e in event.events]
        return None if any(p is None for p in parts) else math.fsum(parts)  # type: ignore[arg-type]
    if isinstance(event, PoissonSampledEvent) and event.sampling_probability == 1.0:
        return _gaussian_mu2(event.event, factor)
    return None


def exact_gaussian_epsilon(event: PrivacyEvent, delta: float, neighbors: Neighbors = "add_or_remove") -> float | None:
    """Exact ε when ``event`` is a composition of unsampled Gaussian releases, else None.

    Composing Gaussian releases with μ_i = Δ/σ_i gives one Gaussian with
    μ = sqrt(Σ μ_i²) (Dong, Roth, Su, "Gaussian differential privacy", 2019,
    Cor. 3.3), whose ε at δ solves δ = Φ(μ/2 - ε/μ) - e^ε Φ(-μ/2 - ε/μ)
    (Balle and Wang 2018, Thm. 8), computed by ``dp_accounting.get_epsilon_gaussian``."""
    mu2 = _gaussian_mu2(event, sensitivity_factor(neighbors))
    if mu2 is None:
        return None
    return float(dp_accounting.get_epsilon_gaussian(1.0 / math.sqrt(mu2), _check_delta(delta)))


def basic_epsilon(event: PrivacyEvent, neighbors: Neighbors = "add_or_remove") -> float | None:
    """Σ ε over an event made only of pure-DP parts (local reports, pure DP,
    Laplace, discrete Laplace), by basic composition (Dwork et al. 2006); else None.
    The figure a device's ledger uses: simple, valid, and loose."""
    rel = _relation(neighbors)
    f = _factor(rel)
    if isinstance(event, LocalReportEvent):
        if rel != _REPLACE:
            raise AccountingError(_LOCAL_NEEDS_REPLACE)
        return event.epsilon
    if isinstance(event, PureDPEvent):
        return event.epsilon * f
    if isinstance(event, LaplaceEvent):
        return f / event.noise_multiplier
    if isinstance(event, DiscreteLaplaceEvent):
        return f * event.sensitivity / event.scale
    if isinstance(event, SelfComposedEvent):
        inner = basic_epsilon(event.event, neighbors)
        return None if inner is None else event.count * inner
    if isinstance(event, ComposedEvent):
        parts = [basic_epsilon(e, neighbors) for e in event.events]
        return None if any(p is None for p in parts) else math.fsum(parts)  # type: ignore[arg-type]
    return None


@dataclasses.dataclass(frozen=True)
class EpsilonReport:
    """Every available (ε, δ) figure for one event, each a valid upper bound.

    ``epsilon_pld`` is tight (pessimistic discretization); ``epsilon_rdp`` is a
    looser second opinion and ``rdp_complete`` is False when some orders had to
    be dropped (then the RDP figure is looser still, but still valid);
    ``epsilon_exact`` is exact for compositions of unsampled Gaussians;
    ``epsilon_basic`` is Σε for pure-DP compositions. :attr:`epsilon` is the
    smallest of them."""

    delta: float
    neighbors: str
    epsilon_pld: float | None
    epsilon_rdp: float | None
    rdp_order: float | None = None
    rdp_dropped_orders: tuple[float, ...] = ()
    epsilon_exact: float | None = None
    epsilon_basic: float | None = None
    notes: tuple[str, ...] = ()

    @property
    def rdp_complete(self) -> bool:
        return self.epsilon_rdp is not None and not self.rdp_dropped_orders

    @property
    def epsilon(self) -> float:
        """The tightest valid figure."""
        vals = [
            v for v in (self.epsilon_exact, self.epsilon_pld, self.epsilon_rdp, self.epsilon_basic) if v is not None
        ]
        if not vals:
            raise AccountingError("no accountant could handle this event")
        return min(vals)

    def to_dict(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "neighbors": self.neighbors,
            "epsilon_pld": self.epsilon_pld,
            "epsilon_rdp": self.epsilon_rdp,
            "rdp_order": self.rdp_order,
            "rdp_complete": self.rdp_complete,
            "rdp_dropped_orders": list(self.rdp_dropped_orders),
            "epsilon_exact": self.epsilon_exact,
            "epsilon_basic": self.epsilon_basic,
            "notes": list(self.notes),
        }


def account(
    event: PrivacyEvent,
    delta: float,
    neighbors: Neighbors = "add_or_remove",
    discretization: float = DEFAULT_DISCRETIZATION,
) -> EpsilonReport:
    """All figures for ``event`` at ``delta`` (see :class:`EpsilonReport`)."""
    delta = _check_delta(delta)
    rel = _relation(neighbors)
    notes: list[str] = []
    eps_pld: float | None
    try:
        eps_pld = epsilon_pld(event, delta, neighbors, discretization)
    except AccountingError as exc:
        if isinstance(event, LocalReportEvent) or "local report" in str(exc):
            raise
        eps_pld = None
        notes.append(f"PLD accountant: {exc}")
    rdp = RdpAccountant(neighboring_relation=rel)
    eps_rdp: float | None = None
    order: float | None = None
    dropped: tuple[float, ...] = ()
    try:
        _compose(rdp, event)
        eps_rdp, order = rdp.get_epsilon_and_optimal_order(delta)
        eps_rdp, order = float(eps_rdp), float(order)
        dropped = rdp.dropped_orders
        if dropped:
            notes.append(
                f"RDP: the series for orders {min(dropped):g}..{max(dropped):g} did not converge and those "
                f"orders were dropped; the RDP figure is a valid but loose bound (use the PLD figure)"
            )
        if order in (float(rdp.orders.min()), float(rdp.orders.max())):
            notes.append(
                f"RDP: the optimal order {order:g} is at the edge of the order grid; the RDP figure may be loose"
            )
    except AccountingError as exc:
        notes.append(f"RDP accountant: {exc}")
    report = EpsilonReport(
        delta=delta,
        neighbors=neighbors,
        epsilon_pld=eps_pld,
        epsilon_rdp=eps_rdp,
        rdp_order=order,
        rdp_dropped_orders=dropped,
        epsilon_exact=exact_gaussian_epsilon(event, delta, neighbors),
        epsilon_basic=basic_epsilon(event, neighbors),
        notes=tuple(notes),
    )
    if report.epsilon_pld is None and report.epsilon_rdp is None and report.epsilon_basic is None:
        raise AccountingError("; ".join(notes) or f"cannot account {event!r}")
    return report


#: Discretization used while searching; the answer is then checked at the caller's.
_SEARCH_DISCRETIZATION = 1e-3


def gaussian_noise_for_epsilon(
    target_epsilon: float,
    delta: float,
    sample_rate: float = 1.0,
    steps: int = 1,
    neighbors: Neighbors = "add_or_remove",
    discretization: float = DEFAULT_DISCRETIZATION,
) -> float:
    """The smallest noise multiplier (to about 0.1 % relative) for which ``steps``
    Poisson-sampled Gaussian steps stay within (``target_epsilon``, ``delta``) by
    the PLD accountant. The search runs at a coarse discretization; the answer
    is then checked at ``discretization`` and raised until it meets the target."""
    delta = _check_delta(delta)
    if not target_epsilon > 0:
        raise AccountingError(f"target epsilon must be > 0, got {target_epsilon}")

    def eps(z: float, disc: float) -> float:
        return epsilon_pld(sampled_gaussian_event(z, sample_rate, steps), delta, neighbors, disc)

    coarse = max(discretization, _SEARCH_DISCRETIZATION)
    lo, hi = 0.0, 1.0
    while eps(hi, coarse) > target_epsilon:
        lo, hi = hi, hi * 2.0
        if hi > 1e6:
            raise AccountingError(f"no noise multiplier below 1e6 reaches ε = {target_epsilon}")
    while hi - lo > 1e-3 * hi:
        mid = 0.5 * (lo + hi)
        if eps(mid, coarse) > target_epsilon:
            lo = mid
        else:
            hi = mid
    while eps(hi, discretization) > target_epsilon:
        hi *= 1.001
    return hi


def max_steps_for_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    target_epsilon: float,
    delta: float,
    neighbors: Neighbors = "add_or_remove",
    discretization: float = DEFAULT_DISCRETIZATION,
    limit: int = 1_000_000,
) -> int:
    """The largest number of steps (0 if none, at most ``limit``) that stays within
    (``target_epsilon``, ``delta``) by the PLD accountant. Searched at a coarse
    discretization, then checked at ``discretization`` and lowered (by 0.1 %
    steps) if needed, so the answer always meets the target."""
    delta = _check_delta(delta)
    coarse = max(discretization, _SEARCH_DISCRETIZATION)

    def ok(t: int, disc: float = coarse) -> bool:
        return (
            epsilon_pld(sampled_gaussian_event(noise_multiplier, sample_rate, t), delta, neighbors, disc)
            <= target_epsilon
        )

    if not ok(1, discretization):
        return 0
    lo, hi = 1, 2
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > limit:
            hi = limit + 1
            break
    t = _bisect_steps(ok, lo, hi)
    while t > 1 and not ok(t, discretization):
        t -= max(1, t // 1000)
    return t


def _bisect_steps(ok: Any, lo: int, hi: int) -> int:
    """Largest t in [lo, hi) with ok(t), given ok(lo) and not ok(hi) (or hi past the limit)."""
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo
