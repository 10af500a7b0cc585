"""The embedded transport: a durable partitioned log in one SQLite file (WAL mode).

The default when no broker is configured: one machine, no service. Several
processes may share the file (SQLite serializes writers; readers never block
in WAL mode). Each write is one SQLite transaction, committed with
``synchronous=FULL`` by default, so :meth:`~EmbeddedTransport.publish`
returns only once the record is on disk (Hipp et al., "Write-Ahead Logging",
sqlite.org/wal.html).

Consumer groups work as Kafka's eager rebalancing protocol does, with the
database as coordinator:

* a member row holds its topics, a random instance token and a heartbeat
  time; a member silent for ``session_timeout`` seconds is removed by the
  next member that heartbeats;
* every join, leave or removal increments the group's *generation*; a member
  that sees a new generation recomputes its partitions (for each topic,
  partition ``p`` goes to the ``p mod m``-th of the ``m`` subscribed members
  sorted by name) and restarts each from the group's committed offset;
* a commit, plain or transactional, succeeds only in the generation the
  records were delivered in, so a member that lost its partitions cannot
  commit over their new owner (:class:`~pipeline.transport.base.CommitFailedError`);
  a member that follows a new generation while it holds delivered,
  uncommitted records counts it in ``Consumer.generation`` and fails its
  next commit once (see :attr:`~pipeline.transport.base.Consumer.generation`);
* a consume-transform-produce transaction is one SQLite transaction that
  appends the outputs and writes the input offsets.

Schema (``PRAGMA user_version = 2``; version 1 files are upgraded in place)::

    topics(name PRIMARY KEY, partitions, retention)                       retention: seconds, NULL = default
    log(id INTEGER PRIMARY KEY, topic, partition, offset, key, value, ts)  UNIQUE(topic, partition, offset)
                                                                          ts = start of the UTC day
    groups(grp PRIMARY KEY, generation)
    members(grp, member, instance, topics, heartbeat, session_timeout)   PRIMARY KEY(grp, member)
    group_offsets(grp, topic, partition, offset)                          PRIMARY KEY(grp, topic, partition)
"""

from __future__ import annotations

import itertools
import json
import math
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal

