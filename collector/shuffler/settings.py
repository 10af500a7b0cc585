"""The shuffler's settings: :class:`ShufflerSettings`, a frozen value validated at construction, read from
``$LDP_SHUFFLER_<FIELD>`` (and the shared day window's ``$LDP_MAX_DAY_AGE`` / ``$LDP_MAX_DAYS_AHEAD``)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from collector.errors import ConfigError
from ldp_core.days import DAY_WINDOW_ENV, DEFAULT_MAX_DAY_AGE, DEFAULT_MAX_DAYS_AHEAD, DayWindow
from pipeline.settings import check_names, check_ranges, check_topics, settings_from_env
from pipeline.topics import (
    DEFAULT_PARTITIONS,
    RAW_TOPIC,
    SHUFFLED_KEYING_ENV,
    SHUFFLED_KEYINGS,
    SHUFFLED_TOPIC,
    SHUFFLER_STATE_TOPIC,
)

__all__ = ["ShufflerSettings", "DeviceCaps", "ENV_PREFIX", "DEFAULT_KEY_PATH"]

#: prefix of the environment variables :meth:`ShufflerSettings.from_env` reads (``LDP_SHUFFLER_MIN_BATCH``, ...)
ENV_PREFIX = "LDP_SHUFFLER_"
#: the shuffler's secret (checkpoint encryption and dedup digests), created 0600 on first use
DEFAULT_KEY_PATH = "ldp-data/shuffler.key"


@dataclasses.dataclass(frozen=True)
class ShufflerSettings:
    """How the shuffler batches and checkpoints.

    ``min_batch`` is the crowd threshold: no batch smaller than it is ever
    released. ``max_batch`` (and ``max_batch_bytes``) cap a released batch;
    a group is released whole when it can be cut into batches within both
    bounds, else as full ``max_batch`` batches with the (random) remainder
    kept. ``checkpoint_interval`` is the time between transactions (the
    added latency); ``max_pending_reports`` forces one earlier.
    ``max_day_age``, ``max_days_ahead`` are the collector's window of days
    (:mod:`ldp_core.days`; also from ``$LDP_MAX_DAY_AGE`` /
    ``$LDP_MAX_DAYS_AHEAD``) and a group is kept ``expiry_grace_days`` past
    it. ``key_file`` is the shuffler's secret (created 0600 if missing; the
    same file for every member of the group). ``shuffled_key`` is how released
    batches are keyed (:func:`pipeline.topics.shuffled_key`): ``"batch"`` spreads
    a plain metric-day's batches over the shuffled topic's partitions and splits a
    sealed one's released batches by their records' encapsulated keys over the metric-day's sub-keys (so a
    replay reaches its original's member and replay guard: :func:`pipeline.topics.sealed_route`);
    ``"metric-day"`` keeps every batch of a metric-day in one partition, whole. ``shuffled_spread`` (with
    ``"batch"``): 0 gives every released plain batch its own key (the metric-day reaches every partition) and
    routes sealed records over one sub-key per partition; N >= 1 cycles a metric-day's plain batches over N
    sub-keys on N evenly spaced partitions (:func:`pipeline.topics.spread_keys`), and routes its sealed records
    over the same N: fewer partitions per transaction and per read, enough for N members.
    """

    min_batch: int = 1000
    max_batch: int = 1 << 16
    max_batch_bytes: int = 4 << 20
    raw_topic: str = RAW_TOPIC
    shuffled_topic: str = SHUFFLED_TOPIC
    state_topic: str = SHUFFLER_STATE_TOPIC
    partitions: int = DEFAULT_PARTITIONS
    group: str = "ldp-shuffler"
    member: str = "shuffler-0"
    checkpoint_interval: float = 1.0
    max_pending_reports: int = 1 << 22
    dedup_window: int = 16384
    max_day_age: int = DEFAULT_MAX_DAY_AGE
    max_days_ahead: int = DEFAULT_MAX_DAYS_AHEAD
    expiry_grace_days: int = 1
    key_file: str = DEFAULT_KEY_PATH
    refresh_interval: float = 6 * 3600.0
    restore_timeout: float = 120.0
    session_timeout: float = 10.0
    poll_records: int = 500
    shuffled_key: str = "batch"
    shuffled_spread: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.key_file, str) or not self.key_file:
            raise ConfigError("key_file must be a file path")
        check_ranges(
            self,
            {
                "min_batch": (1, 1 << 24),
                "max_batch": (1, 1 << 24),
                "max_batch_bytes": (1024, 1 << 30),
                "partitions": (1, 10_000),
                "max_pending_reports": (1, 1 << 40),
                "dedup_window": (0, 1 << 24),
                "max_day_age": (0, 3660),
                "max_days_ahead": (0, 366),
                "expiry_grace_days": (0, 366),
                "poll_records": (1, 1 << 20),
                "shuffled_spread": (0, 10_000),
                # seconds
                "checkpoint_interval": (0.001, 1e9),
                "refresh_interval": (0.001, 1e9),
                "restore_timeout": (0.001, 1e9),
                "session_timeout": (0.001, 1e9),
            },
        )
        if self.shuffled_key not in SHUFFLED_KEYINGS:
            raise ConfigError(f"shuffled_key must be one of {', '.join(SHUFFLED_KEYINGS)}, got {self.shuffled_key!r}")
        if self.max_batch < self.min_batch:
            raise ConfigError(f"max_batch ({self.max_batch}) must be at least min_batch ({self.min_batch})")
        check_topics(self, "raw_topic", "shuffled_topic", "state_topic")
        topics = (self.raw_topic, self.shuffled_topic, self.state_topic)
        if len(set(topics)) != 3:
            raise ConfigError(f"the raw, shuffled and state topics must differ, got {topics}")
        check_names(self, "group", "member")

    @property
    def day_window(self) -> DayWindow:
        """The shared window of days (:mod:`ldp_core.days`): the collector's, plus ``expiry_grace_days``."""
        return DayWindow(self.max_day_age, self.max_days_ahead, self.expiry_grace_days)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ShufflerSettings:
        """``overrides`` (``None``: not given) over ``$LDP_SHUFFLER_<FIELD>`` over the defaults; the day window
        also from the shared ``$LDP_MAX_DAY_AGE`` / ``$LDP_MAX_DAYS_AHEAD``."""
        return settings_from_env(cls, ENV_PREFIX, environ, overrides, aliases={**DAY_WINDOW_ENV, **SHUFFLED_KEYING_ENV})


