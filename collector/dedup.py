"""The collector's durable store of recently accepted batch ids (idempotent uploads).

A device retries an upload under the same batch id until it gets an answer,
so the collector answers an id it already published with 202 without
publishing it again, provided the retry carries the same content; the same
id with other content is refused (409), never silently dropped.

**What the store keeps.** One SQLite table per **UTC day** of acceptance,
``ids_<day>(id_digests, contents)``, in WAL mode: keyed digests
(HMAC-SHA-256 under a random key kept in the file, truncated to 16 bytes)
of the batch ids accepted that day and digests of their re-encoded frames
(:func:`content_digest`). No time finer than the day is stored (the day is
the table's name): the batch id also travels on the raw topic, and the
transports coarsen record times to the day, so an accept time kept here
would give each upload's arrival time back to whoever holds both. An id is
kept through day ``day + ceil(ttl / 86400)`` (so at least ``ttl`` seconds)
and then purged, by dropping the day's table.

**One row per group commit, found through memory** (schema 6). A day's
table has no key on the id: each record (a group commit's ids) appends one
row, the ids' digests concatenated and their content digests concatenated
(at most ``_PER_ROW`` ids per row; ids of unknown content, from the first
schema, in rows of their own). Each process finds ids through an index in
memory (:mod:`collector.dedup_index`: 8 bytes of each digest -> its row id
and place in the row, 32-64 bytes per id kept, so about 100 MB for three
days of a million batches a day), built from the file when the store opens
and kept current by reading the rows appended since it last looked, its
own and other workers' (``--workers N`` share the file): a lookup reads
those rows first, in the snapshot it answers from, unless ``PRAGMA
data_version`` says no other connection wrote since memory was complete
(then a miss in memory is a miss, with no statement but that one). A hit is
confirmed against the full digest in its row. A record reads the rows
others appended first, in its write transaction, so its own rows follow at
known row ids (SQLite gives a table that never deletes rows the largest row
id + 1, checked with ``last_insert_rowid()``; where the check fails the
next lookup reads them back instead).

Why: with the table keyed by the digest (schemas 4 and 5), every id
landed on a B-tree page of its own, at random, and each such page was
written to the WAL and back at the checkpoint: 11-29 µs of CPU per id at
100,000 ids (more as the table outgrew the page cache), the largest part of
the collector's CPU per upload behind the native front after the frame
checks moved there; and SQLite's Python binding adapts each ``bytes``
parameter (a row per id cost about 2 µs of binding and inserting). One
row per group commit, found in memory, takes the record and its lookup to
a third to a half of that (``benchmarks/bench_dedup_store.py``).

**Why a table per day**: the purge drops a whole day's table, and no
index on the day is needed; a lookup asks each kept day's index (at most
``ceil(ttl / 86400) + 1``). The WAL is checkpointed every ``4000`` pages
rather than SQLite's ``1000``.

``PRAGMA user_version`` holds the schema version; a file of the first
schema (``batch_ids(id, expires)``, accept time + TTL to the microsecond)
is upgraded in place (its expiries reduced to days, then the file vacuumed
so the old values do not linger in free pages), and so are files of
schemas 2 and 3 (``batches(id_digest, content, day)``: their rows move to
the day tables, and schema 2 gains the counters table), and schemas 4 and 5
(day tables keyed by the digest, ``WITHOUT ROWID``: rewritten as
append-only tables; schema 4's content digests were 16 bytes of BLAKE2b:
they are kept and still compared, :func:`same_content`); a newer schema is
refused with :class:`~collector.errors.DedupStoreError` (so a collector
older than schema 6 refuses a file a newer one wrote, whose tables it would
misread: upgrade every collector sharing a file together, or roll back with
a fresh file).

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

from collector.dedup_index import FingerprintTable, fingerprint
from collector.errors import DedupStoreError
from ldp_core.days import DAY_SECONDS, utc_day
from ldp_core.sqlite import immediate_transaction, open_store

__all__ = ["BatchIdStore", "SCHEMA_VERSION", "content_digest", "same_content"]

_CHUNK = 500
#: ids whose digests are remembered between a group commit's lookup and its record (:meth:`BatchIdStore._digest`)
_RECENT = 8192
#: the bytes of an id's keyed digest (HMAC-SHA-256, truncated)
_DIGEST = 16
#: at most this many ids share a row (a group commit's); memory locates an id as row id * _PER_ROW + its place
_PER_ROW = 4096
#: the store's schema (``PRAGMA user_version``): 0 = none or the first ``batch_ids(id, expires)``, 2 = batches
#: with content digests, 3 = 2 and a ``counters`` table, 4 = a table of ids per day, no day index, 5 = 4 with XXH3
#: content digests (schema 4's BLAKE2b ones are still read), 6 = this one (5 with append-only day tables)
SCHEMA_VERSION = 6
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
    """Make day ``day``'s table if it is missing: rows appended in order, no key on the id (schema 6)."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {_table(day)}(id_digests BLOB NOT NULL, contents BLOB)")


