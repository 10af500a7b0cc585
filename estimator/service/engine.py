"""The streaming estimator's engine: consume the shuffled topic, count exactly, checkpoint.

**Exactly once.** Records are counted first into a per-partition *tail*
(what was read since this instance's last commit of that partition). The
engine runs the loop of :mod:`pipeline.processor` (a new consumer
generation, an offset that goes back, a failed commit and a rejoin drop
tails the same way in every processor); its checkpoint

1. drops the tails of partitions this member no longer owns (a rebalance
   that rewound uncommitted records, seen as a new
   :attr:`~pipeline.transport.base.Consumer.generation` after a poll, has
   dropped every tail already: the partitions restart from their committed
   offsets);
2. writes, in one SQLite transaction (``synchronous=FULL``), the certain
   state (everything whose offsets were committed), the offset ranges it
   covers, and the tails marked *pending*;
3. commits the tails' end offsets to the group, and on success folds the
   tails into the certain state.

**A commit reported failed may still have happened** (issue 31). After a
broker dies, a commit the old group coordinator wrote can show at the new
one only once the replicas of the offsets topic catch up, after the client
reported ``UnknownMemberIdError``; the member then rejoins at the offsets it
was told it had not committed. Dropping the tail lost its reports for good
(the streaming group ended 100-200 reports short in 5 of 11 chaos runs). So
the tails of a commit that was sent and not confirmed (a
:class:`~pipeline.transport.base.CommitFailedError`, or any error of the
commit followed by a rejoin) are not dropped but kept as *uncertain*, the
state a crash between snapshot and commit leaves, and the next count of the
partition settles them: where this member counts the partition again from
an offset inside such a tail, the group restarted it there (the commit did
not land) and the tail goes (:meth:`StreamingEstimator._recounted`); where
another member does, :func:`~estimator.service.state.merge_states` drops
the tail because a later range starts inside it; a restart at or after its
end keeps it. A tail's base is where the member restarted the partition
(the committed offset, or the first record if that is lower), and a range
is appended to the previous one only while the member kept the partition
since its last commit, so every restart leaves its start in the state for
the merge to see.
The transport still reports a commit that had landed by the time it
checked as a success (:meth:`pipeline.transport.kafka.KafkaConsumer.commit`).

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
committed), so a report shows up as soon as it is read. When a rebalance
moves a partition, its open tail is dropped and read again, so a live
figure can step back for a moment before it returns to the same total (an
instance's own figure can also count an uncertain tail that another member
recounts, until merged); the snapshot and :func:`~estimator.service.state.merge_states` are never
affected.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from estimator.errors import StateError
from estimator.service.snapshots import SnapshotStore
from estimator.service.state import DEFAULT_GROUP, EstimatorState, Key, Tail, Tally, _add_range
from ldp_core.metrics import MetricDefinition
from ldp_core.wire.sealing import BatchOpener
from pipeline.envelope import ShuffledBatch
from pipeline.processor import StreamProcessor
from pipeline.routes import SealedRoutes, check_shuffled_key, open_routed, route_status
from pipeline.settings import check_names, check_ranges, check_topics, settings_from_env
from pipeline.topics import DEFAULT_PARTITIONS, SHUFFLED_TOPIC
from pipeline.transport.base import (
    CommitFailedError,
    Consumer,
    Record,
    TopicPartition,
    Transaction,
    Transport,
)

__all__ = ["ENV_PREFIX", "EstimatorSettings", "EstimatorStats", "StreamingEstimator"]

log = logging.getLogger("estimator.service")

#: prefix of the environment variables :meth:`EstimatorSettings.from_env` reads (``LDP_ESTIMATOR_GROUP``, ...)
ENV_PREFIX = "LDP_ESTIMATOR_"


@dataclasses.dataclass(frozen=True)
class EstimatorSettings:
    """What one streaming estimator instance consumes and how often it checkpoints.

    A checkpoint (snapshot, then offset commit) happens every
    ``checkpoint_seconds`` while records flow. A missing ``topic`` is
    created with ``partitions`` partitions. ``member`` names this member of
    ``group`` (default: the name kept in the state folder, else random).
    ``replay_set`` is the SQLite file of the sealed records' encapsulated keys already counted (the replay
    guard, :class:`~ldp_core.wire.sealing.ReplayGuard`); default ``sealed-seen.sqlite3`` in the state
    folder. Members of one group that name the same file drop a replay whichever of them counted the
    original, across rebalances (the file must be on one host or a filesystem with working SQLite locks).
    ``shuffled_key`` and ``shuffled_spread`` are the shuffler's (``ldp shuffler --shuffled-key``,
    ``--shuffled-spread``): with them and the topic's partition count the member derives the partition every
    sealed record must be read from and drops one read from another (:mod:`pipeline.routes`).
    """

    topic: str = SHUFFLED_TOPIC
    group: str = DEFAULT_GROUP
    member: str | None = None
    checkpoint_seconds: float = 1.0
    session_timeout: float = 10.0
    partitions: int = DEFAULT_PARTITIONS
    replay_set: str | None = None
    shuffled_key: str = "batch"
    shuffled_spread: int = 0

    def __post_init__(self) -> None:
        check_ranges(
            self,
            {
                "checkpoint_seconds": (0.0, 1e9),
                "session_timeout": (0.001, 1e9),
                "partitions": (1, 10_000),
                "shuffled_spread": (0, 10_000),
            },
        )
        check_shuffled_key(self.shuffled_key)
        check_topics(self, "topic")
        check_names(self, "group", optional=("member",))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> EstimatorSettings:
        """``overrides`` (``None``: not given) over ``$LDP_ESTIMATOR_<FIELD>`` over the defaults."""
        return settings_from_env(cls, ENV_PREFIX, environ, overrides)


@dataclasses.dataclass
class EstimatorStats:
    records: int = 0
    reports: int = 0
    undecodable: int = 0
    sealed_unopened: int = 0  # sealed records that did not open (counted per delivery)
    sealed_replays_dropped: int = 0  # opened sealed records dropped as replays of an already counted record
    sealed_misrouted: int = 0  # sealed records dropped: read from another partition than their key routes to
    sealed_route_mismatch: int = 0  # of those, records of parts routed consistently under another N
    checkpoints: int = 0
    commit_failures: int = 0
    rejoins: int = 0
    dropped_tails: int = 0
    restored_uncertain: int = 0
    discarded_pending: int = 0
    unsure_commits: int = 0  # tails whose commit was reported failed, kept as uncertain (it may have landed)
    last_checkpoint: float = 0.0  # wall-clock time of the last successful commit

    def to_json_obj(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class StreamingEstimator(StreamProcessor):
    """Consumes the shuffled topic in a consumer group and keeps exact, restartable estimates.

    ``state_dir`` holds ``estimator.sqlite3`` (see :class:`~estimator.service.snapshots.SnapshotStore`).
    It runs the loop of :class:`~pipeline.processor.StreamProcessor`: the
    per-record step counts a batch into its partition's tail, a checkpoint
    is the snapshot then the offset commit (see the module docstring); one
    happens every ``checkpoint_seconds`` while records flow, and on
    :meth:`close`. ``settings`` (:class:`EstimatorSettings`) says what to
    consume; the keyword arguments, where given, override its fields.
    """

    def __init__(
        self,
        transport: Transport,
        state_dir: str | Path,
        specs: Any,
        settings: EstimatorSettings | None = None,
        *,
        topic: str | None = None,
        group: str | None = None,
        member: str | None = None,
        checkpoint_seconds: float | None = None,
        session_timeout: float | None = None,
        metrics: Mapping[str, MetricDefinition] | None = None,
        partitions: int | None = None,
        opener: BatchOpener | None = None,
        replay_set: str | Path | None = None,
        shuffled_key: str | None = None,
        shuffled_spread: int | None = None,
    ) -> None:
        given: dict[str, Any] = {
            "shuffled_key": shuffled_key,
            "shuffled_spread": shuffled_spread,
            "replay_set": None if replay_set is None else str(replay_set),
            "topic": topic,
            "group": group,
            "member": member,
            "checkpoint_seconds": checkpoint_seconds,
            "session_timeout": session_timeout,
            "partitions": partitions,
        }
        settings = dataclasses.replace(
            settings or EstimatorSettings(), **{k: v for k, v in given.items() if v is not None}
        )
        topic, group = settings.topic, settings.group
        state_dir = Path(state_dir).expanduser().resolve()
        store = SnapshotStore(state_dir / "estimator.sqlite3")
        meta = store.meta()
        if meta and (meta.get("topic"), meta.get("group")) != (topic, group):
            raise StateError(
                f"{state_dir} holds the state of topic {meta.get('topic')!r}, group "
                f"{meta.get('group')!r}; use another --state folder for topic {topic!r}, group {group!r}"
            )
        member = settings.member or meta.get("member") or f"estimator-{uuid.uuid4().hex[:12]}"
        super().__init__(
            transport,
            topic,
            group,
            member,
            session_timeout=settings.session_timeout,
            partitions=settings.partitions,
            checkpoint_seconds=settings.checkpoint_seconds,
        )
        self.settings = settings
        self.specs = specs
        #: opens sealed batches (the analyzer's keys); ``None``: a sealed batch is undecodable here
        self.opener = opener
        if opener is not None:  # the encapsulated keys already counted outlive a restart (issue #28)
            shared = settings.replay_set
            opener.replays.attach(Path(shared).expanduser() if shared else state_dir / "sealed-seen.sqlite3")
        #: the partition each sealed record must be read from (issue 31)
        self.routes = SealedRoutes(settings.shuffled_key, settings.shuffled_spread)
        self.topic = topic
        self.metrics = dict(metrics or getattr(specs, "metrics", {}) or {})
        self.state_dir = state_dir
        self.store = store
        self.store.set_meta(topic=topic, group=group, member=self.member)
        self.certain, self.segments, loaded = self.store.load()
        self.uncertain = [t for t in loaded if t.status == "uncertain"]
        self._pending = [t for t in loaded if t.status == "pending"]
        self.open: dict[TopicPartition, Tail] = {}
        self._dirty: set[Key] = set()
        self._flushing: dict[TopicPartition, Tail] = {}  # tails whose commit was sent and is not confirmed
        # partitions this member has counted without a break since its last commit of them: their next range
        # extends the last one; any other range is kept apart, so its start voids uncertain tails in a merge
        self._continuing: set[TopicPartition] = set()
        self.stats = EstimatorStats()
        #: partitions the group gives this member, with the committed offset each was got at (the merged
        #: answers' ``missing_parts``); the topic's partition count, once joined
        self._assigned: dict[int, int] = {}
        self._partition_count: int | None = None

    # -- joining -----------------------------------------------------------------------------

    def on_join(self, consumer: Consumer) -> None:
        self._assigned = {}  # a new consumer: the next poll reads the assignment and its offsets afresh
        self.routes.partitions = None  # read again with the first sealed record: the topic may have grown
        if self._pending:
            self._resolve_pending(consumer)
        try:
            self._partition_count = self.transport.partitions(self.topic)
        except Exception:  # noqa: BLE001 - only a figure of the merged answers' missing parts
            log.debug("the partition count of %s is not known", self.topic, exc_info=True)

    def on_poll(self, consumer: Consumer) -> None:
        """Follow the assignment: the partitions this member reads, and where the group had them committed."""
        owned = {tp.partition for tp in consumer.assignment() if tp.topic == self.topic}
        if owned != set(self._assigned):
            self._assigned = {
                p: self._assigned[p] if p in self._assigned else consumer.committed(TopicPartition(self.topic, p)) or 0
                for p in sorted(owned)
            }

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

    # -- consuming (the per-record step of the loop) ---------------------------------------------

    def decode(self, rec: Record) -> ShuffledBatch:
        return open_routed(rec, self.specs, self.opener, self.routes, self.transport, self.stats, log)

    def run_status(self) -> dict[str, Any]:
        """:meth:`StreamProcessor.run_status`, not ready while sealed records arrive routed under another N than
        this member's (``route_mismatch``: what to do; :mod:`pipeline.routes`)."""
        return route_status(super().run_status(), self.routes)

    def on_undecodable(self, rec: Record, exc: BaseException) -> None:
        log.error(
            "estimator: %s[%d]@%d cannot be decoded and is not counted: %s", rec.topic, rec.partition, rec.offset, exc
        )

    def apply(self, rec: Record, sb: ShuffledBatch | None) -> None:
        tp = TopicPartition(rec.topic, rec.partition)
        tail = self.open.get(tp)
        if tail is None:
            # where this member (re)started the partition: the group's committed offset, or the record if that
            # is lower (a commit reported failed that landed after the consumer was positioned, issue 31)
            base = min(self.consumer.committed(tp) or 0, rec.offset)
            tail = self.open[tp] = Tail(tp, base, base, time.time(), Tally())
            self._recounted(tp, base)
        if sb is not None:
            b = sb.batch
            tail.tally.add(b.metric, b.day, b.spec, b.records, sb.meta)
            self.stats.reports += len(b)
        tail.end = rec.offset + 1

    def reset(self, partitions: Collection[TopicPartition] | None) -> None:
        """Drop open tails (they are read again from the committed offsets); the certain state stays."""
        for tp in list(self.open) if partitions is None else partitions:
            self._continuing.discard(tp)
            tail = self.open.pop(tp, None)
            if tail is None:
                continue
            if self._flushing.get(tp) is tail:
                # its commit was sent and not confirmed: it may have landed (issue 31), so the tail stays,
                # uncertain, until a later count of the partition shows where the group restarted it
                del self._flushing[tp]
                tail.status = "uncertain"
                self.uncertain.append(tail)
                self.stats.unsure_commits += 1
            else:
                self.stats.dropped_tails += 1

    def _recounted(self, tp: TopicPartition, base: int) -> None:
        """This member counts ``tp`` again from ``base``: an uncertain tail of its own that ``base`` falls in
        was not committed (the group restarted the partition inside it), so its records are being counted
        again here and the tail goes (:func:`~estimator.service.state.merge_states` does the same for a
        recount by another member)."""
        gone = [t for t in self.uncertain if t.tp == tp and t.base <= base < t.end]
        if gone:
            self.uncertain = [t for t in self.uncertain if all(t is not g for g in gone)]
            self.stats.dropped_tails += len(gone)
            log.info(
                "estimator %s: %s[%d] restarts at %d inside an uncertain tail (%s): its commit did not land, "
                "the tail is counted again",
                self.member,
                tp.topic,
                tp.partition,
                base,
                ", ".join(f"[{t.base}, {t.end})" for t in gone),
            )

    # -- checkpoints ---------------------------------------------------------------------------

    def flush_state(self, tx: Transaction | None) -> Mapping[TopicPartition, int] | None:
        """Write the snapshot: certain state, its ranges, the open tails as pending; their ends are the offsets."""
        with self.lock:
            tails = dict(self.open)
            if not tails and not self._dirty:
                return None
            pending = [dataclasses.replace(t, status="pending") for t in tails.values()]
            self.store.write(self.certain, self._dirty, self.segments, self.uncertain + pending)
            self._dirty = set()
        if not tails:
            return None
        self._flushing = tails
        return {tp: t.end for tp, t in tails.items()}

    def on_commit_failed(self, exc: CommitFailedError) -> None:
        log.info(
            "estimator %s: commit reported failed (%s); its tails are kept as uncertain until the partitions "
            "are counted again",
            self.member,
            exc,
        )
        self.stats.commit_failures += 1
        self.rewind_all()

    def on_committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        for tp, t in self._flushing.items():
            self.certain.merge(t.tally)
            self._dirty.update(t.tally.keys)
            _add_range(self.segments, tp, t.base, t.end, t.started_at, join=tp in self._continuing)
            self._continuing.add(tp)
            if self.open.get(tp) is t:
                del self.open[tp]
        self._flushing = {}
        self.stats.checkpoints += 1
        self.stats.last_checkpoint = time.time()

    def close(self) -> None:
        """Checkpoint, leave the group and close the snapshot store."""
        try:
            if self._consumer is not None:
                self.checkpoint()
        finally:
            self._leave()
            self.store.close()
            if self.opener is not None:
                self.opener.replays.close()
                self.opener.close()  # its worker processes, if any

    def __enter__(self) -> StreamingEstimator:
        return self

    # -- queries -----------------------------------------------------------------------------

    def state(self) -> EstimatorState:
        """A copy of this instance's state; open tails are included (as ``open``)."""
        with self.lock:
            tails = [dataclasses.replace(t, tally=t.tally.copy()) for t in self.uncertain]
            tails += [dataclasses.replace(t, tally=t.tally.copy()) for t in self.open.values()]
            return EstimatorState(
                self.certain.copy(),
                {tp: [list(r) for r in rs] for tp, rs in self.segments.items()},
                tails,
                self.topic,
                self.group,
                self.member,
                dict(self._assigned),
                self._partition_count,
            )

    def freshness(self) -> dict[str, Any]:
        """How current the served figures are: the time of the last snapshot whose offsets were committed
        (``snapshot_time``, POSIX; ``None`` before the first) and, per partition this instance counted,
        the offset the snapshot covers (``committed``) and the offset read so far (``read``: the served
        figures include the records in between, see the module docstring)."""
        with self.lock:
            parts = _partition_offsets(self.segments, self.uncertain, self.open)
            snap = self.stats.last_checkpoint or None
        return {"snapshot_time": snap, "partitions": parts, **self.run_status()}

    def counted(self, metric: str | None = None) -> Tally:
        """Everything counted so far (certain, uncertain and open tails), for one metric or all."""
        with self.lock:
            t = Tally()
            for tally in [self.certain, *(x.tally for x in self.uncertain), *(x.tally for x in self.open.values())]:
                for key, ks in tally.keys.items():
                    if metric is None or key[0] == metric:
                        t.merge_key(key, ks)
            return t


def _partition_offsets(
    segments: Mapping[TopicPartition, list[list[float]]],
    uncertain: Collection[Tail],
    open_tails: Mapping[TopicPartition, Tail],
) -> list[dict[str, Any]]:
    """Per partition: the end of the committed ranges (and of restored uncertain tails, whose commit happened),
    and of what was read (an open tail starts at the group's committed offset and ends at the last read)."""
    committed: dict[TopicPartition, int] = {tp: max(int(r[1]) for r in rs) for tp, rs in segments.items() if rs}
    for t in uncertain:
        committed[t.tp] = max(committed.get(t.tp, 0), t.end)
    read = dict(committed)
    for tp, t in open_tails.items():
        committed[tp] = max(committed.get(tp, 0), t.base)
        read[tp] = max(read.get(tp, 0), t.end)
    return [
        {"topic": tp.topic, "partition": tp.partition, "committed": committed[tp], "read": read[tp]}
        for tp in sorted(read)
    ]
