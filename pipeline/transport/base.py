"""The transport between pipeline stages: a partitioned, durable log with consumer groups.

The model is Kafka's (Kreps, Narkhede and Rao, "Kafka: a distributed
messaging system for log processing", NetDB 2011; exactly-once processing as
in KIP-98 and KIP-447):

* a **topic** has a fixed number of **partitions**; a record goes to
  partition ``partition_for(key, n)``, so records with one key keep their
  order; offsets in a partition are increasing;
* :meth:`Transport.publish` returns only once the record is durable (Kafka:
  acknowledged by all in-sync replicas; embedded log: committed to disk);
* a **consumer group** splits the partitions of its topics among its live
  members; each member reads its partitions from the group's committed
  offsets; after every rebalance each member restarts all its partitions
  from the committed offsets, so records delivered but not committed, by a
  member that died or lost its partitions, are delivered again (at least once);
* a rebalance never rewinds a member silently: if it had delivered records
  it had not committed (on any partition it owned, kept or lost), its
  :attr:`Consumer.generation` goes up and its next commit, plain or
  transactional, raises :class:`CommitFailedError` once, so a consumer that
  keeps state derived from uncommitted records learns to drop it;
* a **transaction** (:meth:`Consumer.transaction`) publishes outputs and
  commits the consumer's input offsets atomically: either both become
  visible or neither does, so consume-transform-produce runs exactly once;
* a record's only time is the **start of the UTC day** it was written
  (:func:`ldp_core.days.day_start`): no transport stores when, within the day, an upload
  arrived; **retention** deletes a record once its whole day is older than
  its topic's retention (Kafka's default is 7 days; ``math.inf`` keeps
  records for ever), and never changes the offsets of those that remain.

One record carries one report *batch* (a wire frame), never one report.

Two implementations pass the same contract suite (``tests/transport_contract.py``):
:class:`~pipeline.transport.embedded.EmbeddedTransport` (SQLite in WAL
mode; the default, no service needed) and
:class:`~pipeline.transport.kafka.KafkaTransport` (kafka-python).
"""

from __future__ import annotations

import abc
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import NamedTuple

import xxhash

from ldp_core.days import DAY_SECONDS
from pipeline.errors import PipelineError

__all__ = [
    "TopicPartition",
    "Record",
    "RecordPosition",
    "TransportError",
    "TopicError",
    "CommitFailedError",
    "FencedError",
    "check_topic_name",
    "check_retention",
    "partition_for",
    "Transaction",
    "TransactionScope",
    "Consumer",
    "Transport",
    "Health",
    "DEFAULT_RETENTION",
]

#: retention of a topic created without one (Kafka's ``log.retention.hours=168``)
DEFAULT_RETENTION = 7.0 * DAY_SECONDS


def check_retention(retention: float | None) -> float | None:
    """Validate a topic retention in seconds (``None``: the transport's default; ``math.inf``: for ever)."""
    if retention is None:
        return None
    if isinstance(retention, bool) or not isinstance(retention, (int, float)) or not retention > 0:
        raise TopicError(
            f"retention must be a positive number of seconds (math.inf to keep records for ever), got {retention!r}"
        )
    return float(retention)


_TOPIC_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class TopicPartition(NamedTuple):
    """One partition of one topic."""

    topic: str
    partition: int


class Record(NamedTuple):
    """A record as delivered to a consumer."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes


class RecordPosition(NamedTuple):
    """Where a published record was stored."""

    topic: str
    partition: int
    offset: int


class TransportError(PipelineError):
    """Base class of transport errors."""


class TopicError(TransportError, ValueError):
    """A topic does not exist, has another partition count, or has an invalid name."""


class CommitFailedError(TransportError):
    """The group was rebalanced before a commit: nothing was committed, the consumer rewound to the committed offsets.

    Raised by the commit that the rebalance made stale, or, when the rebalance
    already happened inside :meth:`Consumer.poll`, by the first commit after
    it (see :attr:`Consumer.generation`). Either way the caller must drop
    everything it derived from records it had not committed: they, and any
    record delivered since, will be delivered again.
    """


class FencedError(TransportError):
    """Another consumer joined the group under this consumer's member name; this one must stop."""


def check_topic_name(name: str) -> str:
    """Kafka's rule: 1-249 characters from ``[A-Za-z0-9._-]``, not ``.`` or ``..``."""
    if not isinstance(name, str) or not 0 < len(name) < 250 or not set(name) <= _TOPIC_CHARS or name in (".", ".."):
        raise TopicError(f"topic name {name!r} is invalid: use 1-249 characters from letters, digits, '.', '_' and '-'")
    return name


def partition_for(key: bytes | None, partitions: int, round_robin: int = 0) -> int:
    """The partition of a record: ``(XXH32(key) * n) >> 32`` (multiply-shift reduction, Lemire 2019).

    Both transports use it, so a key lands in the same partition number on
    either. A record without a key goes to ``round_robin mod n``.
    """
    if partitions < 1:
        raise TopicError(f"a topic needs at least one partition, got {partitions}")
    if key is None:
        return round_robin % partitions
    return (xxhash.xxh32_intdigest(key) * partitions) >> 32


