"""Privacy costs as values: what a report or a release spends.

An *event* describes one privacy-relevant computation (a device's ε-LDP
report, a noisy release of counts, a step of a subsampled Gaussian
mechanism) or a composition of them. Events are small frozen values: a
device's budget ledger charges them, the server's accountants
(:mod:`estimator.accounting`) turn them into (ε, δ) figures, and a privacy
filter spends them. The design follows Google's ``dp_accounting`` events
(``dp_event.py``): the event says *what was run*, never what it costs; the
cost is computed by an accountant, so a better accountant tightens every
figure without touching the events. The server converts an event to its
``dp_accounting`` counterpart with
:func:`estimator.accounting.accountant.to_dp_event`.

Sensitivity convention (the same as ``dp_accounting``'s). A ``noise_multiplier``
is the noise scale divided by the bound ``C`` on *one person's contribution*
(L1 norm for Laplace, L2 norm for Gaussian), and the discrete events'
``sensitivity`` is that bound ``C`` itself. Whether two neighbouring datasets
differ by one contribution (add or remove a person: the released quantity moves
by at most ``C``) or by two (replace a person's data: it moves by up to ``2C``)
is decided by the accountant's neighbouring relation, not by the event.

This module needs only the standard library: it is imported on devices.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import TYPE_CHECKING, Any, ClassVar

from ldp_core.errors import SpecError

if TYPE_CHECKING:
    from ldp_core.mechanisms.base import ReportSpec

__all__ = [
    "PrivacyEvent",
    "LocalReportEvent",
    "PureDPEvent",
    "LaplaceEvent",
    "DiscreteLaplaceEvent",
    "GaussianEvent",
    "DiscreteGaussianEvent",
    "PoissonSampledEvent",
    "ComposedEvent",
    "SelfComposedEvent",
    "local_event",
    "event_from_dict",
    "sampled_gaussian_event",
]


def _positive_finite(kind: str, field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SpecError(f"{kind}: {field} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0.0:
        raise SpecError(f"{kind}: {field} must be a finite number > 0, got {value!r}")
    return v


def _positive_int(kind: str, field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise SpecError(f"{kind}: {field} must be a positive integer, got {value!r}")
    v = int(value)
    if v < 1:
        raise SpecError(f"{kind}: {field} must be a positive integer, got {value!r}")
    return v


@dataclasses.dataclass(frozen=True)
class PrivacyEvent:
    """Base class of privacy events. Subclasses are frozen and validated."""

    kind: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form; :func:`event_from_dict` inverts it."""
        out: dict[str, Any] = {"kind": self.kind}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, PrivacyEvent):
                v = v.to_dict()
            elif isinstance(v, tuple):
                v = [e.to_dict() for e in v]
            out[f.name] = v
        return out


@dataclasses.dataclass(frozen=True)
class LocalReportEvent(PrivacyEvent):
    """One report of an ε-LDP randomizer: for *any* two values of the user, every
    output is at most e^ε times likelier under one than under the other (pure
    ε-DP with respect to replacing the user's value). It says nothing about
    whether the user reported at all."""

    epsilon: float
    kind: ClassVar[str] = "local_report"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _positive_finite(self.kind, "epsilon", self.epsilon))


@dataclasses.dataclass(frozen=True)
class PureDPEvent(PrivacyEvent):
    """Any central ε-DP computation for which only ε is known (for example the
    sparse vector technique). Accountants treat it as its worst case, binary
    randomized response with parameter ε, which every ε-DP mechanism is a
    post-processing of (Kairouz, Oh and Viswanath, "The composition theorem for
    differential privacy", ICML 2015)."""

    epsilon: float
    kind: ClassVar[str] = "pure_dp"

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _positive_finite(self.kind, "epsilon", self.epsilon))


@dataclasses.dataclass(frozen=True)
class LaplaceEvent(PrivacyEvent):
    """Continuous Laplace noise of scale ``b = noise_multiplier * C`` added to a
    quantity whose L1 change per contribution is at most ``C``: (1 / noise_multiplier)-DP
    under add/remove neighbours (Dwork, McSherry, Nissim, Smith 2006)."""

    noise_multiplier: float
    kind: ClassVar[str] = "laplace"

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", _positive_finite(self.kind, "noise_multiplier", self.noise_multiplier)
        )


@dataclasses.dataclass(frozen=True)
class DiscreteLaplaceEvent(PrivacyEvent):
    """Integer noise with P[x] ∝ exp(-|x| / scale) added to an integer quantity
    whose L1 change per contribution is at most ``sensitivity``: (sensitivity /
    scale)-DP under add/remove neighbours (Ghosh, Roughgarden, Sundararajan 2009;
    Canonne, Kamath, Steinke 2020)."""

    scale: float
    sensitivity: int = 1
    kind: ClassVar[str] = "discrete_laplace"

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", _positive_finite(self.kind, "scale", self.scale))
        object.__setattr__(self, "sensitivity", _positive_int(self.kind, "sensitivity", self.sensitivity))

    @property
    def epsilon(self) -> float:
        """ε under add/remove neighbours: sensitivity / scale."""
        return self.sensitivity / self.scale


@dataclasses.dataclass(frozen=True)
class GaussianEvent(PrivacyEvent):
    """Gaussian noise of standard deviation ``σ = noise_multiplier * C`` added to a
    quantity whose L2 change per contribution is at most ``C``."""

    noise_multiplier: float
    kind: ClassVar[str] = "gaussian"

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", _positive_finite(self.kind, "noise_multiplier", self.noise_multiplier)
        )