def _to_append_only(conn: sqlite3.Connection) -> bool:
    """In a write transaction: rewrite each day table of schemas 4 and 5 (keyed by the id, ``WITHOUT ROWID``)
    as schema 6's append-only table, rows in key order. Whether there was any."""
    changed = False
    for day in _days(conn):
        name = _table(day)
        (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
        if "WITHOUT ROWID" not in str(sql).upper():
            continue
        conn.execute(f"ALTER TABLE {name} RENAME TO old_{name}")
        _create_day(conn, day)
        conn.execute(f"INSERT INTO {name}(id_digests, contents) SELECT id_digest, content FROM old_{name}")
        conn.execute(f"DROP TABLE old_{name}")
        changed = True
    return changed


def _days(conn: sqlite3.Connection) -> list[int]:
    """The days whose table exists, oldest first."""
    names = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name GLOB 'ids_[0-9]*'")
    return sorted(int(n[4:]) for (n,) in names if n[4:].isdigit())


def _rows_n(rows: list[tuple[bytes, bytes | None]]) -> list[int]:
    """The number of ids in each of ``rows`` (``(id_digests, contents)``)."""
    return [len(digests) // _DIGEST for digests, _ in rows]


def _pack(records: list[tuple[bytes, bytes | None]]) -> tuple[list[tuple[bytes, bytes | None]], list[int]]:
    """The rows that record ``records`` (``(id digest, content digest or None)``): one per run of at most
    ``_PER_ROW`` ids whose content digests have one length (or are all unknown), the digests and the contents
    each concatenated; and the fingerprints of the ids, in the order of the rows."""
    groups: dict[int, list[tuple[bytes, bytes | None]]] = {}  # by content length, -1 for unknown
    for dg, c in records:
        groups.setdefault(-1 if c is None else len(c), []).append((dg, c))
    rows: list[tuple[bytes, bytes | None]] = []
    keys: list[int] = []
    for width, group in groups.items():
        for k in range(0, len(group), _PER_ROW):
            part = group[k : k + _PER_ROW]
            contents = None if width < 0 else b"".join(c for _, c in part if c is not None)
            rows.append((b"".join(dg for dg, _ in part), contents))
            keys.extend(fingerprint(dg) for dg, _ in part)
    return rows, keys


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
        self.ttl = float(ttl)
        self.ttl_days = max(1, math.ceil(self.ttl / DAY_SECONDS))
        self.purge_interval = float(purge_interval)
        self.clock = clock
        self.counter_flush = float(counter_flush)
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # counts not written yet (see the module docstring)
        self._flushed = time.monotonic()
        self._conn = open_store(self.path, synchronous="NORMAL")
        try:
            self._conn.execute(f"PRAGMA wal_autocheckpoint={_CHECKPOINT_PAGES}")
            self._key = self._open_schema()
        except BaseException:
            self._conn.close()
            raise
        self._mac = hmac.new(self._key, digestmod=hashlib.sha256)
        self._next_purge = 0.0
        # id -> digest of the ids asked last (cleared when full): bytes only, so the cyclic GC never walks it, as it
        # walked the 8,192 linked entries of the functools.lru_cache this replaces
        self._recent: dict[bytes, bytes] = {}
        self._cookie = -1  # PRAGMA schema_version when self._tables was read
        self._tables: list[int] = []  # the days whose table exists (as of self._cookie)
        self._made_day: int | None = None  # the day whose table this process made sure of last
        self._index: dict[int, FingerprintTable] = {}  # per day: the ids read from its table so far
        self._read_to: dict[int, int] = {}  # per day: the last row id read into its index
        # PRAGMA data_version when memory last held everything in the file (None: not known to): it changes
        # when another connection commits, never for this one's own commits, whose ids go to memory directly
        self._synced: int | None = None
        with self._lock:
            self._conn.execute("BEGIN")
            try:
                self._catch_up(
                    self._kept_days(self._cutoff())
                )  # every kept id into memory now, not on the first upload
            finally:
                self._conn.execute("COMMIT")

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
                    conn.executemany(f"INSERT INTO {_table(d)}(id_digests, contents) VALUES (?, ?)", rows)
                conn.execute("DROP TABLE batch_ids")
                upgraded = True
            if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'batches'").fetchone():
                # schemas 2 and 3: one table with a day column and an index on it; the rows move to their day's table
                for (d,) in conn.execute("SELECT DISTINCT day FROM batches").fetchall():
                    _create_day(conn, int(d))
                    conn.execute(
                        f"INSERT INTO {_table(int(d))}(id_digests, contents) "
                        "SELECT id_digest, content FROM batches WHERE day = ?",
                        (int(d),),
                    )
                conn.execute("DROP TABLE batches")  # and its index
            _to_append_only(conn)  # schemas 4 and 5: a table keyed by the id per day
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
        last few thousand are remembered (:attr:`_recent`: one HMAC per id instead of two)."""
        key = bytes(batch_id)
        digest = self._recent.get(key)
        if digest is None:
            if len(self._recent) >= _RECENT:
                self._recent.clear()
            digest = self._recent[key] = self._digest_uncached(key)
        return digest

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
            for d in list(self._index):  # dropped (purged), or dropped and made again: read it afresh
                if d not in self._tables or self._max_row(d) < self._read_to[d]:
                    del self._index[d], self._read_to[d]
        return [d for d in self._tables if d >= cutoff]

    def _max_row(self, day: int) -> int:
        return int(self._conn.execute(f"SELECT coalesce(max(rowid), 0) FROM {_table(day)}").fetchone()[0])

    def _index_for(self, day: int, size: int) -> FingerprintTable:
        index = self._index.get(day)
        if index is None:
            index = self._index[day] = FingerprintTable(2 * size)
        return index

    def _catch_up(self, days: list[int]) -> None:
        """Within a transaction: read the rows appended to the tables of ``days`` since this process last did
        (by any process: another worker's records too) into their indexes."""
        for d in days:
            start = self._read_to.get(d, 0)
            rows = self._conn.execute(
                f"SELECT rowid, id_digests FROM {_table(d)} WHERE rowid > ? ORDER BY rowid", (start,)
            ).fetchall()
            if not rows:
                continue
            latest: dict[int, int] = {}  # an id recorded twice: its later place (rows in order)
            for r, digests in rows:
                for pos in range(len(digests) // _DIGEST):
                    latest[fingerprint(digests[pos * _DIGEST : pos * _DIGEST + 8])] = r * _PER_ROW + pos
            self._index_for(d, len(latest)).put(list(latest), list(latest.values()))
            self._read_to[d] = int(rows[-1][0])

    def lookup(self, ids: Iterable[bytes]) -> dict[bytes, bytes | None]:
        """The ids among ``ids`` accepted within the TTL, each with its content digest (``None``: not known,
        an id carried over from the first schema). Read from memory (:mod:`collector.dedup_index`) after
        catching up with the rows appended since the last call; only a hit reads its row. An id recorded on
        two days (only when a lookup failed) answers with the later day's content."""
        todo = {self._digest(i): bytes(i) for i in ids}
        if not todo:
            return {}
        digests = list(todo)
        keys = [fingerprint(d) for d in digests]
        cutoff = self._cutoff()
        with self._lock:
            conn = self._conn
            if self._synced is not None and self._synced == self._data_version():
                # nobody else wrote since memory was complete: a miss in memory is a miss in the file
                days = [d for d in self._tables if d >= cutoff]
                if not any(r >= 0 for d in days if d in self._index for r in self._index[d].get(keys)):
                    return {}
            conn.execute("BEGIN")  # the schema and the ids read from one snapshot
            try:
                days = self._kept_days(cutoff)
                self._catch_up(days)
                self._synced = self._data_version()
                return self._read_hits(days, keys, digests, todo)
            finally:
                conn.execute("COMMIT")

    def _data_version(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def _read_hits(
        self, days: list[int], keys: list[int], digests: list[bytes], todo: dict[bytes, bytes]
    ) -> dict[bytes, bytes | None]:
        """Within a transaction, memory current: the ids whose fingerprint is in memory and whose row holds
        their full digest, each with its content digest (a later day's record of an id wins)."""
        out: dict[bytes, bytes | None] = {}
        for d in days:  # oldest first
            index = self._index.get(d)
            if index is None:
                continue
            wanted: dict[int, list[tuple[int, bytes]]] = {}  # row id: (place in the row, digest)
            for place, dg in zip(index.get(keys), digests, strict=True):
                if place >= 0:
                    wanted.setdefault(place // _PER_ROW, []).append((place % _PER_ROW, dg))
            row_ids = list(wanted)
            for k in range(0, len(row_ids), _CHUNK):
                part = row_ids[k : k + _CHUNK]
                sql = (
                    f"SELECT rowid, id_digests, contents FROM {_table(d)} WHERE rowid IN ({','.join('?' * len(part))})"
                )
                for r, stored, contents in self._conn.execute(sql, part):
                    n = len(stored) // _DIGEST
                    width = len(contents) // n if contents is not None else 0
                    for pos, dg in wanted[r]:
                        if stored[pos * _DIGEST : (pos + 1) * _DIGEST] != dg:  # another id of the same fingerprint
                            continue
                        out[todo[dg]] = None if contents is None else bytes(contents[pos * width : (pos + 1) * width])
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
            records = [(self._digest(i), None if c is None else bytes(c)) for i, c in ids.items()]
        else:
            records = [(self._digest(i), None) for i in ids]
        rows, keys = _pack(records)
        with self._lock:
            pending = self._take_pending(counts)
            conn = self._conn
            try:
                with immediate_transaction(conn):
                    if day != self._made_day:  # once a day per process (another worker may have made it)
                        _create_day(conn, day)
                        self._made_day = day
                        self._synced = None  # this process's list of day tables may lack it
                    # the rows other processes appended first (unless nobody else wrote since memory was
                    # complete); then ours follow the last one read, each the largest row id + 1 (SQLite's rule
                    # for a table that never deletes rows), checked below
                    complete = self._synced is not None and self._synced == self._data_version()
                    if not complete:
                        self._catch_up([day])
                    start = self._read_to.get(day, 0)
                    conn.executemany(f"INSERT INTO {_table(day)}(id_digests, contents) VALUES (?, ?)", rows)
                    last = int(conn.execute("SELECT last_insert_rowid()").fetchone()[0]) if rows else start
                    conn.executemany(_ADD_COUNT, pending)
                    if now >= self._next_purge:
                        self._purge(day - self.ttl_days)
                        self._next_purge = now + self.purge_interval
            except BaseException:
                self._made_day = None  # rolled back, perhaps with the day's table: make sure of it next time
                self._synced = None
                self._put_back(pending, counts)
                raise
            if rows and last == start + len(rows):  # committed: our rows into memory without reading them back
                places = [(start + 1 + k) * _PER_ROW + pos for k, n in enumerate(_rows_n(rows)) for pos in range(n)]
                self._index_for(day, len(keys)).put(keys, places)
                self._read_to[day] = last
            if not (complete and last == start + len(rows)):  # the next lookup reads the file's news
                self._synced = None

    def _purge(self, oldest: int) -> None:
        """In a write transaction: drop the tables of the days before ``oldest``."""
        for d in _days(self._conn):
            if d < oldest:
                self._conn.execute(f"DROP TABLE IF EXISTS {_table(d)}")
                self._synced = None  # this process's list of day tables still has it

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
                self._catch_up(days)
                return sum(len(self._index[d]) for d in days if d in self._index)
            finally:
                conn.execute("COMMIT")

    def close(self) -> None:
        try:
            self.flush_counts()
        finally:
            with self._lock:
                self._conn.close()
