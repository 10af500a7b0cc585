"""The device side of Prio3 metrics (docs/PRIO3.md): shard each value, seal each share to its aggregator,
queue the report in the durable outbox and upload it to the collector like any other report batch.

:class:`Prio3Client` keeps its own store (an outbox, the same :class:`~client_sdk.outbox.Outbox` and
:class:`~client_sdk.upload.uploader.Uploader` the LDP client uses). The collector and the log see the
report id, the public share and two ciphertexts: neither share, so neither the value. What a report
costs: one Prio3 sharding (the crate's, through the binding) and two HPKE seals.

Prio3 reports spend no local ε: their protection is that the leader and the helper do not collude. So the
privacy ledger is not charged; ``max_reports_per_day`` still caps how many reports this client makes per
metric and UTC day (counted in memory, per client object).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from client_sdk.outbox import Outbox
from client_sdk.store import Store
from client_sdk.upload.uploader import HttpTransport, Uploader, UploadResult, urllib_transport
from ldp_core.days import utc_day
from ldp_core.metrics import MetricSet
from ldp_core.prio3.report import make_report
from ldp_core.prio3.vdaf import VdafFailure

__all__ = ["Prio3Client"]


class Prio3Client:
    """Record values of a metrics file's Prio3 metrics and upload them (``flush``)."""

    def __init__(
        self,
        metrics: MetricSet,
        directory: str | Path,
        collector_url: str,
        *,
        batch_size: int = 100,
        clock: Callable[[], float] = time.time,
        transport: HttpTransport = urllib_transport,
    ) -> None:
        if not metrics.prio3:
            raise ValueError("the metrics file declares no prio3 metric")
        self.metrics = metrics
        self.clock = clock
        self.store = Store(directory)
        self.outbox = Outbox(self.store)
        self.specs = {name: metrics.prio3_spec(name) for name in metrics.prio3}
        for spec in self.specs.values():
            self.outbox.add_spec(spec)
        self.uploader = Uploader(self.outbox, collector_url, batch_size=batch_size, clock=clock, transport=transport)
        self._made: collections.Counter[tuple[str, int]] = collections.Counter()
        #: why values were not recorded: unknown_metric, bad_value, expired_metric, daily_cap
        self.errors: collections.Counter[str] = collections.Counter()

    def record(self, metric: str, value: Any) -> bool:
        """Shard, seal and queue one value; ``False`` (and counted in :attr:`errors`) if it was not recorded."""
        m = self.metrics.prio3.get(metric)
        if m is None:
            self.errors["unknown_metric"] += 1
            return False
        now = self.clock()
        day = utc_day(now)
        if m.is_expired(day):
            self.errors["expired_metric"] += 1
            return False
        if self._made[metric, day] >= m.max_reports_per_day:
            self.errors["daily_cap"] += 1
            return False
        keys = self.metrics.prio3_aggregators
        try:
            report = make_report(self.specs[metric], value, day, keys["leader"], keys["helper"])
        except VdafFailure:
            self.errors["bad_value"] += 1
            return False
        with self.store.transaction() as conn:
            self.outbox.put_in(conn, metric, self.specs[metric], day, [report], now)
        self._made[metric, day] += 1
        return True

    def flush(self, timeout: float = 30.0) -> UploadResult:
        """Upload every queued report now (until ``timeout`` seconds pass or a transient failure)."""
        return self.uploader.upload_all(force=True, deadline=time.monotonic() + timeout)

    def pending(self) -> int:
        return self.outbox.size() + self.outbox.pending_batches()

    def close(self) -> None:
        self.store.close()
