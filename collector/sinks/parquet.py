"""The Parquet sink: shuffled batches become a dataset partitioned by metric and day.

Layout of a dataset rooted at ``root``::

    metric=<name>/day=<N>/part-<topic>-<partition>-<first>-<last>-<spec_id>.parquet
    _chunks/<topic>/<partition>.log       chunk boundaries, one "first last" line per chunk
    _chunks/<topic>/<partition>.lock      serializes appends to that log
    _undecodable/<topic>-<partition>-<offset>.ldps   shuffled batches no loaded metrics file explains

``N`` is the UTC day number (days since 1970-01-01). A file holds the
reports of one metric, day and spec taken from one *chunk*: the records
(shuffled batches) of one topic partition with offsets ``first..last``
(20-digit zero-padded). Columns mirror the spec's record layout: integer
fields as integer columns of the same width and signedness, packed-bit
(sub-array) fields as ``fixed_size_binary`` of the field's byte width, in
the wire's byte order; plus a dictionary-encoded ``spec_id`` column. The
file's schema metadata holds ``ldp.spec`` (the spec dict, so a file is
readable without any metrics file), ``ldp.spec_id``, ``ldp.metric``,
``ldp.day``, ``ldp.source`` (topic, partition, first, last) and
``ldp.shuffles`` (the shuffle metadata of every batch in the file, with
its offset).

**Durability.** A file is written to a hidden temporary name in its folder,
flushed and fsync'ed, renamed over its final name, and the folder is
fsync'ed (as are folders created on the way). The sink commits a
partition's offset only after every file of the chunk is durable.

**Exactly once.** A crash between a file's rename and the offset commit
makes the chunk's records come back. They must land in the same files, not
in new ones: a file's name is a function of its chunk, and the chunk's
boundaries are fixed *before* any of its files is written, by appending
``first last`` to the partition's chunk log (under an exclusive lock,
fsync'ed). Whoever writes a chunk that starts at ``first`` -- the same
process after a restart, or another member of the group after a
rebalance -- reads the log, keeps the recorded ``last`` (waiting for more
records if it has fewer), and writes the same names with the same content
(records in offset order: deterministic), skipping files that already
exist. Every commit is at a chunk end, so a new owner always starts at a
chunk start. A member that finds the group's committed offset moved under
one of its chunks (another member owned the partition meanwhile) drops
its buffers and rejoins instead of writing; a rebalance that rewound
uncommitted records (a new :attr:`~collector.transport.base.Consumer.generation`
after a poll) drops every buffer at once. Files are complete or absent
(atomic rename), so a reader that lists the folders sees each report once.

The lock is an ``fcntl`` lock: correct for every writer on one machine (the
embedded transport's case). On Kafka the group protocol already keeps two
members from owning a partition at once, so several machines may share the
dataset folder.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import re
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from client_sdk.errors import FrameError, LDPError
from client_sdk.mechanisms import spec_from_dict
from client_sdk.mechanisms.base import MechanismSpec
from collector.envelope import ShuffleMeta, decode_envelope
from collector.topics import DEFAULT_PARTITIONS, SHUFFLED_TOPIC
from collector.transport.base import CommitFailedError, Consumer, Record, TopicPartition, Transport

__all__ = [
    "SHUFFLED_TOPIC",
    "DEFAULT_GROUP",
    "FORMAT",
    "SinkError",
    "PartFile",
    "PartData",
    "SinkStats",
    "records_to_table",
    "table_to_records",
    "part_name",
    "parse_part_name",
    "write_table_atomic",
    "fsync_dir",
    "list_parts",
    "read_part",
    "ChunkLog",
    "ParquetSink",
]

DEFAULT_GROUP = "ldp-parquet-sink"
FORMAT = "ldp-parquet/1"

log = logging.getLogger(__name__)

_PART_RE = re.compile(r"^part-(?P<topic>[A-Za-z0-9._-]+)-(?P<partition>\d+)-(?P<first>\d{20})-(?P<last>\d{20})-"
                      r"(?P<spec_id>[0-9a-f]{16})\.parquet$")


class SinkError(LDPError):
    """The dataset or its chunk logs are inconsistent, or a file cannot be read as a sink part."""


# -- records <-> Arrow ---------------------------------------------------------------------------


def records_to_table(records: np.ndarray, spec: MechanismSpec) -> pa.Table:
    """An Arrow table whose columns mirror ``spec.record_dtype``, plus ``spec_id``."""
    dtype = spec.record_dtype
    if records.dtype != dtype:
        raise FrameError(f"records have dtype {records.dtype}, spec {spec.name} ({spec.spec_id}) needs {dtype}")
    n = int(records.size)
    arrays, names = [], []
    for name in dtype.names or ():
        ftype = dtype.fields[name][0]
        col = records[name]
        if ftype.subdtype is not None:
            raw = np.ascontiguousarray(col).view(np.uint8).reshape(-1)
            arr = pa.FixedSizeBinaryArray.from_buffers(pa.binary(ftype.itemsize), n, [None, pa.py_buffer(raw)])
        else:
            arr = pa.array(np.ascontiguousarray(col, dtype=ftype.newbyteorder("=")))
        arrays.append(arr)
        names.append(name)
    arrays.append(pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([spec.spec_id])))
    names.append("spec_id")
    return pa.Table.from_arrays(arrays, names=names)


def table_to_records(table: pa.Table, spec: MechanismSpec) -> np.ndarray:
    """Inverse of :func:`records_to_table`; checks the columns against the spec's layout."""
    dtype = spec.record_dtype
    n = table.num_rows
    out = np.empty(n, dtype=dtype)
    for name in dtype.names or ():
        if name not in table.column_names:
            raise SinkError(f"column {name!r} of spec {spec.name} ({spec.spec_id}) is missing; "
                            f"the file has {table.column_names}")
        ftype = dtype.fields[name][0]
        col = table.column(name).combine_chunks()
        if ftype.subdtype is not None:
            if col.type != pa.binary(ftype.itemsize):
                raise SinkError(f"column {name!r} is {col.type}, expected fixed_size_binary[{ftype.itemsize}]")
            if n:
                data = np.frombuffer(col.buffers()[1], dtype=np.uint8, count=n * ftype.itemsize,
                                     offset=col.offset * ftype.itemsize)
                out[name] = data.view(ftype.base).reshape((n, *ftype.shape))
        else:
            if col.type != pa.from_numpy_dtype(ftype.newbyteorder("=")):
                raise SinkError(f"column {name!r} is {col.type}, expected {ftype}")
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


