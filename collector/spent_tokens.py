"""The spent-token store: each redeemed upload token with the batch it paid for, atomic across processes.

A token (its SHA-256 digest) is recorded with the batch id it paid for. Spending it again with the same batch
id is a retry (true); with another batch id, a double spend (false). :meth:`SpentTokens.spend_many` decides a
group of spends in one SQLite write transaction (``BEGIN IMMEDIATE``), so collector workers and collector
processes sharing the file on one host never both accept one token, and the collector pays one commit per
turn of its event loop rather than one per upload.

**Layout (schema 2).** The first layout (one row per token, keyed by its digest: ``spent(digest PRIMARY KEY,
batch_id, day) WITHOUT ROWID``) put every token on a B-tree page of its own, at random, and each commit wrote
every such page to the WAL: 24-26 µs of CPU per token at 60,000 tokens, and no cheaper in groups of 32
(docs/benchmarks/PIPELINE.md, "Session 12"). As the batch-id store (:mod:`collector.dedup`, schema 6):

* one table per token day, ``spent_<day>(digests, batch_ids)``, and **one row per group**: its tokens' 32-byte
  digests concatenated, and their 16-byte batch ids (at most :data:`PER_ROW` a row);
* each process finds tokens through an index in memory (:class:`collector.dedup_index.FingerprintTable`: 8
  bytes of the digest to its row and place), confirmed against the full digest in the row. A token whose 8
  bytes another token of the day already has is kept in a dict by its full digest instead;
* inside the write transaction the index first reads the rows other processes appended since (by row id;
  skipped when ``PRAGMA data_version`` says no other connection committed since this one's last spend), so
  the decision sees every spend committed before it; then the group's new tokens follow as one row. A
  transaction that fails makes this process read its days again from the file (what it had put into memory
  may name a row id that another process's next row takes);
* the tables of token days older than ``keep_days`` are dropped (a token is good on its day and the next).

A file of the first layout is rewritten in place when opened, and a view named ``spent`` takes the old table's
place: a collector of the first layout on the same file then fails on every spend (SQLite refuses to write to
a view) instead of accepting tokens this layout has recorded. A file of a later schema is refused.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Sequence

from collector.dedup_index import FingerprintTable, fingerprint
from ldp_core.days import day_of_iso, iso_day
from ldp_core.errors import ConfigError
from ldp_core.sqlite import immediate_transaction, open_store

__all__ = ["SpentTokens", "SCHEMA_VERSION", "PER_ROW"]

SCHEMA_VERSION = 2
#: the most tokens one row holds (a place in the index is ``row id * PER_ROW + position``)
PER_ROW = 4096
_DIGEST = 32
_BATCH = 16


def _table(day: int) -> str:
    return f"spent_{int(day)}"


class _Day:
    """What this process knows of one token day's table: its index and the last row read into it."""

    __slots__ = ("index", "extra", "read_to")

    def __init__(self) -> None:
        self.index = FingerprintTable()
        self.extra: dict[bytes, int] = {}  # digests whose fingerprint another digest of the day has: their place
        self.read_to = 0

    def find(self, digest: bytes, key: int) -> int:
        """The place the index has for ``digest`` (-1: none; a place from the table is still to be confirmed)."""
        place = self.extra.get(digest)
        return place if place is not None else self.index.get([key])[0]

    def put(self, entries: Sequence[tuple[bytes, int]]) -> None:
        """Index ``(digest, place)`` entries of new tokens (a taken fingerprint sends its digest to ``extra``)."""
        keys = [fingerprint(d) for d, _ in entries]
        taken = self.index.get(keys)
        fresh: dict[int, int] = {}
        for (digest, place), key, old in zip(entries, keys, taken, strict=True):
            if old >= 0 or key in fresh:
                self.extra[digest] = place
            else:
                fresh[key] = place
        fresh_keys, fresh_places = list(fresh), list(fresh.values())
        if fresh_keys:
            self.index.put(fresh_keys, fresh_places)


