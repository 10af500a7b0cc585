"""Group commit: the collector's single publisher thread.

Request handlers hand each validated batch to :class:`Ingestor` and wait on
a future. The thread takes every submission queued so far (up to
``max_group``) and handles them together:

1. ids already in the :class:`~collector.dedup.BatchIdStore`, or repeated
   in the group, are duplicates: they are answered without publishing;
2. the rest are published with **one** ``Transport.publish_many`` call,
   which returns once every record is durable (one fsync for the embedded
   log, one flush for Kafka);
3. their ids are recorded in the store (one SQLite transaction);
4. the futures resolve: ``"accepted"`` or ``"duplicate"``, or an
   :class:`~collector.errors.UnavailableError` if the transport failed, in
   which case nothing of the group was acknowledged to anyone.

Batching the durable step is what lets one worker accept thousands of
uploads a second while answering each only after its batch is durable
(the same idea as a database's group commit).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Literal, NamedTuple

from collector.dedup import BatchIdStore
from collector.errors import UnavailableError
from collector.transport import TopicError, Transport

__all__ = ["Ingestor", "Outcome", "Submission", "GroupStats"]

log = logging.getLogger("ldp.collector")

Outcome = Literal["accepted", "duplicate"]


class Submission(NamedTuple):
    batch_id: bytes
    key: bytes
    value: bytes
    reports: int
    future: "concurrent.futures.Future[Outcome]"


class GroupStats(NamedTuple):
    """What one group commit did (passed to the ``on_group`` callback)."""

    published: int
    duplicates: int
    failed: int
    seconds: float


class Ingestor:
    """Publishes submitted batches to ``topic`` in group commits on one background thread."""

    def __init__(self, transport: Transport, topic: str, dedup: BatchIdStore, *, partitions: int,
                 max_group: int = 512, retry_after: int = 2,
                 on_group: Callable[[GroupStats], None] | None = None) -> None:
        self.transport = transport
        self.topic = topic
        self.dedup = dedup
        self.partitions = int(partitions)
        self.max_group = int(max_group)
        self.retry_after = int(retry_after)
        self.on_group = on_group
        self._queue: deque[Submission] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._topic_ready = False
        self._thread: threading.Thread | None = None
        #: the last transport failure, ``None`` once a publish succeeds again
        self.last_error: str | None = None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("the ingestor is already started")
        self._thread = threading.Thread(target=self._run, name="ldp-ingest", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Publish what is queued, then stop the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def queued(self) -> int:
        return len(self._queue)

    # -- producer side -----------------------------------------------------------

    def submit(self, batch_id: bytes, key: bytes, value: bytes, reports: int) -> "concurrent.futures.Future[Outcome]":
        fut: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                fut.set_exception(UnavailableError("shutting_down", "the collector is shutting down; retry later",
                                                   self.retry_after))
                return fut
            self._queue.append(Submission(bytes(batch_id), key, value, reports, fut))
            self._cond.notify()
        return fut

    # -- the thread ------------------------------------------------------------

    def _take(self) -> list[Submission] | None:
        with self._cond:
            while not self._queue and not self._stopping:
                self._cond.wait()
            if not self._queue:
                return None
            n = min(len(self._queue), self.max_group)
            return [self._queue.popleft() for _ in range(n)]

    def _run(self) -> None:
        while True:
            group = self._take()
            if group is None:
                return
            try:
                self._commit(group)
            except BaseException as exc:  # never leave a request waiting
                log.exception("group commit failed unexpectedly")
                err = UnavailableError("internal", f"the collector failed to store the batch ({type(exc).__name__}); "
                                       "retry later", self.retry_after)
                for s in group:
                    if not s.future.done():
                        s.future.set_exception(err)

    def _ensure_topic(self) -> None:
        if self._topic_ready:
            return
        try:
            self.transport.partitions(self.topic)
        except TopicError:
            self.transport.create_topic(self.topic, self.partitions)
        self._topic_ready = True

    def _commit(self, group: list[Submission]) -> None:
        t0 = time.perf_counter()
        fresh: dict[bytes, Submission] = {}
        dups: list[Submission] = []
        try:
            known = self.dedup.seen(s.batch_id for s in group)
        except Exception as exc:  # the store is only an optimization: fall back to publishing
            log.warning("batch-id store unreadable (%r); publishing without the duplicate check", exc)
            known = set()
        for s in group:
            if s.batch_id in known or s.batch_id in fresh:
                dups.append(s)
            else:
                fresh[s.batch_id] = s
        if fresh:
            try:
                self._ensure_topic()
                self.transport.publish_many(self.topic, [(s.key, s.value) for s in fresh.values()])
            except Exception as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.warning("the transport refused %d batches: %s", len(fresh), self.last_error)
                err = UnavailableError("transport_unavailable",
                                       f"the transport did not accept the batch ({self.last_error}); retry later",
                                       self.retry_after)
                for s in group:
                    s.future.set_exception(err)
                self._report(GroupStats(0, 0, len(group), time.perf_counter() - t0))
                return
            self.last_error = None
            try:
                self.dedup.add(fresh)
            except Exception as exc:  # published: answer 202; a retry is caught by the shuffler's id window
                log.warning("could not record %d batch ids (%r); a retry of them will reach the shuffler", len(fresh), exc)
        for s in fresh.values():
            s.future.set_result("accepted")
        for s in dups:
            s.future.set_result("duplicate")
        self._report(GroupStats(len(fresh), len(dups), 0, time.perf_counter() - t0))

    def _report(self, stats: GroupStats) -> None:
        if self.on_group is not None:
            try:
                self.on_group(stats)
            except Exception:
                log.exception("on_group callback failed")
