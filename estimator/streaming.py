"""The streaming estimator: live estimates from the shuffled topic, exact across restarts and instances.

One accumulator per (metric, spec, day) sums the reports of every shuffled
batch consumed (accumulators are linear: :mod:`estimator.oracles.base`), and
a small HTTP service serves the current estimates with confidence intervals
and the shuffle's central ε.

**Exactly once.** Records are counted first into a per-partition *tail*
(what was read since this instance's last commit of that partition). A
checkpoint

1. drops the tails of partitions this member no longer owns (a rebalance
   that rewound uncommitted records, seen as a new
   :attr:`~pipeline.transport.base.Consumer.generation` after a poll, has
   dropped every tail already: the partitions restart from their committed
   offsets);
2. writes, in one SQLite transaction (``synchronous=FULL``), the certain
   state (everything whose offsets were committed), the offset ranges it
   covers, and the tails marked *pending*;
3. commits the tails' end offsets to the group, and on success folds the
   tails into the certain state. A failed commit (rebalance) drops the tails:
   the partitions' next owner reads them again from the committed offsets.

After a crash the snapshot holds the certain state and possibly pending
tails, whose commit may or may not have happened. A pending tail
``[base, end)`` is resolved against the group's committed offset c: if
``c < end`` the commit did not happen (or was overtaken by another member,
which counted those records itself) and the tail is discarded, so the
records, delivered again, are counted once; if ``c >= end`` the tail is kept
as *uncertain*. Records below the committed offset are never delivered
again, and records at or above it are not in the state, so a single
instance never loses or double-counts a report.

**What is served.** Estimates include the open tails (read, not yet
committed), so a report shows up as soon as it is read. When a commit fails
or a rebalance moves a partition, its tail is dropped and read again, so a
live figure can step back for a moment before it returns to the same
total; the snapshot and :func:`merge_states` are never affected.

**Several instances.** Members of one group split the partitions. Each
snapshot records, per partition, the offset ranges it counted and when each
range began. :func:`merge_states` sums the instances' certain states and
keeps an uncertain tail ``[base, end)`` unless some range, of any instance,
that began later starts inside it: a member starts a partition at the
group's committed offset, so if the tail's commit had succeeded every later
range would start at or after ``end``. The merged estimates therefore equal
those of one instance reading every partition. (An instance alone includes
its uncertain tails; only in the double fault -- it crashed between snapshot
and commit, and another member took over the partition before it restarted
-- does its own view over-count until merged.)
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import io
import json
import logging
import math
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from client_sdk.errors import FrameError
from client_sdk.mechanisms import spec_from_dict
from client_sdk.mechanisms.base import MechanismSpec
from client_sdk.metrics import MetricDefinition
from client_sdk.store import immediate_transaction
from pipeline.envelope import ShuffleMeta, decode_envelope
from pipeline.topics import DEFAULT_PARTITIONS, SHUFFLED_TOPIC
from pipeline.transport.base import CommitFailedError, Consumer, Record, TopicPartition, Transport
from estimator.errors import StateError
from estimator.estimate import Estimate
from estimator.oracles import accumulator_for
from estimator.oracles.base import Accumulator

__all__ = [
    "SHUFFLED_TOPIC",
    "DEFAULT_GROUP",
    "DEFAULT_PORT",
    "Key",
    "KeyState",
    "Tally",
    "Tail",
    "EstimatorState",
    "StateError",
    "EstimatorStats",
    "SnapshotStore",
    "StreamingEstimator",
    "merge_states",
    "estimate_json",
    "parse_day",
    "create_app",
]

DEFAULT_GROUP = "ldp-estimator"
DEFAULT_PORT = 8090

log = logging.getLogger(__name__)

Key = tuple[str, str, int]  # (metric, spec_id, day)
_EPOCH = _dt.date(1970, 1, 1)



def parse_day(value: str | int) -> int:
    """A UTC day number from ``20419`` or ``2025-11-27``."""
    if isinstance(value, int):
        return value
    s = str(value).strip()
    if s.lstrip("-").isdigit():
        return int(s)
    try:
        return (_dt.date.fromisoformat(s) - _EPOCH).days
    except ValueError:
        raise ValueError(f"day {value!r} is neither a day number (days since 1970-01-01) nor an ISO date") from None


# -- per-key state -----------------------------------------------------------------------------


@dataclasses.dataclass
class KeyState:
    """The accumulator of one (metric, spec, day) and what the shuffle metadata said about its batches.

    ``central_epsilon``/``central_delta`` are the largest over the batches:
    each report sits in exactly one shuffled batch, so the weakest batch's
    guarantee holds for every report (Feldman et al. 2021 bound per batch).
    """

    acc: Accumulator
    batches: int = 0
    epsilon0: float | None = None
    central_epsilon: float | None = None
    central_delta: float | None = None
    bound: str | None = None

    @classmethod
    def empty(cls, spec: MechanismSpec) -> "KeyState":
        return cls(accumulator_for(spec))

    @property
    def spec(self) -> MechanismSpec:
        return self.acc.spec

    def add(self, records: np.ndarray, meta: ShuffleMeta | None) -> None:
        self.acc.update(records)
        self.batches += 1
        if meta is not None:
            self._meta(meta.epsilon0, meta.central_epsilon, meta.central_delta, meta.bound)

    def _meta(self, eps0: float | None, ce: float | None, cd: float | None, bound: str | None) -> None:
        if eps0 is not None:
            self.epsilon0 = eps0 if self.epsilon0 is None else max(self.epsilon0, eps0)
        if ce is not None and (self.central_epsilon is None or ce > self.central_epsilon):
            self.central_epsilon, self.bound = ce, bound
        if cd is not None:
            self.central_delta = cd if self.central_delta is None else max(self.central_delta, cd)

    def merge(self, other: "KeyState") -> "KeyState":
        self.acc.merge(other.acc)
        self.batches += other.batches
        self._meta(other.epsilon0, other.central_epsilon, other.central_delta, other.bound)
        return self

    def copy(self) -> "KeyState":
        acc = type(self.acc).from_state(self.spec, self.acc.state())
        return KeyState(acc, self.batches, self.epsilon0, self.central_epsilon, self.central_delta, self.bound)

    def header(self) -> dict[str, Any]:
        return {"spec": self.spec.to_dict(), "n": self.acc.n, "batches": self.batches, "epsilon0": self.epsilon0,
                "central_epsilon": self.central_epsilon, "central_delta": self.central_delta, "bound": self.bound}

    def to_bytes(self) -> bytes:
        head = json.dumps(self.header(), sort_keys=True).encode()
        buf = io.BytesIO()
        np.savez(buf, **self.acc.sums)
        return len(head).to_bytes(4, "little") + head + buf.getvalue()

    @classmethod
    def from_parts(cls, head: Mapping[str, Any], sums: Mapping[str, Any]) -> "KeyState":
        spec = spec_from_dict(dict(head["spec"]))
        acc = accumulator_for(spec)
        acc = type(acc).from_state(spec, {"spec": spec.to_dict(), "n": int(head["n"]),
                                          "sums": {k: np.asarray(v) for k, v in sums.items()}})
        return cls(acc, int(head["batches"]), head.get("epsilon0"), head.get("central_epsilon"),
                   head.get("central_delta"), head.get("bound"))

    @classmethod
    def from_bytes(cls, data: bytes) -> "KeyState":
        hl = int.from_bytes(data[:4], "little")
        head = json.loads(data[4: 4 + hl])
        with np.load(io.BytesIO(data[4 + hl:]), allow_pickle=False) as z:
            sums = {k: z[k] for k in z.files}
        return cls.from_parts(head, sums)

    def to_json_obj(self) -> dict[str, Any]:
        return {**self.header(), "sums": {k: v.tolist() for k, v in self.acc.sums.items()}}

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> "KeyState":
        return cls.from_parts(obj, obj["sums"])


class Tally:
    """KeyStates by (metric, spec_id, day); adds and merges exactly (integer sums)."""

    def __init__(self) -> None:
        self.keys: dict[Key, KeyState] = {}

    def add(self, metric: str, day: int, spec: MechanismSpec, records: np.ndarray, meta: ShuffleMeta | None) -> Key:
        key = (metric, spec.spec_id, int(day))
        ks = self.keys.get(key)
        if ks is None:
            ks = self.keys[key] = KeyState.empty(spec)
        ks.add(records, meta)
        return key

    def merge_key(self, key: Key, ks: KeyState) -> None:
        mine = self.keys.get(key)
        if mine is None:
            self.keys[key] = ks.copy()
        else:
            mine.merge(ks)

    def merge(self, other: "Tally") -> "Tally":
        for key, ks in other.keys.items():
            self.merge_key(key, ks)
        return self

    def copy(self) -> "Tally":
        return Tally().merge(self)

    @property
    def n(self) -> int:
        return sum(ks.acc.n for ks in self.keys.values())

    def to_json_obj(self) -> list[dict[str, Any]]:
        return [{"metric": k[0], "spec_id": k[1], "day": k[2], **ks.to_json_obj()} for k, ks in sorted(self.keys.items())]

    def to_bytes(self) -> bytes:
        """Binary form for snapshots: a JSON index, then each key's :meth:`KeyState.to_bytes`."""
        blobs = [(k, ks.to_bytes()) for k, ks in sorted(self.keys.items())]
        index = json.dumps([[k[0], k[1], k[2], len(b)] for k, b in blobs]).encode()
        return len(index).to_bytes(4, "little") + index + b"".join(b for _, b in blobs)

    @classmethod
    def from_bytes(cls, data: bytes) -> "Tally":
        n = int.from_bytes(data[:4], "little")
        pos = 4 + n
        t = cls()
        for metric, spec_id, day, size in json.loads(data[4:pos]):
            t.keys[(metric, spec_id, int(day))] = KeyState.from_bytes(data[pos:pos + size])
            pos += size
        return t

    @classmethod
    def from_json_obj(cls, items: Iterable[Mapping[str, Any]]) -> "Tally":
        t = cls()
        for it in items:
            ks = KeyState.from_json_obj(it)
            if not ks.spec.has_id(it["spec_id"]):  # snapshots from before the RFC 8785 ids hold the legacy one
                raise StateError(f"state entry for {it['metric']} says spec {it['spec_id']} but holds {ks.spec.spec_id}")
            t.keys[(str(it["metric"]), str(it["spec_id"]), int(it["day"]))] = ks
        return t


