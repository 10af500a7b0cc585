"""The SDK's on-disk state: one SQLite database in the storage directory.

The budget ledger, the outbox and the persisted tallies share
one database file so that spending budget and queueing the report it pays
for commit in *one* transaction: after a crash either both exist or
neither does, and a report can never leave the device without its spend.

* WAL journal (readers never block the writer; a kill -9 loses nothing
  committed) with ``synchronous=FULL``: every commit fsyncs the WAL, so a
  spend is durable even across power loss before its report can be read by
  the uploader. The SDK commits in batches on a background thread, so this
  fsync is paid once per batch and never on the app's thread.
* Writers open ``BEGIN IMMEDIATE`` transactions: the write lock is taken at
  the start, so two threads or two processes read-check-update the ledger
  strictly one after the other (no lost updates, no lock-upgrade deadlock).
* One connection per thread (SQLite connections must not interleave
  transactions from several threads).

**Schema versions** (``PRAGMA user_version``). 1: clock, ledger, specs,
outbox, batches, counters. 2 adds ``pins``: the definition (mechanism spec
and domain, RFC 8785 JSON) each memoized metric was first reported under
(:mod:`client_sdk.memo`, "Pins"). A version-1 file is upgraded in place
when it is opened (one transaction: the new table, then the version; every
existing row stays); a file of a newer version than this SDK's is refused,
so an older SDK never runs on a store whose pins it would ignore. 3 adds ``tokens``: the anonymous upload
tokens the device holds (:mod:`client_sdk.upload.token_wallet`), each with its UTC day and the batch it is bound
to; versions 1 and 2 are upgraded in place the same way. 4 adds what a federated-learning device
(:class:`client_sdk.fl.device.FLDevice` with ``storage_dir``) must not forget when the app restarts:
``fl_sample_ledger``, one row per (task, round) it trained under local DP-SGD with the signed spec
(RFC 8785-style canonical JSON) and δ, written before that round's update leaves the device; ``fl_state``,
per task, the model it belongs to and the last round's settings; ``fl_arrays``, per task, SCAFFOLD's control
variate, Ditto's personal model, MOON's previous model and the last global model, as raw little-endian
bytes with their dtype and shape (:mod:`client_sdk.fl.device_store`). Versions 1 to 3 are upgraded in
place. 5 adds ``clock_mono``: the boot id and monotonic reading of the last clock observation, which cap how
far the ledger's high-water mark may advance (:mod:`client_sdk.ledger`, "Forward jumps"); versions 1 to 4 are
upgraded in place. 6 adds ``token_key_pins``: the issuer's token key the device accepted for each day
(:mod:`client_sdk.upload.token_wallet`, "Key consistency"), so a later different key for that day is refused
(an older SDK would ignore the pins, hence the new version); versions 1 to 5 are upgraded in place.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import threading
from collections.abc import Iterator, Mapping

from ldp_core.sqlite import immediate_transaction, use_wal

__all__ = ["Store", "DB_FILENAME", "SCHEMA_VERSION", "UPGRADABLE_VERSIONS", "immediate_transaction"]

DB_FILENAME = "ldp-sdk.sqlite3"
SCHEMA_VERSION = 6
#: Versions this SDK upgrades in place (see the module docstring).
UPGRADABLE_VERSIONS = (0, 1, 2, 3, 4, 5)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS clock (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    high_water REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS clock_mono (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    boot TEXT NOT NULL,
    mono REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS ledger (
    day INTEGER NOT NULL,
    metric TEXT NOT NULL,
    spent INTEGER NOT NULL,
    reports INTEGER NOT NULL,
    PRIMARY KEY (day, metric)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS specs (
    spec_id TEXT PRIMARY KEY,
    spec TEXT NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    metric TEXT NOT NULL,
    spec_id TEXT NOT NULL,
    day INTEGER NOT NULL,
    record BLOB NOT NULL,
    enqueued REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS outbox_group ON outbox (metric, spec_id, day, id);
CREATE TABLE IF NOT EXISTS batches (
    batch_id BLOB PRIMARY KEY,
    frame BLOB NOT NULL,
    n INTEGER NOT NULL,
    first_id INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt REAL NOT NULL,
    lease_until REAL NOT NULL DEFAULT 0,
    lease_pid INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS pins (
    metric TEXT PRIMARY KEY,
    definition TEXT NOT NULL,
    pinned REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tokens (
    token BLOB PRIMARY KEY,
    day TEXT NOT NULL,
    batch_id BLOB UNIQUE,
    fetched REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tokens_free ON tokens (day, batch_id);
CREATE TABLE IF NOT EXISTS token_key_pins (
    day TEXT PRIMARY KEY,
    token_key_id TEXT NOT NULL,
    public_key TEXT NOT NULL,
    pinned REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fl_sample_ledger (
    task TEXT NOT NULL,
    round INTEGER NOT NULL,
    spec TEXT NOT NULL,
    delta REAL NOT NULL,
    recorded REAL NOT NULL,
    PRIMARY KEY (task, round)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fl_state (
    task TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    settings TEXT NOT NULL,
    updated REAL NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS fl_arrays (
    task TEXT NOT NULL,
    name TEXT NOT NULL,
    dtype TEXT NOT NULL,
    shape TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (task, name)
) WITHOUT ROWID;
"""


