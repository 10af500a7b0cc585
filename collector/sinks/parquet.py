"""The Parquet sink: shuffled batches become a dataset partitioned by metric and day.

The dataset format (file names, columns, metadata, readers) is
:mod:`pipeline.dataset`; this module writes it. Beside the data files the
sink keeps, under the dataset's root::

    metric=<name>/day=<N>/part-...parquet     the data (pipeline.dataset)
    _chunks/<topic>/<partition>.log       chunk boundaries, one "first last" line per chunk
    _chunks/<topic>/<partition>.lock      serializes appends to that log
    _undecodable/<topic>-<partition>-<offset>.ldps   shuffled batches no loaded metrics file explains

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
chunk start. A member keeps in memory only the chunks above its last
commit, but a question about an offset below them reads the whole log
again: the group's committed offset may go back (an older commit that
shows after a newer one, an offset reset), and the records read again must
be cut as before, or they would be written twice under other names
(issue 31; ``tests/collector/test_sink_rewind.py``). A member that finds the group's committed offset moved under
one of its chunks (another member owned the partition meanwhile) drops
its buffers and rejoins instead of writing; a rebalance that rewound
uncommitted records (a new :attr:`~pipeline.transport.base.Consumer.generation`
after a poll) drops every buffer at once, as does a failed commit, and a
partition whose offsets go back (it restarted from its committed offset)
drops its own (the rules of :mod:`pipeline.processor`, whose loop the sink
runs: its checkpoint is a flush). Files are complete or absent (atomic
rename), so a reader that lists the folders sees each report once.

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
import time
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from collector.errors import SinkError
from ldp_core.files import write_atomic
from ldp_core.mechanisms.base import ReportSpec
from ldp_core.wire.sealing import BatchOpener
from pipeline.dataset import FORMAT, fsync_dir, makedirs_durable, part_name, records_to_table, write_table_atomic
from pipeline.envelope import ShuffledBatch, ShuffleMeta
from pipeline.processor import StreamProcessor
from pipeline.routes import SealedRoutes, check_shuffled_key, open_routed, route_status
from pipeline.settings import check_names, check_ranges, check_topics, settings_from_env
from pipeline.topics import DEFAULT_PARTITIONS, SHUFFLED_TOPIC
from pipeline.transport.base import CommitFailedError, Consumer, Record, TopicPartition, Transaction, Transport

__all__ = [
    "SHUFFLED_TOPIC",
    "DEFAULT_GROUP",
    "SinkError",
    "SinkSettings",
    "SinkStats",
    "ChunkLog",
    "ParquetSink",
]

DEFAULT_GROUP = "ldp-parquet-sink"
#: prefix of the environment variables :meth:`SinkSettings.from_env` reads (``LDP_SINK_FLUSH_SECONDS``, ...)
ENV_PREFIX = "LDP_SINK_"

log = logging.getLogger(__name__)

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
        self._floor = 0  # chunks ending below this offset were dropped from memory (forget_below)
        self._held = False

    @contextlib.contextmanager
    def locked(self) -> Iterator[ChunkLog]:
        makedirs_durable(self.dir)
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

    def reread_from(self, offset: int) -> None:
        """Make sure the chunks around ``offset`` are in memory (call under :meth:`locked` before a lookup).

        :meth:`forget_below` drops committed chunks; if the group's committed
        offset later goes back below them (an older commit that shows after
        a newer one, an operator's offset reset), this member reads those
        records again and must find their recorded boundaries, or it would
        cut the range anew and write its batches a second time under other
        names (issue 31). So a question below the forgotten part reads the
        whole log again.
        """
        if offset < self._floor:
            self._read_pos, self._ends, self._starts, self._floor = 0, {}, [], 0
            self._refresh()

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
            self._floor = max(self._floor, offset)


# -- the sink ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SinkSettings:
    """How the sink consumes and when it flushes.

    A flush happens when ``flush_reports`` reports are buffered or the
    oldest buffered batch is ``flush_seconds`` old. A missing ``topic`` is
    created with ``partitions`` partitions. ``member`` names this member of
    ``group`` (default: random). ``shuffled_key`` and ``shuffled_spread`` are the shuffler's: with them and the
    topic's partition count the sink drops a sealed record read from another partition than its encapsulated
    key routes to (:mod:`pipeline.routes`).
    """

    topic: str = SHUFFLED_TOPIC
    group: str = DEFAULT_GROUP
    member: str | None = None
    flush_reports: int = 1_000_000
    flush_seconds: float = 5.0
    session_timeout: float = 10.0
    partitions: int = DEFAULT_PARTITIONS
    shuffled_key: str = "batch"
    shuffled_spread: int = 0

    def __post_init__(self) -> None:
        check_ranges(
            self,
            {
                "flush_reports": (1, 1 << 40),
                "flush_seconds": (0.0, 1e9),
                "session_timeout": (0.001, 1e9),
                "partitions": (1, 10_000),
                "shuffled_spread": (0, 10_000),
            },
        )
        check_shuffled_key(self.shuffled_key)
        check_topics(self, "topic")
        check_names(self, "group", optional=("member",))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> SinkSettings:
        """``overrides`` (``None``: not given) over ``$LDP_SINK_<FIELD>`` over the defaults."""
        return settings_from_env(cls, ENV_PREFIX, environ, overrides)


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
    sealed_unopened: int = 0  # sealed records that did not open (counted per delivery)
    sealed_replays_dropped: int = 0  # opened sealed records dropped as replays of an already counted record
    sealed_misrouted: int = 0  # sealed records dropped: read from another partition than their key routes to
    sealed_route_mismatch: int = 0  # of those, records of parts routed consistently under another N
    rejoins: int = 0

    def to_json_obj(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Item:
    offset: int
    meta: ShuffleMeta | None
    metric: str
    day: int
    spec: ReportSpec | None
    records: np.ndarray | None


@dataclasses.dataclass
class _Buffer:
    base: int | None  # the group's committed offset when this buffer started
    items: list[_Item]
    since: float


class ParquetSink(StreamProcessor):
    """Consume shuffled batches in a consumer group and write them as a Parquet dataset (see the module docstring).

    ``specs`` resolves ``(metric, spec_id)`` to a spec (a
    :class:`~pipeline.catalog.SpecCatalog`). A batch no spec explains is
    kept verbatim under ``_undecodable/`` and counted, never dropped.
    ``settings`` (:class:`SinkSettings`) says when to flush; the keyword
    arguments, where given, override its fields.
    """

    def __init__(
        self,
        transport: Transport,
        root: str | os.PathLike[str],
        specs: Any,
        settings: SinkSettings | None = None,
        *,
        topic: str | None = None,
        group: str | None = None,
        member: str | None = None,
        flush_reports: int | None = None,
        flush_seconds: float | None = None,
        session_timeout: float | None = None,
        partitions: int | None = None,
        opener: BatchOpener | None = None,
        shuffled_key: str | None = None,
        shuffled_spread: int | None = None,
    ) -> None:
        given: dict[str, Any] = {
            "shuffled_key": shuffled_key,
            "shuffled_spread": shuffled_spread,
            "topic": topic,
            "group": group,
            "member": member,
            "flush_reports": flush_reports,
            "flush_seconds": flush_seconds,
            "session_timeout": session_timeout,
            "partitions": partitions,
        }
        settings = dataclasses.replace(settings or SinkSettings(), **{k: v for k, v in given.items() if v is not None})
        super().__init__(
            transport,
            settings.topic,
            settings.group,
            settings.member or f"sink-{uuid.uuid4().hex[:12]}",
            session_timeout=settings.session_timeout,
            partitions=settings.partitions,
        )
        self.settings = settings
        self.root = Path(root).expanduser().resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.specs = specs
        #: opens sealed batches (the analyzer's keys); ``None``: a sealed batch is undecodable here
        self.opener = opener
        if opener is not None:  # the encapsulated keys already written outlive a restart (issue #28)
            (self.root / "_replays").mkdir(exist_ok=True)
            opener.replays.attach(self.root / "_replays" / "seen.sqlite3")
        #: the partition each sealed record must be read from (issue 31)
        self.routes = SealedRoutes(settings.shuffled_key, settings.shuffled_spread)
        self.topic = settings.topic
        self.flush_reports = settings.flush_reports
        self.flush_seconds = float(settings.flush_seconds)
        self.stats = SinkStats()
        self._buffers: dict[TopicPartition, _Buffer] = {}
        self._buffered_reports = 0
        self._known_committed: dict[TopicPartition, int] = {}
        self._logs: dict[TopicPartition, ChunkLog] = {}
        self._flushing: dict[TopicPartition, int] = {}  # per partition: how many buffered items the flush wrote
        self._flushed = 0

    def __enter__(self) -> ParquetSink:
        return self

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.opener is not None:
                self.opener.replays.close()
                self.opener.close()  # its worker processes, if any

    # -- consuming (the per-record step of the loop) ---------------------------------------------

    def on_join(self, consumer: Consumer) -> None:
        self.routes.partitions = None  # read again with the first sealed record: the topic may have grown

    def decode(self, rec: Record) -> ShuffledBatch:
        return open_routed(rec, self.specs, self.opener, self.routes, self.transport, self.stats, log)

    def run_status(self) -> dict[str, Any]:
        """:meth:`StreamProcessor.run_status`, not ready while sealed records arrive routed under another N than
        this member's (``route_mismatch``: what to do; :mod:`pipeline.routes`)."""
        return route_status(super().run_status(), self.routes)

    def apply(self, rec: Record, sb: ShuffledBatch | None) -> None:
        tp = TopicPartition(rec.topic, rec.partition)
        buf = self._buffers.get(tp)
        if buf is None:
            base = self._known_committed.get(tp)
            if base is None:
                base = self.consumer.committed(tp)
            buf = self._buffers[tp] = _Buffer(base, [], time.monotonic())
        if sb is None:  # undecodable: kept under _undecodable/, its offset still part of the chunk
            buf.items.append(_Item(rec.offset, None, "", 0, None, None))
            return
        b = sb.batch
        buf.items.append(_Item(rec.offset, sb.meta, b.metric, b.day, b.spec, b.records))
        self._buffered_reports += len(b)
        self.stats.reports += len(b)

    def reset(self, partitions: Collection[TopicPartition] | None) -> None:
        """Drop buffers: the records come again from the committed offsets (and land in the same files)."""
        if partitions is None:
            self._buffers.clear()
            self._buffered_reports = 0
            self._known_committed.clear()
        else:
            for tp in partitions:
                self._drop(tp)

    def on_undecodable(self, rec: Record, exc: BaseException) -> None:
        path = self.root / "_undecodable" / f"{rec.topic}-{rec.partition}-{rec.offset:020d}.ldps"
        log.error(
            "parquet sink: %s[%d]@%d cannot be decoded (%s); kept in %s",
            rec.topic,
            rec.partition,
            rec.offset,
            exc,
            path,
        )
        makedirs_durable(path.parent)
        write_atomic(path, rec.value)

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

    def checkpoint_due(self) -> bool:
        return self.flush_due()

    def settled(self) -> bool:
        return not self._buffers

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
            if offsets:
                cl.reread_from(offsets[0])
            i = 0
            while i < len(items):
                first = offsets[i]
                inside = cl.containing(first)
                if inside is not None:
                    raise SinkError(
                        f"{tp.topic}[{tp.partition}]: offset {first} falls inside the recorded chunk "
                        f"{inside}; the group's committed offset is not at a chunk boundary"
                    )
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
                        raise SinkError(
                            f"{tp.topic}[{tp.partition}]: recorded chunk {first}..{last} ends at an "
                            "offset this consumer was not given"
                        )
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
            path = (
                self.root / f"metric={metric}" / f"day={day}" / part_name(tp.topic, tp.partition, first, last, spec_id)
            )
            if path.exists():
                self.stats.files_existing += 1
                continue
            spec = its[0].spec
            assert spec is not None
            parts = [it.records for it in its if it.records is not None]
            records = np.concatenate(parts) if len(parts) > 1 else parts[0]
            table = records_to_table(records, spec)
            shuffles = [{"offset": it.offset, **(it.meta.to_json() if it.meta else {})} for it in its]
            table = table.replace_schema_metadata(
                {
                    "ldp.format": FORMAT,
                    "ldp.metric": metric,
                    "ldp.day": str(day),
                    "ldp.spec": json.dumps(spec.to_dict(), sort_keys=True),
                    "ldp.spec_id": spec_id,
                    "ldp.source": json.dumps(
                        {"topic": tp.topic, "partition": tp.partition, "first": first, "last": last}
                    ),
                    "ldp.shuffles": json.dumps(shuffles, sort_keys=True),
                }
            )
            write_table_atomic(path, table)
            self.stats.files_written += 1
        self.stats.chunks += 1

    def flush(self) -> int:
        """Write every complete chunk durably, then commit the offsets; returns the batches committed.

        This is the sink's checkpoint (:meth:`~pipeline.processor.StreamProcessor.checkpoint`):
        buffers of partitions this member no longer owns are dropped first;
        a failed write commits nothing.
        """
        self._flushed = 0
        self.checkpoint()
        return self._flushed

    def final_checkpoint(self) -> None:
        self.flush()

    def flush_state(self, tx: Transaction | None) -> Mapping[TopicPartition, int] | None:
        """Write every complete chunk of every buffer; the offsets just past them (``None``: nothing to commit)."""
        consumer = self._consumer
        if not self._buffers or consumer is None:
            return None
        offsets: dict[TopicPartition, int] = {}
        self._flushing = {}
        for tp in list(self._buffers):
            buf = self._buffers[tp]
            if consumer.committed(tp) != buf.base:
                self.rejoin(
                    f"the committed offset of {tp.topic}[{tp.partition}] moved from {buf.base} to "
                    f"{consumer.committed(tp)} while this member held it"
                )
                return None
            chunks = self._plan(tp, buf.items)
            for i, j in chunks:
                self._write_chunk(tp, buf.items[i : j + 1])
            if chunks:
                k = chunks[-1][1] + 1
                offsets[tp] = buf.items[k - 1].offset + 1
                self._flushing[tp] = k
        return offsets or None

    def on_commit_failed(self, exc: CommitFailedError) -> None:
        self.stats.commit_failures += 1
        log.info(
            "parquet sink %s: commit failed (%s); the chunks are durable and their next owner rewrites the same files",
            self.member,
            exc,
        )
        self.rewind_all()

    def on_committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.stats.commits += 1
        done = 0
        for tp, k in self._flushing.items():
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
        self._flushing = {}
        self._flushed = done
