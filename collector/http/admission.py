"""What a decoded batch must satisfy before the collector publishes it: the ``Idempotency-Key``, the day
window, the metric's expiry, the per-token report bound and, for sealed records, the analyzer keys."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from collector.errors import RejectedBatch
from collector.settings import CollectorSettings
from ldp_core.days import utc_day
from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import ReportBatch
from ldp_core.wire.sealing import KEY_ID_SIZE

__all__ = ["Admission"]


class Admission:
    """The checks of a decoded batch (:meth:`check`); each failure is a :class:`RejectedBatch`.

    ``tokens``: the collector requires upload tokens (``--require-tokens``), so that a batch carries at most
    its metric's ``max_reports_per_day`` reports. ``clock`` gives the current POSIX time (the day window).
    """

    def __init__(
        self, settings: CollectorSettings, declared: MetricSet, clock: Callable[[], float], *, tokens: bool
    ) -> None:
        self.settings = settings
        self.declared = declared
        self.clock = clock
        self.tokens = tokens
        self.sealing_ids = {k.key_id for k in declared.analyzer_keys}
        self.window = settings.day_window  # the settings are frozen: one DayWindow, not one per upload

    def check(self, batch: ReportBatch, key: str | None, keys_checked: bool = False) -> None:
        """Refuse ``batch`` (uploaded with the ``Idempotency-Key`` ``key``) if the collector will not take it.
        ``keys_checked``: the native front's pre-check found that each sealed record names an analyzer key of
        the metrics file (:func:`collector.http.decode.spec_entries`); they are not scanned again."""
        if key is not None and key.strip().lower() != batch.batch_id.hex():
            raise RejectedBatch(
                400,
                "idempotency_key_mismatch",
                f"Idempotency-Key {key[:64]!r} differs from the frame's batch id {batch.batch_id.hex()}",
            )
        if len(batch) == 0:
            raise RejectedBatch(422, "empty", "the batch holds no reports")
        self._check_day(batch.day)
        m = (
            self.declared.get(batch.metric) or self.declared.prio3[batch.metric]
        )  # after the day checks: a day far out of range is bad_day, not expired_metric
        if self.tokens and len(batch) > m.max_reports_per_day:
            # one token pays for one device's reports of one metric-day: what bounds a device's influence
            raise RejectedBatch(
                422,
                "too_many_reports",
                f"with tokens a batch carries at most the metric's max_reports_per_day ({m.max_reports_per_day}) "
                f"reports, got {len(batch)}",
            )
        if batch.sealed:
            self._check_sealed(batch, m.sealed, keys_checked)
        if m.is_expired(batch.day):
            raise RejectedBatch(
                422,
                "expired_metric",
                f"metric {batch.metric!r} expired on {m.expires.isoformat()}; "
                f"reports for day {batch.day} are no longer collected",
            )

    def _check_day(self, day: int) -> None:
        settings = self.settings
        now = utc_day(self.clock())
        oldest, newest = self.window.bounds(now)  # the window the shuffler keeps too (ldp_core.days)
        if day > newest:
            raise RejectedBatch(
                422,
                "bad_day",
                f"day {day} is {day - now} days ahead of the collector's "
                f"UTC day {now}; at most {settings.max_days_ahead} ahead is accepted (check the clock)",
            )
        if day < oldest:
            raise RejectedBatch(
                422,
                "bad_day",
                f"day {day} is {now - day} days old; batches older than {settings.max_day_age} days are not accepted",
            )

    def _check_sealed(self, batch: ReportBatch, metric_sealed: bool, keys_checked: bool = False) -> None:
        """What can be checked of sealed records without the analyzer's key (which the collector never has):
        the metric is a sealed one, and every record names a key of the metrics file."""
        if not metric_sealed:
            raise RejectedBatch(
                422,
                "not_sealed_metric",
                f"metric {batch.metric!r} is not sealed: send its records plain (GET /v1/metrics)",
            )
        if keys_checked:
            return
        # each record's key id as one opaque value: np.unique over them is 10x faster than over rows (axis=0)
        rows = np.ascontiguousarray(batch.records).view(np.uint8).reshape(len(batch), -1)
        kids = np.ascontiguousarray(rows[:, :KEY_ID_SIZE]).view(np.dtype((np.void, KEY_ID_SIZE))).ravel()
        seen = {k.tobytes().hex() for k in np.unique(kids)}
        unknown = sorted(seen - self.sealing_ids)
        if unknown:
            raise RejectedBatch(
                422,
                "unknown_analyzer_key",
                f"records are sealed to analyzer key(s) {unknown[:4]}; this collector accepts "
                f"{sorted(self.sealing_ids)}: refresh the metric definitions from GET /v1/metrics",
            )