@dataclasses.dataclass
class Tail:
    """Records of one partition counted since its last commit: offsets ``[base, end)``."""

    tp: TopicPartition
    base: int
    end: int
    started_at: float
    tally: Tally
    status: str = "open"  # open (in memory) | pending (on disk, commit unknown) | uncertain (resolved as counted)

    def to_json_obj(self) -> dict[str, Any]:
        return {"topic": self.tp.topic, "partition": self.tp.partition, "base": self.base, "end": self.end,
                "started_at": self.started_at, "status": self.status, "tally": self.tally.to_json_obj()}

    @classmethod
    def from_json_obj(cls, o: Mapping[str, Any]) -> "Tail":
        return cls(TopicPartition(o["topic"], int(o["partition"])), int(o["base"]), int(o["end"]),
                   float(o["started_at"]), Tally.from_json_obj(o["tally"]), str(o["status"]))


@dataclasses.dataclass
class EstimatorState:
    """What one instance has counted: certain state, its offset ranges, and tails."""

    certain: Tally
    segments: dict[TopicPartition, list[list[float]]]  # tp -> [[base, end, started_at], ...]
    tails: list[Tail]
    topic: str = SHUFFLED_TOPIC
    group: str = DEFAULT_GROUP
    member: str = ""

    def counted(self) -> Tally:
        """Everything this instance counted (certain plus every tail)."""
        t = self.certain.copy()
        for tail in self.tails:
            t.merge(tail.tally)
        return t

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "format": "ldp-estimator-state/1", "topic": self.topic, "group": self.group, "member": self.member,
            "certain": self.certain.to_json_obj(),
            "segments": [{"topic": tp.topic, "partition": tp.partition, "ranges": rs}
                         for tp, rs in sorted(self.segments.items())],
            "tails": [t.to_json_obj() for t in self.tails],
        }

    @classmethod
    def from_json_obj(cls, o: Mapping[str, Any]) -> "EstimatorState":
        if o.get("format") != "ldp-estimator-state/1":
            raise StateError(f"not an estimator state (format {o.get('format')!r})")
        segs = {TopicPartition(s["topic"], int(s["partition"])): [list(r) for r in s["ranges"]] for s in o["segments"]}
        return cls(Tally.from_json_obj(o["certain"]), segs, [Tail.from_json_obj(t) for t in o["tails"]],
                   o.get("topic", SHUFFLED_TOPIC), o.get("group", DEFAULT_GROUP), o.get("member", ""))