class Transaction(abc.ABC):
    """Outputs buffered by one consume-transform-produce step; see :meth:`Consumer.transaction`."""

    @abc.abstractmethod
    def publish(self, topic: str, key: bytes | None, value: bytes) -> None:
        """Add an output; it becomes visible only if the transaction commits."""


class Consumer(abc.ABC):
    """One member of a consumer group, reading the partitions the group assigns it.

    Use as a context manager; closing leaves the group at once so that its
    partitions move to the other members without waiting for a timeout.
    """

    topics: tuple[str, ...]
    group: str
    member: str
    session_timeout: float
    _rewinds: int = 0
    _rewind_unreported: bool = False

    def _set_identity(self, topics: list[str], group: str, member: str | None, session_timeout: float) -> None:
        """Check and store the arguments every implementation's constructor takes."""
        if not topics:
            raise ValueError("consume() needs at least one topic")
        if not isinstance(group, str) or not group:
            raise ValueError(f"group must be a non-empty string, got {group!r}")
        if session_timeout <= 0:
            raise ValueError(f"session_timeout must be positive, got {session_timeout!r}")
        self.topics = tuple(dict.fromkeys(topics))
        self.group = group
        self.member = member if member is not None else uuid.uuid4().hex[:16]
        self.session_timeout = float(session_timeout)

    @property
    def generation(self) -> int:
        """How many rebalances rewound records this member had delivered but not committed (0 at the start).

        After every rebalance a member restarts all its partitions from the
        committed offsets. If it had delivered records it had not committed
        (on any partition it owned, kept or lost), that rebalance increments
        ``generation`` and makes the next :meth:`commit` or transaction
        commit raise :class:`CommitFailedError`, exactly once, committing
        nothing. A consumer that keeps state derived from uncommitted records
        may compare ``generation`` after each :meth:`poll` to drop that state
        at once, instead of waiting for the failed commit; the failed commit
        still comes, so a consumer that only catches it is correct too. A
        commit that fails because of a rebalance it raced with increments
        ``generation`` as well (with no second failure). A rebalance that
        found nothing uncommitted changes neither.
        """
        return self._rewinds

    def _rebalance_rewound(self, *, report: bool = True) -> None:
        """Record that a rebalance discarded delivered, uncommitted records; ``report``: the next commit must fail."""
        self._rewinds += 1
        if report:
            self._rewind_unreported = True

    def _take_unreported_rewind(self) -> CommitFailedError | None:
        """The error the next commit must raise (once) after a rebalance rewound uncommitted records, else ``None``."""
        if not self._rewind_unreported:
            return None
        self._rewind_unreported = False
        return CommitFailedError(
            f"group {self.group!r} rebalanced after member {self.member!r} received records it had not committed "
            f"(generation {self._rewinds}); nothing was committed: drop what was derived from uncommitted records, "
            "they and every record received since will be delivered again"
        )

    @abc.abstractmethod
    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]:
        """Up to ``max_records`` records, waiting up to ``timeout`` seconds for the first; ``[]`` if none came."""

    @abc.abstractmethod
    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit the group's next offsets (default: just past every record delivered so far).

        Raises :class:`CommitFailedError` if the group rebalanced since the
        records were delivered, or if this is the first commit after a
        rebalance that rewound uncommitted records (see :attr:`generation`);
        nothing is committed and the consumer rewinds to the committed offsets.
        """

    @abc.abstractmethod
    def transaction(self) -> TransactionScope:
        """A context manager for one atomic consume-transform-produce step.

        ``with consumer.transaction() as tx: tx.publish(...)`` commits on
        normal exit the outputs *and* the offsets just past every record
        delivered so far, atomically. An exception inside the block aborts:
        no output becomes visible, the consumer rewinds to the committed
        offsets (the records will be delivered again), and the exception
        propagates. A rebalance before the commit raises :class:`CommitFailedError`
        with the same effect, as does the first transaction commit after a
        rebalance that rewound uncommitted records (see :attr:`generation`).
        """

    @abc.abstractmethod
    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions this member currently owns (as of the last poll)."""

    def reachable(self) -> bool:
        """Whether the input stream answers now (any thread may ask; it must not block).

        Kafka: the group coordinator is connected (a client of a stopped broker keeps polling and
        reconnecting without raising). The embedded log: always.
        """
        return True

    @abc.abstractmethod
    def positions(self) -> dict[TopicPartition, int]:
        """For each owned partition with delivered records, the offset just past the last one delivered."""

    @abc.abstractmethod
    def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp``, or ``None``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Leave the group without committing anything."""

    def records(self, idle_timeout: float | None = 1.0, max_records: int = 500) -> Iterator[Record]:
        """Records one by one, until none arrives for ``idle_timeout`` seconds (``None``: forever)."""
        idle_since = time.monotonic()
        while True:
            batch = self.poll(max_records=max_records, timeout=0.2)
            if batch:
                yield from batch
                idle_since = time.monotonic()
            elif idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                return

    def __iter__(self) -> Iterator[Record]:
        return self.records(idle_timeout=None)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TransactionScope(abc.ABC):
    """What :meth:`Consumer.transaction` returns: ``__enter__`` gives the :class:`Transaction`."""

    @abc.abstractmethod
    def __enter__(self) -> Transaction: ...

    @abc.abstractmethod
    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class Health(NamedTuple):
    """What :meth:`Transport.health` found: whether the log answers, and a line for an operator."""

    ok: bool
    detail: str


class Transport(abc.ABC):
    """A partitioned durable log. Implementations: embedded (SQLite) and Kafka."""

    url: str

    @abc.abstractmethod
    def create_topic(
        self, name: str, partitions: int = 1, *, retention: float | None = None, segment: float | None = None
    ) -> None:
        """Create ``name`` with ``partitions`` partitions; a no-op if it exists with that count, :class:`TopicError` if with another.

        ``retention`` (seconds; ``math.inf``: for ever) applies to a topic this call creates; ``None`` takes the
        transport's default. ``segment`` (seconds) bounds how long a log segment stays open: a broker deletes only
        whole segments, so records below the log start offset (:meth:`delete_before`) stay on its disk until their
        segment rolls (Kafka's default: 7 days); ``None`` takes the broker's default. An existing topic keeps its
        own settings."""

    def ensure_topic(
        self, name: str, partitions: int, *, retention: float | None = None, segment: float | None = None
    ) -> int:
        """The partition count of ``name``, creating it with ``partitions`` (and ``retention``) if it is missing.

        Several processes may race to create a topic: creating an existing one with the same count is a no-op."""
        try:
            return self.partitions(name)
        except TopicError:
            self.create_topic(name, partitions, retention=retention, segment=segment)
            return self.partitions(name)

    @abc.abstractmethod
    def partitions(self, topic: str) -> int:
        """The partition count of ``topic``; :class:`TopicError` if it does not exist."""

    @abc.abstractmethod
    def publish_many(self, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> list[RecordPosition]:
        """Publish ``(key, value)`` pairs; return their positions once all are durable."""

    def publish(self, topic: str, key: bytes | None, value: bytes) -> RecordPosition:
        """Publish one record; return its position once it is durable."""
        return self.publish_many(topic, [(key, value)])[0]

    @abc.abstractmethod
    def consume(
        self,
        topics: str | Sequence[str],
        group: str,
        *,
        member: str | None = None,
        session_timeout: float = 10.0,
        static: bool = False,
    ) -> Consumer:
        """Join ``group`` as a member reading ``topics``.

        ``member`` names the member (default: random). Give a stable name to
        a worker that restarts: the Kafka transport derives its transactional
        id from it, so a restarted worker aborts its dead predecessor's open
        transaction at once instead of after the transaction timeout. A
        member silent (no poll, for the embedded log; no heartbeat, for
        Kafka) for ``session_timeout`` seconds is removed from the group.
        ``static`` (with a ``member``) makes it a static member on Kafka
        (``group.instance.id`` = ``member``, KIP-345): a restart within the
        session timeout takes its partitions back without a rebalance, and
        closing does not leave the group (its partitions wait for the session
        timeout). The embedded log ignores it.
        """

    def delete_before(self, topic: str, offsets: Mapping[int, int]) -> None:
        """Delete, for each partition ``p`` of ``offsets``, the records of ``topic`` below offset ``offsets[p]``.

        The records at and after the offset keep their offsets, and later
        records are numbered as before; a group whose committed offset points
        at deleted records resumes at the oldest record left. ``offsets[p]``
        must not lie past the partition's end (use an offset that was read). Used for the shuffler's
        superseded checkpoints (:mod:`collector.shuffler`). The embedded log
        overwrites the deleted records' bytes (``secure_delete``); Kafka moves
        the partition's log start offset (DeleteRecords, KIP-107): no consumer
        can read them any more, and the broker removes the segments wholly
        below it. Raises :class:`NotImplementedError` where a transport cannot.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot delete records")

    def health(self, topic: str | None = None, *, timeout: float = 2.0) -> Health:
        """Whether the log answers now (within about ``timeout`` s), for readiness probes.

        The default asks for ``topic``'s partition count (a missing topic still
        means the log answers); implementations with a cheaper or bounded
        probe override it. Never raises.
        """
        try:
            if topic is not None:
                self.partitions(topic)
        except TopicError:
            pass  # reachable; the topic is created on the first publish
        except Exception as exc:
            return Health(False, f"{type(exc).__name__}: {exc}")
        return Health(True, "transport reachable")

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections; published records stay."""

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