@dataclasses.dataclass(frozen=True)
class DeviceCaps:
    """What devices enforce, whatever a metrics server tells them: their local policy's per-metric daily ε cap.

    The shuffler's per-person figure assumes a device sends at most ``r`` reports of a metric a day. Its metrics
    file says ``r = max_reports_per_day``, but a metrics server that devices trust can raise ``r`` on them (a
    served definition is adopted while ``r·ε₀`` fits the device's :class:`~client_sdk.policy.LocalPolicy`). With
    the app's caps given here, the figure takes ``r = max(max_reports_per_day, ⌊cap / ε₀⌋)``: what a device
    allows, so a hostile metrics server cannot make the printed ε wrong. ``default`` applies to every metric
    (the policy's ``per_metric_daily``), ``per_metric`` to named ones (its ``per_metric_overrides``).
    """

    default: float | None = None
    per_metric: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, cap in [("default", self.default), *self.per_metric.items()]:
            if cap is not None and not (isinstance(cap, (int, float)) and 0 < float(cap) < float("inf")):
                raise ConfigError(f"the device ε cap of {name!r} must be a positive number, got {cap!r}")

    @classmethod
    def parse(cls, values: list[str] | None) -> DeviceCaps | None:
        """``--device-epsilon-cap`` values: ``EPS`` (every metric) or ``METRIC=EPS`` (one); ``None`` if none."""
        if not values:
            return None
        default: float | None = None
        per: dict[str, float] = {}
        for v in values:
            name, sep, num = v.rpartition("=")
            try:
                cap = float(num)
            except ValueError:
                raise ConfigError(f"--device-epsilon-cap takes EPS or METRIC=EPS, got {v!r}") from None
            if sep:
                per[name] = cap
            else:
                default = cap
        return cls(default, per)

    def cap(self, metric: str) -> float | None:
        return self.per_metric.get(metric, self.default)

    def reports(self, metric: str, epsilon0: float, reports_per_day: int) -> int:
        """The most reports of ``metric`` one device can send a day: the metrics file's ``r``, or more when
        the device's cap allows more reports of ``epsilon0`` each."""
        cap = self.cap(metric)
        if cap is None or not epsilon0 > 0:
            return reports_per_day
        return max(reports_per_day, int(math.floor(cap / epsilon0 + 1e-9)))