def _add_range(segments: dict[TopicPartition, list[list[float]]], tp: TopicPartition, base: int, end: int,
               started_at: float) -> None:
    rs = segments.setdefault(tp, [])
    if rs and int(rs[-1][1]) == base:
        rs[-1][1] = end
    else:
        rs.append([base, end, started_at])


def merge_states(states: Sequence[EstimatorState]) -> Tally:
    """The exact union of several instances' counts (see the module docstring).

    Raises :class:`StateError` if two instances' certain ranges overlap
    (they would count a report twice) or the states come from different
    topics or groups.
    """
    if not states:
        return Tally()
    if len({(s.topic, s.group) for s in states}) > 1:
        raise StateError("states come from different topics or consumer groups and do not merge")
    total = Tally()
    starts: dict[TopicPartition, list[tuple[int, float, int, int]]] = {}  # (base, started_at, state, id)
    ranges: dict[TopicPartition, list[tuple[int, int, int]]] = {}
    for i, s in enumerate(states):
        total.merge(s.certain)
        for tp, rs in s.segments.items():
            for base, end, started in rs:
                starts.setdefault(tp, []).append((int(base), float(started), i, -1))
                ranges.setdefault(tp, []).append((int(base), int(end), i))
        for j, t in enumerate(s.tails):
            starts.setdefault(t.tp, []).append((t.base, t.started_at, i, j))
    for tp, rs in ranges.items():
        rs.sort()
        for (b1, e1, i1), (b2, e2, i2) in zip(rs, rs[1:]):
            if b2 < e1:
                raise StateError(f"{tp.topic}[{tp.partition}]: instances {i1} and {i2} both counted offsets "
                                 f"{b2}..{min(e1, e2) - 1}; these states do not come from one consumer group run")
    for i, s in enumerate(states):
        for j, t in enumerate(s.tails):
            void = any(t.base <= b < t.end and started > t.started_at and (si, sj) != (i, j)
                       for b, started, si, sj in starts.get(t.tp, []))
            if not void:
                total.merge(t.tally)
    return total


