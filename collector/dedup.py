"""The collector's durable store of recently accepted batch ids (idempotent uploads).

A device retries an upload under the same batch id until it gets an answer,
so the collector answers an id it already published with 202 without
publishing it again. The store is a SQLite table ``batch_ids(id, expires)``
in WAL mode; an id is kept for ``ttl`` seconds (default three days, longer
than a device's outbox keeps a batch) and then purged.

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

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from client_sdk.store import immediate_transaction

__all__ = ["BatchIdStore"]

_CHUNK = 500


class BatchIdStore:
    """Batch ids accepted within the last ``ttl`` seconds, in the SQLite file ``path`` (``":memory:"`` for tests)."""

    def __init__(self, path: str | Path, *, ttl: float = 3 * 86400.0, purge_interval: float = 60.0,
                 clock: Callable[[], float] = time.time) -> None:
        if not ttl > 0:
            raise ValueError(f"ttl must be > 0 seconds, got {ttl!r}")
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        self.ttl = float(ttl)
        self.purge_interval = float(purge_interval)
        self.clock = clock
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(self.path, timeout=60.0, isolation_level=None, check_same_thread=False)
        if self.path != ":memory:":
            self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute("CREATE TABLE IF NOT EXISTS batch_ids(id BLOB PRIMARY KEY, expires REAL NOT NULL) WITHOUT ROWID")
        self._conn.execute("CREATE INDEX IF NOT EXISTS batch_ids_expires ON batch_ids(expires)")
        self._next_purge = 0.0

    def seen(self, ids: Iterable[bytes]) -> set[bytes]:
        """The ids among ``ids`` accepted within the TTL."""
        todo = list(dict.fromkeys(bytes(i) for i in ids))
        now = self.clock()
        out: set[bytes] = set()
        with self._lock:
            for k in range(0, len(todo), _CHUNK):
                part = todo[k : k + _CHUNK]
                marks = ",".join("?" * len(part))
                rows = self._conn.execute(f"SELECT id FROM batch_ids WHERE expires > ? AND id IN ({marks})", (now, *part))
                out.update(bytes(r[0]) for r in rows)
        return out

    def add(self, ids: Iterable[bytes]) -> None:
        """Record ``ids`` as accepted now (one transaction); purge expired ids now and then."""
        now = self.clock()
        rows = [(bytes(i), now + self.ttl) for i in ids]
        with self._lock:
            with immediate_transaction(self._conn):
                self._conn.executemany("INSERT OR REPLACE INTO batch_ids(id, expires) VALUES (?, ?)", rows)
                if now >= self._next_purge:
                    self._conn.execute("DELETE FROM batch_ids WHERE expires <= ?", (now,))
                    self._next_purge = now + self.purge_interval

    def __len__(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM batch_ids WHERE expires > ?", (self.clock(),)).fetchone()[0])

    def close(self) -> None:
        with self._lock:
            self._conn.close()
