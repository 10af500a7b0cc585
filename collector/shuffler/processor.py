"""The shuffler's stream processor, :class:`Shuffler`: it applies raw uploads to the buffered groups of the
partitions it owns, releases crowds, and commits released batches, checkpoints and input offsets in one
transaction; it restores a partition from its checkpoint after a start or a rebalance. :mod:`collector.shuffler`
describes the whole design (exactly once, what a checkpoint does not hold, duplicates, the central guarantee).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

from collector.errors import ConfigError, ShufflerStateError
from collector.shuffler.checkpoint import (
    CheckpointHeader,
    _Keys,
    _state_keys,
    decode_checkpoint_chunk,
    load_or_create_key,
    open_checkpoint_chunk,
)
from collector.shuffler.groups import _gather, _Group, _GroupKey, plan_release
from collector.shuffler.permute import WordSource, csprng_permutation, urandom_words, warm_up
from collector.shuffler.settings import DeviceCaps, ShufflerSettings
from collector.shuffler.state import _Partition
from collector.shuffler.stats import _TOTALS, ShufflerStats
from ldp_core.days import utc_day
from ldp_core.errors import FrameError
from ldp_core.mechanisms.base import ReportSpec
from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import ReportBatch, decode_frame
from ldp_core.wire.framing import FramingError
from ldp_core.wire.sealed import SealedSpec
from pipeline.envelope import ShuffleMeta, encode_envelope
from pipeline.processor import StreamProcessor
from pipeline.topics import sealed_route, shuffled_key, spread_keys
from pipeline.transport import (
    CommitFailedError,
    Consumer,
    FencedError,
    Record,
    TopicPartition,
    Transaction,
    Transport,
    TransportError,
)

__all__ = ["Guarantee", "Shuffler", "STATE_SEGMENT_SECONDS"]

log = logging.getLogger("ldp.shuffler")

#: the state topic's log segments roll at least this often (seconds), so the broker removes superseded
#: checkpoints from its disk within about this time plus its retention check interval (5 minutes by default)
STATE_SEGMENT_SECONDS = 600.0

#: ``(n, epsilon0) -> (central epsilon, delta, name of the bound)``
Guarantee = Callable[[int, float], "tuple[float, float, str]"]


class Shuffler(StreamProcessor):
    """One shuffler worker. ``run()`` loops until stopped; ``close()`` leaves the group.

    It runs the transactional loop of :class:`~pipeline.processor.StreamProcessor`:
    the per-record step applies a raw upload or a checkpoint chunk, the
    checkpoint publishes every changed partition's checkpoint into the open
    transaction and commits it (see :mod:`collector.shuffler`).

    ``specs`` resolves the specs of raw frames: a :class:`~ldp_core.metrics.MetricSet`
    (a frame must carry its metric's current spec) or a mapping from spec id
    to spec. ``guarantee`` computes each released batch's central (ε, δ);
    ``words`` is the CSPRNG word source of the permutations (tests may seed
    it); ``new_batch_id`` draws released batch ids (default ``secrets.token_bytes(16)``).

    Released batches are published into a transaction as soon as they are
    cut (on Kafka they travel to the broker while the shuffler works on); the
    transaction commits at the next checkpoint, together with the checkpoints
    and the input offsets.
    """

    transactional = True

    def __init__(
        self,
        transport: Transport,
        specs: MetricSet | Mapping[str, ReportSpec],
        settings: ShufflerSettings = ShufflerSettings(),
        *,
        guarantee: Guarantee | None = None,
        words: WordSource = urandom_words,
        new_batch_id: Callable[[], bytes] = lambda: secrets.token_bytes(16),
        key: bytes | None = None,
        clock: Callable[[], float] = time.time,
        device_caps: DeviceCaps | None = None,
    ) -> None:
        super().__init__(
            transport,
            [settings.raw_topic, settings.state_topic],
            settings.group,
            settings.member,
            session_timeout=settings.session_timeout,
            partitions=settings.partitions,
            checkpoint_seconds=settings.checkpoint_interval,
            poll_records=settings.poll_records,
        )
        self.settings = settings
        self.guarantee = guarantee
        self.words = words
        self.new_batch_id = new_batch_id
        self.clock = clock
        self.window = settings.day_window
        self._keys = _Keys(load_or_create_key(settings.key_file) if key is None else key)
        #: per metric, the most reports one device sends a day (``max_reports_per_day``): the central ε is
        #: computed per person from it; unknown without a metrics file, and then no central figure is attached
        self._reports_per_person: dict[str, int] = {}
        #: the app's per-metric daily ε caps that devices enforce (``--device-epsilon-cap``): with them the figure
        #: holds whatever a metrics server tells devices (:class:`~collector.shuffler.settings.DeviceCaps`)
        self.device_caps = device_caps
        if isinstance(specs, MetricSet):
            # a sealed metric's records are opaque fixed-width bytes here (ldp_core.wire.sealing.SealedSpec)
            self._by_metric: dict[str, ReportSpec] | None = {n: m.wire_spec for n, m in specs.items()}
            self._by_id: dict[str, ReportSpec] = {m.spec.spec_id: m.spec for m in specs.values()}
            self._reports_per_person = {n: int(m.max_reports_per_day) for n, m in specs.items()}
        else:
            self._by_metric = None
            self._by_id = dict(specs)
        self.stats = ShufflerStats()
        self._parts: dict[int, _Partition] = {}
        self._state_keys: list[bytes] = []
        self._shuffled_partitions = settings.partitions  # the shuffled topic's, once ensure_topics ran
        # per (metric, day, count): the metric-day's sub-keys (pipeline.topics.spread_keys)
        self._sub_keys: dict[tuple[str, int, int], list[bytes]] = {}
        # per metric-day: the next sub-key a plain batch takes (shuffled_spread >= 1)
        self._next_sub: dict[tuple[str, int], int] = {}
        self._expected: dict[TopicPartition, int] = {}  # what the consumer must report as delivered
        self._progress = False
        self._last_input = time.monotonic()
        self._guarantee_failed = False
        self._warming = False
        self._totals: dict[int, collections.Counter[str]] = {}  # per owned raw partition, as last committed
        self._today: int | None = None
        self._deletes: dict[int, int] = {}  # state partition -> offset below which its records are superseded
        self._deleted: dict[int, int] = {}
        self._can_delete = True

    # -- setup --------------------------------------------------------------------------------

    def ensure_topics(self) -> None:
        s = self.settings
        n = self.transport.ensure_topic(s.raw_topic, s.partitions)
        self.transport.ensure_topic(s.shuffled_topic, n)
        # no retention: a checkpoint older than one would be lost with the reports it buffers; the shuffler
        # deletes superseded checkpoints itself (_delete_superseded), and short segments let the broker
        # drop them from its disk within STATE_SEGMENT_SECONDS (it deletes whole segments only)
        m = self.transport.ensure_topic(s.state_topic, n, retention=math.inf, segment=STATE_SEGMENT_SECONDS)
        if m != n:
            raise ConfigError(
                f"the state topic {s.state_topic!r} has {m} partitions but the raw topic "
                f"{s.raw_topic!r} has {n}; they must be equal (the shuffler pairs them)"
            )
        self._state_keys = _state_keys(n)
        self._shuffled_partitions = self.transport.partitions(s.shuffled_topic)

    def on_join(self, consumer: Consumer) -> None:
        try:  # an empty transaction: the Kafka transport's init_transactions aborts a zombie's open one
            with consumer.transaction():
                pass
        except CommitFailedError:
            pass

    def open(self) -> None:
        """Create missing topics, join the group, and fence a dead predecessor's open transaction."""
        if self._consumer is not None:
            return
        if not self._warming:
            self._warming = True
            threading.Thread(target=warm_up, name="ldp-shuffler-warm-up", daemon=True).start()
        self.consumer  # noqa: B018 - joins: ensure_topics, then on_join

    def join(self) -> None:  # what the runner's connect() retries
        self.open()

    def totals(self) -> dict[str, int]:
        """The counters of :class:`ShufflerStats` that are counted at commit, summed over the partitions this
        worker owns, since each partition's first record: kept (sealed) in the checkpoints, so they survive
        restarts. Summed over every worker of the group they reconcile with the collector's
        (docs/ARCHITECTURE.md)."""
        with self.lock:
            out: collections.Counter[str] = collections.Counter()
            for t in self._totals.values():
                out.update(t)
            return {k: int(out.get(k, 0)) for k in _TOTALS}

    # close(): the loop's; it aborts an open (uncommitted) transaction and leaves the group

    # -- the loop -----------------------------------------------------------------------------

    def run(  # type: ignore[override]  # idle_exit, not the loop's idle_timeout: ldp shuffler's contract
        self, stop: threading.Event | None = None, *, idle_exit: float | None = None
    ) -> ShufflerStats:
        """Shuffle until ``stop`` is set (or, with ``idle_exit``, until no input came for that many seconds
        and nothing is waiting to be checkpointed); a final checkpoint is written before returning."""
        self.open()
        self._last_input = time.monotonic()
        stats: ShufflerStats = super().run(stop, idle_timeout=idle_exit)
        return stats

    def settled(self) -> bool:
        return not self._progress and all(p.live for p in self._parts.values())

    def final_checkpoint(self) -> None:
        if all(p.live for p in self._parts.values()):
            self.checkpoint(force=True)

    def step(self, timeout: float = 0.2, *, max_records: int | None = None) -> int:
        """Poll once, apply what came, and checkpoint if one is due; return the number of raw records polled."""
        self._require_consumer()
        applied = self.poll_and_apply(max_records=max_records, timeout=timeout)
        raw = sum(1 for r in applied if r.topic == self.settings.raw_topic)
        if raw:
            self._last_input = time.monotonic()
        self._check_restores()
        today = self._day()
        if today != self._today:
            self._today = today
            for part in self._parts.values():
                if part.live:
                    self._expire(part, today)
        self._delete_superseded()
        self.checkpoint()
        return raw

    def _delete_superseded(self) -> None:
        """Delete the state records before each partition's latest committed checkpoint (older checkpoints,
        aborted chunks): nobody needs them, and they would tell what was buffered when."""
        todo, self._deletes = self._deletes, {}
        if not todo or not self._can_delete:
            return
        try:
            self.transport.delete_before(self.settings.state_topic, todo)
        except NotImplementedError:
            self._can_delete = False
            log.warning(
                "%s cannot delete records: superseded checkpoints stay in %r (sealed, but they show when how "
                "much was buffered)",
                type(self.transport).__name__,
                self.settings.state_topic,
            )
            return
        except TransportError as exc:  # retried with the next checkpoint read back
            log.warning("deleting superseded checkpoints of %r failed: %s", self.settings.state_topic, exc)
            return
        for p, off in todo.items():
            self._deleted[p] = max(off, self._deleted.get(p, 0))
        self.stats.superseded_deletes += 1

    def rewound(self, consumer: Consumer, records: Sequence[Record]) -> bool:
        """Whether the consumer started over from the committed offsets (a rebalance): its delivered positions
        no longer match the records received since the last commit. Then the shuffler does too, entirely."""
        for r in records:
            self._expected[TopicPartition(r.topic, r.partition)] = r.offset + 1
        return consumer.positions() != self._expected

    def on_partition_rewind(self, tp: TopicPartition, rec: Record) -> bool:
        log.warning("offset %d of %s[%d] came again unannounced; rewinding", rec.offset, tp.topic, tp.partition)
        self.rewind_all()
        return False

    def on_poll(self, consumer: Consumer) -> None:
        self._sync_assignment()

    def reset(self, partitions: Collection[TopicPartition] | None) -> None:
        """Forget partitions (``None``: every one): each is restored from its checkpoint as its records come again.

        A full reset follows an aborted transaction (:meth:`~pipeline.processor.StreamProcessor.rewind_all`
        aborts the open one, or an empty one, which rewinds the consumer to the committed offsets).
        """
        if partitions is None:
            self._parts.clear()
            self._expected = {}
            self._progress = False
        else:
            for tp in partitions:
                self._parts.pop(tp.partition, None)

    def process(self, rec: Record) -> bool | None:
        if rec.topic == self.settings.raw_topic:
            return self._on_raw(rec)
        return self._on_state(rec)

    def _require_consumer(self) -> Consumer:
        if self._consumer is None:
            raise RuntimeError("call open() (or run()) first")
        return self._consumer

    def _sync_assignment(self) -> None:
        owned = self._require_consumer().assignment()
        raw = {tp.partition for tp in owned if tp.topic == self.settings.raw_topic}
        state = {tp.partition for tp in owned if tp.topic == self.settings.state_topic}
        if raw != state:
            raise ShufflerStateError(
                f"the group assigned raw partitions {sorted(raw)} but state partitions {sorted(state)} to member "
                f"{self.settings.member!r}; the shuffler needs them paired (equal partition counts, and every "
                f"member of group {self.settings.group!r} must be a shuffler subscribing to both topics)"
            )
        for p in list(self._parts):
            if p not in raw:
                del self._parts[p]
        for p in list(self._totals):
            if p not in raw:
                del self._totals[p]
        for p in raw:
            if p not in self._parts:
                part = self._parts[p] = _Partition(
                    p,
                    self._consumer.committed(  # type: ignore[union-attr]
                        TopicPartition(self.settings.raw_topic, p)
                    ),
                    self.settings.dedup_window,
                )
                if not part.live:
                    self.stats.restores += 1

    # -- input ----------------------------------------------------------------------------------

    def _on_raw(self, r: Record) -> bool:
        part = self._parts.get(r.partition)
        if part is None:
            return True
        # (an offset that came again unannounced was caught by the loop: on_partition_rewind)
        if part.live:
            self._apply(part, r)
        else:
            part.held.append(r)
        return True

    def _on_state(self, r: Record) -> bool:
        part = self._parts.get(r.partition)
        if part is None:
            return True
        try:
            header, payload = decode_checkpoint_chunk(r.value)
        except (FrameError, FramingError) as exc:
            log.warning("ignoring a malformed record in %s[%d]@%d: %s", r.topic, r.partition, r.offset, exc)
            return True
        if header.group != self.settings.group or header.partition != r.partition:
            if not part.foreign:
                part.foreign = True
                log.warning(
                    "%s[%d]@%d holds a checkpoint of group %r: the state topic is shared, so superseded "
                    "checkpoints of this partition are no longer deleted",
                    r.topic,
                    r.partition,
                    r.offset,
                    header.group,
                )
            return True
        part.dirty = True  # the next transaction commits past this chunk: it writes a fresh checkpoint
        if header.chunk == 0 and header.snapshot == part.latest:
            self._supersede(part, r.offset)  # our latest committed checkpoint starts here: all before is garbage
        if part.live or header.raw_offset != part.committed:
            return True
        chunks = part.assembling.setdefault(header.snapshot, {})
        chunks[header.chunk] = (header, payload, r.offset)
        if len(chunks) == header.chunks:
            self._load(part, [chunks[i] for i in range(header.chunks)])
        return True

    def _supersede(self, part: _Partition, offset: int) -> None:
        if not part.foreign and offset > self._deleted.get(part.index, 0):
            self._deletes[part.index] = max(offset, self._deletes.get(part.index, 0))

    def _load(self, part: _Partition, chunks: list[tuple[CheckpointHeader, memoryview, int]]) -> None:
        """Restore ``part`` from the chunks of the checkpoint at its committed offset, then apply the raw
        records held back meanwhile."""
        opened = [open_checkpoint_chunk(h, p, self._keys, key_file=self.settings.key_file) for h, p, _ in chunks]
        part.restore(chunks[0][0].snapshot, opened)
        self._totals[part.index] = part.totals.copy()
        self._supersede(part, chunks[0][2])
        held, part.held = part.held, []
        log.info(
            "partition %d restored at raw offset %s: %d reports buffered, %d ids",
            part.index,
            part.committed,
            part.buffered(),
            len(part.ids),
        )
        self._expire(part, self._day())
        for r in held:
            self._apply(part, r)

    def _check_restores(self) -> None:
        now = time.monotonic()
        for part in self._parts.values():
            if not part.live and now - part.restore_since > self.settings.restore_timeout:
                raise ShufflerStateError(
                    f"partition {part.index}: no checkpoint of group {self.settings.group!r} with raw offset "
                    f"{part.committed} arrived from {self.settings.state_topic!r} within "
                    f"{self.settings.restore_timeout:g} s; the state topic was truncated or belongs to another "
                    "deployment. Restoring would lose or double-count reports, so the shuffler stops."
                )

    def _resolve(self, metric: str, spec_id: str) -> ReportSpec:
        spec = self._by_metric.get(metric) if self._by_metric is not None else self._by_id.get(spec_id)
        if spec is None or spec.spec_id != spec_id:
            raise FrameError(f"metric {metric!r} with spec {spec_id} is not in the shuffler's metrics file")
        return spec

    def _day(self) -> int:
        return utc_day(self.clock())

    def _apply(self, part: _Partition, r: Record) -> None:
        part.raw_next = r.offset + 1
        part.dirty = True
        self._progress = True
        try:
            batch = decode_frame(r.value, self._resolve)
        except FrameError as exc:
            part.delta["undecodable_batches"] += 1
            log.warning("dropping raw record %s[%d]@%d: %s", r.topic, r.partition, r.offset, exc)
            return
        group = part.groups.get((batch.metric, batch.spec.spec_id, batch.day))
        expected = self._by_metric.get(batch.metric) if self._by_metric is not None else None
        if (expected is not None and expected != batch.spec) or (group is not None and group.spec != batch.spec):
            # sealed records of a metric declared plain (or the other way round): never mixed into one crowd
            part.delta["undecodable_batches"] += 1
            log.warning(
                "dropping raw record %s[%d]@%d: its records are %s, metric %s is not",
                r.topic,
                r.partition,
                r.offset,
                "sealed" if batch.sealed else "plain",
                batch.metric,
            )
            return
        n = len(batch)
        digest = self._keys.digest(batch.batch_id)
        if digest in part.ids:
            part.delta["duplicate_batches"] += 1
            part.delta["duplicate_reports"] += n
            return
        part.delta["input_batches"] += 1
        part.delta["input_reports"] += n
        part.ids.add(digest)
        oldest = self.window.oldest_kept(self._day())
        if batch.day < oldest:
            part.delta["expired_batches"] += 1
            part.delta["expired_reports"] += n
            log.warning(
                "dropping %d reports of %s day %d read from %s[%d]@%d: the day left the window (oldest kept: %d; "
                "max_day_age %d + %d grace day(s)) before the shuffler read it",
                n,
                batch.metric,
                batch.day,
                r.topic,
                r.partition,
                r.offset,
                oldest,
                self.window.max_day_age,
                self.window.grace_days,
            )
            return
        key = (batch.metric, batch.spec.spec_id, batch.day)
        group = part.groups.get(key)
        if group is None:
            group = part.groups[key] = _Group(batch.spec)
        group.add_upload(batch.records)
        if group.n >= self.settings.min_batch:
            self._release(part, key, group)

    def _expire(self, part: _Partition, today: int) -> None:
        """Drop (count, log) the buffered groups whose day left the window: they never reached a crowd."""
        oldest = self.window.oldest_kept(today)
        for key in [k for k in part.groups if k[2] < oldest]:
            n = part.groups.pop(key).n
            part.delta["expired_groups"] += 1
            part.delta["expired_reports"] += n
            part.dirty = True
            self._progress = True
            log.warning(
                "dropping %d buffered reports of %s day %d (partition %d): no crowd of %d before the day left "
                "the window (UTC day %d, max_day_age %d + %d grace day(s))",
                n,
                key[0],
                key[2],
                part.index,
                self.settings.min_batch,
                today,
                self.window.max_day_age,
                self.window.grace_days,
            )

    def _release(self, part: _Partition, key: _GroupKey, group: _Group) -> None:
        s = self.settings
        spec = group.spec
        cap = min(s.max_batch, max(1, s.max_batch_bytes // spec.record_size))
        sizes = plan_release(group.n, s.min_batch, cap)
        if not sizes:
            return
        recs, src = group.arrays()
        perm = csprng_permutation(recs.size, self.words)
        recs = _gather(recs, perm)
        src = src[perm]
        metric, _, day = key
        # keyed per batch, a plain metric-day's batches spread over the shuffled partitions, one key per batch; a
        # sealed one's batch is split by its records' encapsulated keys over the metric-day's sub-keys, so a
        # replayed sealed record reaches the partition, hence the member and replay guard, of its original
        sealed = isinstance(spec, SealedSpec)
        spread = s.shuffled_key == "batch"
        tx = self.transaction()
        pos = 0
        for size in sizes:
            chunk = np.ascontiguousarray(recs[pos : pos + size])
            chunk_src = src[pos : pos + size]
            pos += size
            bid = self.new_batch_id()
            eps, delta, bound = self._central(size, spec.epsilon, self._reports_for(metric, spec.epsilon))
            meta = ShuffleMeta(
                shuffle_id=bid.hex(),
                n=size,
                epsilon0=float(spec.epsilon),
                central_epsilon=eps,
                central_delta=delta,
                bound=bound,
                sources=_sources(chunk_src),
            )
            if spread and sealed:
                n_parts = self._publish_routed(tx, meta, ReportBatch(metric, spec, day, chunk, bid), chunk_src)
                part.delta["released_parts"] += n_parts
            else:
                out_key = self._out_key(metric, day, bid) if spread else shuffled_key(metric, day)
                tx.publish(s.shuffled_topic, out_key, encode_envelope(meta, ReportBatch(metric, spec, day, chunk, bid)))
                part.delta["released_parts"] += 1
            part.pending_reports += size
            part.delta["released_batches"] += 1
            part.delta["released_reports"] += size
        if pos < recs.size:
            group.keep(recs[pos:].copy(), src[pos:])
        else:
            del part.groups[key]

    def _publish_routed(self, tx: Transaction, meta: ShuffleMeta, batch: ReportBatch, src: np.ndarray) -> int:
        """Publish a released sealed batch as parts, one per sub-key of its metric-day that its records route to
        (:func:`pipeline.topics.sealed_route`: by each record's encapsulated key), in their shuffled order.

        Every part carries the whole release's central (ε, δ): the crowd was shuffled together, and which part a
        record falls in depends only on its encapsulated key, a random value the device drew independently of
        the report, so the parts are a post-processing of the shuffled release (the analyzer, all members
        together, sees all of them). Each part gets its own batch id; ``release_id``/``release_n`` name the
        release. The parts are published in the same transaction as the checkpoint: all or none commit.
        """
        s = self.settings
        keys = self._keys_of(batch.metric, batch.day, s.shuffled_spread or self._shuffled_partitions)
        idx = sealed_route(batch.records, batch.spec.record_size, len(keys))
        parts = 0
        for j in np.unique(idx).tolist():
            sel = idx == j
            sub = np.ascontiguousarray(batch.records[sel])
            sid = self.new_batch_id()
            part_meta = dataclasses.replace(
                meta,
                shuffle_id=sid.hex(),
                n=int(sub.size),
                sources=_sources(src[sel]),
                release_id=meta.shuffle_id,
                release_n=meta.n,
                part=int(j),
                parts=len(keys),
            )
            tx.publish(
                s.shuffled_topic,
                keys[j],
                encode_envelope(part_meta, ReportBatch(batch.metric, batch.spec, batch.day, sub, sid)),
            )
            parts += 1
        return parts

    def _out_key(self, metric: str, day: int, bid: bytes) -> bytes:
        """A spread batch's key: its own (``shuffled_spread`` 0), else the metric-day's next sub-key."""
        n = self.settings.shuffled_spread
        if n == 0:
            return shuffled_key(metric, day, bid)
        keys = self._keys_of(metric, day, n)
        nxt = self._next_sub.get((metric, day), 0)
        self._next_sub[(metric, day)] = (nxt + 1) % len(keys)
        return keys[nxt]

    def _keys_of(self, metric: str, day: int, count: int) -> list[bytes]:
        """The metric-day's ``count`` sub-keys over the shuffled topic's partitions, computed once."""
        keys = self._sub_keys.get((metric, day, count))
        if keys is None:
            keys = self._sub_keys[(metric, day, count)] = spread_keys(metric, day, count, self._shuffled_partitions)
        return keys

    def _reports_for(self, metric: str, epsilon0: float) -> int | None:
        """``r`` of the per-person figure: the metrics file's ``max_reports_per_day``, raised to what the devices'
        own caps allow when they are known; ``None`` (no figure) without a metrics file."""
        r = self._reports_per_person.get(metric)
        if r is None or self.device_caps is None:
            return r
        return self.device_caps.reports(metric, float(epsilon0), r)

    def _central(
        self, n: int, epsilon0: float, reports_per_person: int | None
    ) -> tuple[float | None, float | None, str | None]:
        """The batch's central (ε, δ, bound) per *person*, not per report.

        A device sends up to ``r = max_reports_per_day`` reports of a metric
        and day (often in one upload), so a batch of ``n`` reports may hold as
        few as ``⌈n / r⌉`` people, and each person's day is one
        ``r·ε₀``-LDP randomizer (basic composition of its ``r`` reports). The
        bound is evaluated for that crowd and that randomizer; with ``r``
        unknown (no metrics file) no figure is attached.
        """
        if self.guarantee is None or reports_per_person is None:
            return None, None, None
        r = max(1, int(reports_per_person))
        people = -(-int(n) // r)
        try:
            eps, delta, bound = self.guarantee(people, r * float(epsilon0))
            return float(eps), float(delta), f"{bound}; per person: {people} people of up to {r} report(s) each"
        except Exception as exc:  # a figure we cannot compute is omitted, never invented
            if not self._guarantee_failed:
                log.warning("central guarantee unavailable (%r); batches are released without it", exc)
                self._guarantee_failed = True
            return None, None, None

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoint(self, force: bool = False) -> bool:
        """Commit released batches, changed checkpoints and input offsets in one transaction, if one is due.

        Due when input was applied and ``checkpoint_interval`` passed (or
        ``max_pending_reports`` wait), or ``refresh_interval`` passed with
        checkpoints to rewrite; ``force`` skips the timers. Never while a
        partition is restoring. Returns whether a transaction committed. A
        transaction that fails to commit is aborted and every partition is
        restored from the committed checkpoints.
        """
        s = self.settings
        self._require_consumer()
        parts = list(self._parts.values())
        if not all(p.live for p in parts):
            return False
        elapsed = time.monotonic() - self._last_checkpoint
        pending = sum(p.pending_reports for p in parts)
        dirty = any(p.dirty for p in parts)
        if force:
            due = self._progress or dirty
        else:
            due = (self._progress and (elapsed >= s.checkpoint_interval or pending >= s.max_pending_reports)) or (
                dirty and elapsed >= s.refresh_interval
            )
        if not due:
            return False
        last = self._last_checkpoint
        try:
            if super().checkpoint():
                return True
        except FencedError:
            raise
        except TransportError as exc:  # the loop aborted the transaction and forgot every partition
            self.stats.aborted_transactions += 1
            log.warning("checkpoint aborted (%s); restoring from the committed checkpoints", exc)
        self._last_checkpoint = last  # not checkpointed: the next one is due as before
        return False

    def flush_state(self, tx: Transaction | None) -> Mapping[TopicPartition, int] | None:
        """Publish a checkpoint of every changed partition into the transaction the loop then commits."""
        assert tx is not None
        s = self.settings
        for p in self._parts.values():
            p.writing = None
            if p.dirty and p.raw_next is not None:
                for chunk in p.checkpoint_chunks(s.group, s.max_batch_bytes, self._keys, self.words):
                    tx.publish(s.state_topic, self._state_keys[p.index], chunk)
        return {}

    def on_commit_failed(self, exc: CommitFailedError) -> None:
        self.stats.aborted_transactions += 1
        log.warning("checkpoint aborted (%s); restoring from the committed checkpoints", exc)
        self.rewind_all()

    def on_committed(self, offsets: Mapping[TopicPartition, int]) -> None:
        self._expected = {}
        parts = list(self._parts.values())
        for p in parts:
            p.pending_reports = 0
            p.dirty = False
            if p.writing is not None:
                p.latest, p.writing = p.writing, None
            for name, value in p.delta.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)
            p.totals.update({k: v for k, v in p.delta.items() if k in _TOTALS})
            self._totals[p.index] = p.totals.copy()
            p.delta.clear()
        self._progress = False
        self._last_checkpoint = time.monotonic()
        self.stats.checkpoints += 1
        self.stats.buffered_reports = sum(p.buffered() for p in parts)


def _sources(src: np.ndarray) -> int:
    """How many uploads the records whose upload indices are ``src`` came from."""
    return int(np.count_nonzero(np.bincount(src, minlength=1)))