# -- estimates as JSON --------------------------------------------------------------------------


def _finite(x: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in np.asarray(x, dtype=np.float64)]


def estimate_json(metric: str, key: Key, ks: KeyState, *, confidence: float = 0.95, norm_sub: bool = False,
                  definition: MetricDefinition | None = None) -> dict[str, Any]:
    """The JSON answer of ``GET /v1/estimates/{metric}``."""
    est: Estimate = ks.acc.estimate(confidence)
    if norm_sub:
        est = est.norm_sub()
    spec = ks.spec
    out: dict[str, Any] = {
        "metric": metric,
        "day": key[2],
        "date": (_EPOCH + _dt.timedelta(days=key[2])).isoformat(),
        "spec_id": key[1],
        "mechanism": spec.name,
        "spec": spec.to_dict(),
        "n": est.n,
        "batches": ks.batches,
        "epsilon": spec.epsilon,
        "epsilon0_reported": ks.epsilon0,
        "central_epsilon": ks.central_epsilon,
        "central_delta": ks.central_delta,
        "central_bound": ks.bound,
        "confidence": est.confidence,
        "postprocessing": est.postprocessing,
        "counts": _finite(est.counts),
        "std_error": _finite(est.std_error),
        "ci_low": _finite(est.ci_low),
        "ci_high": _finite(est.ci_high),
    }
    if definition is not None and hasattr(definition.domain, "values"):
        out["labels"] = [definition.domain.label(i) for i in range(spec.domain_size)]
    return out


