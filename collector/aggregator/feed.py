"""The leader's intake: Prio3 report batches read from the collector's raw topic (the embedded log or
Kafka), queued in the leader (:meth:`Aggregator.ingest`), then aggregation jobs run with the helper.

Frames of other metrics on the topic are not the leader's: it skips them (its consumer group is its
own, so the shuffler still reads every record). A frame that does not decode is counted and skipped.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from collector.aggregator.service import Aggregator
from ldp_core.errors import FrameError
from ldp_core.wire.frames import decode_frame, read_header
from pipeline.topics import DEFAULT_PARTITIONS

__all__ = ["LeaderFeed"]

log = logging.getLogger("ldp.prio3")


class LeaderFeed:
    """A thread: consume ``topic`` as ``group``, queue the Prio3 reports, run jobs until stopped."""

    def __init__(self, leader: Aggregator, transport: Any, topic: str, *, group: str = "ldp-prio3-leader") -> None:
        if leader.role != "leader":
            raise ValueError("the feed runs in the leader")
        self.leader = leader
        self.transport = transport
        self.topic = topic
        self.group = group
        self.frames = 0
        self.bad_frames = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="prio3-leader-feed")

    def start(self) -> LeaderFeed:
        self._thread.start()
        return self

    def _take(self, value: bytes) -> None:
        try:
            header = read_header(value)
        except FrameError:
            self.bad_frames += 1
            return
        if header.metric not in self.leader.specs:
            return
        try:
            batch = decode_frame(value, lambda metric, spec_id: self.leader.specs[metric])
        except (FrameError, KeyError):
            self.bad_frames += 1
            return
        self.frames += 1
        self.leader.ingest(batch.metric, batch.day, (r.tobytes() for r in batch.records["report"]))

    def _run(self) -> None:
        try:
            self.transport.ensure_topic(
                self.topic, DEFAULT_PARTITIONS
            )  # as the collector makes it, if it is not up yet
            consumer = self.transport.consume(self.topic, self.group, member="prio3-leader-0")
            with consumer:
                while not self._stop.is_set():
                    records = consumer.poll(max_records=200, timeout=0.2)
                    for rec in records:
                        self._take(rec.value)
                    if records:
                        consumer.commit()
                    while not self._stop.is_set() and self.leader.step() > 0:
                        pass
        except Exception as exc:  # noqa: BLE001 -- reported by status(); the service stays up to say so
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("prio3 leader feed stopped")

    def status(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "bad_frames": self.bad_frames,
            "error": self.error,
            "alive": self._thread.is_alive(),
        }

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._thread.join(timeout)