# -- names and durable files -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PartFile:
    """A data file of the dataset, described by its path and name."""

    path: Path
    metric: str
    day: int
    topic: str
    partition: int
    first: int
    last: int
    spec_id: str


def part_name(topic: str, partition: int, first: int, last: int, spec_id: str) -> str:
    """``part-<topic>-<partition>-<first>-<last>-<spec_id>.parquet`` (offsets zero-padded to 20 digits)."""
    return f"part-{topic}-{partition}-{first:020d}-{last:020d}-{spec_id}.parquet"


def parse_part_name(name: str) -> dict[str, Any] | None:
    """The fields of a part file name, or ``None`` if ``name`` is not one."""
    m = _PART_RE.match(name)
    if m is None:
        return None
    return {"topic": m["topic"], "partition": int(m["partition"]), "first": int(m["first"]),
            "last": int(m["last"]), "spec_id": m["spec_id"]}


def fsync_dir(path: Path) -> None:
    """fsync a folder, so that entries created or renamed in it survive a power cut."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs_durable(path: Path) -> None:
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            d.mkdir()
        fsync_dir(d.parent)


def write_table_atomic(path: Path, table: pa.Table) -> None:
    """Write ``table`` to ``path`` atomically and durably: temp name, fsync, rename, fsync folder."""
    _makedirs_durable(path.parent)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "wb") as f:
            pq.write_table(table, f, compression="zstd")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


# -- reading -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PartData:
    """The content of one part file."""

    file: PartFile
    spec: MechanismSpec
    records: np.ndarray
    shuffles: list[dict[str, Any]]


def list_parts(root: str | os.PathLike[str], metric: str, days: Iterable[int] | None = None) -> list[PartFile]:
    """The part files of ``metric`` (for ``days`` if given), sorted by day, topic, partition and offset."""
    base = Path(root) / f"metric={metric}"
    wanted = None if days is None else set(int(d) for d in days)
    out = []
    if not base.is_dir():
        return out
    for day_dir in base.iterdir():
        if not day_dir.is_dir() or not day_dir.name.startswith("day="):
            continue
        try:
            day = int(day_dir.name[4:])
        except ValueError:
            continue
        if wanted is not None and day not in wanted:
            continue
        for f in day_dir.iterdir():
            fields = parse_part_name(f.name)
            if fields is not None:
                out.append(PartFile(path=f, metric=metric, day=day, **fields))
    out.sort(key=lambda p: (p.day, p.topic, p.partition, p.first, p.spec_id))
    return out


def read_part(part: PartFile | str | os.PathLike[str]) -> PartData:
    """Read a part file; its spec comes from the file's own metadata."""
    if not isinstance(part, PartFile):
        path = Path(part)
        fields = parse_part_name(path.name)
        if fields is None:
            raise SinkError(f"{path} is not named like a part file (part-<topic>-<p>-<first>-<last>-<spec>.parquet)")
        md = pq.read_schema(path).metadata or {}
        part = PartFile(path=path, metric=md.get(b"ldp.metric", b"").decode(), day=int(md.get(b"ldp.day", b"0")),
                        **fields)
    table = pq.read_table(part.path)
    md = table.schema.metadata or {}
    if md.get(b"ldp.format") != FORMAT.encode():
        raise SinkError(f"{part.path} was not written by this sink (format {md.get(b'ldp.format')!r})")
    spec = spec_from_dict(json.loads(md[b"ldp.spec"]))
    if spec.spec_id != part.spec_id or md.get(b"ldp.spec_id", b"").decode() != spec.spec_id:
        raise SinkError(f"{part.path}: its metadata's spec has id {spec.spec_id}, its name says {part.spec_id}")
    return PartData(part, spec, table_to_records(table, spec), json.loads(md.get(b"ldp.shuffles", b"[]")))


