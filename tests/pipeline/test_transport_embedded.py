"""The transport contract against the embedded SQLite log, and what only the embedded log does."""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.transport import (
    DEFAULT_URL,
    CommitFailedError,
    FencedError,
    TopicError,
    TopicPartition,
    TransportError,
    open_transport,
)
from pipeline.transport.embedded import SCHEMA_VERSION, EmbeddedTransport
from pipeline.transport.kafka import KafkaTransport
from tests.support.transport_contract import TransportContract, drain


class TestEmbeddedTransport(TransportContract):
    @pytest.fixture
    def transport_url(self, tmp_path: Path) -> str:
        return f"sqlite:///{tmp_path / 'log.sqlite3'}"


# -- what only the embedded log does, or does differently ---------------------------------


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EmbeddedTransport]:
    t = EmbeddedTransport(tmp_path / "log.sqlite3")
    yield t
    t.close()


def test_the_file_is_in_wal_mode_with_full_sync(log: EmbeddedTransport) -> None:
    conn = sqlite3.connect(log.path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    finally:
        conn.close()
    assert log._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


def test_a_stale_member_cannot_commit(log: EmbeddedTransport) -> None:
    """a's records were delivered in generation g; b's join makes g+1: a's plain and transactional commits are refused."""
    log.create_topic("in", 2)
    log.create_topic("out", 1)
    log.publish_many("in", [(f"k{i}".encode(), b"v") for i in range(10)])
    a = log.consume("in", "g", member="a")
    drain([a], 10)
    b = log.consume("in", "g", member="b")
    with pytest.raises(CommitFailedError, match="rebalanced"):
        a.commit()
    assert a.positions() == {}
    assert all(a.committed(TopicPartition("in", p)) is None for p in range(2))
    drain([a], 1)  # a follows the new generation and reads its partition again
    b.poll(timeout=0.1)
    c = log.consume("in", "g", member="c")
    with pytest.raises(CommitFailedError):
        with a.transaction() as tx:
            tx.publish("out", None, b"never")
    with log.consume("out", "reader") as r:
        assert r.poll(timeout=0.3) == []
    for m in (a, b, c):
        m.close()


def test_a_silent_member_is_removed_after_its_session_timeout(log: EmbeddedTransport) -> None:
    """A member that stops polling (no close) loses its partitions after session_timeout; its uncommitted records come back."""
    log.create_topic("t", 1)
    log.publish_many("t", [(None, f"v{i}".encode()) for i in range(6)])
    silent = log.consume("t", "g", member="a", session_timeout=0.5)
    assert len(drain([silent], 6)[0]) == 6
    live = log.consume("t", "g", member="b", session_timeout=5.0)
    assert live.poll(timeout=0.1) == []  # "a" sorts first and still owns the only partition
    recs = drain([live], 6, timeout=10)[0]
    assert [r.offset for r in recs] == list(range(6))
    assert live.assignment() == {TopicPartition("t", 0)}
    with pytest.raises((CommitFailedError, FencedError)):
        silent.commit()
    live.close()
    silent.close()


def test_a_second_consumer_with_the_same_member_name_fences_the_first(log: EmbeddedTransport) -> None:
    log.create_topic("t", 1)
    first = log.consume("t", "g", member="worker")
    first.poll(timeout=0.05)
    second = log.consume("t", "g", member="worker")
    second.poll(timeout=0.05)
    with pytest.raises(FencedError, match="fenced"):
        first.commit({TopicPartition("t", 0): 0})
    second.close()
    first.close()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.sqlite3"
    EmbeddedTransport(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(TransportError, match="schema version"):
        EmbeddedTransport(path)


def test_records_must_be_bytes(log: EmbeddedTransport) -> None:
    log.create_topic("t", 1)
    with pytest.raises(TypeError, match="bytes"):
        log.publish("t", None, "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="key"):
        log.publish("t", 7, b"v")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="synchronous"):
        EmbeddedTransport(log.path, synchronous="OFF")  # type: ignore[arg-type]


def test_open_transport_reads_urls_and_defaults_to_the_embedded_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("LDP_TRANSPORT", raising=False)
    with open_transport() as t:
        assert isinstance(t, EmbeddedTransport)
        assert t.path == (tmp_path / DEFAULT_URL.removeprefix("sqlite:///")).resolve()
    with open_transport("sqlite:///rel/log.sqlite3?synchronous=NORMAL") as t:
        assert t.path == (tmp_path / "rel" / "log.sqlite3").resolve() and t.synchronous == "NORMAL"
    with open_transport(f"sqlite:///{tmp_path / 'abs.sqlite3'}") as t:
        assert t.path == tmp_path / "abs.sqlite3"
    monkeypatch.setenv("LDP_TRANSPORT", "kafka://127.0.0.1:1,127.0.0.1:2?client_id=x&transaction_timeout=3")
    t = open_transport()  # connects lazily
    assert isinstance(t, KafkaTransport)
    assert (t.bootstrap, t.client_id, t.transaction_timeout) == ("127.0.0.1:1,127.0.0.1:2", "x", 3.0)
    t.close()
    for bad in ("redis://x", "sqlite://host/x", "sqlite:///", "kafka://"):
        with pytest.raises(ValueError):
            open_transport(bad)


def test_publish_is_durable_before_it_returns(tmp_path: Path) -> None:
    """A record acknowledged by publish() is visible to a separate connection at once (it is committed)."""
    with EmbeddedTransport(tmp_path / "log.sqlite3") as t:
        t.create_topic("t", 1)
        pos = t.publish("t", b"k", b"v")
        conn = sqlite3.connect(t.path)
        try:
            row = conn.execute(
                "SELECT key, value FROM log WHERE topic='t' AND partition=? AND offset=?", (pos.partition, pos.offset)
            ).fetchone()
        finally:
            conn.close()
    assert row == (b"k", b"v")


# -- time: only the day is stored; retention ------------------------------------------------

DAY = 86400.0


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _stored_times(path: Path) -> list[float]:
    conn = sqlite3.connect(path)
    try:
        return [r[0] for r in conn.execute("SELECT ts FROM log ORDER BY id")]
    finally:
        conn.close()


def test_records_keep_only_the_start_of_their_utc_day(tmp_path: Path) -> None:
    """An upload's arrival time inside its day is not stored: every record of a day carries the day's start."""
    clock = Clock(20_000 * DAY + 12_345.678)
    t = EmbeddedTransport(tmp_path / "log.sqlite3", clock=clock)
    t.create_topic("raw", 2)
    t.publish("raw", b"a", b"1")
    clock.t += 3_600.5
    with t.consume("raw", "g") as c:  # the transactional path stamps records the same way
        assert [r.value for r in c.records(idle_timeout=0.2)] == [b"1"]
        with c.transaction() as tx:
            tx.publish("raw", b"b", b"2")
    t.close()
    assert _stored_times(tmp_path / "log.sqlite3") == [20_000 * DAY, 20_000 * DAY]


def test_retention_deletes_whole_old_days_keeps_offsets_and_spares_forever_topics(tmp_path: Path) -> None:
    start = 20_000 * DAY + 100.0
    clock = Clock(start)
    t = EmbeddedTransport(tmp_path / "log.sqlite3", retention=2 * DAY, purge_interval=1e9, clock=clock)
    t.create_topic("raw", 1)
    t.create_topic("state", 1, retention=math.inf)
    assert t.retention_of("raw") == 2 * DAY and t.retention_of("state") == math.inf
    t.publish_many("raw", [(b"k", b"day0-%d" % i) for i in range(5)])
    t.publish_many("state", [(b"k", b"cp-%d" % i) for i in range(3)])
    with t.consume("raw", "slow") as c:  # a group that read two records of day 0, then stopped
        got = c.poll(max_records=2, timeout=1.0)
        assert [r.offset for r in got] == [0, 1]
        c.commit()
    clock.t = start + DAY
    t.publish("raw", b"k", b"day1")
    clock.t = start + 2 * DAY  # day 0 ended 2 days minus 100 s ago: not yet older than the retention
    assert t.purge() == 0
    clock.t = 20_000 * DAY + 3 * DAY + 1.0  # day 0 ended more than 2 days ago, day 1 did not
    assert t.purge() == 5
    clock.t += 10 * DAY  # everything is old now, but the newest record of a partition stays (offsets go on)
    assert t.purge() == 0
    positions = t.publish_many("raw", [(b"k", b"late")])
    assert positions[0].offset == 6
    with t.consume("raw", "slow") as c:  # its committed offset 2 was deleted: it resumes at the oldest left
        assert [(r.offset, r.value) for r in c.records(idle_timeout=0.2)] == [(5, b"day1"), (6, b"late")]
    with t.consume("state", "reader") as c:
        assert [r.value for r in c.records(idle_timeout=0.2)] == [b"cp-0", b"cp-1", b"cp-2"]
    t.close()


def test_publishing_purges_by_itself_every_purge_interval(tmp_path: Path) -> None:
    clock = Clock(20_000 * DAY)
    t = EmbeddedTransport(tmp_path / "log.sqlite3", retention=DAY, purge_interval=3600.0, clock=clock)
    t.create_topic("raw", 1)
    t.publish_many("raw", [(None, b"old-%d" % i) for i in range(4)])
    clock.t += 5 * DAY
    t.publish("raw", None, b"new")  # due: purges the 4 old ones (the new one is the partition's newest)
    with t.consume("raw", "g") as c:
        assert [r.value for r in c.records(idle_timeout=0.2)] == [b"new"]
    t.close()


def test_bad_retention_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TopicError, match="retention must be a positive number"):
        EmbeddedTransport(tmp_path / "a.sqlite3", retention=0)
    t = EmbeddedTransport(tmp_path / "b.sqlite3")
    with pytest.raises(TopicError, match="retention must be a positive number"):
        t.create_topic("x", 1, retention=-5)
    t.close()


def test_a_version_1_file_is_upgraded_in_place(tmp_path: Path) -> None:
    """A log written before per-topic retention opens, keeps its records and gets the default retention."""
    path = tmp_path / "log.sqlite3"
    conn = sqlite3.connect(path)
    recent = time.time() - 3600  # within the default retention, so opening and publishing purges nothing
    conn.executescript(f"""
        CREATE TABLE topics(name TEXT PRIMARY KEY, partitions INTEGER NOT NULL);
        CREATE TABLE log(id INTEGER PRIMARY KEY, topic TEXT NOT NULL, partition INTEGER NOT NULL,
                         offset INTEGER NOT NULL, key BLOB, value BLOB NOT NULL, ts REAL NOT NULL);
        CREATE UNIQUE INDEX log_position ON log(topic, partition, offset);
        INSERT INTO topics VALUES ('raw', 1);
        INSERT INTO log(topic, partition, offset, key, value, ts) VALUES ('raw', 0, 0, NULL, x'01', {recent});
        PRAGMA user_version=1;
    """)
    conn.close()
    t = EmbeddedTransport(path)
    assert t.retention_of("raw") == t.retention
    assert t.publish("raw", None, b"\x02").offset == 1
    with t.consume("raw", "g") as c:
        assert [r.value for r in c.records(idle_timeout=0.2)] == [b"\x01", b"\x02"]
    t.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()


def test_ensure_topic_creates_once_and_reports_partitions(log: EmbeddedTransport) -> None:
    assert log.ensure_topic("t", 3) == 3
    assert log.ensure_topic("t", 5) == 3  # exists: its count wins, nothing is recreated
