"""The Kafka transport, on kafka-python (install ``crc32c`` too: record-batch CRCs are then computed in C).

* Publishing (:meth:`KafkaTransport.publish_many`, the collector's path) uses
  an idempotent librdkafka producer (``confluent-kafka``,
  :mod:`pipeline.transport.kafka_producer`) with ``acks=all``: a record is
  acknowledged once every in-sync replica has it, and retries cannot
  duplicate it (KIP-98). librdkafka builds and sends record batches in C
  threads, so the collector's event loop does not share the interpreter
  lock with a Python producer (issue 31: kafka-python's producer was about a
  third of the collector's CPU per report). The consumers, the admin client
  and the transactional producers stay on kafka-python. The partition is chosen by
  :func:`~pipeline.transport.base.partition_for` (XXH32), not by Kafka's
  murmur2 partitioner, so keys land in the same partitions as in the
  embedded log.
* Producers and consumers retry a lost connection at least every second
  (:data:`RECONNECT_BACKOFF_MAX_MS`), so they publish and consume again
  promptly after a broker restart; :mod:`pipeline.transport.kafka_logs`
  says so in one line per broker state change (unreachable, reachable
  again) instead of kafka-python's burst of ERROR lines.
* Consumers read with ``isolation_level="read_committed"`` (records of open
  or aborted transactions are never delivered), auto-commit off.
* :meth:`KafkaConsumer.transaction` uses one transactional producer per
  consumer: ``begin_transaction``, the outputs, ``send_offsets_to_transaction``
  with the consumer's ``group_metadata()`` (generation, member id and static
  instance id in TxnOffsetCommit v3: the group coordinator refuses the
  offsets of a member it expelled, KIP-447), ``commit_transaction``. Its
  ``transactional.id`` is ``ldp.<group>.<member>``: a restarted worker that
  keeps its member name aborts its dead predecessor's open transaction when
  it starts. A transactional request without an answer replaces the
  producer; the new one's ``init_transactions`` settles the open transaction
  first, and a token in the offsets' metadata tells whether it committed
  (then it is reported committed, not rewound: docs/PIPELINE.md).
* After every rebalance a member restarts its partitions from the committed
  offsets (as the embedded log does), so both transports redeliver the same
  records after a rebalance; if it drops delivered, uncommitted records, the
  rebalance listener counts it in ``Consumer.generation`` and the next commit
  fails once (see :attr:`~pipeline.transport.base.Consumer.generation`).
  A join round that completes between two polls is taken up by the next
  poll, not sent again (:mod:`pipeline.transport.kafka_join`), so one change
  of membership is one rebalance. The offset fetch asks for stable offsets (KIP-447's ``require_stable``,
  sent by kafka-python 3 for read_committed consumers): a member taking over
  a partition waits until a committed transaction's offsets are written.

kafka-python >= 3.0.12 (pyproject.toml). One private call remains
(:meth:`KafkaConsumer._tx_call`): its ``send_offsets_to_transaction``,
``commit_transaction`` and ``abort_transaction`` wait for the answer without a
timeout, so the transport starts the same request on the producer's
transaction manager and bounds the wait itself.
"""

from __future__ import annotations

import itertools
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any

from ldp_core.days import day_start
from pipeline.transport.base import (
    CommitFailedError,
    Consumer,
    Health,
    Record,
    RecordPosition,
    TopicError,
    TopicPartition,
    Transaction,
    TransactionScope,
    Transport,
    TransportError,
    check_retention,
    check_topic_name,
    partition_for,
)
from pipeline.transport.kafka_cluster import describe_cluster
from pipeline.transport.kafka_join import keep_finished_joins
from pipeline.transport.kafka_resume import Identity, identity_of, resume_after_fence, resume_transactions

__all__ = ["KafkaTransport", "KafkaConsumer", "describe_cluster"]

log = logging.getLogger(__name__)

#: kafka-python's reconnect backoff grows up to 30 s by default: after an outage of a few seconds the clients
#: tried again only 7-11 s after the broker was back (uploads waited that long for their 202). At most 1 s
#: (one connection attempt per second per broker while it is down) reconnects within about a second.
RECONNECT_BACKOFF_MAX_MS = 1000

#: large enough for a 4,096-report batch of the widest mechanisms; the project's broker accepts 8 MiB
DEFAULT_MAX_REQUEST_SIZE = 8 << 20