# -- snapshots ----------------------------------------------------------------------------------


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
        self._conn.execute("PRAGMA journal_mode=WAL")
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
                "SELECT topic, partition, base, end, started_at FROM segments ORDER BY topic, partition, base"):
            segments.setdefault(TopicPartition(topic, int(part)), []).append([int(base), int(end), float(started)])
        tails = []
        for topic, part, base, end, started, status, blob in self._conn.execute(
                "SELECT topic, partition, base, end, started_at, status, blob FROM tails"):
            tally = Tally.from_bytes(blob) if blob else Tally()
            tails.append(Tail(TopicPartition(topic, int(part)), int(base), int(end), float(started), tally, status))
        return certain, segments, tails

    def write(self, certain: Tally, dirty: Iterable[Key], segments: Mapping[TopicPartition, list[list[float]]],
              tails: Iterable[Tail]) -> None:
        c = self._conn
        with immediate_transaction(c):
            for key in dirty:
                c.execute("INSERT OR REPLACE INTO certain(metric, spec_id, day, blob) VALUES (?,?,?,?)",
                          (key[0], key[1], key[2], certain.keys[key].to_bytes()))
            c.execute("DELETE FROM segments")
            c.executemany("INSERT INTO segments VALUES (?,?,?,?,?)",
                          [(tp.topic, tp.partition, int(b), int(e), float(s))
                           for tp, rs in segments.items() for b, e, s in rs])
            c.execute("DELETE FROM tails")
            c.executemany("INSERT INTO tails VALUES (?,?,?,?,?,?,?)",
                          [(t.tp.topic, t.tp.partition, t.base, t.end, t.started_at, t.status,
                            t.tally.to_bytes()) for t in tails])

    def close(self) -> None:
        self._conn.close()


# -- the engine ---------------------------------------------------------------------------------


