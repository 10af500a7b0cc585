"""One Prio3 aggregator (docs/PRIO3.md): the leader or the helper of a two-aggregator VDAF, with its state.

Both open only their own input share of each report (:func:`ldp_core.prio3.report.open_share`), run the
crate's verification through the binding, and sum the output shares of the reports that verified into
one aggregate share per (metric, day) batch. The **leader** takes the reports (from the log,
:mod:`collector.aggregator.feed`) and drives the **helper** over HTTP, one aggregation job per batch of
reports: it sends the helper's sealed share, the public share and its own verifier share; the helper
answers with its verifier share and the verifier message it computed; the leader recomputes the message
from both verifier shares itself and refuses the report if the helper's differs or if its own
verification fails. A report that does not verify is rejected by both, without either seeing the value.

Per report: its id is the VDAF nonce, kept by each aggregator for good, so a replayed report (the same
upload twice, or the leader sending a report to the helper again) is dropped. Per batch: the number of
reports and a checksum (XOR of SHA-256 of their ids, as in DAP) go with each aggregate share, so the
collector refuses to unshard two shares over different report sets (a helper that accepted what the
leader refused, or the reverse). A batch is released at most once and only with at least ``min_batch``
reports: collecting it twice around one more report would isolate that report's value; reports of a
batch that was released are rejected.

Central DP (``central_epsilon``): the aggregator adds discrete Laplace noise of scale Δ/ε to its aggregate
share when it releases it (:mod:`ldp_core.prio3.noise`), with a fresh seed from the OS CSPRNG, so the
collector never holds the exact aggregate; the share's JSON says which noise it carries.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ldp_core.metrics import MetricSet
from ldp_core.prio3.noise import AggregatorNoise, SeedSource, os_seed
from ldp_core.prio3.report import CTX, ROLES, Prio3Spec, ReportParts, open_share, split_report
from ldp_core.prio3.vdaf import NONCE_SIZE, VERIFY_KEY_SIZE, VdafFailure, load_binding

__all__ = ["Aggregator", "AggregateShare", "CollectRefused", "HelperCall"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS reports (
  report_id BLOB PRIMARY KEY, metric TEXT NOT NULL, day INTEGER NOT NULL,
  report BLOB, status TEXT NOT NULL, reason TEXT
);
CREATE INDEX IF NOT EXISTS reports_pending ON reports (status, metric, day);
CREATE TABLE IF NOT EXISTS batches (
  metric TEXT NOT NULL, day INTEGER NOT NULL, share BLOB, n INTEGER NOT NULL DEFAULT 0,
  checksum BLOB NOT NULL DEFAULT x'0000000000000000000000000000000000000000000000000000000000000000',
  collected INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (metric, day)
);
"""

#: the leader's call to the helper: (path, JSON body) -> JSON answer
HelperCall = Callable[[str, dict[str, Any]], dict[str, Any]]


