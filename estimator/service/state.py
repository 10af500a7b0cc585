"""The streaming estimator's state: per-key accumulators, tallies, tails, and the exact merge of instances.

One :class:`KeyState` per (metric, spec, day) holds an accumulator and
what the shuffle metadata said about its batches; a :class:`Tally` holds
them by key; a :class:`Tail` is what one partition counted since its last
commit; an :class:`EstimatorState` is all one instance counted (see
:mod:`estimator.service.engine` for how tails become certain).

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
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from estimator.errors import StateError
from estimator.oracles import state_for
from estimator.oracles.base import LinearState
from ldp_core.days import parse_day
from ldp_core.mechanisms import spec_from_dict
from ldp_core.mechanisms.base import ReportSpec
from pipeline.envelope import ShuffleMeta
from pipeline.topics import SHUFFLED_TOPIC
from pipeline.transport.base import TopicPartition

__all__ = [
    "DEFAULT_GROUP",
    "Key",
    "KeyState",
    "Tally",
    "Tail",
    "EstimatorState",
    "merge_states",
    "missing_parts",
    "parse_day",
]

DEFAULT_GROUP = "ldp-estimator"

Key = tuple[str, str, int]  # (metric, spec_id, day)


# -- per-key state -----------------------------------------------------------------------------


@dataclasses.dataclass
class KeyState:
    """The accumulator of one (metric, spec, day) and what the shuffle metadata said about its batches.

    ``central_epsilon``/``central_delta`` are the largest over the batches:
    each report sits in exactly one shuffled batch, so the weakest batch's
    guarantee holds for every report (Feldman et al. 2021 bound per batch).
    """

    acc: LinearState
    batches: int = 0
    epsilon0: float | None = None
    central_epsilon: float | None = None
    central_delta: float | None = None
    bound: str | None = None

    @classmethod
    def empty(cls, spec: ReportSpec) -> KeyState:
        return cls(state_for(spec))

    @property
    def spec(self) -> ReportSpec:
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

    def merge(self, other: KeyState) -> KeyState:
        self.acc.merge(other.acc)
        self.batches += other.batches
        self._meta(other.epsilon0, other.central_epsilon, other.central_delta, other.bound)
        return self

    def copy(self) -> KeyState:
        acc = type(self.acc).from_state(self.spec, self.acc.state())
        return KeyState(acc, self.batches, self.epsilon0, self.central_epsilon, self.central_delta, self.bound)

    def header(self) -> dict[str, Any]:
        return {
            "spec": self.spec.to_dict(),
            "n": self.acc.n,
            "batches": self.batches,
            "epsilon0": self.epsilon0,
            "central_epsilon": self.central_epsilon,
            "central_delta": self.central_delta,
            "bound": self.bound,
        }

    def to_bytes(self) -> bytes:
        head = json.dumps(self.header(), sort_keys=True).encode()
        buf = io.BytesIO()
        np.savez(buf, **self.acc.sums)  # type: ignore[arg-type]  # numpy's stub types **kwds as allow_pickle
        return len(head).to_bytes(4, "little") + head + buf.getvalue()

    @classmethod
    def from_parts(cls, head: Mapping[str, Any], sums: Mapping[str, Any]) -> KeyState:
        spec = spec_from_dict(dict(head["spec"]))
        acc = state_for(spec)
        acc = type(acc).from_state(
            spec, {"spec": spec.to_dict(), "n": int(head["n"]), "sums": {k: np.asarray(v) for k, v in sums.items()}}
        )
        return cls(
            acc,
            int(head["batches"]),
            head.get("epsilon0"),
            head.get("central_epsilon"),
            head.get("central_delta"),
            head.get("bound"),
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> KeyState:
        hl = int.from_bytes(data[:4], "little")
        head = json.loads(data[4 : 4 + hl])
        with np.load(io.BytesIO(data[4 + hl :]), allow_pickle=False) as z:
            sums = {k: z[k] for k in z.files}
        return cls.from_parts(head, sums)

    def to_json_obj(self) -> dict[str, Any]:
        return {**self.header(), "sums": {k: v.tolist() for k, v in self.acc.sums.items()}}

    @classmethod
    def from_json_obj(cls, obj: Mapping[str, Any]) -> KeyState:
        return cls.from_parts(obj, obj["sums"])


class Tally:
    """KeyStates by (metric, spec_id, day); adds and merges exactly (integer sums)."""

    def __init__(self) -> None:
        self.keys: dict[Key, KeyState] = {}

    def add(self, metric: str, day: int, spec: ReportSpec, records: np.ndarray, meta: ShuffleMeta | None) -> Key:
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

    def merge(self, other: Tally) -> Tally:
        for key, ks in other.keys.items():
            self.merge_key(key, ks)
        return self

    def copy(self) -> Tally:
        return Tally().merge(self)

    @property
    def n(self) -> int:
        return sum(ks.acc.n for ks in self.keys.values())

    def to_json_obj(self) -> list[dict[str, Any]]:
        return [
            {"metric": k[0], "spec_id": k[1], "day": k[2], **ks.to_json_obj()} for k, ks in sorted(self.keys.items())
        ]

    def to_bytes(self) -> bytes:
        """Binary form for snapshots: a JSON index, then each key's :meth:`KeyState.to_bytes`."""
        blobs = [(k, ks.to_bytes()) for k, ks in sorted(self.keys.items())]
        index = json.dumps([[k[0], k[1], k[2], len(b)] for k, b in blobs]).encode()
        return len(index).to_bytes(4, "little") + index + b"".join(b for _, b in blobs)

    @classmethod
    def from_bytes(cls, data: bytes) -> Tally:
        n = int.from_bytes(data[:4], "little")
        pos = 4 + n
        t = cls()
        for metric, spec_id, day, size in json.loads(data[4:pos]):
            t.keys[(metric, spec_id, int(day))] = KeyState.from_bytes(data[pos : pos + size])
            pos += size
        return t

    @classmethod
    def from_json_obj(cls, items: Iterable[Mapping[str, Any]]) -> Tally:
        t = cls()
        for it in items:
            ks = KeyState.from_json_obj(it)
            if ks.spec.spec_id != it["spec_id"]:
                raise StateError(
                    f"state entry for {it['metric']} says spec {it['spec_id']} but holds {ks.spec.spec_id}"
                )
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
        return {
            "topic": self.tp.topic,
            "partition": self.tp.partition,
            "base": self.base,
            "end": self.end,
            "started_at": self.started_at,
            "status": self.status,
            "tally": self.tally.to_json_obj(),
        }

    @classmethod
    def from_json_obj(cls, o: Mapping[str, Any]) -> Tail:
        return cls(
            TopicPartition(o["topic"], int(o["partition"])),
            int(o["base"]),
            int(o["end"]),
            float(o["started_at"]),
            Tally.from_json_obj(o["tally"]),
            str(o["status"]),
        )


