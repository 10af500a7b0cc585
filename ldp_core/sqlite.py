"""SQLite helpers that the device store, the embedded log, the collector and the estimator share."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

__all__ = ["immediate_transaction"]


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
