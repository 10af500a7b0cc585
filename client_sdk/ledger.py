"""The budget ledger: what the device has spent, per metric and per UTC day.

:class:`BudgetLedger` charges each report's ε against the
:class:`~client_sdk.policy.LocalPolicy` caps and counts reports per metric
per day (report sampling: at most r). A spend is one ``BEGIN IMMEDIATE``
transaction that reads the day's totals, checks every cap and writes the
new totals: atomic across threads and across processes that share the
storage directory, so two processes together never exceed a cap. Amounts
are integers in units of 1e-9 ε (:func:`~client_sdk.policy.to_units`),
spends rounded up and caps down, so sums are exact.

**Time.** The ledger keeps a high-water mark of the wall clock and charges
each spend to the UTC day of ``max(now, high_water)``. A clock moved
backwards therefore never reaches a day whose budget was already counted
as past: it lands on the latest day seen, whose spends are on record, and
spends nothing new. (A clock moved far *forward* and back again keeps the
device on the future day until real time catches up: the safe direction.)

**Forward jumps.** A wall clock moved *forward* would open a fresh day's
budget at each jump (five jumps of a day in one real day: six daily caps).
So the mark never advances by more than the monotonic time that really
passed: with the previous observation's monotonic reading ``m0`` and
the same boot, the new mark is ``max(high, min(now, high + (mono - m0)))``.
The mark, the monotonic reading and the boot id (Linux
``/proc/sys/kernel/random/boot_id``; elsewhere an id drawn per process, so a
process restart counts as a reboot) are persisted in the same transaction as
the spend. While real days pass the wall clock and the monotonic clock move
together and nothing changes; a forward jump is held back to real elapsed
time, so within W monotonic seconds the ledger charges at most
``ceil(W / 86400) + 1`` UTC days, as when no clock is touched. Monotonic time
does not survive a reboot: on the first observation of a new boot the mark
follows the wall clock as before (the residual, docs/PRIVACY.md: one extra
day's budget per reboot combined with a clock jump). A wall clock found
*behind* the mark within a boot and later corrected forward stays capped by
monotonic time too, so the device may lag real days for the rest of that boot
(fewer budgets, never more).

*Departure from the design:* ``try_spend`` takes no ``day`` argument. A
day chosen by the caller could be an earlier one, which is exactly what the
high-water mark forbids; the ledger derives the day itself.
"""

from __future__ import annotations

import enum
import secrets
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from client_sdk.policy import EPSILON_UNIT, LocalPolicy, to_units
from client_sdk.store import Store
from ldp_core.days import utc_day
from ldp_core.errors import BudgetError
from ldp_core.privacy_events import ComposedEvent, LocalReportEvent, PrivacyEvent, PureDPEvent, SelfComposedEvent

__all__ = ["BudgetLedger", "SpendOutcome", "MetricBudget", "DayBudget", "Cost", "epsilon_of", "boot_id"]

_BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
_PROCESS_BOOT = "process-" + secrets.token_hex(16)


def boot_id() -> str:
    """The id of this boot (Linux), or an id drawn once per process where the OS gives none.

    Monotonic readings are comparable only under the same id."""
    try:
        with open(_BOOT_ID_PATH, encoding="ascii") as f:
            value = f.read().strip()
    except OSError:
        return _PROCESS_BOOT
    return value or _PROCESS_BOOT


Cost = float | PrivacyEvent


def epsilon_of(cost: Cost) -> float:
    """The pure ε a cost stands for.

    A float is ε itself. A :class:`LocalReportEvent` or :class:`PureDPEvent`
    is its ε; compositions add up (basic sequential composition). Other
    events (Gaussian, sampled, ...) have no pure-ε value and are refused.
    """
    if isinstance(cost, (LocalReportEvent, PureDPEvent)):
        return cost.epsilon
    if isinstance(cost, ComposedEvent):
        return sum(epsilon_of(e) for e in cost.events)
    if isinstance(cost, SelfComposedEvent):
        return cost.count * epsilon_of(cost.event)
    if isinstance(cost, PrivacyEvent):
        raise BudgetError(f"the device ledger charges pure-epsilon events only, got a {cost.kind!r} event")
    if isinstance(cost, bool) or not isinstance(cost, (int, float)) or not 0.0 < float(cost) < float("inf"):
        raise BudgetError(f"an epsilon cost must be a finite number > 0, got {cost!r}")
    return float(cost)


