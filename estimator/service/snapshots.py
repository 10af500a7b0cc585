"""The streaming estimator's snapshot store: one instance's state and consumed offsets in one SQLite file."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from pathlib import Path

from estimator.service.state import Key, KeyState, Tail, Tally
from ldp_core.sqlite import immediate_transaction, use_wal
from pipeline.transport.base import TopicPartition

__all__ = ["SnapshotStore"]


class SnapshotStore:
    """The instance's state and consumed offsets in one SQLite file (WAL, ``synchronous=FULL``).

    Tables: ``meta(k, v)``, ``certain(metric, spec_id, day, blob)``,
    ``segments(topic, partition, base, end, started_at)`` and
    ``tails(topic, partition, base, end, started_at, blob)`` (pending tails).
    :meth:`write` replaces segments and tails and upserts the changed
    certain keys in one transaction, so a crash leaves the previous snapshot
    or the new one, never a mix.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False, timeout=30.0)
        use_wal(self._conn, 30.0)
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.executescript("""
            CREATE TABLE IF NOT EXISTS meta(k TEXT PRIMARY KEY, v TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS certain(metric TEXT, spec_id TEXT, day INTEGER, blob BLOB NOT NULL,
                                               PRIMARY KEY(metric, spec_id, day));
            CREATE TABLE IF NOT EXISTS segments(topic TEXT, partition INTEGER, base INTEGER, end INTEGER,
                                                started_at REAL);
            CREATE TABLE IF NOT EXISTS tails(topic TEXT, partition INTEGER, base INTEGER, end INTEGER,
                                             started_at REAL, status TEXT, blob BLOB NOT NULL);
        """)

    def meta(self) -> dict[str, str]:
        return dict(self._conn.execute("SELECT k, v FROM meta").fetchall())

    def set_meta(self, **kv: str) -> None:
        with immediate_transaction(self._conn):
            for k, v in kv.items():
                self._conn.execute("INSERT OR REPLACE INTO meta(k, v) VALUES (?, ?)", (k, v))

    def load(self) -> tuple[Tally, dict[TopicPartition, list[list[float]]], list[Tail]]:
        certain = Tally()
        for metric, spec_id, day, blob in self._conn.execute("SELECT metric, spec_id, day, blob FROM certain"):
            certain.keys[(metric, spec_id, int(day))] = KeyState.from_bytes(blob)
        segments: dict[TopicPartition, list[list[float]]] = {}
        for topic, part, base, end, started in self._conn.execute(
            "SELECT topic, partition, base, end, started_at FROM segments ORDER BY topic, partition, base"
        ):
            segments.setdefault(TopicPartition(topic, int(part)), []).append([int(base), int(end), float(started)])
        tails = []
        for topic, part, base, end, started, status, blob in self._conn.execute(
            "SELECT topic, partition, base, end, started_at, status, blob FROM tails"
        ):
            tally = Tally.from_bytes(blob) if blob else Tally()
            tails.append(Tail(TopicPartition(topic, int(part)), int(base), int(end), float(started), tally, status))
        return certain, segments, tails

    def write(
        self,
        certain: Tally,
        dirty: Iterable[Key],
        segments: Mapping[TopicPartition, list[list[float]]],
        tails: Iterable[Tail],
    ) -> None:
        c = self._conn
        with immediate_transaction(c):
            for key in dirty:
                c.execute(
                    "INSERT OR REPLACE INTO certain(metric, spec_id, day, blob) VALUES (?,?,?,?)",
                    (key[0], key[1], key[2], certain.keys[key].to_bytes()),
                )
            c.execute("DELETE FROM segments")
            c.executemany(
                "INSERT INTO segments VALUES (?,?,?,?,?)",
                [(tp.topic, tp.partition, int(b), int(e), float(s)) for tp, rs in segments.items() for b, e, s in rs],
            )
            c.execute("DELETE FROM tails")
            c.executemany(
                "INSERT INTO tails VALUES (?,?,?,?,?,?,?)",
                [
                    (t.tp.topic, t.tp.partition, t.base, t.end, t.started_at, t.status, t.tally.to_bytes())
                    for t in tails
                ],
            )

    def close(self) -> None:
        self._conn.close()
