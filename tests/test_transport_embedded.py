"""The transport contract against the embedded SQLite log, and what only the embedded log does."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.transport import (
    DEFAULT_URL,
    CommitFailedError,
    FencedError,
    TopicPartition,
    TransportError,
    open_transport,
)
from collector.transport.embedded import SCHEMA_VERSION, EmbeddedTransport
from collector.transport.kafka import KafkaTransport
from tests.transport_contract import TransportContract, drain


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


def test_open_transport_reads_urls_and_defaults_to_the_embedded_log(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
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
            row = conn.execute("SELECT key, value FROM log WHERE topic='t' AND partition=? AND offset=?",
                               (pos.partition, pos.offset)).fetchone()
        finally:
            conn.close()
    assert row == (b"k", b"v")