class SpendOutcome(enum.Enum):
    """The result of one spend attempt."""

    OK = "ok"
    REPORT_LIMIT = "report_limit"  # r reports already sent for this metric today
    METRIC_CAP = "metric_cap"  # the metric's daily ε cap would be exceeded
    TOTAL_CAP = "total_cap"  # the device's daily ε cap would be exceeded

    def __bool__(self) -> bool:
        return self is SpendOutcome.OK


@dataclass(frozen=True)
class MetricBudget:
    """One metric's spend on one day."""

    spent: float
    cap: float
    reports: int

    @property
    def remaining(self) -> float:
        return max(0.0, self.cap - self.spent)


@dataclass(frozen=True)
class DayBudget:
    """A read-only view of one UTC day's spending."""

    day: int
    spent: float
    cap: float
    metrics: Mapping[str, MetricBudget]

    @property
    def remaining(self) -> float:
        return max(0.0, self.cap - self.spent)


class BudgetLedger:
    """Persistent, atomic daily ε accounting (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        policy: LocalPolicy,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] | None = None,
        boot: Callable[[], str] = boot_id,
    ) -> None:
        if not isinstance(policy, LocalPolicy):
            raise BudgetError(f"policy must be a LocalPolicy, got {type(policy).__name__}")
        self.store = store
        self.policy = policy
        self.clock = clock
        # No monotonic source given: the real one under the real wall clock; a simulated wall clock (an
        # injected ``clock``, or ``now=``) stands for a world where both move together.
        self._monotonic = monotonic
        self._simulated = monotonic is None and clock is not time.time
        self.boot = boot

    def reading(self, wall: float, *, simulated: bool = False) -> tuple[float, str]:
        """The monotonic reading and boot id to observe with wall time ``wall``."""
        if self._monotonic is not None:
            return self._monotonic(), self.boot()
        if self._simulated or simulated:
            return wall, "simulated"
        return time.monotonic(), self.boot()

    @classmethod
    def open(
        cls,
        directory: str,
        policy: LocalPolicy,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] | None = None,
        boot: Callable[[], str] = boot_id,
    ) -> BudgetLedger:
        return cls(Store(directory), policy, clock=clock, monotonic=monotonic, boot=boot)

    # -- inside a caller's transaction --------------------------------------
    @staticmethod
    def observe_time_in(
        conn: sqlite3.Connection, now: float, mono: float | None = None, boot: str | None = None
    ) -> float:
        """Raise the high-water mark towards ``now``, by at most the monotonic time since the last
        observation of the same boot (module docstring, "Forward jumps"); return the mark.

        Without ``mono`` and ``boot`` the mark follows ``now`` alone (and the monotonic anchor is kept)."""
        row = conn.execute("SELECT high_water FROM clock WHERE id = 1").fetchone()
        target = now
        if row is not None:
            high = float(row[0])
            anchor = None if mono is None else conn.execute("SELECT boot, mono FROM clock_mono WHERE id = 1").fetchone()
            if anchor is not None and anchor[0] == boot:
                target = min(now, high + max(0.0, mono - float(anchor[1])))  # type: ignore[operator]
            target = max(high, target)
        if mono is not None and boot is not None:
            conn.execute(
                "INSERT INTO clock_mono (id, boot, mono) VALUES (1, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET boot = excluded.boot, mono = excluded.mono",
                (boot, mono),
            )
        if row is None:
            conn.execute("INSERT INTO clock (id, high_water) VALUES (1, ?)", (target,))
        elif target > float(row[0]):
            conn.execute("UPDATE clock SET high_water = ? WHERE id = 1", (target,))
        return target

    def spend_in(
        self, conn: sqlite3.Connection, metric: str, units: int, day: int, max_reports: int | None
    ) -> SpendOutcome:
        """Check every cap for one report of ``units`` and record it if all hold."""
        row = conn.execute("SELECT spent, reports FROM ledger WHERE day = ? AND metric = ?", (day, metric)).fetchone()
        spent, reports = (int(row[0]), int(row[1])) if row else (0, 0)
        if max_reports is not None and reports >= max_reports:
            return SpendOutcome.REPORT_LIMIT
        if spent + units > self.policy.metric_cap_units(metric):
            return SpendOutcome.METRIC_CAP
        total = conn.execute("SELECT COALESCE(SUM(spent), 0) FROM ledger WHERE day = ?", (day,)).fetchone()[0]
        if int(total) + units > self.policy.total_cap_units:
            return SpendOutcome.TOTAL_CAP
        conn.execute(
            "INSERT INTO ledger (day, metric, spent, reports) VALUES (?, ?, ?, 1) "
            "ON CONFLICT (day, metric) DO UPDATE SET spent = spent + excluded.spent, reports = reports + 1",
            (day, metric, units),
        )
        return SpendOutcome.OK

    def spend_many_in(
        self, conn: sqlite3.Connection, day: int, requests: list[tuple[str, int, int | None]]
    ) -> list[SpendOutcome]:
        """:meth:`spend_in` for many ``(metric, units, max_reports)`` in order, with one
        read and one write per metric: the same decisions, inside one transaction."""
        rows = conn.execute("SELECT metric, spent, reports FROM ledger WHERE day = ?", (day,)).fetchall()
        state = {m: [int(s), int(r)] for m, s, r in rows}
        total = sum(s for s, _ in state.values())
        total_cap = self.policy.total_cap_units
        caps: dict[str, int] = {}
        touched: set[str] = set()
        out: list[SpendOutcome] = []
        for metric, units, max_reports in requests:
            cur = state.setdefault(metric, [0, 0])
            cap = caps.get(metric)
            if cap is None:
                cap = caps[metric] = self.policy.metric_cap_units(metric)
            if max_reports is not None and cur[1] >= max_reports:
                out.append(SpendOutcome.REPORT_LIMIT)
            elif cur[0] + units > cap:
                out.append(SpendOutcome.METRIC_CAP)
            elif total + units > total_cap:
                out.append(SpendOutcome.TOTAL_CAP)
            else:
                cur[0] += units
                cur[1] += 1
                total += units
                touched.add(metric)
                out.append(SpendOutcome.OK)
        conn.executemany(
            "INSERT INTO ledger (day, metric, spent, reports) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (day, metric) DO UPDATE SET spent = excluded.spent, reports = excluded.reports",
            [(day, m, state[m][0], state[m][1]) for m in sorted(touched)],
        )
        return out

    # -- standalone ---------------------------------------------------------
    def spend(
        self, metric: str, cost: Cost, *, max_reports: int | None = None, now: float | None = None
    ) -> SpendOutcome:
        """Charge ``cost`` to ``metric`` on the current day, atomically; say why if refused."""
        units = to_units(epsilon_of(cost), round_up=True)
        with self.store.transaction() as conn:
            wall = self.clock() if now is None else now
            high = self.observe_time_in(conn, wall, *self.reading(wall, simulated=now is not None))
            return self.spend_in(conn, metric, units, utc_day(high), max_reports)

    def try_spend(self, metric: str, cost: Cost, *, max_reports: int | None = None, now: float | None = None) -> bool:
        """``True`` and recorded if one report of ``cost`` fits every cap today, else ``False``."""
        return bool(self.spend(metric, cost, max_reports=max_reports, now=now))

    def high_water(self) -> float | None:
        row = self.store.connection().execute("SELECT high_water FROM clock WHERE id = 1").fetchone()
        return None if row is None else float(row[0])

    def current_day(self, now: float | None = None) -> int:
        """The day the next spend would be charged to."""
        now = self.clock() if now is None else now
        high = self.high_water()
        return utc_day(now if high is None else max(now, high))

    def day_budget(self, day: int | None = None) -> DayBudget:
        """What was spent on ``day`` (default: the current day) against the caps."""
        day = self.current_day() if day is None else day
        rows = (
            self.store.connection()
            .execute("SELECT metric, spent, reports FROM ledger WHERE day = ? ORDER BY metric", (day,))
            .fetchall()
        )
        metrics = {
            m: MetricBudget(spent=s * EPSILON_UNIT, cap=self.policy.metric_cap(m), reports=int(r)) for m, s, r in rows
        }
        total = sum(int(s) for _, s, _ in rows) * EPSILON_UNIT
        return DayBudget(day=day, spent=total, cap=self.policy.total_daily, metrics=MappingProxyType(metrics))

    def days(self) -> list[int]:
        """The days with any spend on record, oldest first."""
        rows = self.store.connection().execute("SELECT DISTINCT day FROM ledger ORDER BY day").fetchall()
        return [int(r[0]) for r in rows]

    def prune(self, before_day: int) -> int:
        """Forget the spends of days before ``before_day`` (never the current one)."""
        before_day = min(before_day, self.current_day())
        with self.store.transaction() as conn:
            return conn.execute("DELETE FROM ledger WHERE day < ?", (before_day,)).rowcount