@dataclasses.dataclass(frozen=True)
class DiscreteGaussianEvent(PrivacyEvent):
    """Integer noise with P[x] ∝ exp(-x² / (2 sigma²)) added to an integer quantity
    whose L2 change per contribution is at most ``sensitivity`` (Canonne, Kamath,
    Steinke, "The discrete Gaussian for differential privacy", NeurIPS 2020)."""

    sigma: float
    sensitivity: int = 1
    kind: ClassVar[str] = "discrete_gaussian"

    def __post_init__(self) -> None:
        object.__setattr__(self, "sigma", _positive_finite(self.kind, "sigma", self.sigma))
        object.__setattr__(self, "sensitivity", _positive_int(self.kind, "sensitivity", self.sensitivity))


@dataclasses.dataclass(frozen=True)
class PoissonSampledEvent(PrivacyEvent):
    """``event`` run on a Poisson sample: each person is included independently
    with probability ``sampling_probability`` (0 < q <= 1)."""

    sampling_probability: float
    event: PrivacyEvent
    kind: ClassVar[str] = "poisson_sampled"

    def __post_init__(self) -> None:
        q = _positive_finite(self.kind, "sampling_probability", self.sampling_probability)
        if q > 1.0:
            raise SpecError(f"{self.kind}: sampling_probability must be in (0, 1], got {q}")
        object.__setattr__(self, "sampling_probability", q)
        if not isinstance(self.event, PrivacyEvent):
            raise SpecError(f"{self.kind}: event must be a PrivacyEvent, got {self.event!r}")


@dataclasses.dataclass(frozen=True)
class ComposedEvent(PrivacyEvent):
    """The events run one after the other on the same data, each possibly chosen
    after seeing the earlier outputs (adaptive composition with parameters fixed
    in advance; for parameters chosen on the fly use a privacy filter)."""

    events: tuple[PrivacyEvent, ...]
    kind: ClassVar[str] = "composed"

    def __post_init__(self) -> None:
        events = tuple(self.events)
        if not events:
            raise SpecError(f"{self.kind}: events must not be empty")
        for e in events:
            if not isinstance(e, PrivacyEvent):
                raise SpecError(f"{self.kind}: every element must be a PrivacyEvent, got {e!r}")
        object.__setattr__(self, "events", events)


@dataclasses.dataclass(frozen=True)
class SelfComposedEvent(PrivacyEvent):
    """``event`` run ``count`` times (each run possibly adaptive)."""

    event: PrivacyEvent
    count: int
    kind: ClassVar[str] = "self_composed"

    def __post_init__(self) -> None:
        if not isinstance(self.event, PrivacyEvent):
            raise SpecError(f"{self.kind}: event must be a PrivacyEvent, got {self.event!r}")
        object.__setattr__(self, "count", _positive_int(self.kind, "count", self.count))


def local_event(spec: ReportSpec) -> LocalReportEvent:
    """The event of one report privatized under ``spec``: every registered
    mechanism is pure ``spec.epsilon``-LDP per report. Repeated reports of
    the same value compose unless the mechanism memoizes its randomization
    (RAPPOR's permanent randomized response), which the ledger decides."""
    return LocalReportEvent(spec.epsilon)


_KINDS: dict[str, type[PrivacyEvent]] = {
    cls.kind: cls
    for cls in (
        LocalReportEvent,
        PureDPEvent,
        LaplaceEvent,
        DiscreteLaplaceEvent,
        GaussianEvent,
        DiscreteGaussianEvent,
        PoissonSampledEvent,
        ComposedEvent,
        SelfComposedEvent,
    )
}


def event_from_dict(data: dict[str, Any]) -> PrivacyEvent:
    """Inverse of :meth:`PrivacyEvent.to_dict`."""
    if not isinstance(data, dict) or data.get("kind") not in _KINDS:
        raise SpecError(f"a privacy event must be an object with 'kind' one of {sorted(_KINDS)}, got {data!r}")
    params = {k: v for k, v in data.items() if k != "kind"}
    if "event" in params:
        params["event"] = event_from_dict(params["event"])
    if "events" in params:
        params["events"] = tuple(event_from_dict(e) for e in params["events"])
    try:
        return _KINDS[data["kind"]](**params)
    except TypeError as exc:
        raise SpecError(f"{data['kind']}: {exc}") from None


def sampled_gaussian_event(noise_multiplier: float, sample_rate: float, steps: int) -> PrivacyEvent:
    """``steps`` Gaussian steps with ``noise_multiplier``, Poisson-sampled at ``sample_rate`` (1 = no sampling):
    SelfComposed(PoissonSampled(q, Gaussian(σ)), T), the privacy event of T DP-SGD steps (Abadi et al. 2016) and
    of T Poisson-sampled rounds of DP-FedAvg. The one place that event is built: :meth:`ldp_core.fl.dpsgd.DPSGDConfig.event`,
    :meth:`ldp_core.fl.local_dpsgd.LocalDPSGDSpec.event` and the server's accountant call it."""
    step: PrivacyEvent = GaussianEvent(noise_multiplier)
    if sample_rate < 1.0:
        step = PoissonSampledEvent(sample_rate, step)
    return SelfComposedEvent(step, steps)
