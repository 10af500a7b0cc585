"""The streaming estimator's engine: consume the shuffled topic, count exactly, checkpoint.

**Exactly once.** Records are counted first into a per-partition *tail*
(what was read since this instance's last commit of that partition). A
checkpoint

1. drops the tails of partitions this member no longer owns (a rebalance
   that rewound uncommitted records, seen as a new
   :attr:`~pipeline.transport.base.Consumer.generation` after a poll, has
   dropped every tail already: the partitions restart from their committed
   offsets);
2. writes, in one SQLite transaction (``synchronous=FULL``), the certain
   state (everything whose offsets were committed), the offset ranges it
   covers, and the tails marked *pending*;
3. commits the tails' end offsets to the group, and on success folds the
   tails into the certain state. A failed commit (rebalance) drops the tails:
   the partitions' next owner reads them again from the committed offsets.

After a crash the snapshot holds the certain state and possibly pending
tails, whose commit may or may not have happened. A pending tail
``[base, end)`` is resolved against the group's committed offset c: if
``c < end`` the commit did not happen (or was overtaken by another member,
which counted those records itself) and the tail is discarded, so the
records, delivered again, are counted once; if ``c >= end`` the tail is kept
as *uncertain*. Records below the committed offset are never delivered
again, and records at or above it are not in the state, so a single
instance never loses or double-counts a report.

**What is served.** Estimates include the open tails (read, not yet
committed), so a report shows up as soon as it is read. When a commit fails
or a rebalance moves a partition, its tail is dropped and read again, so a
live figure can step back for a moment before it returns to the same
total; the snapshot and :func:`~estimator.streaming.state.merge_states` are never
affected.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from client_sdk.errors import FrameError
from client_sdk.metrics import MetricDefinition
from estimator.errors import StateError
from estimator.streaming.snapshots import SnapshotStore
from estimator.streaming.state import DEFAULT_GROUP, Key, Tail, Tally, EstimatorState, _add_range
from pipeline.envelope import decode_envelope
from pipeline.topics import DEFAULT_PARTITIONS, SHUFFLED_TOPIC
from pipeline.transport.base import CommitFailedError, Consumer, Record, TopicPartition, Transport

__all__ = ["EstimatorStats", "StreamingEstimator"]

log = logging.getLogger("estimator.streaming")

@dataclasses.dataclass
class EstimatorStats:
    records: int = 0
    reports: int = 0
    undecodable: int = 0
    checkpoints: int = 0
    commit_failures: int = 0
    rejoins: int = 0
    dropped_tails: int = 0
    restored_uncertain: int = 0
    discarded_pending: int = 0
    last_checkpoint: float = 0.0  # wall-clock time of the last successful commit

    def to_json_obj(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class StreamingEstimator:
    """Consumes the shuffled topic in a consumer group and keeps exact, restartable estimates.

    ``state_dir`` holds ``estimator.sqlite3`` (see :class:`SnapshotStore`).
    A checkpoint (snapshot, then offset commit) happens every
    ``checkpoint_seconds`` while records flow, and on :meth:`close`.
    """

    def __init__(self, transport: Transport, state_dir: str | Path, specs: Any, *, topic: str = SHUFFLED_TOPIC,
                 group: str = DEFAULT_GROUP, member: str | None = None, checkpoint_seconds: float = 1.0,
                 session_timeout: float = 10.0, metrics: Mapping[str, MetricDefinition] | None = None,
                 partitions: int = DEFAULT_PARTITIONS) -> None:
        self.transport = transport
        self.specs = specs
        self.topic = topic
        self.group = group
        self.metrics = dict(metrics or getattr(specs, "metrics", {}) or {})
        self.checkpoint_seconds = float(checkpoint_seconds)
        self.session_timeout = float(session_timeout)
        self.partitions = int(partitions)
        self.state_dir = Path(state_dir).expanduser().resolve()
        self.store = SnapshotStore(self.state_dir / "estimator.sqlite3")
        meta = self.store.meta()
        if meta and (meta.get("topic"), meta.get("group")) != (topic, group):
            raise StateError(f"{self.state_dir} holds the state of topic {meta.get('topic')!r}, group "
                             f"{meta.get('group')!r}; use another --state folder for topic {topic!r}, group {group!r}")
        self.member = member or meta.get("member") or f"estimator-{uuid.uuid4().hex[:12]}"
        self.store.set_meta(topic=topic, group=group, member=self.member)
        self.certain, self.segments, loaded = self.store.load()
        self.uncertain = [t for t in loaded if t.status == "uncertain"]
        self._pending = [t for t in loaded if t.status == "pending"]
        self.open: dict[TopicPartition, Tail] = {}
        self._dirty: set[Key] = set()
        self._generation = 0
        self._consumer: Consumer | None = None
        self._last_checkpoint = time.monotonic()
        self.lock = threading.RLock()
        self.stats = EstimatorStats()

    # -- consumer ----------------------------------------------------------------------------

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self.transport.ensure_topic(self.topic, self.partitions)
            self._consumer = self.transport.consume(self.topic, self.group, member=self.member,
                                                    session_timeout=self.session_timeout)
            if self._pending:
                self._resolve_pending(self._consumer)
        return self._consumer

    def _resolve_pending(self, consumer: Consumer) -> None:
        """Pending tails from before a crash: counted iff the group's offset reached their end."""
        with self.lock:
            for t in self._pending:
                c = consumer.committed(t.tp) or 0
                if c >= t.end:
                    t.status = "uncertain"
                    self.uncertain.append(t)
                    self.stats.restored_uncertain += 1
                else:
                    self.stats.discarded_pending += 1
            self._pending = []
            self.store.write(self.certain, (), self.segments, self.uncertain)

    def _rejoin(self, why: str) -> None:
        log.warning("estimator %s: %s; dropping uncommitted tails and rejoining group %s", self.member, why, self.group)
        self.stats.rejoins += 1
        with self.lock:
            self.stats.dropped_tails += len(self.open)
            self.open.clear()
        self._generation = 0
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    # -- consuming ---------------------------------------------------------------------------

    def poll_once(self, *, max_records: int = 500, timeout: float = 0.2) -> int:
        consumer = self.consumer
        recs = consumer.poll(max_records=max_records, timeout=timeout)
        with self.lock:
            if consumer.generation != self._generation:
                # a rebalance restarted every partition from its committed offset: the tails are void
                self._generation = consumer.generation
                self.stats.dropped_tails += len(self.open)
                self.open.clear()
            for rec in recs:
                self._accept(rec)
        return len(recs)

    def _accept(self, rec: Record) -> None:
        tp = TopicPartition(rec.topic, rec.partition)
        tail = self.open.get(tp)
        if tail is not None and rec.offset < tail.end:
            # the consumer restarted the partition from the group's committed offset
            self.stats.dropped_tails += 1
            del self.open[tp]
            tail = None
        if tail is None:
            base = self.consumer.committed(tp) or 0
            tail = self.open[tp] = Tail(tp, base, base, time.time(), Tally())
        self.stats.records += 1
        try:
            sb = decode_envelope(rec.value, self.specs)
        except FrameError as exc:
            self.stats.undecodable += 1
            log.error("estimator: %s[%d]@%d cannot be decoded and is not counted: %s", rec.topic, rec.partition,
                      rec.offset, exc)
        else:
            b = sb.batch
            tail.tally.add(b.metric, b.day, b.spec, b.records, sb.meta)
            self.stats.reports += len(b)
        tail.end = rec.offset + 1

    def checkpoint(self) -> bool:
        """Snapshot, then commit (see the module docstring); returns whether offsets were committed."""
        self._last_checkpoint = time.monotonic()
        consumer = self._consumer
        if consumer is None:
            return False
        owned = consumer.assignment()
        with self.lock:
            for tp in [tp for tp in self.open if tp not in owned]:
                self.stats.dropped_tails += 1
                del self.open[tp]
            tails = dict(self.open)
        if not tails and not self._dirty:
            return False
        with self.lock:
            pending = [dataclasses.replace(t, status="pending") for t in tails.values()]
            self.store.write(self.certain, self._dirty, self.segments, self.uncertain + pending)
            self._dirty = set()
        if not tails:
            return False
        try:
            consumer.commit({tp: t.end for tp, t in tails.items()})
        except CommitFailedError as exc:
            log.info("estimator %s: commit failed (%s); tails dropped, their records come again", self.member, exc)
            self.stats.commit_failures += 1
            with self.lock:
                self.stats.dropped_tails += len(self.open)
                self.open.clear()
            return False
        with self.lock:
            for tp, t in tails.items():
                self.certain.merge(t.tally)
                self._dirty.update(t.tally.keys)
                _add_range(self.segments, tp, t.base, t.end, t.started_at)
                if self.open.get(tp) is t:
                    del self.open[tp]
        self.stats.checkpoints += 1
        self.stats.last_checkpoint = time.time()
        return True

    def run(self, *, stop: threading.Event | None = None, idle_timeout: float | None = None,
            max_records: int = 500) -> EstimatorStats:
        """Consume until ``stop`` is set or nothing arrived for ``idle_timeout`` seconds; checkpoint at the end."""
        idle_since = time.monotonic()
        while stop is None or not stop.is_set():
            if self.poll_once(max_records=max_records, timeout=0.2):
                idle_since = time.monotonic()
            if time.monotonic() - self._last_checkpoint >= self.checkpoint_seconds:
                self.checkpoint()
            if idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                break
        self.checkpoint()
        return self.stats

    def close(self) -> None:
        """Checkpoint, leave the group and close the snapshot store."""
        try:
            if self._consumer is not None:
                self.checkpoint()
        finally:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
            self.store.close()

    def __enter__(self) -> "StreamingEstimator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries -----------------------------------------------------------------------------

    def state(self) -> EstimatorState:
        """A copy of this instance's state; open tails are included (as ``open``)."""
        with self.lock:
            tails = [dataclasses.replace(t, tally=t.tally.copy()) for t in self.uncertain]
            tails += [dataclasses.replace(t, tally=t.tally.copy()) for t in self.open.values()]
            return EstimatorState(self.certain.copy(), {tp: [list(r) for r in rs] for tp, rs in self.segments.items()},
                                  tails, self.topic, self.group, self.member)

    def counted(self, metric: str | None = None) -> Tally:
        """Everything counted so far (certain, uncertain and open tails), for one metric or all."""
        with self.lock:
            t = Tally()
            for tally in [self.certain, *(x.tally for x in self.uncertain), *(x.tally for x in self.open.values())]:
                for key, ks in tally.keys.items():
                    if metric is None or key[0] == metric:
                        t.merge_key(key, ks)
            return t