from ldp_core.days import DAY_SECONDS, day_start
from ldp_core.sqlite import immediate_transaction, use_wal
from pipeline.transport.base import (
    DEFAULT_RETENTION,
    CommitFailedError,
    Consumer,
    FencedError,
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

__all__ = ["EmbeddedTransport", "EmbeddedConsumer", "SCHEMA_VERSION"]

SCHEMA_VERSION = 2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topics(name TEXT PRIMARY KEY, partitions INTEGER NOT NULL, retention REAL);
CREATE TABLE IF NOT EXISTS log(
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    key BLOB, value BLOB NOT NULL, ts REAL NOT NULL);
CREATE UNIQUE INDEX IF NOT EXISTS log_position ON log(topic, partition, offset);
CREATE INDEX IF NOT EXISTS log_day ON log(topic, ts);
CREATE TABLE IF NOT EXISTS groups(grp TEXT PRIMARY KEY, generation INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS members(
    grp TEXT NOT NULL, member TEXT NOT NULL, instance TEXT NOT NULL, topics TEXT NOT NULL,
    heartbeat REAL NOT NULL, session_timeout REAL NOT NULL, PRIMARY KEY(grp, member));
CREATE TABLE IF NOT EXISTS group_offsets(
    grp TEXT NOT NULL, topic TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    PRIMARY KEY(grp, topic, partition));
"""

Synchronous = Literal["FULL", "NORMAL", "EXTRA"]


def _connect(path: Path, synchronous: Synchronous) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=60.0, isolation_level=None, check_same_thread=False)
    mode = use_wal(conn, 60.0)
    if str(mode).lower() != "wal":
        conn.close()
        raise TransportError(f"SQLite refused WAL mode for {path} (got {mode!r}); put the log on a local file system")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    return conn


def _partitions(conn: sqlite3.Connection, topic: str) -> int:
    row = conn.execute("SELECT partitions FROM topics WHERE name=?", (topic,)).fetchone()
    if row is None:
        raise TopicError(f"topic {topic!r} does not exist: create it first with create_topic({topic!r}, partitions)")
    return int(row[0])


def _append(
    conn: sqlite3.Connection, topic: str, items: Sequence[tuple[bytes | None, int, bytes]], now: float
) -> list[RecordPosition]:
    """Append ``(key, partition, value)`` records inside the caller's write transaction, stamped with the start of
    the UTC day of ``now`` (the log keeps no finer time)."""
    nxt: dict[int, int] = {}
    rows, out = [], []
    now = day_start(now)
    for key, part, value in items:
        if part not in nxt:
            row = conn.execute("SELECT MAX(offset) FROM log WHERE topic=? AND partition=?", (topic, part)).fetchone()
            nxt[part] = 0 if row[0] is None else int(row[0]) + 1
        off = nxt[part]
        nxt[part] = off + 1
        rows.append((topic, part, off, key, value, now))
        out.append(RecordPosition(topic, part, off))
    conn.executemany("INSERT INTO log(topic, partition, offset, key, value, ts) VALUES (?,?,?,?,?,?)", rows)
    return out


def _check_value(key: bytes | None, value: bytes) -> None:
    if key is not None and not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"a record key must be bytes or None, got {type(key).__name__}")
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"a record value must be bytes, got {type(value).__name__}")


class EmbeddedTransport(Transport):
    """A durable partitioned log in the SQLite file ``path`` (created with its folder if missing).

    ``synchronous="FULL"`` (default) fsyncs the WAL at every commit, so an
    acknowledged record survives a power cut; ``"NORMAL"`` survives a crash
    of the process but may lose the last commits on power loss, and is faster.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        synchronous: Synchronous = "FULL",
        poll_interval: float = 0.05,
        retention: float = DEFAULT_RETENTION,
        purge_interval: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"synchronous must be 'FULL', 'NORMAL' or 'EXTRA', got {synchronous!r}")
        retention = check_retention(retention)  # type: ignore[assignment]
        if retention is None:
            raise TopicError("the embedded log's default retention must be a number of seconds (math.inf: for ever)")
        if not purge_interval > 0:
            raise ValueError(f"purge_interval must be > 0 seconds, got {purge_interval!r}")
        self.retention = float(retention)
        self.purge_interval = float(purge_interval)
        self.clock = clock
        self._next_purge = 0.0
        self.path = Path(path).expanduser().resolve()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.synchronous: Synchronous = synchronous
        self.poll_interval = float(poll_interval)
        self.url = f"sqlite:///{self.path}"
        self._lock = threading.Lock()
        self._rr = itertools.count()
        self._conn = _connect(self.path, synchronous)
        # deletions (retention, delete_before) overwrite the freed content: a deleted record must not stay readable
        self._conn.execute("PRAGMA secure_delete=ON")
        with immediate_transaction(self._conn) as c:
            version = c.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, 1, SCHEMA_VERSION):
                raise TransportError(
                    f"{self.path} has log schema version {version}; this code reads versions 1 and {SCHEMA_VERSION}"
                )
            if version == 1:  # version 2 added per-topic retention (and the day index below)
                c.execute("ALTER TABLE topics ADD COLUMN retention REAL")
            for stmt in filter(str.strip, _SCHEMA.split(";")):
                c.execute(stmt)
            c.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise TransportError(f"the transport on {self.path} is closed")

    def create_topic(
        self, name: str, partitions: int = 1, *, retention: float | None = None, segment: float | None = None
    ) -> None:
        check_topic_name(name)
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise TopicError(f"partitions must be a positive integer, got {partitions!r}")
        retention = check_retention(retention)
        with self._lock:
            self._check_open()
            with immediate_transaction(self._conn) as c:
                row = c.execute("SELECT partitions FROM topics WHERE name=?", (name,)).fetchone()
                if row is None:
                    c.execute(
                        "INSERT INTO topics(name, partitions, retention) VALUES (?, ?, ?)",
                        (name, partitions, None if retention is None else min(retention, 1e300)),
                    )
                elif int(row[0]) != partitions:
                    raise TopicError(f"topic {name!r} exists with {row[0]} partitions, not {partitions}")

    def partitions(self, topic: str) -> int:
        with self._lock:
            self._check_open()
            return _partitions(self._conn, topic)

    def _place(
        self, conn: sqlite3.Connection, topic: str, items: Iterable[tuple[bytes | None, bytes]]
    ) -> list[tuple[bytes | None, int, bytes]]:
        n = _partitions(conn, topic)
        placed = []
        for key, value in items:
            _check_value(key, value)
            placed.append((None if key is None else bytes(key), partition_for(key, n, next(self._rr)), bytes(value)))
        return placed

    def publish_many(self, topic: str, items: Iterable[tuple[bytes | None, bytes]]) -> list[RecordPosition]:
        with self._lock:
            self._check_open()
            now = self.clock()
            with immediate_transaction(self._conn) as c:
                out = _append(c, topic, self._place(c, topic, items), now)
        if now >= self._next_purge:
            self.purge(now)
        return out

    def retention_of(self, topic: str) -> float:
        """The retention of ``topic`` in seconds (``math.inf``: kept for ever)."""
        with self._lock:
            self._check_open()
            row = self._conn.execute("SELECT retention FROM topics WHERE name=?", (topic,)).fetchone()
        if row is None:
            raise TopicError(f"topic {topic!r} does not exist")
        return self.retention if row[0] is None else (math.inf if row[0] >= 1e300 else float(row[0]))

    def purge(self, now: float | None = None) -> int:
        """Delete the records whose whole day ended more than their topic's retention before ``now``; return
        how many. The newest record of each partition is always kept, so offsets never restart (the log
        numbers a partition's records from its highest offset); SQLite reuses the freed pages.

        Runs by itself at most every ``purge_interval`` seconds while records are published. A group whose
        committed offset points at deleted records resumes at the oldest record left, as on Kafka."""
        now = self.clock() if now is None else float(now)
        deleted = 0
        with self._lock:
            self._check_open()
            self._next_purge = now + self.purge_interval
            topics = self._conn.execute("SELECT name, retention FROM topics").fetchall()
            for name, ret in topics:
                keep = self.retention if ret is None else float(ret)
                if keep >= 1e300:
                    continue
                cutoff = now - keep - DAY_SECONDS  # a record's ts is the start of its day: the whole day must be older
                with immediate_transaction(self._conn) as c:
                    cur = c.execute(
                        "DELETE FROM log WHERE topic=? AND ts<? AND offset < (SELECT MAX(l2.offset) FROM log l2 "
                        "WHERE l2.topic=log.topic AND l2.partition=log.partition)",
                        (name, cutoff),
                    )
                    deleted += cur.rowcount
        return deleted

    def delete_before(self, topic: str, offsets: Mapping[int, int]) -> None:
        """Delete the records of ``topic`` below ``offsets[p]`` in each partition ``p`` (one transaction); their
        bytes are overwritten (``PRAGMA secure_delete``), in the database and, once SQLite checkpoints it, in the
        WAL. The newest record of a partition is always kept, so offsets never restart."""
        with self._lock:
            self._check_open()
            with immediate_transaction(self._conn) as c:
                n = _partitions(c, topic)
                for p, off in offsets.items():
                    if not 0 <= int(p) < n:
                        raise TopicError(f"topic {topic!r} has no partition {p}")
                    c.execute(
                        "DELETE FROM log WHERE topic=? AND partition=? AND offset<? AND offset < "
                        "(SELECT MAX(l2.offset) FROM log l2 WHERE l2.topic=? AND l2.partition=?)",
                        (topic, int(p), int(off), topic, int(p)),
                    )

    def consume(
        self,
        topics: str | Sequence[str],
        group: str,
        *,
        member: str | None = None,
        session_timeout: float = 10.0,
        static: bool = False,
    ) -> EmbeddedConsumer:
        self._check_open()
        return EmbeddedConsumer(
            self,
            [topics] if isinstance(topics, str) else list(topics),
            group,
            member=member,
            session_timeout=session_timeout,
        )

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._conn.close()

    def __repr__(self) -> str:
        return f"EmbeddedTransport({str(self.path)!r}, synchronous={self.synchronous!r})"