# -- chunk logs --------------------------------------------------------------------------------


class ChunkLog:
    """The chunk boundaries of one topic partition: an append-only ``first last`` text file.

    Use :meth:`locked` around :meth:`lookup`/:meth:`append`; the lock is an
    exclusive ``fcntl`` lock on a sibling ``.lock`` file. The content is read
    incrementally (only what was appended since the last read).
    """

    def __init__(self, root: Path, topic: str, partition: int) -> None:
        self.dir = root / "_chunks" / topic
        self.path = self.dir / f"{partition}.log"
        self.lock_path = self.dir / f"{partition}.lock"
        self._read_pos = 0
        self._ends: dict[int, int] = {}
        self._starts: list[int] = []
        self._held = False

    @contextlib.contextmanager
    def locked(self) -> Iterator["ChunkLog"]:
        _makedirs_durable(self.dir)
        with open(self.lock_path, "a+b") as lk:
            fcntl.flock(lk.fileno(), fcntl.LOCK_EX)
            self._held = True
            try:
                self._refresh()
                yield self
            finally:
                self._held = False
                fcntl.flock(lk.fileno(), fcntl.LOCK_UN)

    def _refresh(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._read_pos)
                data = f.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        for line in data[: end + 1].splitlines():
            parts = line.split()
            if len(parts) != 2 or not all(p.isdigit() for p in parts):
                continue  # a line torn by a crash; never acknowledged
            first, last = int(parts[0]), int(parts[1])
            if first not in self._ends:
                self._ends[first] = last
                bisect.insort(self._starts, first)
        self._read_pos += end + 1

    def lookup(self, first: int) -> int | None:
        """The recorded last offset of the chunk starting at ``first``."""
        return self._ends.get(first)

    def next_start_after(self, offset: int) -> int | None:
        i = bisect.bisect_right(self._starts, offset)
        return self._starts[i] if i < len(self._starts) else None

    def containing(self, offset: int) -> tuple[int, int] | None:
        """The recorded chunk ``(first, last)`` with ``first < offset <= last``, if any."""
        i = bisect.bisect_left(self._starts, offset) - 1
        if i >= 0:
            first = self._starts[i]
            if self._ends[first] >= offset:
                return first, self._ends[first]
        return None

    def append(self, first: int, last: int) -> None:
        """Record the chunk ``first..last`` durably (call under :meth:`locked`)."""
        if not self._held:
            raise SinkError("ChunkLog.append() outside locked()")
        new = not self.path.exists()
        if not new:
            with open(self.path, "rb") as r:
                size = r.seek(0, os.SEEK_END)
                r.seek(max(0, size - 64))
                tail = r.read()
            if tail and not tail.endswith(b"\n"):  # a torn line, never acknowledged: cut it
                os.truncate(self.path, size - len(tail) + tail.rfind(b"\n") + 1)
        with open(self.path, "ab") as f:
            f.write(f"{first} {last}\n".encode())
            f.flush()
            os.fsync(f.fileno())
        if new:
            fsync_dir(self.dir)
        self._refresh()

    def forget_below(self, offset: int) -> None:
        """Drop cached chunks that end before ``offset`` (they are committed; nobody writes them again)."""
        keep = [s for s in self._starts if self._ends[s] >= offset]
        if len(keep) != len(self._starts):
            self._ends = {s: self._ends[s] for s in keep}
            self._starts = keep