#: numbers the offset commits of the process (with the member name and the time, the token a commit leaves in
#: its offsets' metadata; see :meth:`KafkaConsumer.commit`)
_COMMITS = itertools.count()


def _errors() -> Any:
    import kafka.errors

    return kafka.errors


class KafkaTransport(Transport):
    """Topics on the Kafka cluster at ``bootstrap`` (``host:port[,host:port...]``).

    ``replication_factor`` applies to topics this transport creates (1 on the
    project's single-node broker). Extra ``producer_config`` and
    ``consumer_config`` entries go to kafka-python unchanged (the
    transactional producers and the consumers); ``publish_config`` entries
    (librdkafka's property names) go to the publishing producer unchanged.
    """

    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9092",
        *,
        client_id: str = "ldp",
        replication_factor: int = 1,
        transaction_timeout: float = 10.0,
        request_timeout: float = 30.0,
        retention: float | None = None,
        clock: Callable[[], float] = time.time,
        producer_config: Mapping[str, Any] | None = None,
        consumer_config: Mapping[str, Any] | None = None,
        publish_config: Mapping[str, Any] | None = None,
    ) -> None:
        if not bootstrap or not isinstance(bootstrap, str):
            raise ValueError(f"bootstrap must be 'host:port[,host:port...]', got {bootstrap!r}")
        self.bootstrap = bootstrap
        self.url = f"kafka://{bootstrap}"
        from pipeline.transport import kafka_logs

        #: one line per broker state change, not kafka-python's burst of errors (librdkafka reports to it too)
        self._state_log = kafka_logs.install()
        self.client_id = client_id
        self.replication_factor = int(replication_factor)
        self.transaction_timeout = float(transaction_timeout)
        self.request_timeout = float(request_timeout)
        #: retention of topics this transport creates without one (``None``: the broker's ``log.retention``)
        self.retention = check_retention(retention)
        self.clock = clock
        self.producer_config = dict(producer_config or {})
        self.consumer_config = dict(consumer_config or {})
        self.publish_config = dict(publish_config or {})
        self._lock = threading.Lock()
        self._admin: Any = None
        self._producer: Any = None
        self._partitions: dict[str, int] = {}
        self._rr = itertools.count()
        self._closed = False

    # -- clients -------------------------------------------------------------

    def _admin_client(self) -> Any:
        if self._closed:
            raise TransportError(f"the transport on {self.url} is closed")
        if self._admin is None:
            from kafka import KafkaAdminClient

            try:
                self._admin = KafkaAdminClient(
                    bootstrap_servers=self.bootstrap,
                    client_id=f"{self.client_id}-admin",
                    request_timeout_ms=int(self.request_timeout * 1000),
                )
            except _errors().KafkaError as exc:
                raise TransportError(
                    f"cannot reach Kafka at {self.bootstrap} ({exc!r}); start the project's broker with `ldp kafka up`"
                ) from exc
        return self._admin

    def producer_settings(self, **extra: Any) -> dict[str, Any]:
        cfg: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "client_id": f"{self.client_id}-producer",
            "acks": "all",
            "enable_idempotence": True,
            "linger_ms": 2,
            "max_request_size": DEFAULT_MAX_REQUEST_SIZE,
            "batch_size": 1 << 20,
            "request_timeout_ms": int(self.request_timeout * 1000),
            "allow_auto_create_topics": False,
            "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
        }
        cfg.update(self.producer_config)
        cfg.update(extra)
        return cfg

    def publish_settings(self) -> dict[str, Any]:
        """The publishing producer's librdkafka configuration (:func:`~pipeline.transport.kafka_producer.rdkafka_settings`)."""
        from pipeline.transport.kafka_producer import rdkafka_settings

        return rdkafka_settings(
            self.bootstrap,
            f"{self.client_id}-producer",
            self.request_timeout,
            DEFAULT_MAX_REQUEST_SIZE,
            RECONNECT_BACKOFF_MAX_MS,
            self.publish_config,
        )

    def _producer_client(self) -> Any:
        """The publishing producer (librdkafka), made at first use; one that hit a fatal error is replaced."""
        if self._closed:
            raise TransportError(f"the transport on {self.url} is closed")
        with self._lock:
            old = self._producer
            if old is not None and old.fatal is None:
                return old
            from pipeline.transport.kafka_producer import RdkafkaProducer

            try:
                self._producer = RdkafkaProducer(self.publish_settings(), self._state_log, timeout=self.request_timeout)
            except Exception as exc:  # confluent_kafka.KafkaException: a bad setting
                raise TransportError(f"cannot make a Kafka producer for {self.bootstrap}: {exc!r}") from exc
        if old is not None:
            old.close(timeout=0)
        return self._producer

    # -- topics --------------------------------------------------------------

    def create_topic(
        self, name: str, partitions: int = 1, *, retention: float | None = None, segment: float | None = None
    ) -> None:
        check_topic_name(name)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise TopicError(f"partitions must be a positive integer, got {partitions!r}")
        retention = check_retention(retention)
        if retention is None:
            retention = self.retention
        configs = (
            {}
            if retention is None
            else {"retention.ms": "-1" if math.isinf(retention) else str(max(1, int(retention * 1000)))}
        )
        if segment is not None:
            if not (isinstance(segment, int | float) and math.isfinite(segment) and segment >= 1):
                raise TopicError(f"segment must be a finite number of seconds >= 1, got {segment!r}")
            configs["segment.ms"] = str(int(segment * 1000))
        from kafka.admin import NewTopic

        errors = _errors()
        with self._lock:
            admin = self._admin_client()
            try:
                admin.create_topics([NewTopic(name, partitions, self.replication_factor, topic_configs=configs)])
            except errors.TopicAlreadyExistsError:
                pass
            self._partitions.pop(name, None)
        have = self._wait_for_leaders(name)
        if have != partitions:
            raise TopicError(f"topic {name!r} exists with {have} partitions, not {partitions}")
        with self._lock:  # seen with a leader for each: a publish right after asks no broker again (in a cluster,
            self._partitions[name] = have  # one that has not heard of the topic yet would call it missing)

    def _describe(self, topic: str) -> dict[str, Any] | None:
        with self._lock:
            desc = self._admin_client().describe_topics([topic])
        info = next((t for t in desc if t.get("name") == topic), None)
        if info is None or info.get("error_code", 0) != 0 or not info.get("partitions"):
            return None
        return info

    def _wait_for_leaders(self, topic: str) -> int:
        """Wait until every partition of a new topic has a leader; return the partition count."""
        end = time.monotonic() + self.request_timeout
        while True:
            info = self._describe(topic)
            if info is not None and all(
                p.get("leader_id", -1) >= 0 and p.get("error_code", 0) == 0 for p in info["partitions"]
            ):
                return len(info["partitions"])
            if time.monotonic() > end:
                raise TopicError(
                    f"topic {topic!r} was created but its partitions have no leader after "
                    f"{self.request_timeout:g} s; check the broker's log"
                )
            time.sleep(0.05)

    def partitions(self, topic: str) -> int:
        with self._lock:
            n = self._partitions.get(topic)
        if n is not None:
            return n
        info = self._describe(topic)
        if info is None:
            raise TopicError(
                f"topic {topic!r} does not exist on {self.bootstrap}: "
                f"create it first with create_topic({topic!r}, partitions)"
            )
        n = len(info["partitions"])
        with self._lock:
            self._partitions[topic] = n
        return n

    # -- publishing ------------------------------------------------------------

    def publish_many(self, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> list[RecordPosition]:
        n = self.partitions(topic)
        producer = self._producer_client()
        records = []
        for key, value in items:
            _check_value(key, value)
            records.append(
                (_b(key), value if type(value) is bytes else bytes(value), partition_for(key, n, next(self._rr)))
            )
        return [RecordPosition(topic, p, off) for p, off in producer.publish(topic, records, self._day_ms())]

    def publish_nowait(
        self, topic: str, items: Iterable[tuple[bytes | None, bytes]], done: Callable[[str | None], None]
    ) -> None:
        """:meth:`publish_many` without waiting, for a caller on an event loop (the collector's group commit):
        ``done(None)`` once every record is acknowledged (``acks=all``), ``done(error)`` if any is not; it runs
        on the producer's poll thread. Raises :class:`TransportError` at once if a record is refused or
        librdkafka's queue is full (``done`` is then never called)."""
        n = self.partitions(topic)
        producer = self._producer_client()
        records = []
        for key, value in items:
            _check_value(key, value)
            records.append(
                (_b(key), value if type(value) is bytes else bytes(value), partition_for(key, n, next(self._rr)))
            )
        producer.publish_nowait(topic, records, self._day_ms(), done)

    def delete_before(self, topic: str, offsets: Mapping[int, int]) -> None:
        """DeleteRecords (KIP-107): move each partition's log start offset up to ``offsets[p]`` (an offset past
        the high watermark is refused). Consumers can no longer read what lies below; the broker deletes the segments wholly below
        it at its next retention check (``log.retention.check.interval.ms``)."""
        from kafka import TopicPartition as KTP

        if not offsets:
            return
        n = self.partitions(topic)
        for p in offsets:
            if not 0 <= int(p) < n:
                raise TopicError(f"topic {topic!r} has no partition {p}")
        errors = _errors()
        with self._lock:
            admin = self._admin_client()
            try:
                admin.delete_records(
                    {KTP(topic, int(p)): int(off) for p, off in offsets.items()},
                    timeout_ms=int(self.request_timeout * 1000),
                )
            except errors.KafkaError as exc:
                raise TransportError(f"Kafka did not delete records of {topic!r}: {exc!r}") from exc

    def _day_ms(self) -> int:
        """A record's timestamp: the start of the current UTC day (Kafka would otherwise store the send time)."""
        return int(day_start(self.clock())) * 1000

    def consume(
        self,
        topics: str | Sequence[str],
        group: str,
        *,
        member: str | None = None,
        session_timeout: float = 10.0,
        static: bool = False,
    ) -> KafkaConsumer:
        names = [topics] if isinstance(topics, str) else list(topics)
        for t in names:
            self.partitions(t)
        return KafkaConsumer(
            self, names, group, member=member, session_timeout=session_timeout, static=static and member is not None
        )

    def health(self, topic: str | None = None, *, timeout: float = 2.0) -> Health:
        """Whether the cluster answers a describe request within about ``timeout`` s (a fresh admin client)."""
        try:
            info = describe_cluster(self.bootstrap.split(",")[0], timeout=timeout)
        except (TransportError, ValueError) as exc:
            return Health(False, str(exc))
        return Health(True, f"{len(info['brokers'])} broker(s) up in cluster {info['cluster_id']}")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._producer is not None:
                self._producer.close(timeout=10)
            if self._admin is not None:
                self._admin.close()

    def __repr__(self) -> str:
        return f"KafkaTransport({self.bootstrap!r})"


def _b(key: bytes | None) -> bytes | None:
    return None if key is None else bytes(key)


def _check_value(key: bytes | None, value: bytes) -> None:
    if key is not None and not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"a record key must be bytes or None, got {type(key).__name__}")
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"a record value must be bytes, got {type(value).__name__}")