@dataclasses.dataclass
class EstimatorStats:
    records: int = 0
    reports: int = 0
    undecodable: int = 0
    checkpoints: int = 0
    commit_failures: int = 0
    rejoins: int = 0
    dropped_tails: int = 0
    restored_uncertain: int = 0
    discarded_pending: int = 0
    last_checkpoint: float = 0.0  # wall-clock time of the last successful commit

    def to_json_obj(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class StreamingEstimator:
    """Consumes the shuffled topic in a consumer group and keeps exact, restartable estimates.

    ``state_dir`` holds ``estimator.sqlite3`` (see :class:`SnapshotStore`).
    A checkpoint (snapshot, then offset commit) happens every
    ``checkpoint_seconds`` while records flow, and on :meth:`close`.
    """

    def __init__(self, transport: Transport, state_dir: str | Path, specs: Any, *, topic: str = SHUFFLED_TOPIC,
                 group: str = DEFAULT_GROUP, member: str | None = None, checkpoint_seconds: float = 1.0,
                 session_timeout: float = 10.0, metrics: Mapping[str, MetricDefinition] | None = None,
                 partitions: int = DEFAULT_PARTITIONS) -> None:
        self.transport = transport
        self.specs = specs
        self.topic = topic
        self.group = group
        self.metrics = dict(metrics or getattr(specs, "metrics", {}) or {})
        self.checkpoint_seconds = float(checkpoint_seconds)
        self.session_timeout = float(session_timeout)
        self.partitions = int(partitions)
        self.state_dir = Path(state_dir).expanduser().resolve()
        self.store = SnapshotStore(self.state_dir / "estimator.sqlite3")
        meta = self.store.meta()
        if meta and (meta.get("topic"), meta.get("group")) != (topic, group):
            raise StateError(f"{self.state_dir} holds the state of topic {meta.get('topic')!r}, group "
                             f"{meta.get('group')!r}; use another --state folder for topic {topic!r}, group {group!r}")
        self.member = member or meta.get("member") or f"estimator-{uuid.uuid4().hex[:12]}"
        self.store.set_meta(topic=topic, group=group, member=self.member)
        self.certain, self.segments, loaded = self.store.load()
        self.uncertain = [t for t in loaded if t.status == "uncertain"]
        self._pending = [t for t in loaded if t.status == "pending"]
        self.open: dict[TopicPartition, Tail] = {}
        self._dirty: set[Key] = set()
        self._generation = 0
        self._consumer: Consumer | None = None
        self._last_checkpoint = time.monotonic()
        self.lock = threading.RLock()
        self.stats = EstimatorStats()

    # -- consumer ----------------------------------------------------------------------------

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self.transport.ensure_topic(self.topic, self.partitions)
            self._consumer = self.transport.consume(self.topic, self.group, member=self.member,
                                                    session_timeout=self.session_timeout)
            if self._pending:
                self._resolve_pending(self._consumer)
        return self._consumer

    def _resolve_pending(self, consumer: Consumer) -> None:
        """Pending tails from before a crash: counted iff the group's offset reached their end."""
        with self.lock:
            for t in self._pending:
                c = consumer.committed(t.tp) or 0
                if c >= t.end:
                    t.status = "uncertain"
                    self.uncertain.append(t)
                    self.stats.restored_uncertain += 1
                else:
                    self.stats.discarded_pending += 1
            self._pending = []
            self.store.write(self.certain, (), self.segments, self.uncertain)

    def _rejoin(self, why: str) -> None:
        log.warning("estimator %s: %s; dropping uncommitted tails and rejoining group %s", self.member, why, self.group)
        self.stats.rejoins += 1
        with self.lock:
            self.stats.dropped_tails += len(self.open)
            self.open.clear()
        self._generation = 0
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    # -- consuming ---------------------------------------------------------------------------

    def poll_once(self, *, max_records: int = 500, timeout: float = 0.2) -> int:
        consumer = self.consumer
        recs = consumer.poll(max_records=max_records, timeout=timeout)
        with self.lock:
            if consumer.generation != self._generation:
                # a rebalance restarted every partition from its committed offset: the tails are void
                self._generation = consumer.generation
                self.stats.dropped_tails += len(self.open)
                self.open.clear()
            for rec in recs:
                self._accept(rec)
        return len(recs)

    def _accept(self, rec: Record) -> None:
        tp = TopicPartition(rec.topic, rec.partition)
        tail = self.open.get(tp)
        if tail is not None and rec.offset < tail.end:
            # the consumer restarted the partition from the group's committed offset
            self.stats.dropped_tails += 1
            del self.open[tp]
            tail = None
        if tail is None:
            base = self.consumer.committed(tp) or 0
            tail = self.open[tp] = Tail(tp, base, base, time.time(), Tally())
        self.stats.records += 1
        try:
            sb = decode_envelope(rec.value, self.specs)
        except FrameError as exc:
            self.stats.undecodable += 1
            log.error("estimator: %s[%d]@%d cannot be decoded and is not counted: %s", rec.topic, rec.partition,
                      rec.offset, exc)
        else:
            b = sb.batch
            tail.tally.add(b.metric, b.day, b.spec, b.records, sb.meta)
            self.stats.reports += len(b)
        tail.end = rec.offset + 1

    def checkpoint(self) -> bool:
        """Snapshot, then commit (see the module docstring); returns whether offsets were committed."""
        self._last_checkpoint = time.monotonic()
        consumer = self._consumer
        if consumer is None:
            return False
        owned = consumer.assignment()
        with self.lock:
            for tp in [tp for tp in self.open if tp not in owned]:
                self.stats.dropped_tails += 1
                del self.open[tp]
            tails = dict(self.open)
        if not tails and not self._dirty:
            return False
        with self.lock:
            pending = [dataclasses.replace(t, status="pending") for t in tails.values()]
            self.store.write(self.certain, self._dirty, self.segments, self.uncertain + pending)
            self._dirty = set()
        if not tails:
            return False
        try:
            consumer.commit({tp: t.end for tp, t in tails.items()})
        except CommitFailedError as exc:
            log.info("estimator %s: commit failed (%s); tails dropped, their records come again", self.member, exc)
            self.stats.commit_failures += 1
            with self.lock:
                self.stats.dropped_tails += len(self.open)
                self.open.clear()
            return False
        with self.lock:
            for tp, t in tails.items():
                self.certain.merge(t.tally)
                self._dirty.update(t.tally.keys)
                _add_range(self.segments, tp, t.base, t.end, t.started_at)
                if self.open.get(tp) is t:
                    del self.open[tp]
        self.stats.checkpoints += 1
        self.stats.last_checkpoint = time.time()
        return True

    def run(self, *, stop: threading.Event | None = None, idle_timeout: float | None = None,
            max_records: int = 500) -> EstimatorStats:
        """Consume until ``stop`` is set or nothing arrived for ``idle_timeout`` seconds; checkpoint at the end."""
        idle_since = time.monotonic()
        while stop is None or not stop.is_set():
            if self.poll_once(max_records=max_records, timeout=0.2):
                idle_since = time.monotonic()
            if time.monotonic() - self._last_checkpoint >= self.checkpoint_seconds:
                self.checkpoint()
            if idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout:
                break
        self.checkpoint()
        return self.stats

    def close(self) -> None:
        """Checkpoint, leave the group and close the snapshot store."""
        try:
            if self._consumer is not None:
                self.checkpoint()
        finally:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
            self.store.close()

    def __enter__(self) -> "StreamingEstimator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries -----------------------------------------------------------------------------

    def state(self) -> EstimatorState:
        """A copy of this instance's state; open tails are included (as ``open``)."""
        with self.lock:
            tails = [dataclasses.replace(t, tally=t.tally.copy()) for t in self.uncertain]
            tails += [dataclasses.replace(t, tally=t.tally.copy()) for t in self.open.values()]
            return EstimatorState(self.certain.copy(), {tp: [list(r) for r in rs] for tp, rs in self.segments.items()},
                                  tails, self.topic, self.group, self.member)

    def counted(self, metric: str | None = None) -> Tally:
        """Everything counted so far (certain, uncertain and open tails), for one metric or all."""
        with self.lock:
            t = Tally()
            for tally in [self.certain, *(x.tally for x in self.uncertain), *(x.tally for x in self.open.values())]:
                for key, ks in tally.keys.items():
                    if metric is None or key[0] == metric:
                        t.merge_key(key, ks)
            return t


# -- HTTP ---------------------------------------------------------------------------------------


def _select(tally: Tally, metric: str, day: str | None, spec_id: str | None) -> tuple[Key, KeyState]:
    from fastapi import HTTPException

    keys = [k for k in tally.keys if k[0] == metric]
    if not keys:
        raise HTTPException(404, f"no reports of metric {metric!r} were counted yet")
    if day is None:
        d = max(k[2] for k in keys)
    else:
        try:
            d = parse_day(day)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
    keys = [k for k in keys if k[2] == d and (spec_id is None or k[1] == spec_id)]
    if not keys:
        raise HTTPException(404, f"no reports of metric {metric!r} on day {d}"
                            + (f" under spec {spec_id}" if spec_id else ""))
    if len(keys) > 1:
        raise HTTPException(409, f"metric {metric!r} has reports under several specs on day {d}: "
                            f"{sorted(k[1] for k in keys)}; choose one with ?spec_id=")
    return keys[0], tally.keys[keys[0]]


def create_app(estimator: StreamingEstimator | None = None, *, state: Any = None,
               peers: Sequence[str] = (), metrics: Mapping[str, MetricDefinition] | None = None) -> Any:
    """The estimator's HTTP API (FastAPI).

    ``GET /v1/estimates/{metric}?day=&spec_id=&confidence=&norm_sub=&merged=``,
    ``GET /v1/estimates`` (what is available), ``GET /v1/state`` (this
    instance's state, for :func:`merge_states`), ``/healthz``, ``/metrics``.
    With ``peers`` (base URLs of the other instances of the group) and
    ``merged=true``, the answer merges every instance's state.
    Without an ``estimator``, ``state`` (a callable returning an
    :class:`EstimatorState`) serves a fixed state.
    """
    from fastapi import FastAPI, HTTPException, Query
    from fastapi.responses import PlainTextResponse

    app = FastAPI(title="ldp estimator", version="1",
                  description="Live frequency estimates with confidence intervals from the shuffled report stream.")
    defs = dict(metrics or (estimator.metrics if estimator is not None else {}))

    def local_state() -> EstimatorState:
        if estimator is not None:
            return estimator.state()
        return state()

    def merged_tally(metric: str, merged: bool) -> Tally:
        if not merged or not peers:
            return estimator.counted(metric) if estimator is not None else local_state().counted()
        import httpx

        states = [local_state()]
        for url in peers:
            try:
                r = httpx.get(url.rstrip("/") + "/v1/state", timeout=30.0)
                r.raise_for_status()
            except httpx.HTTPError as exc:
                raise HTTPException(502, f"peer {url} did not answer /v1/state: {exc}") from None
            states.append(EstimatorState.from_json_obj(r.json()))
        try:
            return merge_states(states)
        except StateError as exc:
            raise HTTPException(409, str(exc)) from None

    @app.get("/healthz")
    def healthz() -> dict[str, Any]:
        return {"status": "ok"}

    @app.get("/v1/estimates")
    def available() -> dict[str, Any]:
        t = estimator.counted() if estimator is not None else local_state().counted()
        return {"estimates": [{"metric": k[0], "spec_id": k[1], "day": k[2], "n": ks.acc.n, "batches": ks.batches}
                              for k, ks in sorted(t.keys.items())]}

    @app.get("/v1/estimates/{metric}")
    def estimates(metric: str, day: str | None = None, spec_id: str | None = None,
                  confidence: float = Query(0.95, gt=0.0, lt=1.0), norm_sub: bool = False,
                  merged: bool = False) -> dict[str, Any]:
        key, ks = _select(merged_tally(metric, merged), metric, day, spec_id)
        out = estimate_json(metric, key, ks, confidence=confidence, norm_sub=norm_sub, definition=defs.get(metric))
        out["merged_instances"] = 1 + (len(peers) if merged else 0)
        return out

    @app.get("/v1/state")
    def get_state() -> dict[str, Any]:
        return local_state().to_json_obj()

    @app.get("/metrics", response_class=PlainTextResponse)
    def prometheus() -> str:
        lines = []
        if estimator is not None:
            for k, v in estimator.stats.to_json_obj().items():
                lines.append(f"# TYPE ldp_estimator_{k} {'gauge' if k == 'last_checkpoint' else 'counter'}")
                lines.append(f"ldp_estimator_{k} {v}")
        return "\n".join(lines) + "\n"

    return app
