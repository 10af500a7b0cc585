"""The project's two shared durability helpers: ``ldp_core.files.write_atomic`` and
``client_sdk.store.immediate_transaction``.

``write_atomic`` must leave the target either untouched or wholly replaced (readers never see a torn
file), remove its temporary file when anything fails, and fsync the file before the rename and the folder
after it. ``immediate_transaction`` must serialize two writers' read-check-update sequences and roll back
on an exception.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from pathlib import Path
from typing import BinaryIO

import pytest

from ldp_core.files import makedirs_durable, temp_name, write_atomic
from ldp_core.sqlite import immediate_transaction


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


# -- write_atomic ----------------------------------------------------------------------------


def test_write_atomic_writes_bytes_and_replaces(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_atomic(target, b"first")
    assert target.read_bytes() == b"first"
    write_atomic(str(target), bytearray(b"second, longer"))
    assert target.read_bytes() == b"second, longer"
    assert leftovers(tmp_path) == []


def test_write_atomic_streams_through_a_writer(tmp_path: Path) -> None:
    target = tmp_path / "blob.bin"

    def writer(f: BinaryIO) -> None:
        for i in range(100):
            f.write(bytes([i]) * 1000)

    write_atomic(target, writer)
    data = target.read_bytes()
    assert len(data) == 100_000 and data[:1000] == b"\0" * 1000 and data[-1000:] == bytes([99]) * 1000


def test_a_failing_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    write_atomic(target, b"old")

    def broken(f: BinaryIO) -> None:
        f.write(b"half of the new conte")
        raise RuntimeError("disk on fire")

    with pytest.raises(RuntimeError, match="disk on fire"):
        write_atomic(target, broken)
    assert target.read_bytes() == b"old"
    assert leftovers(tmp_path) == []


def test_a_failing_rename_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "a-folder"
    target.mkdir()
    (target / "inside").write_bytes(b"x")  # a non-empty folder cannot be replaced by a file
    with pytest.raises(OSError):
        write_atomic(target, b"data")
    assert target.is_dir() and leftovers(tmp_path) == []


def test_a_missing_folder_is_an_oserror_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_atomic(tmp_path / "no" / "such" / "folder" / "f", b"data")
    assert list(tmp_path.iterdir()) == []


def test_write_atomic_fsyncs_the_file_before_the_rename_and_the_folder_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        mode = os.fstat(fd).st_mode
        events.append(("fsync", "dir" if stat.S_ISDIR(mode) else "file"))
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        assert Path(src).read_bytes() == b"complete content", "renamed before the content was written"
        events.append(("replace", Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write_atomic(tmp_path / "f.json", b"complete content")
    assert events == [("fsync", "file"), ("replace", "f.json"), ("fsync", "dir")]


def test_readers_see_a_whole_file_while_it_is_rewritten(tmp_path: Path) -> None:
    """Readers racing a writer see one complete version or another, never a mix or a truncated file."""
    target = tmp_path / "f.bin"
    versions = [bytes([k]) * (50_000 + 1000 * k) for k in range(8)]
    write_atomic(target, versions[0])
    stop = threading.Event()
    bad: list[int] = []

    def reader() -> None:
        while not stop.is_set():
            data = target.read_bytes()
            if data not in versions:
                bad.append(len(data))

    threads = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(80):
            write_atomic(target, versions[i % len(versions)])
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert bad == [] and leftovers(tmp_path) == []


def test_create_only_keeps_the_first_file_and_its_mode(tmp_path: Path) -> None:
    """``replace=False`` (the device secret): of racing writers exactly one wins, the file is never replaced."""
    target = tmp_path / "secret"
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def create(k: int) -> None:
        barrier.wait()
        try:
            write_atomic(target, bytes([k]) * 32, mode=0o600, replace=False)
            outcomes.append("won")
        except FileExistsError:
            outcomes.append("exists")

    threads = [threading.Thread(target=create, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["exists", "exists", "exists", "won"]
    data = target.read_bytes()
    assert len(data) == 32 and len(set(data)) == 1
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    with pytest.raises(FileExistsError):
        write_atomic(target, b"other", replace=False)
    assert target.read_bytes() == data and leftovers(tmp_path) == []


def test_temporary_names_are_hidden_unique_and_beside_the_target(tmp_path: Path) -> None:
    a, b = temp_name(tmp_path / "part.parquet"), temp_name(tmp_path / "part.parquet")
    assert a != b and a.parent == b.parent == tmp_path
    assert a.name.startswith(".part.parquet.") and a.name.endswith(".tmp")


def test_makedirs_durable_creates_every_missing_parent(tmp_path: Path) -> None:
    deep = tmp_path / "a" / "b" / "c"
    makedirs_durable(deep)
    makedirs_durable(deep)  # existing: nothing to do
    assert deep.is_dir()


# -- immediate_transaction --------------------------------------------------------------------


def connect(path: Path, timeout: float = 30.0) -> sqlite3.Connection:
    conn = sqlite3.connect(str(path), timeout=timeout, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    return conn


def test_immediate_transactions_serialize_two_read_check_update_writers(tmp_path: Path) -> None:
    """Two writers each read a counter, wait, and write it back plus one; none is lost and none fails.

    With a deferred ``BEGIN`` both would read, then the second to write would fail with "database is
    locked" (SQLite cannot upgrade its read lock); ``BEGIN IMMEDIATE`` makes the second wait at the start."""
    db = tmp_path / "c.sqlite3"
    with immediate_transaction(connect(db)) as c:
        c.execute("CREATE TABLE counter (n INTEGER NOT NULL)")
        c.execute("INSERT INTO counter VALUES (0)")
    errors: list[BaseException] = []
    inside = [0]
    overlap = [0]

    def writer() -> None:
        conn = connect(db)
        try:
            for _ in range(25):
                with immediate_transaction(conn):
                    inside[0] += 1
                    overlap[0] = max(overlap[0], inside[0])
                    (n,) = conn.execute("SELECT n FROM counter").fetchone()
                    time.sleep(0.001)
                    conn.execute("UPDATE counter SET n = ?", (n + 1,))
                    inside[0] -= 1
        except BaseException as exc:  # noqa: BLE001 -- reported by the assertion below
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert overlap[0] == 1, "two writers were inside a transaction at once"
    assert connect(db).execute("SELECT n FROM counter").fetchone()[0] == 50