@dataclasses.dataclass
class EstimatorState:
    """What one instance has counted: certain state, its offset ranges, and tails."""

    certain: Tally
    segments: dict[TopicPartition, list[list[float]]]  # tp -> [[base, end, started_at], ...]
    tails: list[Tail]
    topic: str = SHUFFLED_TOPIC
    group: str = DEFAULT_GROUP
    member: str = ""
    #: the partitions the group gives this member now, each with the group's committed offset when it got it
    #: (where its reading started; ``None``: not known, e.g. a fixed state)
    assigned: dict[int, int] | None = None
    #: the topic's partitions (``None``: not known)
    partition_count: int | None = None

    def counted(self) -> Tally:
        """Everything this instance counted (certain plus every tail)."""
        t = self.certain.copy()
        for tail in self.tails:
            t.merge(tail.tally)
        return t

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "format": "ldp-estimator-state/1",
            "topic": self.topic,
            "group": self.group,
            "member": self.member,
            "certain": self.certain.to_json_obj(),
            "segments": [
                {"topic": tp.topic, "partition": tp.partition, "ranges": rs} for tp, rs in sorted(self.segments.items())
            ],
            "tails": [t.to_json_obj() for t in self.tails],
            "assigned": None if self.assigned is None else {str(p): c for p, c in sorted(self.assigned.items())},
            "partition_count": self.partition_count,
        }

    @classmethod
    def from_json_obj(cls, o: Mapping[str, Any]) -> EstimatorState:
        if o.get("format") != "ldp-estimator-state/1":
            raise StateError(f"not an estimator state (format {o.get('format')!r})")
        segs = {TopicPartition(s["topic"], int(s["partition"])): [list(r) for r in s["ranges"]] for s in o["segments"]}
        return cls(
            Tally.from_json_obj(o["certain"]),
            segs,
            [Tail.from_json_obj(t) for t in o["tails"]],
            o.get("topic", SHUFFLED_TOPIC),
            o.get("group", DEFAULT_GROUP),
            o.get("member", ""),
            None if o.get("assigned") is None else {int(p): int(c) for p, c in o["assigned"].items()},
            None if o.get("partition_count") is None else int(o["partition_count"]),
        )