class SpentTokens:
    """Redeemed tokens (see the module docstring); ``path`` may be ``":memory:"`` for tests."""

    def __init__(self, path: str | os.PathLike[str], *, keep_days: int = 3) -> None:
        self.path = str(path)
        self.keep_days = keep_days
        self._conn = open_store(self.path, synchronous="NORMAL")
        self._lock = threading.Lock()
        self._days: dict[int, _Day] = {}
        self._cookie = -1  # the schema version the table list was read at
        self._tables: set[int] = set()
        self._purged_for = -1
        self._version: int | None = None  # PRAGMA data_version at this connection's last spend
        with immediate_transaction(self._conn):
            self._upgrade()

    # -- schema -----------------------------------------------------------------------------------------

    def _upgrade(self) -> None:
        conn = self._conn
        version = int(conn.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise ConfigError(
                f"{self.path}: spent-token store of schema {version}; this collector knows schema {SCHEMA_VERSION} "
                "at most: run the newer collector"
            )
        if version == SCHEMA_VERSION:
            return
        old = conn.execute("SELECT type FROM sqlite_master WHERE name = 'spent'").fetchone()
        if old is not None and old[0] == "table":  # schema 1: one row per token
            by_day: dict[int, list[tuple[bytes, bytes]]] = {}
            for digest, batch_id, day in conn.execute("SELECT digest, batch_id, day FROM spent"):
                by_day.setdefault(day_of_iso(str(day)), []).append((bytes(digest), bytes(batch_id)))
            for day, items in by_day.items():
                self._create(day)
                for k in range(0, len(items), PER_ROW):
                    part = items[k : k + PER_ROW]
                    conn.execute(
                        f"INSERT INTO {_table(day)}(digests, batch_ids) VALUES (?, ?)",
                        (b"".join(d for d, _ in part), b"".join(b for _, b in part)),
                    )
            conn.execute("DROP TABLE spent")
        if old is None or old[0] == "table":
            # a first-layout collector on this file fails on every spend rather than take a token spent here
            conn.execute("CREATE VIEW spent AS SELECT NULL AS digest, NULL AS batch_id, NULL AS day WHERE 0")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _create(self, day: int) -> None:
        self._conn.execute(f"CREATE TABLE IF NOT EXISTS {_table(day)}(digests BLOB NOT NULL, batch_ids BLOB NOT NULL)")

    def _refresh(self) -> None:
        """In a transaction: the list of day tables, re-read when the schema changed (another process created or
        dropped one); a dropped table's index is forgotten, and so is one dropped and made again."""
        cookie = int(self._conn.execute("PRAGMA schema_version").fetchone()[0])
        if cookie == self._cookie:
            return
        self._cookie = cookie
        names = self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'spent_%'")
        self._tables = {int(n[len("spent_") :]) for (n,) in names if n[len("spent_") :].isdigit()}
        for day in list(self._days):
            if day not in self._tables or self._max_row(day) < self._days[day].read_to:
                del self._days[day]

    def _max_row(self, day: int) -> int:
        return int(self._conn.execute(f"SELECT coalesce(max(rowid), 0) FROM {_table(day)}").fetchone()[0])

    def _catch_up(self, day: int) -> _Day:
        """In a transaction: the day's index, with the rows appended since this process last read (by anyone)."""
        known = self._days.get(day)
        if known is None:
            known = self._days[day] = _Day()
        rows = self._conn.execute(
            f"SELECT rowid, digests FROM {_table(day)} WHERE rowid > ? ORDER BY rowid", (known.read_to,)
        ).fetchall()
        for rowid, digests in rows:
            n = len(digests) // _DIGEST
            known.put([(bytes(digests[k * _DIGEST : (k + 1) * _DIGEST]), rowid * PER_ROW + k) for k in range(n)])
            known.read_to = int(rowid)
        return known

    def _paid_for(self, day: int, place: int, digest: bytes) -> bytes | None:
        """The batch id recorded with ``digest`` at ``place`` of the day's table (``None``: another digest there)."""
        row = self._conn.execute(
            f"SELECT digests, batch_ids FROM {_table(day)} WHERE rowid = ?", (place // PER_ROW,)
        ).fetchone()
        pos = place % PER_ROW
        if row is None or bytes(row[0][pos * _DIGEST : (pos + 1) * _DIGEST]) != digest:
            return None
        return bytes(row[1][pos * _BATCH : (pos + 1) * _BATCH])

    # -- spending ---------------------------------------------------------------------------------------

    def spend(self, digest: bytes, batch_id: bytes, day: str) -> bool:
        """True if the token is new (now recorded) or a retry for the same ``batch_id``; False if it was spent on
        another batch. Atomic across processes sharing the file (:meth:`spend_many` of one token)."""
        return self.spend_many([(digest, batch_id, day)])[0]

    def spend_many(self, spends: Sequence[tuple[bytes, bytes, str]]) -> list[bool]:
        """:meth:`spend` for each ``(digest, batch_id, token day)`` in order, in one write transaction: the
        verdicts are those of the calls one after the other (a token twice with two batch ids: the second is
        refused), and no other process spends in between."""
        if not spends:
            return []
        for digest, batch_id, _ in spends:
            if len(digest) != _DIGEST or len(batch_id) != _BATCH:
                raise ValueError(f"a token digest is {_DIGEST} bytes and a batch id {_BATCH}")
        with self._lock:
            try:
                with immediate_transaction(self._conn):
                    out, version = self._decide(self._conn, spends)
            except BaseException:
                # rolled back: what this call put into memory may name rows that do not exist (read them again)
                self._version = None
                self._cookie = -1
                self._days.clear()
                raise
            self._version = version
        return out

    def _decide(
        self, conn: sqlite3.Connection, spends: Sequence[tuple[bytes, bytes, str]]
    ) -> tuple[list[bool], int | None]:
        """Inside the write transaction of :meth:`spend_many`: catch up, decide each spend, append the new ones;
        the verdicts, and the ``PRAGMA data_version`` memory is current at (``None``: read the file next time)."""
        out: list[bool] = []
        days: dict[int, _Day] = {}
        new: dict[int, list[tuple[bytes, bytes]]] = {}
        now: dict[bytes, bytes] = {}  # the tokens this call records: their batch ids
        # ``current``: no other connection committed since this one's last spend (``PRAGMA data_version`` changes
        # only with others' commits), so memory holds every row of the days it read, and the list of tables
        version: int | None = int(conn.execute("PRAGMA data_version").fetchone()[0])
        current = version == self._version
        if not current:
            self._refresh()
        for _, _, iso in spends:
            day = day_of_iso(iso)
            if day not in days:
                if day not in self._tables:
                    self._create(day)
                    self._tables.add(day)
                known = self._days.get(day)
                days[day] = known if current and known is not None else self._catch_up(day)
        for digest, batch_id, iso in spends:
            digest, batch_id = bytes(digest), bytes(batch_id)
            paid = now.get(digest)
            if paid is None:
                day = day_of_iso(iso)
                place = days[day].find(digest, fingerprint(digest))
                paid = self._paid_for(day, place, digest) if place >= 0 else None
                if paid is None:  # a new token: recorded with this batch
                    now[digest] = paid = batch_id
                    new.setdefault(day, []).append((digest, batch_id))
            out.append(paid == batch_id)
        for day, items in new.items():
            known = days[day]
            for k in range(0, len(items), PER_ROW):
                part = items[k : k + PER_ROW]
                rowid = conn.execute(
                    f"INSERT INTO {_table(day)}(digests, batch_ids) VALUES (?, ?)",
                    (b"".join(d for d, _ in part), b"".join(b for _, b in part)),
                ).lastrowid
                if rowid != known.read_to + 1:  # cannot happen in the write lock; read the file again next time
                    version = None
                    break
                known.put([(d, rowid * PER_ROW + j) for j, (d, _) in enumerate(part)])
                known.read_to = rowid
        newest = max(days)
        if newest > self._purged_for:
            for day in sorted(self._tables):
                if day < newest - self.keep_days:
                    conn.execute(f"DROP TABLE IF EXISTS {_table(day)}")
                    self._tables.discard(day)
                    self._days.pop(day, None)
            self._purged_for = newest
        return out, version

    def records(self) -> list[tuple[bytes, bytes, str]]:
        """Every recorded ``(token digest, batch id, token day)``, by day, then in the order they were spent."""
        out: list[tuple[bytes, bytes, str]] = []
        with self._lock, immediate_transaction(self._conn):
            self._refresh()
            for day in sorted(self._tables):
                for digests, batch_ids in self._conn.execute(
                    f"SELECT digests, batch_ids FROM {_table(day)} ORDER BY rowid"
                ):
                    out.extend(
                        (
                            bytes(digests[k * _DIGEST : (k + 1) * _DIGEST]),
                            bytes(batch_ids[k * _BATCH : (k + 1) * _BATCH]),
                            iso_day(day),
                        )
                        for k in range(len(digests) // _DIGEST)
                    )
        return out

    def __len__(self) -> int:
        """The tokens recorded, on every day kept."""
        with self._lock, immediate_transaction(self._conn):
            self._refresh()
            return sum(len(self._catch_up(d).extra) + len(self._days[d].index) for d in sorted(self._tables))

    def close(self) -> None:
        with self._lock:
            self._conn.close()