def test_the_write_lock_is_taken_at_begin(tmp_path: Path) -> None:
    db = tmp_path / "l.sqlite3"
    first, second = connect(db), connect(db, timeout=0.05)
    with immediate_transaction(first):
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            with immediate_transaction(second):
                pass  # pragma: no cover -- BEGIN IMMEDIATE itself must wait for the lock, then fail
    with immediate_transaction(second):  # free again once the first committed
        pass


def test_an_exception_rolls_back(tmp_path: Path) -> None:
    conn = connect(tmp_path / "r.sqlite3")
    with immediate_transaction(conn):
        conn.execute("CREATE TABLE t (x INTEGER)")
    with pytest.raises(ValueError):
        with immediate_transaction(conn):
            conn.execute("INSERT INTO t VALUES (1)")
            raise ValueError("changed my mind")
    assert conn.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 0
    assert not conn.in_transaction


# -- use_wal: many processes opening one new database ---------------------------------------------

OPENER = """
import sys, time
from client_sdk.store import Store
base, t0, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
errors = []
for k in range(rounds):
    while time.time() < t0 + 0.05 * k:
        pass
    try:
        Store(f"{base}/device-{k}").close()  # every process opens round k's fresh store at the same instant
    except Exception as exc:
        errors.append(f"round {k}: {exc!r}")
print(len(errors), errors[:3])
"""


def test_processes_opening_one_new_store_together_all_succeed(tmp_path: Path) -> None:
    """Two processes of one app starting together must both open the store. SQLite answers the
    conversion of a new file to WAL with ``database is locked`` at once (no busy handler) while
    another opener holds a lock: before ``use_wal`` this failed in 8 of 30 rounds of 6 openers."""
    import subprocess
    import sys

    rounds, procs = 40, 6
    t0 = time.time() + 1.5  # after every interpreter has started
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", OPENER, str(tmp_path), str(t0), str(rounds)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(procs)
    ]
    outs = [p.communicate(timeout=120) for p in runs]
    assert [p.returncode for p in runs] == [0] * procs, [err for _, err in outs]
    assert [out.split(" ", 1)[0] for out, _ in outs] == ["0"] * procs, [out for out, _ in outs]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"device-{k}" for k in range(rounds))
