"""The durable outbox: privatized reports waiting for upload.

Reports are rows of the SDK database (:mod:`client_sdk.store`), written in
the same transaction as the budget spend that pays for them, so they
survive a crash or ``kill -9`` of the app. A row holds only the metric
name, the spec id, the UTC day and the privatized record's bytes (plus a
local enqueue time used to decide when a batch is old enough to send; it is
never uploaded).

**Batches.** The uploader :meth:`claims <Outbox.claim>` work: either a
batch already formed and due for a retry, or a new batch of up to
``batch_size`` reports of one (metric, spec, day), formed when the group has
``batch_size`` reports, when its oldest report is older than ``max_age``, or
on a flush. Forming a batch draws a random 16-byte batch id, encodes the
wire frame and stores both, and deletes the reports from the queue, in one
transaction *before* the first attempt: every retry resends the identical
frame under the identical id, so a collector that deduplicates batch ids
counts it once.

**Leases.** A claimed batch is leased to the claiming process (pid and an
expiry). Another process, or this one after a restart, may claim it again
when the lease expires or, on POSIX, as soon as the leasing process is gone.

**Size cap.** The outbox holds at most ``max_reports`` reports (queued and
batched). When a new report would exceed it, the oldest go first: whole
batches that are not in flight, then the oldest queued reports. Every
dropped report is counted in the ``outbox_dropped`` tally.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterable

import numpy as np

from client_sdk.store import Store
from ldp_core.errors import LDPError
from ldp_core.mechanisms import ReportSpec, spec_from_dict
from ldp_core.processes import pid_alive
from ldp_core.wire.frames import ReportBatch, encode_frame

__all__ = ["Outbox", "PendingBatch", "DEFAULT_MAX_REPORTS"]

DEFAULT_MAX_REPORTS = 10_000


@dataclasses.dataclass(frozen=True)
class PendingBatch:
    """A batch claimed for upload: its id, its frame and how often it was tried."""

    batch_id: bytes
    frame: bytes
    n: int
    attempts: int


class Outbox:
    """The durable, capped queue of privatized reports (see the module docstring)."""

    def __init__(self, store: Store, *, max_reports: int = DEFAULT_MAX_REPORTS, lease_seconds: float = 120.0) -> None:
        if isinstance(max_reports, bool) or not isinstance(max_reports, int) or max_reports < 1:
            raise ValueError(f"max_reports must be a positive integer, got {max_reports!r}")
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds!r}")
        self.store = store
        self.max_reports = max_reports
        self.lease_seconds = float(lease_seconds)
        self._specs: dict[str, ReportSpec] = {}
        self._registered: set[str] = set()
        #: applied to each batch as it is formed (the client seals sealed metrics' records here)
        self.sealer: Callable[[ReportBatch], ReportBatch] | None = None

    def add_spec(self, spec: ReportSpec) -> None:
        """Know ``spec`` by its id without the mechanism registry: for specs :func:`spec_from_dict` cannot
        rebuild (a Prio3 metric's, :mod:`client_sdk.prio3`), whose queued reports survive a restart only
        once the same spec is added again."""
        self._specs[spec.spec_id] = spec

    # -- writing (inside the recorder's transaction) --------------------------
    def put_in(
        self,
        conn: sqlite3.Connection,
        metric: str,
        spec: ReportSpec,
        day: int,
        records: np.ndarray | Iterable[bytes],
        now: float,
    ) -> int:
        """Queue records (an array of ``spec.record_dtype`` or raw record bytes);
        return how many old reports were dropped to respect the cap."""
        if spec.spec_id not in self._registered:
            conn.execute(
                "INSERT OR IGNORE INTO specs (spec_id, spec) VALUES (?, ?)",
                (spec.spec_id, json.dumps(spec.to_dict(), sort_keys=True)),
            )
            self._registered.add(spec.spec_id)
            self._specs.setdefault(spec.spec_id, spec)
        if isinstance(records, np.ndarray):
            raw = np.ascontiguousarray(records).tobytes()
            size = spec.record_size
            blobs: Iterable[bytes] = (raw[i : i + size] for i in range(0, len(raw), size))
        else:
            blobs = records
        conn.executemany(
            "INSERT INTO outbox (metric, spec_id, day, record, enqueued) VALUES (?, ?, ?, ?, ?)",
            ((metric, spec.spec_id, day, b, now) for b in blobs),
        )
        return self._enforce_cap_in(conn, now)

    def put(self, metric: str, spec: ReportSpec, day: int, records: np.ndarray, now: float | None = None) -> int:
        """:meth:`put_in` in a transaction of its own."""
        with self.store.transaction() as conn:
            return self.put_in(conn, metric, spec, day, records, time.time() if now is None else now)

    def _count_in(self, conn: sqlite3.Connection) -> int:
        queued = conn.execute("SELECT COUNT(*) FROM outbox").fetchone()[0]
        batched = conn.execute("SELECT COALESCE(SUM(n), 0) FROM batches").fetchone()[0]
        return int(queued) + int(batched)

    def _enforce_cap_in(self, conn: sqlite3.Connection, now: float) -> int:
        excess = self._count_in(conn) - self.max_reports
        dropped = 0
        while excess > 0:
            oldest_queued = conn.execute("SELECT MIN(id) FROM outbox").fetchone()[0]
            victim = None
            for batch_id, n, first_id, lease_until, lease_pid in conn.execute(
                "SELECT batch_id, n, first_id, lease_until, lease_pid FROM batches ORDER BY first_id"
            ).fetchall():
                if oldest_queued is not None and first_id > oldest_queued:
                    break
                if lease_until <= now or not pid_alive(lease_pid):
                    victim = (batch_id, int(n))
                    break
            if victim is not None:
                conn.execute("DELETE FROM batches WHERE batch_id = ?", (victim[0],))
                excess -= victim[1]
                dropped += victim[1]
                continue
            removed = conn.execute(
                "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT ?)", (excess,)
            ).rowcount
            if removed <= 0:
                break  # only in-flight batches remain; they leave on their own
            excess -= removed
            dropped += removed
        if dropped:
            Store.bump_counters(conn, {"outbox_dropped": dropped})
        return dropped

    # -- reading -------------------------------------------------------------
    def size(self) -> int:
        """Reports waiting (queued or in formed batches)."""
        return self._count_in(self.store.connection())

    def pending_batches(self) -> int:
        return int(self.store.connection().execute("SELECT COUNT(*) FROM batches").fetchone()[0])

    def _spec(self, conn: sqlite3.Connection, spec_id: str) -> ReportSpec | None:
        spec = self._specs.get(spec_id)
        if spec is None:
            row = conn.execute("SELECT spec FROM specs WHERE spec_id = ?", (spec_id,)).fetchone()
            if row is None:
                return None
            try:
                spec = spec_from_dict(json.loads(row[0]))
            except (LDPError, ValueError):
                return None
            if spec.spec_id != spec_id:
                return None
            self._specs[spec_id] = spec
        return spec

    def claim(self, now: float, *, batch_size: int, max_age: float, force: bool = False) -> PendingBatch | None:
        """The next batch to send now, leased to this process, or ``None``."""
        got = self.claim_batches(now, batch_size=batch_size, max_age=max_age, force=force, limit=1)
        return got[0] if got else None

    def claim_batches(
        self, now: float, *, batch_size: int, max_age: float, force: bool = False, limit: int = 8
    ) -> list[PendingBatch]:
        """Up to ``limit`` batches to send now, leased to this process, in one transaction:
        formed batches due for a retry first (oldest first), then new ones."""
        out: list[PendingBatch] = []
        pid = os.getpid()
        lease = (now + self.lease_seconds, pid)
        with self.store.transaction() as conn:
            for batch_id, frame, n, attempts, lease_until, lease_pid in conn.execute(
                "SELECT batch_id, frame, n, attempts, lease_until, lease_pid FROM batches "
                "WHERE next_attempt <= ? ORDER BY first_id",
                (now,),
            ).fetchall():
                if len(out) >= limit:
                    return out
                if lease_until <= now or (lease_pid != pid and not pid_alive(lease_pid)):
                    conn.execute(
                        "UPDATE batches SET lease_until = ?, lease_pid = ? WHERE batch_id = ?", (*lease, batch_id)
                    )
                    out.append(PendingBatch(bytes(batch_id), bytes(frame), int(n), int(attempts)))
            groups = conn.execute(
                "SELECT metric, spec_id, day, COUNT(*), MIN(enqueued) FROM outbox "
                "GROUP BY metric, spec_id, day ORDER BY MIN(id)"
            ).fetchall()
            for metric, spec_id, day, count, oldest in groups:
                whole = force or oldest <= now - max_age
                wanted = -(-count // batch_size) if whole else count // batch_size
                for _ in range(wanted):
                    if len(out) >= limit:
                        return out
                    batch = self._form_in(conn, metric, spec_id, int(day), batch_size, now, lease)
                    if batch is None:
                        break
                    out.append(batch)
        return out

    def _form_in(
        self,
        conn: sqlite3.Connection,
        metric: str,
        spec_id: str,
        day: int,
        batch_size: int,
        now: float,
        lease: tuple[float, int],
    ) -> PendingBatch | None:
        """Move the ``batch_size`` oldest reports of a group into a new batch (inside a
        transaction); ``None`` (and the reports counted as unsendable) if the spec is unknown."""
        rows = conn.execute(
            "SELECT id, record FROM outbox WHERE metric = ? AND spec_id = ? AND day = ? ORDER BY id LIMIT ?",
            (metric, spec_id, day, batch_size),
        ).fetchall()
        if not rows:
            return None
        ids = [r[0] for r in rows]
        spec = self._spec(conn, spec_id)
        frame = None
        batch_id = secrets.token_bytes(16)
        if spec is not None:
            raw = b"".join(bytes(r[1]) for r in rows)
            if len(raw) == spec.record_size * len(rows):
                records = np.frombuffer(raw, dtype=spec.record_dtype)
                batch = ReportBatch(metric, spec, day, records, batch_id)
                frame = encode_frame(batch if self.sealer is None else self.sealer(batch))
        conn.execute(f"DELETE FROM outbox WHERE id IN ({','.join('?' * len(ids))})", ids)
        if frame is None:  # a spec this SDK cannot rebuild: the reports can never be sent
            Store.bump_counters(conn, {"outbox_unsendable": len(ids)})
            return None
        conn.execute(
            "INSERT INTO batches (batch_id, frame, n, first_id, attempts, next_attempt, lease_until, lease_pid) "
            "VALUES (?, ?, ?, ?, 0, ?, ?, ?)",
            (batch_id, frame, len(ids), ids[0], now, *lease),
        )
        return PendingBatch(batch_id, frame, len(ids), 0)

    def next_due(self, now: float, *, batch_size: int, max_age: float) -> float | None:
        """The earliest time at which :meth:`claim` would find work (``None``: nothing queued)."""
        conn = self.store.connection()
        times: list[float] = []
        row = conn.execute("SELECT MIN(MAX(next_attempt, lease_until)) FROM batches").fetchone()
        if row[0] is not None:
            times.append(float(row[0]))
        for count, oldest in conn.execute(
            "SELECT COUNT(*), MIN(enqueued) FROM outbox GROUP BY metric, spec_id, day"
        ).fetchall():
            times.append(now if count >= batch_size else float(oldest) + max_age)
        return min(times) if times else None

    # -- outcomes --------------------------------------------------------------
    def ack(self, batch_id: bytes) -> bool:
        """The collector accepted the batch: forget it. ``False`` if it was already gone.

        Committed without an fsync: if the machine loses power before the next
        durable commit, the batch is sent again under the same id, and the
        collector, which deduplicates batch ids, does not count it twice."""
        with self.store.transaction(durable=False) as conn:
            row = conn.execute("SELECT n FROM batches WHERE batch_id = ?", (batch_id,)).fetchone()
            if row is None:
                return False
            conn.execute("DELETE FROM batches WHERE batch_id = ?", (batch_id,))
            Store.bump_counters(conn, {"uploaded_batches": 1, "uploaded_reports": int(row[0])})
            return True

    def reject(self, batch_id: bytes) -> int:
        """The collector refused the batch for good: drop it, count it, return its size."""
        with self.store.transaction() as conn:
            row = conn.execute("SELECT n FROM batches WHERE batch_id = ?", (batch_id,)).fetchone()
            if row is None:
                return 0
            conn.execute("DELETE FROM batches WHERE batch_id = ?", (batch_id,))
            Store.bump_counters(conn, {"upload_rejected_batches": 1, "upload_rejected_reports": int(row[0])})
            return int(row[0])

    def release(self, batch_ids: list[bytes]) -> None:
        """Give back leases of batches claimed but not attempted."""
        with self.store.transaction(durable=False) as conn:
            conn.executemany(
                "UPDATE batches SET lease_until = 0, lease_pid = 0 WHERE batch_id = ?", [(b,) for b in batch_ids]
            )

    def defer(self, batch_id: bytes, next_attempt: float) -> None:
        """A transient failure: try again at ``next_attempt``, and release the lease."""
        with self.store.transaction() as conn:
            conn.execute(
                "UPDATE batches SET attempts = attempts + 1, next_attempt = ?, lease_until = 0, lease_pid = 0 "
                "WHERE batch_id = ?",
                (next_attempt, batch_id),
            )
