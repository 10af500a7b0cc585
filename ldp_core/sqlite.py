"""SQLite helpers that the device store, the embedded log, the collector and the estimator share."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator

__all__ = ["immediate_transaction", "use_wal"]


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
