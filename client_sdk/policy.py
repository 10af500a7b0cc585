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
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from client_sdk.errors import BudgetError
from client_sdk.metrics import MetricDefinition

__all__ = ["LocalPolicy", "EPSILON_UNIT", "to_units"]

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


@dataclasses.dataclass(frozen=True)
class LocalPolicy:
    """Daily ε caps enforced on the device (see the module docstring)."""

    per_metric_daily: float
    total_daily: float
    per_metric_overrides: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "per_metric_daily", _check_cap("per_metric_daily", self.per_metric_daily))
        object.__setattr__(self, "total_daily", _check_cap("total_daily", self.total_daily))
        if not isinstance(self.per_metric_overrides, Mapping):
            raise BudgetError("local policy: per_metric_overrides must map metric names to caps")
        overrides = {
            str(k): _check_cap(f"per_metric_overrides[{k!r}]", v) for k, v in self.per_metric_overrides.items()
        }
        object.__setattr__(self, "per_metric_overrides", MappingProxyType(overrides))

    def metric_cap(self, metric: str) -> float:
        """The daily ε cap of ``metric`` (never above the total cap)."""
        return min(self.per_metric_overrides.get(metric, self.per_metric_daily), self.total_daily)

    def metric_cap_units(self, metric: str) -> int:
        return to_units(self.metric_cap(metric), round_up=False)

    @property
    def total_cap_units(self) -> int:
        return to_units(self.total_daily, round_up=False)

    def check_metric(self, metric: MetricDefinition) -> None:
        """Raise :class:`BudgetError` if ``metric``'s daily demand exceeds a cap."""
        cap = self.metric_cap(metric.name)
        demand = metric.daily_epsilon
        if to_units(demand, round_up=True) > to_units(cap, round_up=False):
            raise BudgetError(
                f"metric {metric.name!r} asks for up to {metric.max_reports_per_day} report(s) of "
                f"epsilon {metric.spec.epsilon:g} per day ({demand:g} in all), above this device's daily cap "
                f"of {cap:g} for it; lower its epsilon or max_reports_per_day, or raise the local policy's cap"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "per_metric_daily": self.per_metric_daily,
            "total_daily": self.total_daily,
            "per_metric_overrides": dict(self.per_metric_overrides),
        }
