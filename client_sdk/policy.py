"""The device's local privacy policy: daily ε caps the device, not the server, controls.

A :class:`LocalPolicy` caps the ε a device spends

* per metric per UTC day (``per_metric_daily``; ``per_metric_overrides``
  may lower or raise it for named metrics), and
* over all metrics per UTC day (``total_daily``).

Reports compose sequentially: a device's reports on one day are jointly
``Σ ε_i``-LDP (basic composition; Dwork and Roth, "The Algorithmic
Foundations of Differential Privacy", 2014, Thm. 3.16), so capping the sum
of the per-report ε caps the day's privacy loss. The :class:`BudgetLedger
<client_sdk.ledger.BudgetLedger>` enforces the caps report by report.

Before that, :meth:`LocalPolicy.check_metric` refuses a *definition* whose
own daily demand ``r * ε`` (r = ``max_reports_per_day``) exceeds a cap: a
metric from a mistaken or malicious server that asks for more than the
device allows is not adopted at all, rather than adopted and cut short.

**What a memoized definition may ask beyond ε.** ε∞ bounds what a RAPPOR
metric reveals about the *value*; it says nothing about how well a device's
reports identify the *device*. A definition with no instantaneous
randomization (``p = 0, q = 1``) makes every report of one value the same
bytes (the permanent response itself), and 4,096 bits in 65,536 cohorts make
those bytes a fingerprint. So :meth:`LocalPolicy.check_metric` also refuses a
memoized definition whose per-bit instantaneous ε, ``ln(q(1-p) / (p(1-q)))``,
is above ``max_irr_epsilon`` (infinite for ``p = 0`` or ``q = 1``), or that has
more than ``max_rappor_bits`` bits or ``max_rappor_cohorts`` cohorts. The
shipped bounds (:data:`SHIPPED_MAX_IRR_EPSILON` 2.5, :data:`SHIPPED_MAX_RAPPOR_BITS`
1,024, :data:`SHIPPED_MAX_RAPPOR_COHORTS` 128) are the laxest a policy accepts:
a device may be configured stricter, never laxer, and nothing a server sends
changes a :class:`LocalPolicy`. (The paper's IRR, p = 0.5 and q = 0.75, has a
per-bit ε of ln 3 = 1.1.)

**Repeated-collection mechanisms** (docs/NUMERIC.md, "Repeated collection").
A memoized 1bitmean, dbitflip or loloha metric reveals one memoized response
per distinct (rounded, bucketed or hashed) value a device uses, so its
lifetime loss grows with how many there can be: the policy refuses a
1bitmean ``granularity`` above 64 (at most 65 bits of ε each), a dbitflip
``sample`` above 32 or ``buckets`` above 1,024, and a loloha ``g`` above 64
(lifetime loss ``g·ε∞``) or one without instantaneous randomization
(``epsilon_one`` must be below ``epsilon``). These bounds are fixed in the SDK.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from client_sdk.memo import MemoStore
from ldp_core.errors import BudgetError
from ldp_core.mechanisms.loloha import LolohaSpec
from ldp_core.mechanisms.rappor import RapporSpec
from ldp_core.mechanisms.repeated import DBitFlipSpec, OneBitMeanSpec
from ldp_core.metrics import MetricDefinition

__all__ = [
    "LocalPolicy",
    "EPSILON_UNIT",
    "to_units",
    "SHIPPED_MAX_IRR_EPSILON",
    "SHIPPED_MAX_RAPPOR_BITS",
    "SHIPPED_MAX_RAPPOR_COHORTS",
    "MAX_1BITMEAN_GRANULARITY",
    "MAX_DBITFLIP_SAMPLE",
    "MAX_DBITFLIP_BUCKETS",
    "MAX_LOLOHA_G",
]

#: The laxest bounds a :class:`LocalPolicy` accepts on a memoized definition (module docstring).
SHIPPED_MAX_IRR_EPSILON = 2.5
SHIPPED_MAX_RAPPOR_BITS = 1024
SHIPPED_MAX_RAPPOR_COHORTS = 128
#: Bounds on the repeated-collection mechanisms (module docstring): 1bitmean's grid, dbitflip's sampled and
#: total buckets, loloha's hash range (its lifetime loss is g·ε∞).
MAX_1BITMEAN_GRANULARITY = 64
MAX_DBITFLIP_SAMPLE = 32
MAX_DBITFLIP_BUCKETS = 1024
MAX_LOLOHA_G = 64

#: Ledgers count ε in integer units of 1e-9 so that sums and cap checks are
#: exact; spends are rounded up and caps down (never in the device's disfavor).
EPSILON_UNIT = 1e-9


def to_units(epsilon: float, *, round_up: bool) -> int:
    """ε in integer units of :data:`EPSILON_UNIT`, rounded up (spends) or down (caps)."""
    scaled = epsilon / EPSILON_UNIT
    nearest = round(scaled)
    if abs(scaled - nearest) < 1e-6:  # absorb float noise such as 0.1 / 1e-9
        return int(nearest)
    return int(math.ceil(scaled) if round_up else math.floor(scaled))


def _check_cap(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BudgetError(f"local policy: {name} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value <= 0.0:
        raise BudgetError(f"local policy: {name} must be a finite number > 0, got {value!r}")
    return value


def _check_bound(name: str, value: Any, shipped: float, *, integer: bool) -> Any:
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise BudgetError(f"local policy: {name} must be {kind}, got {value!r}")
    if not (0 < value <= shipped) or (not integer and not math.isfinite(value)):
        raise BudgetError(
            f"local policy: {name} must be above 0 and at most {shipped:g}, the bound this SDK ships with "
            f"(a device may be stricter, never laxer), got {value!r}"
        )
    return int(value) if integer else float(value)


@dataclasses.dataclass(frozen=True)
class LocalPolicy:
    """Daily ε caps and bounds on memoized definitions, enforced on the device (see the module docstring)."""

    per_metric_daily: float
    total_daily: float
    per_metric_overrides: Mapping[str, float] = dataclasses.field(default_factory=dict)
    max_irr_epsilon: float = SHIPPED_MAX_IRR_EPSILON
    max_rappor_bits: int = SHIPPED_MAX_RAPPOR_BITS
    max_rappor_cohorts: int = SHIPPED_MAX_RAPPOR_COHORTS

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_metric_daily", _check_cap("per_metric_daily", self.per_metric_daily))
        object.__setattr__(self, "total_daily", _check_cap("total_daily", self.total_daily))
        if not isinstance(self.per_metric_overrides, Mapping):
            raise BudgetError("local policy: per_metric_overrides must map metric names to caps")
        overrides = {
            str(k): _check_cap(f"per_metric_overrides[{k!r}]", v) for k, v in self.per_metric_overrides.items()
        }
        object.__setattr__(self, "per_metric_overrides", MappingProxyType(overrides))
        for name, shipped, integer in (
            ("max_irr_epsilon", SHIPPED_MAX_IRR_EPSILON, False),
            ("max_rappor_bits", SHIPPED_MAX_RAPPOR_BITS, True),
            ("max_rappor_cohorts", SHIPPED_MAX_RAPPOR_COHORTS, True),
        ):
            object.__setattr__(self, name, _check_bound(name, getattr(self, name), shipped, integer=integer))

    def metric_cap(self, metric: str) -> float:
        """The daily ε cap of ``metric`` (never above the total cap)."""
        return min(self.per_metric_overrides.get(metric, self.per_metric_daily), self.total_daily)

    def metric_cap_units(self, metric: str) -> int:
        return to_units(self.metric_cap(metric), round_up=False)

    @property
    def total_cap_units(self) -> int:
        return to_units(self.total_daily, round_up=False)

    def check_metric(self, metric: MetricDefinition) -> None:
        """Raise :class:`BudgetError` if ``metric``'s daily demand exceeds a cap, or if it is
        memoized and its instantaneous noise, bits or cohorts are out of bounds."""
        self._check_memoized(metric)
        cap = self.metric_cap(metric.name)
        demand = metric.daily_epsilon
        if to_units(demand, round_up=True) > to_units(cap, round_up=False):
            raise BudgetError(
                f"metric {metric.name!r} asks for up to {metric.max_reports_per_day} report(s) of "
                f"epsilon {metric.spec.epsilon:g} per day ({demand:g} in all), above this device's daily cap "
                f"of {cap:g} for it; lower its epsilon or max_reports_per_day, or raise the local policy's cap"
            )

    def _check_memoized(self, metric: MetricDefinition) -> None:
        spec = metric.spec
        if not MemoStore.supports(spec):
            return
        if isinstance(spec, (OneBitMeanSpec, DBitFlipSpec, LolohaSpec)):
            self._check_repeated(metric.name, spec)
            return
        if not isinstance(spec, RapporSpec):  # a memoized mechanism whose noise this policy cannot bound
            raise BudgetError(
                f"metric {metric.name!r}: this device bounds memoized RAPPOR, 1bitmean, dbitflip and loloha "
                f"definitions only, not {spec.name}"
            )
        problems = []
        if spec.irr_epsilon > self.max_irr_epsilon:
            problems.append(
                f"its instantaneous randomization (p={spec.p:g}, q={spec.q:g}) has a per-bit epsilon of "
                f"{spec.irr_epsilon:g}, above {self.max_irr_epsilon:g} (p=0 or q=1 is none at all: every report "
                "of a value would be the same bytes)"
            )
        if spec.num_bits > self.max_rappor_bits:
            problems.append(f"num_bits {spec.num_bits} is above {self.max_rappor_bits}")
        if spec.num_cohorts > self.max_rappor_cohorts:
            problems.append(f"num_cohorts {spec.num_cohorts} is above {self.max_rappor_cohorts}")
        if problems:
            raise BudgetError(
                f"metric {metric.name!r} would make this device's reports identify it: " + "; ".join(problems)
            )

    @staticmethod
    def _check_repeated(name: str, spec: OneBitMeanSpec | DBitFlipSpec | LolohaSpec) -> None:
        """The repeated-collection mechanisms' lifetime loss grows with the distinct memoized responses a
        device may use (module docstring): bound them."""
        problems = []
        if isinstance(spec, OneBitMeanSpec) and spec.granularity > MAX_1BITMEAN_GRANULARITY:
            problems.append(
                f"granularity {spec.granularity} is above {MAX_1BITMEAN_GRANULARITY} (a device may use "
                f"granularity + 1 memoized bits, each costing epsilon)"
            )
        if isinstance(spec, DBitFlipSpec):
            if spec.d > MAX_DBITFLIP_SAMPLE:
                problems.append(f"sample {spec.d} is above {MAX_DBITFLIP_SAMPLE} buckets per device")
            if spec.k > MAX_DBITFLIP_BUCKETS:
                problems.append(f"buckets {spec.k} is above {MAX_DBITFLIP_BUCKETS}")
        if isinstance(spec, LolohaSpec):
            if spec.hash_range > MAX_LOLOHA_G:
                problems.append(
                    f"g {spec.hash_range} is above {MAX_LOLOHA_G} (the lifetime loss is up to g * epsilon = "
                    f"{spec.epsilon_total:g})"
                )
            if not (math.isfinite(spec.irr_epsilon) and spec.eps_one < spec.epsilon):
                problems.append("it has no instantaneous randomization (epsilon_one must be below epsilon)")
        if problems:
            raise BudgetError(f"metric {name!r} asks more than this device allows: " + "; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_metric_daily": self.per_metric_daily,
            "total_daily": self.total_daily,
            "per_metric_overrides": dict(self.per_metric_overrides),
            "max_irr_epsilon": self.max_irr_epsilon,
            "max_rappor_bits": self.max_rappor_bits,
            "max_rappor_cohorts": self.max_rappor_cohorts,
        }
