"""The batch-id store's layout (schema 5: a table of ids per UTC day) as the collector's workers use it.

Files of schemas 2 and 3 (one ``batches`` table with a day column and an index on it) are written here by
hand, as those collectors wrote them, and upgraded in place: their ids stay known with their content
digests (a retry is a duplicate, other content a conflict). Two stores on one file play two worker
processes: an id one of them records on a new day, after the other read the file's list of day tables, is
still found by the other (a retry through another worker); a purge by one is seen by the other.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import sqlite3
import time
from pathlib import Path

import numpy as np
import pytest

from collector.dedup import SCHEMA_VERSION, BatchIdStore
from ldp_core.days import DAY_SECONDS

DAY = 20_000


def _digest(key: bytes, batch_id: bytes) -> bytes:
    return hmac.new(key, batch_id, hashlib.sha256).digest()[:16]


def _keyed_file(path: Path) -> tuple[sqlite3.Connection, bytes]:
    """A store file as every schema began it: WAL, and the ``meta`` table with the id key (returned)."""
    key = os.urandom(32)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE meta(name TEXT PRIMARY KEY, value BLOB NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('id_key', ?)", (key,))
    return conn, key


def _old_file(path: Path, version: int, rows: dict[bytes, tuple[bytes | None, int]]) -> None:
    """A store as the collector of ``version`` (2 or 3) left it: ``batches(id_digest, content, day)``."""
    conn, key = _keyed_file(path)
    conn.execute("CREATE TABLE batches(id_digest BLOB PRIMARY KEY, content BLOB, day INTEGER NOT NULL) WITHOUT ROWID")
    conn.execute("CREATE INDEX batches_day ON batches(day)")
    if version >= 3:
        conn.execute("CREATE TABLE counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        conn.execute("INSERT INTO counters VALUES ('n', 7)")
    conn.executemany("INSERT INTO batches VALUES (?, ?, ?)", [(_digest(key, i), c, d) for i, (c, d) in rows.items()])
    conn.execute(f"PRAGMA user_version = {version}")
    conn.commit()
    conn.close()


def _tables(path: Path) -> set[str]:
    conn = sqlite3.connect(path)
    try:
        return {n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")}
    finally:
        conn.close()


@pytest.mark.parametrize("version", [2, 3])
def test_a_file_of_schema_2_or_3_is_upgraded_and_keeps_its_ids_and_digests(tmp_path: Path, version: int) -> None:
    path = tmp_path / "ids.sqlite3"
    _old_file(path, version, {b"a" * 16: (b"c" * 16, DAY - 1), b"b" * 16: (None, DAY), b"x" * 16: (b"d" * 16, DAY)})
    store = BatchIdStore(path, clock=lambda: DAY * DAY_SECONDS + 5.0)
    assert store.lookup([b"a" * 16, b"b" * 16, b"x" * 16, b"n" * 16]) == {
        b"a" * 16: b"c" * 16,
        b"b" * 16: None,
        b"x" * 16: b"d" * 16,
    }
    assert len(store) == 3
    store.add({b"l" * 16: b"e" * 16}, {"n": 3})
    assert store.counters() == {"n": 3 + (7 if version >= 3 else 0)}
    store.close()
    assert _tables(path) >= {f"ids_{DAY - 1}", f"ids_{DAY}"}
    assert not _tables(path) & {"batches", "batches_day"}
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    conn.close()


def test_a_retry_through_another_worker_is_found_across_a_new_days_table(tmp_path: Path) -> None:
    """Worker ``b`` read the file's day tables before ``a`` made the next day's: ``b`` still finds an id ``a``
    recorded there (a device's retry reaching the other worker), and sees the day table ``a`` purged go."""
    path = tmp_path / "ids.sqlite3"
    now = [DAY * DAY_SECONDS + 100.0]
    a = BatchIdStore(path, ttl=60.0, purge_interval=0.0, clock=lambda: now[0])
    b = BatchIdStore(path, ttl=60.0, purge_interval=0.0, clock=lambda: now[0])
    a.add({b"1" * 16: b"c" * 16})
    assert b.lookup([b"1" * 16]) == {b"1" * 16: b"c" * 16}  # b's list of day tables: [DAY]
    now[0] += DAY_SECONDS
    a.add({b"2" * 16: b"d" * 16})  # a makes the table of DAY + 1
    assert b.lookup([b"1" * 16, b"2" * 16]) == {b"1" * 16: b"c" * 16, b"2" * 16: b"d" * 16}
    now[0] += DAY_SECONDS
    a.add({b"3" * 16: b"e" * 16})  # DAY is past the TTL: a drops its table
    assert f"ids_{DAY}" not in _tables(path)
    assert b.lookup([b"1" * 16, b"2" * 16, b"3" * 16]) == {b"2" * 16: b"d" * 16, b"3" * 16: b"e" * 16}
    b.add({b"4" * 16: b"f" * 16})
    assert len(a) == len(b) == 3
    a.close()
    b.close()


def test_a_second_record_of_an_id_answers_with_the_later_days_content(tmp_path: Path) -> None:
    """An id is recorded twice only when the lookup before its publish failed: the later record wins, as the
    single table's ``INSERT OR REPLACE`` did."""
    now = [DAY * DAY_SECONDS]
    store = BatchIdStore(tmp_path / "ids.sqlite3", clock=lambda: now[0])
    store.add({b"i" * 16: b"old" * 5 + b"!"})
    now[0] += DAY_SECONDS
    store.add({b"i" * 16: b"new" * 5 + b"!"})
    assert store.lookup([b"i" * 16]) == {b"i" * 16: b"new" * 5 + b"!"}
    store.close()


def test_a_failed_record_that_made_the_days_table_does_not_break_the_next(tmp_path: Path) -> None:
    """The first record of a day makes its table in the same transaction; if that transaction rolls back (here:
    a counter value SQLite cannot store), the next record makes the table again and is found."""
    store = BatchIdStore(tmp_path / "ids.sqlite3", clock=lambda: DAY * DAY_SECONDS)
    with pytest.raises(OverflowError):
        store.add({b"a" * 16: b"c" * 16}, {"n": 1 << 70})
    assert f"ids_{DAY}" not in _tables(tmp_path / "ids.sqlite3")
    store.add({b"b" * 16: b"d" * 16})
    assert store.lookup([b"a" * 16, b"b" * 16]) == {b"b" * 16: b"d" * 16}
    store.close()


def test_a_schema_4_file_keeps_telling_retries_from_conflicts_with_its_blake2b_digests(tmp_path: Path) -> None:
    """Schema 4 stored 16 bytes of BLAKE2b per id; schema 5 stores a marker byte and XXH3-128. A file of schema 4,
    written as that collector wrote it, is opened by this ingestor: a retry of a batch accepted before the upgrade
    is still a duplicate (not published again), other content under its id still a conflict (409), and a batch
    accepted after the upgrade is stored with the new digest and told apart the same way."""
    from collector.dedup import content_digest
    from collector.errors import RejectedBatch
    from collector.ingest import Ingestor
    from pipeline.transport.embedded import EmbeddedTransport

    path = tmp_path / "ids.sqlite3"
    today = int(time.time() // DAY_SECONDS)
    conn, key = _keyed_file(path)
    conn.execute("CREATE TABLE counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    conn.execute(f"CREATE TABLE ids_{today}(id_digest BLOB PRIMARY KEY, content BLOB) WITHOUT ROWID")
    old_frame = b"frame of the batch accepted before the upgrade"
    conn.execute(
        f"INSERT INTO ids_{today} VALUES (?, ?)",
        (_digest(key, b"O" * 16), hashlib.blake2b(old_frame, digest_size=16).digest()),
    )
    conn.execute("PRAGMA user_version = 4")
    conn.commit()
    conn.close()

    transport = EmbeddedTransport(tmp_path / "log.db")
    transport.create_topic("ldp.raw", 1)
    ing = Ingestor(transport, "ldp.raw", BatchIdStore(path), partitions=1, threads=1)
    ing.start()
    try:
        assert ing.submit(b"O" * 16, b"k", old_frame, 1).result(timeout=10) == "duplicate"
        with pytest.raises(RejectedBatch) as info:
            ing.submit(b"O" * 16, b"k", b"other content under the old id", 1).result(timeout=10)
        assert info.value.status == 409
        assert ing.submit(b"N" * 16, b"k", b"a new batch", 1).result(timeout=10) == "accepted"
        assert ing.submit(b"N" * 16, b"k", b"a new batch", 1).result(timeout=10) == "duplicate"
        with pytest.raises(RejectedBatch):
            ing.submit(b"N" * 16, b"k", b"not the new batch", 1).result(timeout=10)
    finally:
        ing.stop()
    with transport.consume("ldp.raw", "check") as c:
        assert [r.value for r in c.records(idle_timeout=0.3)] == [b"a new batch"]
    transport.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 6
    # the new batch's row (a group commit of one), with its schema-5 content digest
    assert conn.execute(
        f"SELECT contents FROM ids_{today} WHERE id_digests = ?", (_digest(key, b"N" * 16),)
    ).fetchone()[0] == content_digest(b"a new batch")
    conn.close()
    assert len(content_digest(b"x")) == 17 and content_digest(b"x")[:1] == b"\x01"


def test_a_schema_5_file_becomes_append_only_and_keeps_its_ids(tmp_path: Path) -> None:
    """Schema 5 kept each day's ids in a table keyed by the id (``WITHOUT ROWID``); schema 6 appends rows and
    finds them through memory. A file as schema 5 left it is rewritten in place: its ids and content
    digests stay found, and its tables take new records."""
    from collector.dedup import content_digest

    path = tmp_path / "ids.sqlite3"
    conn, key = _keyed_file(path)
    conn.execute("CREATE TABLE counters(name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    for day, ids in ((DAY - 1, [b"p" * 16, b"q" * 16]), (DAY, [b"r" * 16])):
        conn.execute(f"CREATE TABLE ids_{day}(id_digest BLOB PRIMARY KEY, content BLOB) WITHOUT ROWID")
        conn.executemany(f"INSERT INTO ids_{day} VALUES (?, ?)", [(_digest(key, i), content_digest(i)) for i in ids])
    conn.execute("PRAGMA user_version = 5")
    conn.commit()
    conn.close()

    store = BatchIdStore(path, clock=lambda: DAY * DAY_SECONDS + 5.0)
    wanted = {i: content_digest(i) for i in (b"p" * 16, b"q" * 16, b"r" * 16)}
    assert store.lookup([*wanted, b"n" * 16]) == wanted
    store.add({b"s" * 16: content_digest(b"s" * 16)})
    assert len(store) == 4
    store.close()
    conn = sqlite3.connect(path)
    sql = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name GLOB 'ids_*'"))
    assert set(sql) == {f"ids_{DAY - 1}", f"ids_{DAY}"}
    assert not any("WITHOUT ROWID" in s.upper() for s in sql.values())
    assert conn.execute(f"SELECT count(*) FROM ids_{DAY}").fetchone()[0] == 2
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    conn.close()
    again = BatchIdStore(path, clock=lambda: DAY * DAY_SECONDS + 9.0)  # a restart reads every kept id back
    assert again.lookup([*wanted, b"s" * 16]) == {**wanted, b"s" * 16: content_digest(b"s" * 16)}
    again.close()


def test_workers_appending_in_turn_each_find_every_id_and_a_restart_finds_them_too(tmp_path: Path) -> None:
    """Each worker appends after the rows the others appended (it reads them first, in its write transaction)
    and knows its own rows' ids without reading them back: the ids of all three, in any order of turns,
    are found by each, with the content recorded last."""
    path = tmp_path / "ids.sqlite3"
    clock = lambda: DAY * DAY_SECONDS + 60.0  # noqa: E731
    workers = [BatchIdStore(path, clock=clock) for _ in range(3)]
    rng = np.random.default_rng(5)
    expected: dict[bytes, bytes] = {}
    for turn in range(60):
        w = workers[int(rng.integers(3))]
        fresh = {os.urandom(16): os.urandom(17) for _ in range(int(rng.integers(1, 300)))}
        retried = dict.fromkeys(list(expected)[: int(rng.integers(0, 3))], b"later content".ljust(17, b"."))
        w.add({**fresh, **retried})
        expected.update(fresh)
        expected.update(retried)
        if turn % 7 == 0:
            probe = workers[int(rng.integers(3))]
            assert probe.lookup([*expected, os.urandom(16)]) == expected
    for w in workers:
        assert w.lookup(list(expected)) == expected
        assert len(w) == len(expected)
        w.close()
    restarted = BatchIdStore(path, clock=clock)
    assert restarted.lookup(list(expected)) == expected
    restarted.close()


def test_an_id_sharing_only_its_fingerprint_with_a_record_is_not_taken_for_it(tmp_path: Path) -> None:
    """Memory holds 8 bytes of each digest; a hit is confirmed against the full digest in its row. A row is
    planted whose digest starts like the digest of an id never recorded: that id is still new."""
    path = tmp_path / "ids.sqlite3"
    store = BatchIdStore(path, clock=lambda: DAY * DAY_SECONDS)
    store.add({b"a" * 16: b"c" * 17})
    conn = sqlite3.connect(path)
    key = bytes(conn.execute("SELECT value FROM meta WHERE name = 'id_key'").fetchone()[0])
    twin = _digest(key, b"b" * 16)[:8] + b"\0" * 8
    conn.execute(f"INSERT INTO ids_{DAY}(id_digests, contents) VALUES (?, ?)", (twin, b"d" * 17))
    conn.commit()
    conn.close()
    assert store.lookup([b"a" * 16, b"b" * 16]) == {b"a" * 16: b"c" * 17}
    store.close()


def test_a_group_commit_is_one_row_and_each_of_its_ids_keeps_its_own_content(tmp_path: Path) -> None:
    """A record of many ids appends one row per 4,096 of them (their digests, and their content digests, each
    concatenated), ids of unknown content a row of their own; each id is found with its own content, by the
    process that wrote it and by one that reads the file afresh."""
    path = tmp_path / "ids.sqlite3"
    clock = lambda: DAY * DAY_SECONDS + 1.0  # noqa: E731
    store = BatchIdStore(path, clock=clock)
    known = {os.urandom(16): os.urandom(17) for _ in range(5000)}
    unknown: dict[bytes, bytes | None] = dict.fromkeys(os.urandom(16) for _ in range(3))
    store.add({**known, **unknown})
    conn = sqlite3.connect(path)
    shapes = sorted(
        conn.execute(f"SELECT length(id_digests), length(contents) FROM ids_{DAY}").fetchall(), key=lambda r: r[0]
    )
    conn.close()
    assert shapes == [(3 * 16, None), (904 * 16, 904 * 17), (4096 * 16, 4096 * 17)]
    everything = {**known, **unknown}
    assert store.lookup([*everything, os.urandom(16)]) == everything
    assert len(store) == 5003
    store.close()
    fresh = BatchIdStore(path, clock=clock)
    assert fresh.lookup(list(everything)) == everything
    fresh.close()