class _KafkaTransaction(Transaction, TransactionScope):
    def __init__(self, consumer: KafkaConsumer) -> None:
        self._consumer = consumer
        self._open = False

    def publish(self, topic: str, key: bytes | None, value: bytes) -> None:
        if not self._open:
            raise TransportError("publish() outside the transaction's `with` block")
        _check_value(key, value)
        c = self._consumer
        n = c._transport.partitions(topic)
        try:
            c._tx_producer().send(
                topic,
                key=_b(key),
                value=bytes(value),
                timestamp_ms=c._transport._day_ms(),
                partition=partition_for(key, n, next(c._transport._rr)),
            )
        except _errors().KafkaError as exc:
            raise TransportError(
                f"the transactional producer refused a record for {topic!r}: {exc!r}; "
                "leave the `with` block (the transaction is aborted) and retry"
            ) from exc

    def __enter__(self) -> Transaction:
        if self._open:
            raise TransportError("this transaction is already open")
        c = self._consumer
        errors = _errors()
        try:
            c._tx_producer().begin_transaction()
        except (errors.ProducerFencedError, errors.InvalidProducerEpochError) as exc:
            c._drop_producer()
            resume_after_fence(c, exc)  # FencedError if another incarnation took the id
            c._rewind()
            raise TransportError(f"cannot begin a transaction: {exc!r}; the producer resumed, retry") from exc
        except (errors.KafkaError, errors.IllegalStateError) as exc:
            # no usable transactional state (e.g. init_transactions timed out while the broker was away):
            # start over with a fresh producer next time, which fences whatever the old one left open
            c._drop_producer()
            c._rewind()
            raise TransportError(f"cannot begin a transaction: {exc!r}") from exc
        self._open = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._open = False
        c = self._consumer
        errors = _errors()
        if exc_type is not None:
            self._abort()
            return
        stale = c._take_unreported_rewind()
        if stale is not None:
            self._abort()
            raise stale
        from kafka import OffsetAndMetadata
        from kafka import TopicPartition as KTP

        # a token in the offsets' metadata, as in KafkaConsumer.commit: tells whether a transaction whose answer
        # was lost committed (its offsets carry the token) once its outcome is settled
        todo = dict(c._delivered)
        token = f"{c.member}:tx{next(_COMMITS)}:{time.time_ns()}"
        offsets = {KTP(tp.topic, tp.partition): OffsetAndMetadata(off, token, -1) for tp, off in todo.items()}
        ending = False  # whether EndTxn(commit) may have reached the coordinator
        try:
            if offsets:
                meta = c._group_metadata()
                if meta is None:
                    raise errors.RebalanceInProgressError("the group is rebalancing")
                # the offsets carry the member's generation (TxnOffsetCommit v3, KIP-447): the group coordinator
                # refuses them from a member it expelled (CommitFailedError), and the transaction is aborted
                c._tx_call("send_offsets_to_transaction", lambda tm: tm.send_offsets_to_transaction(offsets, meta))
            ending = True
            c._tx_call("commit_transaction", lambda tm: tm.begin_commit())
        except (errors.ProducerFencedError, errors.InvalidProducerEpochError) as exc:
            # the coordinator refused this producer's epoch: another incarnation took the id (FencedError from
            # the resume), or the coordinator itself aborted the transaction, open past its timeout (a broker
            # that coordinated it died, the worker paused): then this member resumes and the records come again
            c._drop_producer()
            if resume_after_fence(c, exc) and ending and todo and c._landed_soon(todo, token):
                log.warning("the transaction's commit was refused (%r) but it committed", exc)
                c._delivered = {}
                return
            c._rewind()
            raise TransportError(
                f"the transaction coordinator aborted the transaction ({exc!r}: open longer than the transaction "
                "timeout); the records will be delivered again"
            ) from exc
        except _TransactionStuck as exc:
            c._drop_producer()
            # Issue 31: EndTxn may have reached the transaction coordinator although its answer never came; the
            # coordinator then completes the commit on its own, a moment later. Rewinding to the committed
            # offsets at once read the old ones, and the records were processed and published a second time.
            # Settle the outcome first (a new producer's InitProducerId returns only once the coordinator has
            # completed or aborted the open transaction), then look whether the offsets carry this token.
            if c._settle() and ending and todo and c._landed_soon(todo, token):
                log.warning("the transaction's commit got no answer (%s) but it committed", exc)
                c._delivered = {}
                return
            c._rewind()
            raise TransportError(
                f"the transaction did not complete: {exc}; the producer was replaced (its "
                "successor aborts the open transaction) and the records will be delivered again"
            ) from exc
        except (errors.KafkaError, errors.IllegalStateError) as exc:
            rebalanced = isinstance(
                exc,
                (
                    errors.CommitFailedError,
                    errors.IllegalGenerationError,
                    errors.UnknownMemberIdError,
                    errors.RebalanceInProgressError,
                ),
            )
            if rebalanced and c._delivered:  # this failure reports the rewind: no second one
                c._rebalance_rewound(report=False)
            self._abort()
            if rebalanced:
                raise CommitFailedError(
                    f"group {c.group!r} rebalanced before the transaction committed ({exc!r}); "
                    "it was aborted and its records will be delivered again"
                ) from exc
            raise TransportError(f"the transaction was aborted: {exc!r}") from exc
        c._delivered = {}

    def _abort(self) -> None:
        c = self._consumer
        if c._producer is None:  # replaced after a failure: its successor aborts what it left open
            c._rewind()
            return
        try:
            c._tx_call("abort_transaction", lambda tm: tm.begin_abort())
        except (_TransactionStuck, _errors().KafkaError, _errors().IllegalStateError) as exc:
            # a producer that cannot abort is replaced; its successor's init_transactions aborts the transaction
            log.warning("abort_transaction failed (%r); replacing the transactional producer", exc)
            c._drop_producer()
        finally:
            c._rewind()