def _add_range(
    segments: dict[TopicPartition, list[list[float]]],
    tp: TopicPartition,
    base: int,
    end: int,
    started_at: float,
    *,
    join: bool = True,
) -> None:
    """Add the counted range ``[base, end)``; it extends the last range when ``join`` and they touch."""
    rs = segments.setdefault(tp, [])
    if join and rs and int(rs[-1][1]) == base:
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
    for tp, spans in ranges.items():
        spans.sort()
        for (_, e1, i1), (b2, e2, i2) in zip(spans, spans[1:]):
            if b2 < e1:
                raise StateError(
                    f"{tp.topic}[{tp.partition}]: instances {i1} and {i2} both counted offsets "
                    f"{b2}..{min(e1, e2) - 1}; these states do not come from one consumer group run"
                )
    for i, s in enumerate(states):
        for j, t in enumerate(s.tails):
            void = any(
                t.base <= b < t.end and started > t.started_at and (si, sj) != (i, j)
                for b, started, si, sj in starts.get(t.tp, [])
            )
            if not void:
                total.merge(t.tally)
    return total


def missing_parts(states: Sequence[EstimatorState]) -> list[dict[str, Any]]:
    """The offset ranges of the topic that none of ``states`` counted or reads: what a merged answer over them
    lacks when a member did not answer (issue 31).

    Per partition, the counted ranges and tails of every state are joined; a gap below the last counted offset
    is one (another member counted it and did not answer: e.g. the member that held the partition before a
    rebalance), and a partition no answering member reads now misses everything after its last counted offset
    (``to`` ``None``: up to wherever the missing member got). One dict per gap: ``topic``, ``partition``,
    ``from``, ``to``. Records a retention already deleted show as a gap too (they are not known to be gone).
    """
    if not states:
        return []
    topic = states[0].topic
    counts = [s.partition_count for s in states if s.partition_count is not None]
    spans: dict[int, list[tuple[int, int]]] = {}
    held: set[int] = set()
    for s in states:
        mine: set[int] = set()
        for tp, rs in s.segments.items():
            for base, end, _ in rs:
                spans.setdefault(tp.partition, []).append((int(base), int(end)))
                mine.add(tp.partition)
        for t in s.tails:
            spans.setdefault(t.tp.partition, []).append((t.base, t.end))
            mine.add(t.tp.partition)
        if s.assigned is None:
            held.update(mine)
        else:  # a member reads an assigned partition from the offset it got it at: below it is someone else's
            held.update(s.assigned)
            for p, start in s.assigned.items():
                spans.setdefault(p, []).append((start, start))
    n = max(counts) if counts else max([*spans, *held], default=-1) + 1
    out: list[dict[str, Any]] = []
    for p in range(n):
        cursor = 0
        for base, end in sorted(spans.get(p, [])):
            if base > cursor:
                out.append({"topic": topic, "partition": p, "from": cursor, "to": base})
            cursor = max(cursor, end)
        if p not in held:
            out.append({"topic": topic, "partition": p, "from": cursor, "to": None})
    return out