class CollectRefused(Exception):
    """An aggregate share is not released (too few reports, released already, unknown metric)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class AggregateShare:
    metric: str
    day: int
    share: bytes
    reports: int
    checksum: bytes
    #: the central-DP noise this share carries (``AggregatorNoise.to_json``), None: exact
    noise: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "day": self.day,
            "aggregate_share": self.share.hex(),
            "reports": self.reports,
            "checksum": self.checksum.hex(),
            "noise": self.noise,
        }


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _id_hash(report_id: bytes) -> bytes:
    return hashlib.sha256(report_id).digest()


class Aggregator:
    """The state and the work of one aggregator (``role`` ``"leader"`` or ``"helper"``)."""

    def __init__(
        self,
        role: str,
        metrics: MetricSet,
        key: Any,
        verify_key: bytes,
        state_dir: str | Path,
        *,
        min_batch: int = 1,
        helper: HelperCall | None = None,
        central_epsilon: float | None = None,
        noise_seed: SeedSource = os_seed,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if len(verify_key) != VERIFY_KEY_SIZE:
            raise ValueError(f"the VDAF verify key is {VERIFY_KEY_SIZE} bytes, got {len(verify_key)}")
        if role == "leader" and helper is None:
            raise ValueError("the leader needs the helper's address")
        mine = metrics.prio3_aggregators.get(role)
        if mine is None or mine.key_id != key.key_id:
            raise ValueError(
                f"this {role}'s key {key.key_id} is not the {role} key the metrics file names "
                f"({mine.key_id if mine else 'none'})"
            )
        self.role = role
        self.agg_id = ROLES.index(role)
        self.metrics = metrics
        self.key = key
        self.verify_key = bytes(verify_key)
        self.min_batch = int(min_batch)
        self.helper = helper
        self.specs: dict[str, Prio3Spec] = {n: metrics.prio3_spec(n) for n in metrics.prio3}
        self._vdafs = {n: s.config.vdaf() for n, s in self.specs.items()}
        #: per metric, the noise added to each released share (empty: shares are released exact)
        self.noise: dict[str, AggregatorNoise] = (
            {}
            if central_epsilon is None
            else {n: AggregatorNoise.for_config(s.config, central_epsilon) for n, s in self.specs.items()}
        )
        self._noise_seed = noise_seed
        self._binding = load_binding()
        Path(state_dir).mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(Path(state_dir) / f"prio3-{role}.sqlite3", check_same_thread=False)
        self._db.executescript(_SCHEMA)
        self._lock = threading.RLock()
        #: counts by outcome: received, replayed, accepted, rejected:<reason>
        self.counts: collections.Counter[str] = collections.Counter()
        #: CPU seconds this aggregator spent on reports (thread CPU, HTTP waits excluded) and reports handled
        self.cpu_seconds = 0.0
        self.cpu_reports = 0

    # -- the leader: intake ------------------------------------------------------------------------------------
    def ingest(self, metric: str, day: int, reports: Iterable[bytes]) -> dict[str, int]:
        """Queue reports of ``metric`` (leader): a report id seen before is a replay and dropped."""
        if self.role != "leader":
            raise ValueError("only the leader takes reports")
        spec = self.specs[metric]
        got: collections.Counter[str] = collections.Counter()
        with self._lock, self._db:
            for report in reports:
                rid = bytes(report[:NONCE_SIZE])
                if len(report) != spec.layout.size:
                    got["malformed"] += 1
                    continue
                cur = self._db.execute(
                    "INSERT OR IGNORE INTO reports (report_id, metric, day, report, status) VALUES (?, ?, ?, ?, 'pending')",
                    (rid, metric, int(day), bytes(report)),
                )
                got["queued" if cur.rowcount else "replayed"] += 1
        self.counts["received"] += got["queued"]
        self.counts["replayed"] += got["replayed"]
        self.counts["rejected:malformed"] += got["malformed"]
        return dict(got)

    def pending(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM reports WHERE status = 'pending'").fetchone()[0])

    # -- the leader: one aggregation job -----------------------------------------------------------------------
    def step(self, limit: int = 500) -> int:
        """Run one aggregation job with the helper over up to ``limit`` pending reports of one batch;
        returns how many reports it settled (0: nothing pending)."""
        with self._lock:
            row = self._db.execute(
                "SELECT metric, day FROM reports WHERE status = 'pending' ORDER BY rowid LIMIT 1"
            ).fetchone()
            if row is None:
                return 0
            metric, day = str(row[0]), int(row[1])
            rows = self._db.execute(
                "SELECT report_id, report FROM reports WHERE status = 'pending' AND metric = ? AND day = ? "
                "ORDER BY rowid LIMIT ?",
                (metric, day, limit),
            ).fetchall()
        t0 = time.thread_time()
        spec, vdaf = self.specs[metric], self._vdafs[metric]
        verdicts: dict[bytes, str] = {}
        started: dict[bytes, tuple[bytes, bytes]] = {}
        job: list[dict[str, str]] = []
        collected = self._collected(metric, day)
        for rid, report in rows:
            rid = bytes(rid)
            if collected:
                verdicts[rid] = "rejected:batch_collected"
                continue
            try:
                parts = split_report(spec, bytes(report))
                share = open_share(self.key, 0, spec, day, parts)
                state, vs = vdaf.verify_init(self.verify_key, CTX, 0, parts.report_id, parts.public_share, share)
            except (VdafFailure, self._binding.VdafError, ValueError):
                verdicts[rid] = "rejected:invalid_share"
                continue
            started[rid] = (state, vs)
            job.append(
                {"id": rid.hex(), "public": parts.public_share.hex(), "share": parts.sealed[1].hex(), "vs": vs.hex()}
            )
        cpu = time.thread_time() - t0
        answers: Mapping[str, Any] = {}
        if job:
            assert self.helper is not None
            reply = self.helper("/v1/prio3/aggregate", {"metric": metric, "day": day, "reports": job})
            answers = {a["id"]: a for a in reply.get("results", [])}
        t1 = time.thread_time()
        outs: list[bytes] = []
        for rid, (state, vs0) in started.items():
            verdicts[rid] = self._finish(vdaf, state, vs0, answers.get(rid.hex()), outs)
        self._settle(metric, day, verdicts, outs, vdaf)
        self._charge(cpu + time.thread_time() - t1, len(rows))
        return len(rows)

    def _finish(self, vdaf: Any, state: bytes, vs0: bytes, answer: Mapping[str, Any] | None, outs: list[bytes]) -> str:
        """The leader's verdict on one report from the helper's answer."""
        if answer is None:
            return "rejected:no_helper_answer"
        if answer.get("status") != "continue":
            return "rejected:" + str(answer.get("reason", "helper_refused"))
        try:
            vs1, msg = bytes.fromhex(answer["vs"]), bytes.fromhex(answer["message"])
            mine = vdaf.verifier_shares_to_message(CTX, 0, state, [vs0, vs1])
        except (KeyError, ValueError, TypeError, self._binding.VdafError):
            return "rejected:invalid_proof"
        if mine != msg:
            return "rejected:helper_message_mismatch"
        try:
            outs.append(vdaf.verify_next(CTX, 0, state, msg))
        except self._binding.VdafError:
            return "rejected:verify_failed"
        return "accepted"

    # -- the helper --------------------------------------------------------------------------------------------
    def aggregate_job(self, metric: str, day: int, reports: list[Mapping[str, Any]]) -> dict[str, Any]:
        """The helper's side of one aggregation job (what ``POST /v1/prio3/aggregate`` answers)."""
        if self.role != "helper":
            raise ValueError("only the helper takes aggregation jobs")
        if metric not in self.specs:
            raise CollectRefused(404, "unknown_metric", f"{metric!r} is not a prio3 metric here")
        t0 = time.thread_time()
        spec, vdaf = self.specs[metric], self._vdafs[metric]
        collected = self._collected(metric, day)
        results: list[dict[str, str]] = []
        verdicts: dict[bytes, str] = {}
        outs: list[bytes] = []
        with self._lock:
            for r in reports:
                res, verdict = self._help_one(spec, vdaf, day, r, collected or verdicts, outs)
                results.append(res)
                if verdict is not None:
                    verdicts[bytes.fromhex(res["id"])] = verdict
            self._settle(metric, day, verdicts, outs, vdaf, insert=True)
        self._charge(time.thread_time() - t0, len(reports))
        return {"results": results}

    def _help_one(
        self,
        spec: Prio3Spec,
        vdaf: Any,
        day: int,
        r: Mapping[str, Any],
        earlier: bool | Mapping[bytes, str],
        outs: list[bytes],
    ) -> tuple[dict[str, str], str | None]:
        """One report of a job; ``earlier``: True if the batch was released, else this job's verdicts so far."""
        try:
            rid = bytes.fromhex(str(r["id"]))
            public, sealed, vs0 = (bytes.fromhex(str(r[k])) for k in ("public", "share", "vs"))
        except (KeyError, ValueError):
            return {"id": str(r.get("id", ""))[:64], "status": "reject", "reason": "malformed"}, None
        ident = rid.hex()
        if len(rid) != NONCE_SIZE:
            return {"id": ident, "status": "reject", "reason": "malformed"}, None
        seen = isinstance(earlier, Mapping) and rid in earlier
        if seen or self._db.execute("SELECT 1 FROM reports WHERE report_id = ?", (rid,)).fetchone() is not None:
            self.counts["replayed"] += 1
            return {"id": ident, "status": "reject", "reason": "replayed"}, None
        if earlier is True:
            return {"id": ident, "status": "reject", "reason": "batch_collected"}, "rejected:batch_collected"
        parts = ReportParts(rid, public, (b"", sealed))
        try:
            share = open_share(self.key, 1, spec, day, parts)
            state, vs1 = vdaf.verify_init(self.verify_key, CTX, 1, rid, public, share)
            msg = vdaf.verifier_shares_to_message(CTX, 1, state, [vs0, vs1])
            out = vdaf.verify_next(CTX, 1, state, msg)
        except (VdafFailure, self._binding.VdafError, ValueError):
            return {"id": ident, "status": "reject", "reason": "invalid_proof"}, "rejected:invalid_proof"
        outs.append(out)
        return {"id": ident, "status": "continue", "vs": vs1.hex(), "message": msg.hex()}, "accepted"

    # -- both --------------------------------------------------------------------------------------------------
    def _collected(self, metric: str, day: int) -> bool:
        with self._lock:
            row = self._db.execute(
                "SELECT collected FROM batches WHERE metric = ? AND day = ?", (metric, day)
            ).fetchone()
        return bool(row and row[0])

    def _settle(
        self,
        metric: str,
        day: int,
        verdicts: Mapping[bytes, str],
        outs: list[bytes],
        vdaf: Any,
        *,
        insert: bool = False,
    ) -> None:
        """Record each report's verdict and add the accepted ones' output shares to the batch's aggregate share
        (unless the batch was released meanwhile: then they are rejected, a released share never changes)."""
        with self._lock, self._db:
            if any(v == "accepted" for v in verdicts.values()) and self._collected(metric, day):
                verdicts = {rid: "rejected:batch_collected" if v == "accepted" else v for rid, v in verdicts.items()}
                outs = []
            accepted = [rid for rid, v in verdicts.items() if v == "accepted"]
            for rid, verdict in verdicts.items():
                status, _, reason = verdict.partition(":")
                if insert:
                    self._db.execute(
                        "INSERT INTO reports (report_id, metric, day, status, reason) VALUES (?, ?, ?, ?, ?)",
                        (rid, metric, day, status, reason or None),
                    )
                else:  # the leader drops the report's bytes once settled
                    self._db.execute(
                        "UPDATE reports SET status = ?, reason = ?, report = NULL WHERE report_id = ?",
                        (status, reason or None, rid),
                    )
                self.counts[verdict] += 1
            if not accepted:
                return
            row = self._db.execute(
                "SELECT share, n, checksum FROM batches WHERE metric = ? AND day = ?", (metric, day)
            ).fetchone()
            share = vdaf.aggregate(outs)
            n, checksum = 0, bytes(32)
            if row is not None:
                share = vdaf.merge([bytes(row[0]), share]) if row[0] is not None else share
                n, checksum = int(row[1]), bytes(row[2])
            for rid in accepted:
                checksum = _xor(checksum, _id_hash(rid))
            self._db.execute(
                "INSERT INTO batches (metric, day, share, n, checksum) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (metric, day) DO UPDATE SET share = excluded.share, n = excluded.n, checksum = excluded.checksum",
                (metric, day, share, n + len(accepted), checksum),
            )

    def _charge(self, seconds: float, reports: int) -> None:
        with self._lock:
            self.cpu_seconds += seconds
            self.cpu_reports += reports

    def aggregate_share(self, metric: str, day: int) -> AggregateShare:
        """Release this aggregator's aggregate share of one batch, once, if it holds at least ``min_batch`` reports
        (with this aggregator's central-DP noise added, if it has any)."""
        if metric not in self.specs:
            raise CollectRefused(404, "unknown_metric", f"{metric!r} is not a prio3 metric here")
        with self._lock, self._db:
            row = self._db.execute(
                "SELECT share, n, checksum, collected FROM batches WHERE metric = ? AND day = ?", (metric, day)
            ).fetchone()
            n = int(row[1]) if row else 0
            if row is not None and row[3]:
                raise CollectRefused(409, "collected", f"the batch {metric}/{day} was released already")
            if n < self.min_batch:
                raise CollectRefused(
                    409,
                    "too_few_reports",
                    f"the batch {metric}/{day} holds {n} reports; at least {self.min_batch} are needed",
                )
            self._db.execute("UPDATE batches SET collected = 1 WHERE metric = ? AND day = ?", (metric, day))
        assert row is not None
        share, noise = bytes(row[0]), self.noise.get(metric)
        if noise is None:
            return AggregateShare(metric, day, share, n, bytes(row[2]))
        noised = noise.apply(self.specs[metric].config, share, self._noise_seed())
        return AggregateShare(metric, day, noised, n, bytes(row[2]), noise.to_json())

    def unreleased_share(self, metric: str, day: int) -> tuple[bytes, int]:
        """The exact aggregate share of a batch and its count, in process only and never over HTTP: for a
        simulation that plays every party (``ldp demo --prio3`` checks the exact aggregate against the truth
        while the collector gets noised shares)."""
        with self._lock:
            row = self._db.execute(
                "SELECT share, n FROM batches WHERE metric = ? AND day = ?", (metric, day)
            ).fetchone()
        if row is None or row[0] is None:
            raise CollectRefused(409, "too_few_reports", f"the batch {metric}/{day} holds no reports")
        return bytes(row[0]), int(row[1])

    def status(self) -> dict[str, Any]:
        with self._lock:
            by_status = dict(self._db.execute("SELECT status, COUNT(*) FROM reports GROUP BY status").fetchall())
        return {
            "role": self.role,
            "key_id": self.key.key_id,
            "metrics": sorted(self.specs),
            "reports": by_status,
            "counts": dict(self.counts),
            "cpu_seconds": self.cpu_seconds,
            "cpu_reports": self.cpu_reports,
            "cpu_per_report_us": 1e6 * self.cpu_seconds / self.cpu_reports if self.cpu_reports else None,
            "central_epsilon": next(iter(self.noise.values())).epsilon if self.noise else None,
        }

    def close(self) -> None:
        with self._lock:
            self._db.close()