class _TransactionStuck(Exception):
    """A transactional request got no answer in time (kafka-python's public calls wait for ever)."""


class KafkaConsumer(Consumer):
    """A kafka-python consumer in ``group`` reading ``topics`` with read_committed isolation (not thread-safe)."""

    def __init__(
        self,
        transport: KafkaTransport,
        topics: list[str],
        group: str,
        *,
        member: str | None,
        session_timeout: float,
        static: bool = False,
    ) -> None:
        self._set_identity(topics, group, member, session_timeout)
        from kafka import ConsumerRebalanceListener
        from kafka import KafkaConsumer as _KC

        self._transport = transport
        self.transactional_id = f"ldp.{group}.{self.member}"
        session_ms = max(500, int(session_timeout * 1000))
        cfg: dict[str, Any] = {
            "bootstrap_servers": transport.bootstrap,
            "client_id": f"{transport.client_id}-{self.member}",
            "group_id": group,
            "enable_auto_commit": False,
            "isolation_level": "read_committed",
            "auto_offset_reset": "earliest",
            "session_timeout_ms": session_ms,
            "heartbeat_interval_ms": max(100, session_ms // 3),
            "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
            "max_partition_fetch_bytes": DEFAULT_MAX_REQUEST_SIZE,
            "fetch_max_bytes": 4 * DEFAULT_MAX_REQUEST_SIZE,
            "request_timeout_ms": int(transport.request_timeout * 1000),
        }
        # KIP-345: a restart with the same name gets its partitions back without a rebalance. Kafka allows
        # [A-Za-z0-9._-]{1,249} there; another name stays a dynamic member (one warning)
        if static and re.fullmatch(r"[A-Za-z0-9._-]{1,249}", self.member) is None:
            log.warning("member name %r is no valid group.instance.id: joining as a dynamic member", self.member)
            static = False
        if static:
            cfg["group_instance_id"] = self.member
        self.static = static
        cfg.update(transport.consumer_config)
        self._delivered: dict[TopicPartition, int] = {}
        self._reassigned: set[Any] | None = None
        self._producer: Any = None
        # the producer id and epoch this member's last transactional producer held: its successors resume them
        # (pipeline/transport/kafka_resume.py); None until the first one initialised
        self._identity: Identity | None = None
        self._closed = False
        try:
            self._consumer = _KC(**cfg)
        except _errors().KafkaError as exc:
            raise TransportError(
                f"cannot reach Kafka at {transport.bootstrap} ({exc!r}); start the project's broker with `ldp kafka up`"
            ) from exc
        # kafka-python 3.0.12 drops a join round that completed while no poll() awaited it and sends another
        # JoinGroup: from the leader, a second rebalance of the whole group (pipeline/transport/kafka_join.py)
        keep_finished_joins(self._consumer)
        owner = self

        class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            # called inside KafkaConsumer.poll; poll() below restarts the partitions from the committed offsets
            def on_partitions_revoked(self, revoked: Any) -> None:
                owner._forget_delivered()

            def on_partitions_assigned(self, assigned: Any) -> None:
                owner._reassigned = set(assigned)

        self._consumer.subscribe(list(self.topics), listener=_Listener())
        # kafka-python 3.0.12 drops a group join that a change of the topics' metadata started if it completes
        # while no poll() awaits it (the leader's assignment refreshes the snapshot that asked for it): the member
        # sat with no partitions and no heartbeats until the group expelled it. Fetching the metadata now, after
        # subscribing, makes the first join assign from it, so no second, metadata-driven join follows.
        try:
            self._consumer.topics()
        except _errors().KafkaError as exc:
            self._consumer.close(autocommit=False)
            raise TransportError(f"cannot read the topics' metadata from {transport.bootstrap} ({exc!r})") from exc

    def _tx_producer(self) -> Any:
        if self._producer is None:
            from kafka import KafkaProducer

            t = self._transport
            producer = KafkaProducer(
                **t.producer_settings(
                    transactional_id=self.transactional_id,
                    transaction_timeout_ms=int(t.transaction_timeout * 1000),
                    max_block_ms=int(t.request_timeout * 1000),
                    client_id=f"{t.client_id}-{self.member}-tx",
                )
            )
            try:
                if self._identity is None:  # this member's first producer takes the id, fencing older incarnations
                    producer.init_transactions()
                else:  # a successor: granted only while no other incarnation took the id since
                    resume_transactions(producer, self._identity, t.request_timeout)
            except BaseException:
                producer.close(timeout=0)
                raise
            self._producer = producer
            self._identity = identity_of(producer)
        return self._producer

    def _tx_call(self, what: str, start: Any) -> None:
        """Run one transactional request of the producer with a bounded wait.

        kafka-python's ``send_offsets_to_transaction``, ``commit_transaction``
        and ``abort_transaction`` (3.0.12 as 2.3) wait without a timeout; after
        a broker restart the request may never be answered and the worker
        would hang. This starts the same request on the producer's transaction
        manager (what those calls do, less their unbounded ``wait()``) and
        waits at most ``request_timeout`` (raising :class:`_TransactionStuck`),
        so the caller can replace the producer. The only private call of the
        transactional path: kafka-python has no public bounded variant.
        """
        producer = self._tx_producer()
        result = start(producer._transaction_manager)
        producer._sender.wakeup()
        timeout = self._transport.request_timeout
        if not result.wait(timeout_ms=int(timeout * 1000)):
            raise _TransactionStuck(f"{what} got no answer in {timeout:g} s")

    def _drop_producer(self) -> None:
        """Close the transactional producer without waiting; the next transaction makes a new one."""
        producer, self._producer = self._producer, None
        if producer is not None:
            self._identity = identity_of(producer) or self._identity  # (kafka-python may have bumped its epoch)
            try:
                producer.close(timeout=0)
            except Exception as exc:  # closing a broken client must not hide the error being handled
                log.warning("closing the transactional producer failed: %r", exc)
                # its flush timed out before it stopped its sender: stop that, and mark it closed, or its
                # __del__ closes it again and Python prints that failure's traceback to stderr
                sender = getattr(producer, "_sender", None)
                if sender is not None:
                    try:
                        sender.force_close()
                    except Exception:  # noqa: BLE001 - kafka-python's client may be half closed already
                        # (AttributeError from its wakeup socket, seen after a broker restart): the producer is
                        # dropped either way, and this must not replace the error being handled
                        log.debug("force-closing the producer's sender failed", exc_info=True)
                producer._closed = True

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]:
        if self._closed:
            raise TransportError("poll() on a closed consumer")
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        deadline = time.monotonic() + max(0.0, timeout)
        settle = deadline + self.session_timeout
        while True:
            now = time.monotonic()
            left = max(0, int((deadline - now) * 1000))
            if left == 0 and now < settle and self._joining():
                # see a group join through before returning, so that the assignment comes with this poll (a join
                # that completes between two polls is taken up by the next one: kafka_join.py)
                left = min(200, int((settle - now) * 1000))
            got = self._consumer.poll(timeout_ms=left, max_records=max_records)
            if self._reassigned is not None:
                fresh, self._reassigned = self._reassigned, None
                got = {k: v for k, v in got.items() if k not in fresh}
                self._forget_delivered()
                self._seek_committed(fresh)
            out: list[Record] = []
            for ktp, recs in got.items():
                tp = TopicPartition(ktp.topic, ktp.partition)
                out.extend(Record(tp.topic, tp.partition, r.offset, r.key, r.value) for r in recs)
                if recs:
                    self._delivered[tp] = recs[-1].offset + 1
            now = time.monotonic()
            if out or (now >= deadline and (now >= settle or not self._joining())):
                return out

    def _joining(self) -> bool:
        """Whether a JoinGroup/SyncGroup round of this member is under way."""
        from kafka.structs import MemberState

        return bool(self._consumer.group_metadata().state == MemberState.REBALANCING)

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        if self._closed:
            raise TransportError("commit() on a closed consumer")
        from kafka import OffsetAndMetadata
        from kafka import TopicPartition as KTP

        stale = self._take_unreported_rewind()
        if stale is not None:
            self._rewind()
            raise stale
        todo = dict(self._delivered if offsets is None else offsets)
        errors = _errors()
        # a token of this commit in the offsets' metadata: a commit reported failed may have landed anyway
        token = f"{self.member}:{next(_COMMITS)}:{time.time_ns()}"
        try:
            self._consumer.commit(
                {KTP(tp.topic, tp.partition): OffsetAndMetadata(int(off), token, -1) for tp, off in todo.items()}
            )
        except (
            errors.CommitFailedError,
            errors.IllegalGenerationError,
            errors.UnknownMemberIdError,
            errors.RebalanceInProgressError,
        ) as exc:
            if todo and self._landed(todo, token):
                # Issue 31: the first attempt reached the old group coordinator, which wrote the offsets before
                # its node died; kafka-python retried at the new coordinator, which no longer knew the member
                # and refused. The offsets are the group's now: report success, or the caller drops records the
                # group will never deliver again (the next owner, or this member after its rejoin, starts there)
                log.warning("the offset commit was reported failed (%r) but it landed; the member rejoins", exc)
                for tp, off in todo.items():
                    if self._delivered.get(tp, -1) <= off:
                        self._delivered.pop(tp, None)
                return
            if self._delivered:  # this failure reports the rewind: no second one
                self._rebalance_rewound(report=False)
            self._rewind()
            raise CommitFailedError(
                f"group {self.group!r} rebalanced since these records were delivered ({exc!r}); "
                "nothing was committed and they will be delivered again"
            ) from exc
        for tp, off in todo.items():
            if self._delivered.get(tp, -1) <= off:
                self._delivered.pop(tp, None)

    def _landed(self, todo: Mapping[TopicPartition, int], token: str) -> bool:
        """Whether the group's committed offsets are the ones of the commit carrying ``token`` (an offset
        commit of one group is one write: all of its partitions, or none)."""
        from kafka import TopicPartition as KTP

        try:
            for tp, off in todo.items():
                got = self._consumer.committed(KTP(tp.topic, tp.partition), metadata=True)
                if got is None or got.metadata != token or got.offset != int(off):
                    return False
        except _errors().KafkaError as exc:  # cannot tell: treat as not landed (the records come again)
            log.warning("could not read the committed offsets after a failed commit: %r", exc)
            return False
        return True

    def _settle(self) -> bool:
        """A new transactional producer (its ``init_transactions`` fences the old one and returns once the
        coordinator has completed or aborted the open transaction); whether that worked."""
        try:
            self._tx_producer()
        except Exception as exc:  # noqa: BLE001 - the coordinator is still away: the outcome stays unknown
            log.warning("could not settle the open transaction (%r); its outcome is unknown", exc)
            self._drop_producer()
            return False
        return True

    def _landed_soon(self, todo: Mapping[TopicPartition, int], token: str, wait: float = 2.0) -> bool:
        """:meth:`_landed`, asked again for up to ``wait`` s (a settled commit's offsets show once the markers'
        write is replicated)."""
        end = time.monotonic() + wait
        while not self._landed(todo, token):
            if time.monotonic() > end:
                return False
            time.sleep(0.05)
        return True

    def _generation_stable(self) -> bool:
        """Whether this member's client believes its generation stable (an expelled member may not know yet)."""
        return self._group_metadata() is not None

    def _group_metadata(self) -> Any:
        """The consumer's ``group_metadata()`` (group, generation id, member id, static instance id) if its
        client believes the generation stable, else ``None``. The broker checks the generation itself (KIP-447):
        this only spares a transaction that is bound to be refused."""
        from kafka.structs import MemberState

        meta = self._consumer.group_metadata()
        return meta if meta.state == MemberState.STABLE else None

    def _forget_delivered(self) -> None:
        """A rebalance restarts every partition from the committed offsets: report uncommitted deliveries it drops."""
        if self._delivered:
            self._rebalance_rewound()
        self._delivered = {}

    def _rewind(self) -> None:
        """Seek every owned partition back to the group's committed offset (the beginning if none)."""
        self._delivered = {}
        self._seek_committed(self._consumer.assignment())

    def _seek_committed(self, partitions: Iterable[Any]) -> None:
        for ktp in partitions:
            off = self._consumer.committed(ktp)
            if off is None:
                self._consumer.seek_to_beginning(ktp)
            else:
                self._consumer.seek(ktp, off)

    def transaction(self) -> TransactionScope:
        if self._closed:
            raise TransportError("transaction() on a closed consumer")
        return _KafkaTransaction(self)

    def assignment(self) -> frozenset[TopicPartition]:
        return frozenset(TopicPartition(t.topic, t.partition) for t in self._consumer.assignment())

    def reachable(self) -> bool:
        # kafka-python has no public call for it; its group coordinator knows the group's coordinating broker
        # and its client the connection. Read without their locks (plain attribute reads), so that another
        # thread can ask while the polling thread is blocked in a call to the stopped broker
        coordinator = getattr(self._consumer, "_coordinator", None)
        client = getattr(self._consumer, "_client", None)
        if coordinator is None or client is None:
            return True
        node = coordinator.coordinator_id
        return node is not None and bool(client.connected(node))

    def positions(self) -> dict[TopicPartition, int]:
        return dict(self._delivered)

    def committed(self, tp: TopicPartition) -> int | None:
        from kafka import TopicPartition as KTP

        off = self._consumer.committed(KTP(tp[0], tp[1]))
        return None if off is None else int(off)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._producer is not None:
                self._producer.close(timeout=10)
        finally:
            self._consumer.close(autocommit=False)

    def __repr__(self) -> str:
        return f"KafkaConsumer(group={self.group!r}, member={self.member!r}, topics={self.topics!r})"