def _private(path: str) -> None:
    """Create the database file as 0600 if it is missing, and make it (and its WAL files) 0600 if not.

    SQLite creates its ``-wal`` and ``-shm`` files with the database file's
    permissions, so a private database keeps its journal private too. What
    it holds (the budget spent per metric and day, the reports waiting to
    leave) is the device's business alone, like the memo secret.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    for p in (path, path + "-wal", path + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            if stat.S_IMODE(os.stat(p).st_mode) & 0o077:
                os.chmod(p, 0o600)


class Store:
    """The SDK database at ``<directory>/ldp-sdk.sqlite3`` (created if missing)."""

    def __init__(self, directory: str | os.PathLike[str], *, busy_timeout: float = 30.0) -> None:
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        self.path = os.path.join(self.directory, DB_FILENAME)
        _private(self.path)
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._closed = False
        conn = self.connection()
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return  # already set up: opening takes no write lock
        with self.transaction(conn):
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (*UPGRADABLE_VERSIONS, SCHEMA_VERSION):
                raise sqlite3.DatabaseError(
                    f"{self.path} has schema version {version}; this SDK understands versions up to "
                    f"{SCHEMA_VERSION} (a newer SDK wrote it: use that SDK, or a fresh storage directory)"
                )
            for statement in _SCHEMA.split(";"):  # every table is IF NOT EXISTS: an upgrade adds the new ones
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def connection(self) -> sqlite3.Connection:
        """This thread's connection (opened on first use)."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            if self._closed:
                raise sqlite3.ProgrammingError("the SDK store is closed")
            conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False)
            use_wal(conn, self._busy_timeout)
            conn.execute("PRAGMA synchronous=FULL")
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    @contextlib.contextmanager
    def transaction(
        self, conn: sqlite3.Connection | None = None, *, durable: bool = True
    ) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any exception).

        ``durable=False`` commits without an fsync (``synchronous=NORMAL``): the
        commit survives a crash of the app but may be lost with the machine's
        power. Only for writes whose loss is harmless (acknowledging a delivered
        batch: at worst it is sent again under the same id and deduplicated)."""
        conn = conn if conn is not None else self.connection()
        if not durable:
            conn.execute("PRAGMA synchronous=NORMAL")
        try:
            with immediate_transaction(conn):
                yield conn
        finally:
            if not durable:
                conn.execute("PRAGMA synchronous=FULL")

    @staticmethod
    def bump_counters(conn: sqlite3.Connection, deltas: Mapping[str, int]) -> None:
        """Add ``deltas`` to the persisted tallies (inside a transaction)."""
        conn.executemany(
            "INSERT INTO counters (name, value) VALUES (?, ?) "
            "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value",
            [(k, int(v)) for k, v in deltas.items() if v],
        )

    def counters(self) -> dict[str, int]:
        rows = self.connection().execute("SELECT name, value FROM counters").fetchall()
        return {name: int(value) for name, value in rows}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._all = self._all, []
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        self._local = threading.local()
