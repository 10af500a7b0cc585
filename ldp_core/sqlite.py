"""SQLite helpers that the device store, the embedded log, the collector and the estimator share."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["immediate_transaction", "open_store", "use_wal"]


def open_store(path: str, *, synchronous: str, timeout: float = 60.0) -> sqlite3.Connection:
    """A connection to a server's SQLite store at ``path`` (``":memory:"`` for tests): its folder made, in
    autocommit mode (for :func:`immediate_transaction`), usable from any thread (the caller serializes), WAL
    (:func:`use_wal`) and ``PRAGMA synchronous`` set to ``synchronous`` (``NORMAL`` or ``FULL``). The collector's
    batch-id, spent-token and issued-token stores open theirs so."""
    target = path
    if path != ":memory:":
        target = str(Path(path).expanduser())
        Path(target).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(target, timeout=timeout, isolation_level=None, check_same_thread=False)
    try:
        if path != ":memory:":
            use_wal(conn, timeout)
        conn.execute(f"PRAGMA synchronous={synchronous}")
    except BaseException:
        conn.close()
        raise
    return conn


def use_wal(conn: sqlite3.Connection, timeout: float) -> str:
    """Put the database of ``conn`` in WAL mode, waiting up to ``timeout`` seconds for other openers; return the
    journal mode SQLite reports (``"wal"`` unless the file system cannot do WAL: the caller decides).

    Converting a fresh file to WAL needs exclusive access, and SQLite answers ``PRAGMA journal_mode=WAL`` with
    ``database is locked`` at once, without running the busy handler, while another connection holds any lock
    on it. So several processes opening one new database together (two processes of one app, two collectors)
    would fail at random. WAL is a property of the file: once it is set, this reads it and takes no lock; until
    then it retries with exponential backoff (2 ms doubling to 100 ms)."""
    deadline = time.monotonic() + timeout
    delay = 0.002
    while True:
        try:
            mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower()
            if mode == "wal":
                return mode
            return str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]).lower()
        except sqlite3.OperationalError as exc:
            text = str(exc).lower()
            if ("locked" not in text and "busy" not in text) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


@contextlib.contextmanager
def immediate_transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any exception: the project's one write transaction.

    ``IMMEDIATE`` takes SQLite's write lock at the start rather than at the first write, so two writers (threads
    with their own connections, or processes) that read, check and update run strictly one after the other: no
    lost update, and no deadlock from two readers both upgrading to writers (which SQLite answers with
    ``SQLITE_BUSY`` at once, without waiting out the busy timeout). ``conn`` must be in autocommit mode
    (``isolation_level=None``), so that Python's ``sqlite3`` opens no transaction of its own. Used by the SDK
    store, the embedded log, the collector's deduplication table and the estimator's state."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
