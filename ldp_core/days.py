"""UTC days, the one way the project counts them, and the window of report days.

A *day* is a UTC day number: whole days since 1970-01-01 (:data:`EPOCH`).
Everything that dates a report, a token, a ledger entry or a transport
record uses the functions here: :func:`utc_day` (POSIX time to day),
:func:`day_start` (POSIX time to the start of its day), :func:`iso_day` and
:func:`day_of_iso` (day to ``YYYY-MM-DD`` and back), :func:`utc_iso_day`
(POSIX time to ``YYYY-MM-DD``: the token issuer's day keys) and
:func:`parse_day` (a day number or an ISO date, as users write them).

:class:`DayWindow` is the one window of report days that the collector
accepts and the shuffler keeps.
A batch's ``day`` (UTC days since 1970-01-01) is accepted by the collector
when it lies in ``[today - max_day_age, today + max_days_ahead]``, ``today``
being the UTC day of the collector's clock. The shuffler uses the same
window, also against the UTC clock (never against the newest day it has
seen: one report dated ``today + 1`` must not expire anything): it keeps a
buffered group of day ``d`` while ``d >= today - max_day_age - grace_days``
and drops it (counted, logged) once ``d`` falls below. ``grace_days`` (one
by default) lets a batch answered 202 just before UTC midnight, at the old
edge of the window, still be applied by a shuffler that reads it after
midnight or after a backlog of up to a day. So everything the collector
answered 202 is counted, unless its group never reached a crowd before its
day left the window.

Both services read the window from one pair of settings,
``$LDP_MAX_DAY_AGE`` and ``$LDP_MAX_DAYS_AHEAD`` (:meth:`DayWindow.from_env`);
the collector's older ``$LDP_COLLECTOR_MAX_DAY_AGE`` / ``--max-day-age`` and
the shuffler's ``$LDP_SHUFFLER_MAX_DAY_AGE`` still win where given.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import time
from collections.abc import Callable, Mapping

from ldp_core.errors import ConfigError

__all__ = [
    "EPOCH",
    "DAY_SECONDS",
    "utc_day",
    "day_start",
    "iso_day",
    "day_of_iso",
    "utc_iso_day",
    "parse_day",
    "DayWindow",
    "DAY_WINDOW_ENV",
    "DEFAULT_MAX_DAY_AGE",
    "DEFAULT_MAX_DAYS_AHEAD",
]

#: day 0
EPOCH = _dt.date(1970, 1, 1)
#: seconds in a UTC day (POSIX time has no leap seconds)
DAY_SECONDS = 86400

DEFAULT_MAX_DAY_AGE = 31
DEFAULT_MAX_DAYS_AHEAD = 1
#: the shared environment variables, by field
DAY_WINDOW_ENV = {"max_day_age": "LDP_MAX_DAY_AGE", "max_days_ahead": "LDP_MAX_DAYS_AHEAD"}


def utc_day(t: float) -> int:
    """The UTC day (days since 1970-01-01) holding POSIX time ``t``."""
    return int(t // DAY_SECONDS)


def day_start(t: float) -> float:
    """The start (POSIX seconds) of the UTC day holding time ``t``."""
    return t - t % DAY_SECONDS


def iso_day(day: int) -> str:
    """Day number ``day`` as an ISO date, ``YYYY-MM-DD``."""
    return (EPOCH + _dt.timedelta(days=day)).isoformat()


def day_of_iso(s: str) -> int:
    """The day number of ISO date ``s`` (``YYYY-MM-DD``); ``ValueError`` if it is not one."""
    return (_dt.date.fromisoformat(s) - EPOCH).days


def utc_iso_day(t: float) -> str:
    """The UTC day holding POSIX time ``t``, as an ISO date."""
    return iso_day(utc_day(t))


@dataclasses.dataclass(frozen=True)
class DayWindow:
    """Days ``[today - max_day_age, today + max_days_ahead]`` are accepted; the shuffler drops a buffered day
    once it is older than ``today - max_day_age - grace_days``."""

    max_day_age: int = DEFAULT_MAX_DAY_AGE
    max_days_ahead: int = DEFAULT_MAX_DAYS_AHEAD
    grace_days: int = 1

    def __post_init__(self) -> None:
        for name, hi in (("max_day_age", 3660), ("max_days_ahead", 366), ("grace_days", 366)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
                raise ConfigError(f"{name} must be an integer from 0 to {hi}, got {v!r}")

    def bounds(self, today: int) -> tuple[int, int]:
        """The oldest and the newest day accepted on UTC day ``today`` (both included)."""
        return today - self.max_day_age, today + self.max_days_ahead

    def accepts(self, day: int, today: int) -> bool:
        lo, hi = self.bounds(today)
        return lo <= day <= hi

    def oldest_kept(self, today: int) -> int:
        """The oldest day the shuffler still keeps on UTC day ``today``."""
        return today - self.max_day_age - self.grace_days

    def today(self, clock: Callable[[], float] = time.time) -> int:
        return utc_day(clock())

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: int | None) -> DayWindow:
        """``overrides`` (``None``: not given) over ``$LDP_MAX_DAY_AGE`` / ``$LDP_MAX_DAYS_AHEAD`` over the defaults."""
        env = os.environ if environ is None else environ
        values: dict[str, int] = {}
        for name, var in DAY_WINDOW_ENV.items():
            raw = env.get(var)
            if raw is not None:
                try:
                    values[name] = int(raw)
                except ValueError:
                    raise ConfigError(f"${var}={raw!r} is not an integer") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def parse_day(value: str | int) -> int:
    """A UTC day number from ``20419`` or ``2025-11-27``."""
    if isinstance(value, int):
        return value
    s = str(value).strip()
    if s.lstrip("-").isdigit():
        return int(s)
    try:
        return day_of_iso(s)
    except ValueError:
        raise ValueError(f"day {value!r} is neither a day number (days since 1970-01-01) nor an ISO date") from None