class _EmbeddedTransaction(Transaction, TransactionScope):
    def __init__(self, consumer: EmbeddedConsumer) -> None:
        self._consumer = consumer
        self._outputs: dict[str, list[tuple[bytes | None, bytes]]] = {}
        self._open = False

    def publish(self, topic: str, key: bytes | None, value: bytes) -> None:
        if not self._open:
            raise TransportError("publish() outside the transaction's `with` block")
        _check_value(key, value)
        self._consumer._transport.partitions(topic)
        self._outputs.setdefault(topic, []).append((key, value))

    def __enter__(self) -> Transaction:
        if self._open:
            raise TransportError("this transaction is already open")
        self._open = True
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._open = False
        c = self._consumer
        if exc_type is not None:
            c._rewind()
            return
        stale = c._take_unreported_rewind()
        if stale is not None:
            c._rewind()
            raise stale
        try:
            with immediate_transaction(c._conn) as conn:
                c._check_generation(conn)
                for topic, items in self._outputs.items():
                    _append(conn, topic, c._transport._place(conn, topic, items), c._transport.clock())
                c._write_offsets(conn, c._delivered)
        except BaseException:
            c._rewind()
            raise
        c._committed_delivery()


class EmbeddedConsumer(Consumer):
    """A member of a consumer group on an :class:`EmbeddedTransport` (not thread-safe: one per thread)."""

    def __init__(
        self, transport: EmbeddedTransport, topics: list[str], group: str, *, member: str | None, session_timeout: float
    ) -> None:
        self._set_identity(topics, group, member, session_timeout)
        self._transport = transport
        self._instance = uuid.uuid4().hex
        self._conn = _connect(transport.path, transport.synchronous)
        self._generation = -1
        self._assignment: frozenset[TopicPartition] = frozenset()
        self._fetch: dict[TopicPartition, int] = {}
        self._delivered: dict[TopicPartition, int] = {}
        self._last_heartbeat = 0.0
        self._closed = False
        self._turn = 0
        for t in self.topics:
            _partitions(self._conn, t)
        with immediate_transaction(self._conn) as c:
            c.execute(
                "INSERT OR REPLACE INTO members(grp, member, instance, topics, heartbeat, session_timeout) "
                "VALUES (?,?,?,?,?,?)",
                (group, self.member, self._instance, json.dumps(self.topics), time.time(), self.session_timeout),
            )
            self._bump(c)
            self._last_heartbeat = time.monotonic()

    # -- group membership ----------------------------------------------------

    def _bump(self, c: sqlite3.Connection) -> None:
        c.execute(
            "INSERT INTO groups(grp, generation) VALUES (?, 1) "
            "ON CONFLICT(grp) DO UPDATE SET generation = generation + 1",
            (self.group,),
        )

    def _current_generation(self, c: sqlite3.Connection) -> int:
        row = c.execute("SELECT generation FROM groups WHERE grp=?", (self.group,)).fetchone()
        return -1 if row is None else int(row[0])

    def _check_generation(self, c: sqlite3.Connection) -> None:
        """Inside a write transaction: refuse a commit from a fenced member or an old generation."""
        row = c.execute("SELECT instance FROM members WHERE grp=? AND member=?", (self.group, self.member)).fetchone()
        if row is not None and row[0] != self._instance:
            raise FencedError(
                f"another consumer joined group {self.group!r} as member {self.member!r}; this one is fenced"
            )
        if row is None or self._current_generation(c) != self._generation:
            if self._delivered:  # this failure reports the rewind: no second one
                self._rebalance_rewound(report=False)
            raise CommitFailedError(
                f"group {self.group!r} rebalanced since these records were delivered; "
                "nothing was committed and they will be delivered again"
            )
        c.execute("UPDATE members SET heartbeat=? WHERE grp=? AND member=?", (time.time(), self.group, self.member))

    def _sync(self) -> None:
        """Heartbeat when due, remove silent members, and follow a new generation."""
        due = time.monotonic() - self._last_heartbeat >= self.session_timeout / 3
        if not due and self._current_generation(self._conn) == self._generation:
            return
        with immediate_transaction(self._conn) as c:
            now = time.time()
            gone = c.execute(
                "DELETE FROM members WHERE grp=? AND member<>? AND heartbeat + session_timeout < ?",
                (self.group, self.member, now),
            ).rowcount
            row = c.execute(
                "SELECT instance FROM members WHERE grp=? AND member=?", (self.group, self.member)
            ).fetchone()
            if row is None:
                c.execute(
                    "INSERT INTO members(grp, member, instance, topics, heartbeat, session_timeout) VALUES (?,?,?,?,?,?)",
                    (self.group, self.member, self._instance, json.dumps(self.topics), now, self.session_timeout),
                )
                gone += 1
            elif row[0] != self._instance:
                raise FencedError(
                    f"another consumer joined group {self.group!r} as member {self.member!r}; this one is fenced"
                )
            else:
                c.execute("UPDATE members SET heartbeat=? WHERE grp=? AND member=?", (now, self.group, self.member))
            if gone:
                self._bump(c)
            generation = self._current_generation(c)
            if generation != self._generation:
                self._assign(c, generation)
        self._last_heartbeat = time.monotonic()

    def _assign(self, c: sqlite3.Connection, generation: int) -> None:
        members = c.execute("SELECT member, topics FROM members WHERE grp=? ORDER BY member", (self.group,)).fetchall()
        owned = set()
        for topic in self.topics:
            subs = [m for m, ts in members if topic in json.loads(ts)]
            for p in range(_partitions(c, topic)):
                if subs[p % len(subs)] == self.member:
                    owned.add(TopicPartition(topic, p))
        if self._delivered:
            self._rebalance_rewound()
        self._generation = generation
        self._assignment = frozenset(owned)
        self._fetch = {tp: self._committed_in(c, tp) or 0 for tp in owned}
        self._delivered = {}

    def _committed_in(self, c: sqlite3.Connection, tp: TopicPartition) -> int | None:
        row = c.execute(
            "SELECT offset FROM group_offsets WHERE grp=? AND topic=? AND partition=?",
            (self.group, tp.topic, tp.partition),
        ).fetchone()
        return None if row is None else int(row[0])

    def _write_offsets(self, c: sqlite3.Connection, offsets: Mapping[TopicPartition, int]) -> None:
        for tp, off in offsets.items():
            if tp not in self._assignment:
                raise CommitFailedError(f"{tp} is not assigned to member {self.member!r} of group {self.group!r}")
            c.execute(
                "INSERT INTO group_offsets(grp, topic, partition, offset) VALUES (?,?,?,?) "
                "ON CONFLICT(grp, topic, partition) DO UPDATE SET offset=excluded.offset",
                (self.group, tp.topic, tp.partition, int(off)),
            )

    def _rewind(self) -> None:
        """Forget undelivered progress: restart every owned partition from its committed offset."""
        self._fetch = {tp: self._committed_in(self._conn, tp) or 0 for tp in self._assignment}
        self._delivered = {}

    def _committed_delivery(self) -> None:
        self._delivered = {}

    # -- public API ------------------------------------------------------------

    def poll(self, max_records: int = 500, timeout: float = 1.0) -> list[Record]:
        if self._closed:
            raise TransportError("poll() on a closed consumer")
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        deadline = time.monotonic() + max(0.0, timeout)
        wait = 0.002
        while True:
            self._sync()
            out = self._read(max_records)
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
            wait = min(wait * 2, self._transport.poll_interval)

    def _read(self, max_records: int) -> list[Record]:
        tps = sorted(self._assignment)
        if not tps:
            return []
        self._turn = (self._turn + 1) % len(tps)
        out: list[Record] = []
        for tp in tps[self._turn :] + tps[: self._turn]:
            left = max_records - len(out)
            if left <= 0:
                break
            rows = self._conn.execute(
                "SELECT offset, key, value FROM log WHERE topic=? AND partition=? AND offset>=? ORDER BY offset LIMIT ?",
                (tp.topic, tp.partition, self._fetch[tp], left),
            ).fetchall()
            if rows:
                out.extend(Record(tp.topic, tp.partition, int(o), k, v) for o, k, v in rows)
                self._fetch[tp] = self._delivered[tp] = int(rows[-1][0]) + 1
        return out

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        if self._closed:
            raise TransportError("commit() on a closed consumer")
        stale = self._take_unreported_rewind()
        if stale is not None:
            self._rewind()
            raise stale
        todo = dict(self._delivered if offsets is None else offsets)
        try:
            with immediate_transaction(self._conn) as c:
                self._check_generation(c)
                self._write_offsets(c, todo)
        except CommitFailedError:
            self._rewind()
            raise
        for tp, off in todo.items():
            if self._delivered.get(tp, -1) <= off:
                self._delivered.pop(tp, None)

    def transaction(self) -> TransactionScope:
        if self._closed:
            raise TransportError("transaction() on a closed consumer")
        return _EmbeddedTransaction(self)

    def assignment(self) -> frozenset[TopicPartition]:
        return self._assignment

    def positions(self) -> dict[TopicPartition, int]:
        return dict(self._delivered)

    def committed(self, tp: TopicPartition) -> int | None:
        return self._committed_in(self._conn, TopicPartition(*tp))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            with immediate_transaction(self._conn) as c:
                left = c.execute(
                    "DELETE FROM members WHERE grp=? AND member=? AND instance=?",
                    (self.group, self.member, self._instance),
                ).rowcount
                if left:
                    self._bump(c)
        finally:
            self._conn.close()

    def __repr__(self) -> str:
        return f"EmbeddedConsumer(group={self.group!r}, member={self.member!r}, topics={self.topics!r})"
