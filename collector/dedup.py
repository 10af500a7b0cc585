"""The collector's durable store of recently accepted batch ids (idempotent uploads).

A device retries an upload under the same batch id until it gets an answer,
so the collector answers an id it already published with 202 without
publishing it again, provided the retry carries the same content; the same
id with other content is refused (409), never silently dropped.

**What the store keeps.** One SQLite table per **UTC day** of acceptance,
``ids_<day>(id_digest, content)`` (``WITHOUT ROWID``, keyed by the digest),
in WAL mode: a keyed digest (HMAC-SHA-256 under a random key kept in the
file, truncated to 16 bytes) of each batch id accepted that day and a
digest of its re-encoded frame (:func:`content_digest`). No time finer than the day is stored (the
day is the table's name): the batch id also travels on the raw topic, and
the transports coarsen record times to the day, so an accept time kept here
would give each upload's arrival time back to whoever holds both. An id is
kept through day ``day + ceil(ttl / 86400)`` (so at least ``ttl`` seconds)
and then purged, by dropping the day's table.

**Why a table per day** (schema 4): with one table and an index on the day
(schema 3), recording an id dirtied two pages at random places (the key's
and the index's), each written to the WAL and back at the next checkpoint:
about 30 us of CPU per id, the largest part of a group commit (13 us now). Per-day tables
need no day index (the purge drops a table), which halves the pages an id
dirties; a lookup asks each kept day's table (at most ``ceil(ttl / 86400)
+ 1``, in one statement). The WAL is checkpointed every ``4000`` pages
rather than SQLite's ``1000``: a page that several commits dirty between
two checkpoints is copied back once.

``PRAGMA user_version`` holds the schema version; a file of the first
schema (``batch_ids(id, expires)``, accept time + TTL to the microsecond)
is upgraded in place (its expiries reduced to days, then the file vacuumed
so the old values do not linger in free pages), and so are files of
schemas 2 and 3 (``batches(id_digest, content, day)``: their rows move to
the day tables, and schema 2 gains the counters table), and schema 4 (the
same tables, whose content digests were 16 bytes of BLAKE2b: they are kept
and still compared, :func:`same_content`); a newer schema is refused with
:class:`~collector.errors.DedupStoreError` (so a collector older than
schema 5 refuses a file a newer one wrote, whose digests it would misread:
roll back with a fresh file).

**The content digest** (schema 5) is the 128-bit XXH3 of the re-encoded
frame after a marker byte: 0.2 µs for an 8 KB frame against 9 µs for
BLAKE2b, which was a tenth of the collector's CPU per upload behind the
native front. A non-cryptographic hash suffices because a collision helps
no one: the digest only tells a retry (the same frame, hence the same
digest under any function) from another batch under a reused id (409). To
pass one off as the other an attacker must know a device's random batch id,
and then its frame is answered ``duplicate`` and dropped: the device's own
batch is unaffected, and nothing is published.

**The collector's counters** live here too, in ``counters(name, value)``
(:class:`~pipeline.prometheus.CounterStore`), so that they survive
restarts and every worker process (``--workers N``) renders the same totals
at ``/metrics``. The accepted batches and reports are added **in the
transaction that records their ids** (:meth:`BatchIdStore.add` with
``counts``): the counter is exactly the number of batches recorded, crash
or no crash. Other outcomes (duplicates, refusals) are added in memory and
written at most ``counter_flush`` seconds later (or with the next id
record, or on close): a kill -9 may lose that last second of them, never an
accepted one.

**The crash window.** An id is recorded *after* the transport acknowledged
the batch (recording it before would lose the batch if the publish then
failed: the retry would be taken for a duplicate). A collector killed
between the acknowledgement and the record has published the batch but not
answered; the device retries and the batch is published a second time. That
second copy has the same batch id, metric and day, so it lands in the same
partition of ``ldp.reports.raw`` shortly after the first, and the shuffler
drops it (it keeps a durable window of recent batch ids per partition, see
:mod:`collector.shuffler`): each batch is counted once end to end.
``synchronous=NORMAL`` suffices here for the same reason: a record lost to
a power cut only lets one retry through to the shuffler's check.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import math
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import xxhash

from collector.errors import DedupStoreError
from ldp_core.days import DAY_SECONDS, utc_day
from ldp_core.sqlite import immediate_transaction, use_wal

__all__ = ["BatchIdStore", "SCHEMA_VERSION", "content_digest", "same_content"]

_CHUNK = 500
#: the store's schema (``PRAGMA user_version``): 0 = none or the first ``batch_ids(id, expires)``, 2 = batches
#: with content digests, 3 = 2 and a ``counters`` table, 4 = a table of ids per day, no day index, 5 = this one
#: (4 with XXH3 content digests; schema 4's BLAKE2b ones are still read)
SCHEMA_VERSION = 5
#: the first byte of a schema-5 content digest (XXH3-128 follows); schema 4's are 16 bytes of BLAKE2b, no marker
_XXH3 = b"\x01"
#: WAL pages between automatic checkpoints (SQLite's default is 1000)
_CHECKPOINT_PAGES = 4000

_ADD_COUNT = (
    "INSERT INTO counters(name, value) VALUES (?, ?) ON CONFLICT(name) DO UPDATE SET value = value + excluded.value"
)


def _table(day: int) -> str:
    """The table of the ids accepted on UTC day ``day``."""
    return f"ids_{int(day)}"


def _create_day(conn: sqlite3.Connection, day: int) -> None:
    conn.execute(f"CREATE TABLE IF NOT EXISTS {_table(day)}(id_digest BLOB PRIMARY KEY, content BLOB) WITHOUT ROWID")


def _days(conn: sqlite3.Connection) -> list[int]:
    """The days whose table exists, oldest first."""
    names = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name GLOB 'ids_[0-9]*'")
    return sorted(int(n[4:]) for (n,) in names if n[4:].isdigit())


def content_digest(value: bytes) -> bytes:
    """The digest stored with a batch id: a marker byte and the 128-bit XXH3 of the re-encoded frame (why
    not a cryptographic hash: the module's docstring)."""
    return _XXH3 + xxhash.xxh3_128_digest(value)


def same_content(stored: bytes | None, digest: bytes, value: bytes) -> bool:
    """Whether ``value`` (whose :func:`content_digest` is ``digest``) is the content ``stored`` with its id: an
    unknown one (``None``, an id from the first schema) counts as the same, as before; a 16-byte digest of
    schema 4 is BLAKE2b's, computed again for the comparison (only for an id accepted before the upgrade)."""
    if stored is None:
        return True
    if len(stored) == 16:
        return hashlib.blake2b(value, digest_size=16).digest() == stored
    return stored == digest


class BatchIdStore:
    """Batch ids accepted within the last ``ttl`` seconds (rounded up to whole UTC days), with a digest of their
    content, in the SQLite file ``path`` (``":memory:"`` for tests)."""

    def __init__(
        self,
        path: str | Path,
        *,
        ttl: float = 3.0 * DAY_SECONDS,
        purge_interval: float = 60.0,
        counter_flush: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not ttl > 0:
            raise ValueError(f"ttl must be > 0 seconds, got {ttl!r}")
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        self.ttl = float(ttl)
        self.ttl_days = max(1, math.ceil(self.ttl / DAY_SECONDS))
        self.purge_interval = float(purge_interval)
        self.clock = clock
        self.counter_flush = float(counter_flush)
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # counts not written yet (see the module docstring)
        self._flushed = time.monotonic()
        self._conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
        try:
            if self.path != ":memory:":
                use_wal(self._conn, 60.0)
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute(f"PRAGMA wal_autocheckpoint={_CHECKPOINT_PAGES}")
            self._key = self._open_schema()
        except BaseException:
            self._conn.close()
            raise
        self._mac = hmac.new(self._key, digestmod=hashlib.sha256)
        self._next_purge = 0.0
        self._digests = functools.lru_cache(maxsize=8192)(self._digest_uncached)
        self._cookie = -1  # PRAGMA schema_version when self._tables was read
        self._tables: list[int] = []  # the days whose table exists (as of self._cookie)
        self._made_day: int | None = None  # the day whose table this process made sure of last

    def _open_schema(self) -> bytes:
        conn = self._conn
        with immediate_transaction(conn):
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                raise DedupStoreError(
                    f"the batch-id store {self.path} has schema version {version}, newer than "
                    f"this collector's {SCHEMA_VERSION}: run a newer collector or give it a fresh "
                    "--dedup file"
                )
            conn.execute("CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value BLOB NOT NULL)")
            row = conn.execute("SELECT value FROM meta WHERE name = 'id_key'").fetchone()
            if row is None:
                key = os.urandom(32)
                conn.execute("INSERT INTO meta(name, value) VALUES ('id_key', ?)", (key,))
            else:
                key = bytes(row[0])
            conn.execute("CREATE TABLE IF NOT EXISTS counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
            old = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'batch_ids'").fetchone()
            upgraded = False
            if old is not None:  # schema 1: id + accept time + TTL; keep the day only, content unknown (NULL)
                by_day: dict[int, list[tuple[bytes, None]]] = {}
                for i, e in conn.execute("SELECT id, expires FROM batch_ids").fetchall():
                    by_day.setdefault(utc_day(float(e) - self.ttl), []).append((self._digest_with(key, bytes(i)), None))
                for d, rows in by_day.items():
                    _create_day(conn, d)
                    conn.executemany(f"INSERT OR IGNORE INTO {_table(d)}(id_digest, content) VALUES (?, ?)", rows)
                conn.execute("DROP TABLE batch_ids")
                upgraded = True
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'batches'").fetchone():
                # schemas 2 and 3: one table with a day column and an index on it; the rows move to their day's table
                for (d,) in conn.execute("SELECT DISTINCT day FROM batches").fetchall():
                    _create_day(conn, int(d))
                    conn.execute(
                        f"INSERT OR REPLACE INTO {_table(int(d))}(id_digest, content) "
                        "SELECT id_digest, content FROM batches WHERE day = ?",
                        (int(d),),
                    )
                conn.execute("DROP TABLE batches")  # and its index
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        if upgraded:  # the dropped table's pages (with its accept times) must not stay readable in the file
            conn.execute("VACUUM")
            if self.path != ":memory:":
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return key

    @staticmethod
    def _digest_with(key: bytes, batch_id: bytes) -> bytes:
        return hmac.digest(key, batch_id, "sha256")[:16]  # the one-shot C path: the same bytes as hmac.new

    def _digest_uncached(self, batch_id: bytes) -> bytes:
        # the same bytes as _digest_with: a copy of the HMAC keyed once (its key schedule hashed already) costs
        # a quarter less than the one-shot call
        mac = self._mac.copy()
        mac.update(batch_id)
        return mac.digest()[:16]

    def _digest(self, batch_id: bytes) -> bytes:
        """The keyed digest of ``batch_id``; a group commit asks for each id twice (lookup, then add), so the
        last few thousand are remembered (:attr:`_digests`, an LRU cache: one HMAC per id instead of two)."""
        return self._digests(bytes(batch_id))

    def _cutoff(self) -> int:
        """The oldest accept day still kept."""
        return utc_day(self.clock()) - self.ttl_days

    def _kept_days(self, cutoff: int) -> list[int]:
        """Within a read transaction: the days at or after ``cutoff`` whose table exists (re-read from the schema
        only when it changed: another worker or process created or dropped a day's table)."""
        cookie = int(self._conn.execute("PRAGMA schema_version").fetchone()[0])
        if cookie != self._cookie:
            self._tables = _days(self._conn)
            self._cookie = cookie
        return [d for d in self._tables if d >= cutoff]

    def lookup(self, ids: Iterable[bytes]) -> dict[bytes, bytes | None]:
        """The ids among ``ids`` accepted within the TTL, each with its content digest (``None``: not known,
        an id carried over from the first schema). One statement per 500 ids, over every kept day's table; an
        id recorded on two days (only when a lookup failed) answers with the later day's content."""
        todo = {self._digest(i): bytes(i) for i in ids}
        digests = list(todo)
        cutoff = self._cutoff()
        out: dict[bytes, bytes | None] = {}
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN")  # the schema and the ids read from one snapshot
            try:
                days = self._kept_days(cutoff)
                for k in range(0, len(digests), _CHUNK) if days else ():
                    part = digests[k : k + _CHUNK]
                    marks = ",".join("?" * len(part))
                    sql = " UNION ALL ".join(
                        f"SELECT id_digest, content, {d} FROM {_table(d)} WHERE id_digest IN ({marks})" for d in days
                    )
                    for dg, c, _ in sorted(conn.execute(sql, part * len(days)), key=lambda r: r[2]):
                        out[todo[bytes(dg)]] = None if c is None else bytes(c)
            finally:
                conn.execute("COMMIT")
        return out

    def seen(self, ids: Iterable[bytes]) -> set[bytes]:
        """The ids among ``ids`` accepted within the TTL."""
        return set(self.lookup(ids))

    def add(self, ids: Iterable[bytes] | Mapping[bytes, bytes | None], counts: Mapping[str, int] | None = None) -> None:
        """Record ``ids`` as accepted today (one transaction), with their content digests when ``ids`` maps each
        id to one, and add ``counts`` to the counters in the same transaction (with any pending ones); purge
        expired ids now and then."""
        now = self.clock()
        day = utc_day(now)
        if isinstance(ids, Mapping):
            rows = [(self._digest(i), None if c is None else bytes(c)) for i, c in ids.items()]
        else:
            rows = [(self._digest(i), None) for i in ids]
        with self._lock:
            pending = self._take_pending(counts)
            try:
                with immediate_transaction(self._conn):
                    if day != self._made_day:  # once a day per process (another worker may have made it)
                        _create_day(self._conn, day)
                        self._made_day = day
                    self._conn.executemany(
                        f"INSERT OR REPLACE INTO {_table(day)}(id_digest, content) VALUES (?, ?)", rows
                    )
                    self._conn.executemany(_ADD_COUNT, pending)
                    if now >= self._next_purge:
                        self._purge(day - self.ttl_days)
                        self._next_purge = now + self.purge_interval
            except BaseException:
                self._made_day = None  # rolled back, perhaps with the day's table: make sure of it next time
                self._put_back(pending, counts)
                raise

    def _purge(self, oldest: int) -> None:
        """In a write transaction: drop the tables of the days before ``oldest``."""
        for d in _days(self._conn):
            if d < oldest:
                self._conn.execute(f"DROP TABLE IF EXISTS {_table(d)}")

    # -- counters (pipeline.prometheus.CounterStore) -----------------------------------------

    def _take_pending(self, counts: Mapping[str, int] | None = None) -> list[tuple[str, int]]:
        """The pending counts plus ``counts``, taken out of memory (call with ``_lock`` held)."""
        merged = dict(self._pending)
        for k, v in (counts or {}).items():
            merged[k] = merged.get(k, 0) + int(v)
        self._pending.clear()
        self._flushed = time.monotonic()
        return [(k, v) for k, v in merged.items() if v]

    def _put_back(self, taken: list[tuple[str, int]], counts: Mapping[str, int] | None = None) -> None:
        """A write failed: keep the pending counts in memory (not ``counts``: the caller has them)."""
        own = dict(counts or {})
        for k, v in taken:
            rest = v - int(own.get(k, 0))
            if rest:
                self._pending[k] = self._pending.get(k, 0) + rest

    def add_counts(self, counts: Mapping[str, int]) -> None:
        """Add ``counts`` in memory; write what is pending if ``counter_flush`` seconds passed since the last write."""
        with self._lock:
            for k, v in counts.items():
                self._pending[k] = self._pending.get(k, 0) + int(v)
            due = time.monotonic() - self._flushed >= self.counter_flush
        if due:
            self.flush_counts()

    def flush_counts(self) -> None:
        """Write the pending counts now (one transaction)."""
        with self._lock:
            pending = self._take_pending()
            if not pending:
                return
            try:
                with immediate_transaction(self._conn):
                    self._conn.executemany(_ADD_COUNT, pending)
            except BaseException:
                self._put_back(pending)
                raise

    def counters(self) -> dict[str, int]:
        """Every counter: the durable values plus what is pending in this process."""
        with self._lock:
            out = {str(k): int(v) for k, v in self._conn.execute("SELECT name, value FROM counters")}
            for k, v in self._pending.items():
                out[k] = out.get(k, 0) + v
        return out

    def counter_values(self, name: str) -> dict[tuple[str, ...], float]:
        """The samples of the Prometheus family ``name`` (keys from :func:`pipeline.prometheus.stored_key`)."""
        out: dict[tuple[str, ...], float] = {}
        for key, value in self.counters().items():
            family, _, labels = key.partition("\t")
            if family == name:
                out[tuple(json.loads(labels))] = float(value)
        return out

    def __len__(self) -> int:
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN")
            try:
                days = self._kept_days(self._cutoff())
                return sum(int(conn.execute(f"SELECT COUNT(*) FROM {_table(d)}").fetchone()[0]) for d in days)
            finally:
                conn.execute("COMMIT")

    def close(self) -> None:
        try:
            self.flush_counts()
        finally:
            with self._lock:
                self._conn.close()