# -- the sink ----------------------------------------------------------------------------------


@dataclasses.dataclass
class SinkStats:
    records: int = 0  # shuffled batches consumed (including redeliveries)
    reports: int = 0
    chunks: int = 0
    files_written: int = 0
    files_existing: int = 0  # already durable from an earlier attempt: skipped
    commits: int = 0
    commit_failures: int = 0
    undecodable: int = 0
    rejoins: int = 0

    def to_json_obj(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Item:
    offset: int
    meta: ShuffleMeta | None
    metric: str
    day: int
    spec: MechanismSpec | None
    records: np.ndarray | None


@dataclasses.dataclass
class _Buffer:
    base: int | None  # the group's committed offset when this buffer started
    items: list[_Item]
    since: float


class ParquetSink:
    """Consume shuffled batches in a consumer group and write them as a Parquet dataset (see the module docstring).

    ``specs`` resolves ``(metric, spec_id)`` to a spec (a
    :class:`~collector.catalog.SpecCatalog`). A batch no spec explains is
    kept verbatim under ``_undecodable/`` and counted, never dropped.
    A flush happens when ``flush_reports`` reports are buffered or the
    oldest buffered batch is ``flush_seconds`` old. A missing topic is
    created with ``partitions`` partitions.
    """

    def __init__(self, transport: Transport, root: str | os.PathLike[str], specs: Any, *,
                 topic: str = SHUFFLED_TOPIC, group: str = DEFAULT_GROUP, member: str | None = None,
                 flush_reports: int = 1_000_000, flush_seconds: float = 5.0, session_timeout: float = 10.0,
                 partitions: int = DEFAULT_PARTITIONS) -> None:
        if flush_reports < 1 or flush_seconds < 0:
            raise ValueError("flush_reports must be >= 1 and flush_seconds >= 0")
        self.transport = transport
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.specs = specs
        self.topic = topic
        self.group = group
        self.member = member or f"sink-{uuid.uuid4().hex[:12]}"
        self.flush_reports = int(flush_reports)
        self.flush_seconds = float(flush_seconds)
        self.session_timeout = float(session_timeout)
        self.partitions = int(partitions)
        self.stats = SinkStats()
        self._buffers: dict[TopicPartition, _Buffer] = {}
        self._buffered_reports = 0
        self._known_committed: dict[TopicPartition, int] = {}
        self._logs: dict[TopicPartition, ChunkLog] = {}
        self._generation = 0
        self._consumer: Consumer | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self.transport.ensure_topic(self.topic, self.partitions)
            self._consumer = self.transport.consume(self.topic, self.group, member=self.member,
                                                    session_timeout=self.session_timeout)
        return self._consumer

    def close(self) -> None:
        """Leave the group without flushing (buffered batches are redelivered to the next owner)."""
        self._buffers.clear()
        self._buffered_reports = 0
        self._generation = 0
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

    def _rejoin(self, why: str) -> None:
        log.warning("parquet sink %s: %s; dropping buffers and rejoining group %s", self.member, why, self.group)
        self.stats.rejoins += 1
        self.close()
        self._known_committed.clear()

    def __enter__(self) -> "ParquetSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- consuming ---------------------------------------------------------------------------

    def run(self, *, stop: threading.Event | None = None, idle_timeout: float | None = None,
            max_records: int = 500) -> SinkStats:
        """Consume until ``stop`` is set or nothing arrived for ``idle_timeout`` seconds; flush; return the stats."""
        idle_since = time.monotonic()
        while stop is None or not stop.is_set():
            if self.poll_once(max_records=max_records, timeout=0.2):
                idle_since = time.monotonic()
            if self.flush_due():
                self.flush()
            if idle_timeout is not None and time.monotonic() - idle_since >= idle_timeout and not self._buffers:
                break
        self.flush()
        return self.stats

    def poll_once(self, *, max_records: int = 500, timeout: float = 0.2) -> int:
        """Poll once and buffer what came; returns the number of batches received."""
        consumer = self.consumer
        recs = consumer.poll(max_records=max_records, timeout=timeout)
        if consumer.generation != self._generation:
            # a rebalance restarted every partition from its committed offset: the buffers are void
            self._generation = consumer.generation
            self._buffers.clear()
            self._buffered_reports = 0
            self._known_committed.clear()
        for rec in recs:
            self._accept(rec)
        return len(recs)

    def _accept(self, rec: Record) -> None:
        tp = TopicPartition(rec.topic, rec.partition)
        buf = self._buffers.get(tp)
        if buf is not None and buf.items and rec.offset <= buf.items[-1].offset:
            self._drop(tp)  # the consumer restarted this partition from the committed offset
            buf = None
        if buf is None:
            base = self._known_committed.get(tp)
            if base is None:
                base = self.consumer.committed(tp)
            buf = self._buffers[tp] = _Buffer(base, [], time.monotonic())
        self.stats.records += 1
        try:
            sb = decode_envelope(rec.value, self.specs)
        except FrameError as exc:
            self._keep_undecodable(rec, exc)
            buf.items.append(_Item(rec.offset, None, "", 0, None, None))
            return
        b = sb.batch
        buf.items.append(_Item(rec.offset, sb.meta, b.metric, b.day, b.spec, b.records))
        self._buffered_reports += len(b)
        self.stats.reports += len(b)

    def _keep_undecodable(self, rec: Record, exc: Exception) -> None:
        self.stats.undecodable += 1
        path = self.root / "_undecodable" / f"{rec.topic}-{rec.partition}-{rec.offset:020d}.ldps"
        log.error("parquet sink: %s[%d]@%d cannot be decoded (%s); kept in %s", rec.topic, rec.partition,
                  rec.offset, exc, path)
        _makedirs_durable(path.parent)
        tmp = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
        with open(tmp, "wb") as f:
            f.write(rec.value)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)

    def _drop(self, tp: TopicPartition) -> None:
        buf = self._buffers.pop(tp, None)
        if buf is not None:
            self._buffered_reports -= sum(len(it.records) for it in buf.items if it.records is not None)

    def flush_due(self) -> bool:
        if not self._buffers:
            return False
        if self._buffered_reports >= self.flush_reports:
            return True
        oldest = min(b.since for b in self._buffers.values())
        return time.monotonic() - oldest >= self.flush_seconds

    # -- writing -----------------------------------------------------------------------------

    def _chunk_log(self, tp: TopicPartition) -> ChunkLog:
        cl = self._logs.get(tp)
        if cl is None:
            cl = self._logs[tp] = ChunkLog(self.root, tp.topic, tp.partition)
        return cl

    def _plan(self, tp: TopicPartition, items: Sequence[_Item]) -> list[tuple[int, int]]:
        """Split ``items`` into chunks ``(i, j)`` (inclusive indices) that agree with the chunk log."""
        offsets = [it.offset for it in items]
        out: list[tuple[int, int]] = []
        with self._chunk_log(tp).locked() as cl:
            i = 0
            while i < len(items):
                first = offsets[i]
                inside = cl.containing(first)
                if inside is not None:
                    raise SinkError(f"{tp.topic}[{tp.partition}]: offset {first} falls inside the recorded chunk "
                                    f"{inside}; the group's committed offset is not at a chunk boundary")
                last = cl.lookup(first)
                if last is None:
                    nxt = cl.next_start_after(first)
                    limit = offsets[-1] if nxt is None else min(offsets[-1], nxt - 1)
                    j = bisect.bisect_right(offsets, limit) - 1
                    cl.append(first, offsets[j])
                else:
                    if last > offsets[-1]:
                        break  # the recorded chunk is longer than what we hold: wait for more
                    j = bisect.bisect_left(offsets, last)
                    if j >= len(offsets) or offsets[j] != last:
                        raise SinkError(f"{tp.topic}[{tp.partition}]: recorded chunk {first}..{last} ends at an "
                                        "offset this consumer was not given")
                out.append((i, j))
                i = j + 1
        return out

    def _write_chunk(self, tp: TopicPartition, items: Sequence[_Item]) -> None:
        first, last = items[0].offset, items[-1].offset
        groups: dict[tuple[str, int, str], list[_Item]] = {}
        for it in items:
            if it.spec is not None:
                groups.setdefault((it.metric, it.day, it.spec.spec_id), []).append(it)
        for (metric, day, spec_id), its in groups.items():
            path = self.root / f"metric={metric}" / f"day={day}" / part_name(tp.topic, tp.partition, first, last,
                                                                              spec_id)
            if path.exists():
                self.stats.files_existing += 1
                continue
            spec = its[0].spec
            assert spec is not None
            records = np.concatenate([it.records for it in its]) if len(its) > 1 else its[0].records
            table = records_to_table(records, spec)
            shuffles = [{"offset": it.offset, **(it.meta.to_json() if it.meta else {})} for it in its]
            table = table.replace_schema_metadata({
                "ldp.format": FORMAT,
                "ldp.metric": metric,
                "ldp.day": str(day),
                "ldp.spec": json.dumps(spec.to_dict(), sort_keys=True),
                "ldp.spec_id": spec_id,
                "ldp.source": json.dumps({"topic": tp.topic, "partition": tp.partition, "first": first,
                                          "last": last}),
                "ldp.shuffles": json.dumps(shuffles, sort_keys=True),
            })
            write_table_atomic(path, table)
            self.stats.files_written += 1
        self.stats.chunks += 1

    def flush(self) -> int:
        """Write every complete chunk durably, then commit the offsets; returns the batches committed."""
        if not self._buffers or self._consumer is None:
            return 0
        consumer = self._consumer
        owned = consumer.assignment()
        offsets: dict[TopicPartition, int] = {}
        flushed: dict[TopicPartition, int] = {}
        for tp in list(self._buffers):
            buf = self._buffers[tp]
            if tp not in owned:
                self._drop(tp)
                continue
            if consumer.committed(tp) != buf.base:
                self._rejoin(f"the committed offset of {tp.topic}[{tp.partition}] moved from {buf.base} to "
                             f"{consumer.committed(tp)} while this member held it")
                return 0
            chunks = self._plan(tp, buf.items)
            for i, j in chunks:
                self._write_chunk(tp, buf.items[i: j + 1])
            if chunks:
                k = chunks[-1][1] + 1
                offsets[tp] = buf.items[k - 1].offset + 1
                flushed[tp] = k
        if not offsets:
            return 0
        try:
            consumer.commit(offsets)
        except CommitFailedError as exc:
            self.stats.commit_failures += 1
            log.info("parquet sink %s: commit failed (%s); the chunks are durable and their next owner rewrites "
                     "the same files", self.member, exc)
            self._buffers.clear()
            self._buffered_reports = 0
            return 0
        self.stats.commits += 1
        done = 0
        for tp, k in flushed.items():
            buf = self._buffers[tp]
            gone, rest = buf.items[:k], buf.items[k:]
            done += len(gone)
            self._buffered_reports -= sum(len(it.records) for it in gone if it.records is not None)
            self._known_committed[tp] = offsets[tp]
            self._chunk_log(tp).forget_below(offsets[tp])
            if rest:
                self._buffers[tp] = _Buffer(offsets[tp], rest, time.monotonic())
            else:
                del self._buffers[tp]
        return done
