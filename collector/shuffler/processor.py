"""The shuffler: batches raw uploads per metric, spec and day, permutes them, and releases crowds.

It reads ``ldp.reports.raw`` as a member of a consumer group and writes
``ldp.reports.shuffled`` (:mod:`pipeline.envelope`). For each group
``(metric, spec_id, day)`` it buffers the reports of many uploads; once the
group holds at least ``min_batch`` reports (the crowd threshold) it permutes
all of them with a CSPRNG (:mod:`collector.shuffler.permute`) and releases them as
batches of at most ``max_batch`` reports, each of at least ``min_batch``,
under fresh random batch ids. A group below the threshold stays buffered;
one whose day left the day window it shares with the collector
(:class:`ldp_core.days.DayWindow`: older than ``today - max_day_age -
expiry_grace_days`` by the UTC clock, never by the newest day seen) is
dropped (it never reached a crowd; counted as ``expired_groups`` and
logged).
Nothing of the input survives but the records themselves: not the upload
grouping (uploads are mixed, then re-chunked), not the order (permuted), not
the arrival time (released at checkpoints), not the upload batch ids.

Exactly once, with buffered reports that must survive a crash
-------------------------------------------------------------
A transaction of the transport (:meth:`~pipeline.transport.base.Consumer.transaction`)
commits the outputs together with the offsets just past *every* record
delivered so far. Reports buffered below the threshold have been delivered,
so their offsets get committed too: the buffer itself must therefore be
committed in the same transaction, as data. The shuffler keeps a
**checkpoint** per raw partition ``p`` in the internal topic
``ldp.shuffler.state``, partition ``p`` (it has as many partitions as the
raw topic, and the consumer subscribes to both, so the group assigns raw
``p`` and state ``p`` to the same member; the shuffler checks this). A
checkpoint holds the partition's buffered reports, its window of recent
upload batch ids, and ``raw_offset``: the raw offset up to which it accounts
for the input. Every ``checkpoint_interval`` seconds, one
transaction publishes the released batches, a new checkpoint of every
partition that changed, and commits all input offsets. Hence the invariant:

    for every raw partition ``p`` whose committed offset is ``C``, a checkpoint
    of ``p`` with ``raw_offset == C`` lies beyond state ``p``'s committed offset.

(A checkpoint that was delivered back to the shuffler is rewritten in the next
transaction, since that transaction commits past it.) A partition's buffer
and window change only when a raw record of that partition is applied or a
day leaves the window, so two checkpoints with the same ``raw_offset`` hold
the same state up to expiry, which a restore applies again.

**What a checkpoint does not hold** (format 2, :data:`CHECKPOINT_VERSION`):
the arrival order or any upload number. Each group's buffer is freshly
permuted with the CSPRNG for every checkpoint; the id window is kept as
HMAC-SHA-256 digests (16 bytes) in two unordered sets (:class:`_IdWindow`);
and the whole body is sealed with AES-256-GCM under a subkey of the
shuffler's secret (``key_file``, created 0600 if missing, never written to
a topic), the clear header (group, partition, raw offset, snapshot, chunk,
key id) as associated data. So whoever reads the state topic, even as it is
written, cannot tell which upload a released report came from, nor which
checkpoint interval it arrived in. In memory a group keeps per-record
upload numbers to count a released batch's sources; restored records count
as one, so ``ShuffleMeta.sources`` is a lower bound. Format 1 checkpoints
(clear, in arrival order) are still restored.

**Superseded checkpoints are deleted.** When the shuffler reads back chunk
0 of the latest checkpoint it committed (or restored) for a partition,
every state record before it in that partition is superseded: it calls
:meth:`~pipeline.transport.base.Transport.delete_before` (Kafka:
DeleteRecords; embedded: an overwriting DELETE). Nothing a restore needs is
lost: the checkpoint a restore looks for is the latest committed one.

Released batches go into the open transaction as soon as they are cut (on
Kafka they travel to the broker while the shuffler works on) and become
visible only when it commits.

**Restoring.** A partition is restored when the shuffler starts and whenever
the group moves partitions: its raw records are held back until the
checkpoint with ``raw_offset`` equal to the group's committed offset
arrives, which then replaces the partition's state; the held records are
applied after it. No checkpoint is written while a partition is restoring.
After a rebalance both transports restart *every* owned partition from the
committed offsets and forget what they delivered; the shuffler notices it
because the consumer's delivered positions (``Consumer.positions()``) no
longer match the records it received since its last commit. It then aborts
its open transaction (whose outputs came from records that will be
delivered again) and restores every partition. So after a crash, a
rebalance or an aborted transaction, every report is released exactly once
or is still buffered, and no upload is counted twice.

Duplicates: the collector publishes a retried upload again if it crashed
between publishing and recording the batch id (:mod:`collector.dedup`).
The retry has the same batch id and key, so it lands in the same partition
soon after; the shuffler drops a batch whose id's digest is among the
recent ones of its partition (at least the last ``dedup_window / 2``, at
most ``dedup_window``). The window is part of the checkpoint, so it
survives crashes.

The central guarantee of each released batch comes from an injected
``guarantee(n, epsilon0) -> (epsilon, delta, bound_name)`` (the ``ldp
shuffler`` command wires :func:`estimator.accounting.shuffle.shuffler_guarantee`;
this package does not import the estimator). It is asked per person: for a
batch of ``n`` reports of a metric whose devices send up to ``r`` a day, at
``n = ⌈n / r⌉`` people, each an ``r·ε₀``-LDP randomizer
(:meth:`Shuffler._central`).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import hmac
import itertools
import json
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from collector.errors import ConfigError, ShufflerStateError
from collector.shuffler.permute import WordSource, csprng_permutation, urandom_words, warm_up
from ldp_core.days import DAY_WINDOW_ENV, DEFAULT_MAX_DAY_AGE, DEFAULT_MAX_DAYS_AHEAD, DayWindow, utc_day
from ldp_core.errors import FrameError
from ldp_core.files import load_or_create_private
from ldp_core.mechanisms import spec_from_dict
from ldp_core.mechanisms.base import ReportSpec
from ldp_core.metrics import MetricSet
from ldp_core.wire.frames import ReportBatch, decode_frame
from ldp_core.wire.framing import HEAD_SIZE, FramingError, pack_headed, unpack_headed
from ldp_core.wire.sealing import SealedSpec
from pipeline.envelope import ShuffleMeta, encode_envelope
from pipeline.processor import StreamProcessor
from pipeline.settings import check_names, check_ranges, check_topics, settings_from_env
from pipeline.topics import DEFAULT_PARTITIONS, RAW_TOPIC, SHUFFLED_TOPIC, SHUFFLER_STATE_TOPIC, metric_day_key
from pipeline.transport import (
    CommitFailedError,
    Consumer,
    FencedError,
    Record,
    TopicPartition,
    Transaction,
    Transport,
    TransportError,
    partition_for,
)

__all__ = [
    "Guarantee",
    "ShufflerSettings",
    "ShufflerStats",
    "Shuffler",
    "plan_release",
    "encode_checkpoint_chunk",
    "decode_checkpoint_chunk",
    "CheckpointHeader",
]

log = logging.getLogger("ldp.shuffler")

#: prefix of the environment variables :meth:`ShufflerSettings.from_env` reads (``LDP_SHUFFLER_MIN_BATCH``, ...)
ENV_PREFIX = "LDP_SHUFFLER_"
#: the shuffler's secret (checkpoint encryption and dedup digests), created 0600 on first use
DEFAULT_KEY_PATH = "ldp-data/shuffler.key"
KEY_BYTES = 32
#: the state topic's log segments roll at least this often (seconds), so the broker removes superseded
#: checkpoints from its disk within about this time plus its retention check interval (5 minutes by default)
STATE_SEGMENT_SECONDS = 600.0

#: ``(n, epsilon0) -> (central epsilon, delta, name of the bound)``
Guarantee = Callable[[int, float], "tuple[float, float, str]"]

_GroupKey = tuple[str, str, int]  # metric, spec_id, day


@dataclasses.dataclass(frozen=True)
class ShufflerSettings:
    """How the shuffler batches and checkpoints.

    ``min_batch`` is the crowd threshold: no batch smaller than it is ever
    released. ``max_batch`` (and ``max_batch_bytes``) cap a released batch;
    a group is released whole when it can be cut into batches within both
    bounds, else as full ``max_batch`` batches with the (random) remainder
    kept. ``checkpoint_interval`` is the time between transactions (the
    added latency); ``max_pending_reports`` forces one earlier.
    ``max_day_age``, ``max_days_ahead`` are the collector's window of days
    (:mod:`ldp_core.days`; also from ``$LDP_MAX_DAY_AGE`` /
    ``$LDP_MAX_DAYS_AHEAD``) and a group is kept ``expiry_grace_days`` past
    it; ``max_age_days`` is the old name of ``max_day_age``. ``key_file`` is
    the shuffler's secret (created 0600 if missing; the same file for every
    member of the group).
    """

    min_batch: int = 1000
    max_batch: int = 1 << 16
    max_batch_bytes: int = 4 << 20
    raw_topic: str = RAW_TOPIC
    shuffled_topic: str = SHUFFLED_TOPIC
    state_topic: str = SHUFFLER_STATE_TOPIC
    partitions: int = DEFAULT_PARTITIONS
    group: str = "ldp-shuffler"
    member: str = "shuffler-0"
    checkpoint_interval: float = 1.0
    max_pending_reports: int = 1 << 22
    dedup_window: int = 16384
    max_day_age: int = DEFAULT_MAX_DAY_AGE
    max_days_ahead: int = DEFAULT_MAX_DAYS_AHEAD
    expiry_grace_days: int = 1
    max_age_days: int | None = None
    key_file: str = DEFAULT_KEY_PATH
    refresh_interval: float = 6 * 3600.0
    restore_timeout: float = 120.0
    session_timeout: float = 10.0
    poll_records: int = 500

    def __post_init__(self) -> None:
        if self.max_age_days is not None:  # the old name of max_day_age (it counted from the newest day seen)
            check_ranges(self, {"max_age_days": (0, 3660)})
            object.__setattr__(self, "max_day_age", self.max_age_days)
        if not isinstance(self.key_file, str) or not self.key_file:
            raise ConfigError("key_file must be a file path")
        check_ranges(
            self,
            {
                "min_batch": (1, 1 << 24),
                "max_batch": (1, 1 << 24),
                "max_batch_bytes": (1024, 1 << 30),
                "partitions": (1, 10_000),
                "max_pending_reports": (1, 1 << 40),
                "dedup_window": (0, 1 << 24),
                "max_day_age": (0, 3660),
                "max_days_ahead": (0, 366),
                "expiry_grace_days": (0, 366),
                "poll_records": (1, 1 << 20),
                # seconds
                "checkpoint_interval": (0.001, 1e9),
                "refresh_interval": (0.001, 1e9),
                "restore_timeout": (0.001, 1e9),
                "session_timeout": (0.001, 1e9),
            },
        )
        if self.max_batch < self.min_batch:
            raise ConfigError(f"max_batch ({self.max_batch}) must be at least min_batch ({self.min_batch})")
        check_topics(self, "raw_topic", "shuffled_topic", "state_topic")
        topics = (self.raw_topic, self.shuffled_topic, self.state_topic)
        if len(set(topics)) != 3:
            raise ConfigError(f"the raw, shuffled and state topics must differ, got {topics}")
        check_names(self, "group", "member")

    @property
    def day_window(self) -> DayWindow:
        """The shared window of days (:mod:`ldp_core.days`): the collector's, plus ``expiry_grace_days``."""
        return DayWindow(self.max_day_age, self.max_days_ahead, self.expiry_grace_days)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> ShufflerSettings:
        """``overrides`` (``None``: not given) over ``$LDP_SHUFFLER_<FIELD>`` over the defaults; the day window
        also from the shared ``$LDP_MAX_DAY_AGE`` / ``$LDP_MAX_DAYS_AHEAD``."""
        return settings_from_env(cls, ENV_PREFIX, environ, overrides, aliases=DAY_WINDOW_ENV)


@dataclasses.dataclass
class ShufflerStats:
    """Counters since the process started."""

    input_batches: int = 0
    input_reports: int = 0
    duplicate_batches: int = 0
    duplicate_reports: int = 0
    undecodable_batches: int = 0
    #: batches whose day was already out of the window when they were read (their reports are in expired_reports)
    expired_batches: int = 0
    #: buffered groups dropped because their day left the window before they reached a crowd
    expired_groups: int = 0
    expired_reports: int = 0
    superseded_deletes: int = 0
    released_batches: int = 0
    released_reports: int = 0
    checkpoints: int = 0
    restores: int = 0
    aborted_transactions: int = 0
    buffered_reports: int = 0

    def to_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)


def plan_release(n: int, min_batch: int, cap: int) -> list[int]:
    """Sizes of the batches to release from a group of ``n >= min_batch`` reports (each in ``[min_batch, cap]``).

    Whole group in ``k = ceil(n / cap)`` near-equal batches if each holds at
    least ``min_batch``; otherwise ``n // cap`` batches of ``cap`` and the rest kept.
    """
    cap = max(cap, min_batch)
    if n < min_batch:
        return []
    k = -(-n // cap)
    if n // k >= min_batch:
        base, extra = divmod(n, k)
        return [base + 1] * extra + [base] * (k - extra)
    return [cap] * (n // cap)


# -- the shuffler's secret ---------------------------------------------------------------


def load_or_create_key(path: str) -> bytes:
    """The shuffler's 32-byte secret in ``path``, created on first use (0600, atomically; of several processes
    starting together exactly one creates it, the others read it). Refused if other users may read it."""
    try:
        return load_or_create_private(os.path.expanduser(path), KEY_BYTES)
    except (PermissionError, ValueError) as exc:
        raise ConfigError(f"the shuffler key: {exc}") from None


class _Keys:
    """Subkeys of the shuffler's secret: AES-256-GCM for checkpoints, HMAC-SHA-256 for batch-id digests."""

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, (bytes, bytearray)) or len(secret) != KEY_BYTES:
            raise ConfigError(f"the shuffler key must be {KEY_BYTES} bytes")
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        def sub(label: bytes) -> bytes:
            return hmac.new(bytes(secret), label, hashlib.sha256).digest()

        self.aead = AESGCM(sub(b"ldp-shuffler checkpoint v2"))
        self.dedup = sub(b"ldp-shuffler batch-id digest v2")
        #: names the key in clear checkpoint headers, so a member with another key says so instead of failing later
        self.key_id = sub(b"ldp-shuffler key id")[:8].hex()

    def digest(self, batch_id: bytes) -> bytes:
        return hmac.new(self.dedup, bytes(batch_id), hashlib.sha256).digest()[:16]

    def seal(self, head: bytes, inner: bytes) -> bytes:
        nonce = os.urandom(12)
        return nonce + self.aead.encrypt(nonce, inner, head)

    def open(self, head: bytes, sealed: memoryview) -> bytes:
        from cryptography.exceptions import InvalidTag

        try:
            return bytes(self.aead.decrypt(bytes(sealed[:12]), bytes(sealed[12:]), head))
        except (InvalidTag, ValueError):
            raise FrameError("the checkpoint chunk does not authenticate under this shuffler's key") from None


#: the counters kept per partition in its checkpoints (:meth:`Shuffler.totals`)
_TOTALS = (
    "input_batches",
    "input_reports",
    "duplicate_batches",
    "duplicate_reports",
    "undecodable_batches",
    "expired_batches",
    "expired_groups",
    "expired_reports",
    "released_batches",
    "released_reports",
)

# -- checkpoint chunks ---------------------------------------------------------------

_CKPT_MAGIC = b"LDPQ"
_INNER_MAGIC = b"LDPq"
#: format of the checkpoints written: 2 = sealed, permuted, no upload numbers; 1 (still restored) = in the clear
CHECKPOINT_VERSION = 2


@dataclasses.dataclass(frozen=True)
class CheckpointHeader:
    """The clear header of a checkpoint chunk: which group, partition and input offset it belongs to, nothing
    about its reports. ``key_id`` names the key the payload is sealed with. A version 1 chunk (written in the
    clear by older shufflers) carries its body's description in ``legacy`` (``newest_day``, ``ids``, ``pieces``)."""

    group: str
    partition: int
    raw_offset: int
    snapshot: str
    chunk: int
    chunks: int
    key_id: str = ""
    version: int = CHECKPOINT_VERSION
    legacy: Mapping[str, Any] | None = None

    def to_json(self) -> bytes:
        obj = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("version", "legacy")}
        return json.dumps(obj, separators=(",", ":")).encode()


#: ``[metric, spec dict, day, count]`` of one run of records in a checkpoint body
Piece = tuple[str, dict[str, Any], int, int]


def encode_checkpoint_chunk(header: CheckpointHeader, body: bytes, keys: _Keys) -> bytes:
    """A :mod:`ldp_core.wire.framing` frame (version 2): the clear header as JSON, then the body (see
    :func:`encode_checkpoint_body`) sealed with AES-256-GCM under the shuffler's key, the header as associated data."""
    head = header.to_json()
    return pack_headed(_CKPT_MAGIC, head, keys.seal(head, body), version=CHECKPOINT_VERSION)


def encode_checkpoint_body(
    pieces: Sequence[Piece],
    digests: Sequence[bytes],
    previous: int,
    records: Sequence[bytes],
    totals: Mapping[str, int] | None = None,
) -> bytes:
    """The plaintext of a chunk: ``pieces`` (and on the first chunk the partition's counter ``totals``), then the
    16-byte batch-id digests (the older set's ``previous`` first, each set sorted by value), then the records."""
    obj: dict[str, Any] = {"pieces": list(pieces), "ids": len(digests), "previous": int(previous)}
    if totals:
        obj["totals"] = {k: int(v) for k, v in sorted(totals.items())}
    head = json.dumps(obj, separators=(",", ":")).encode()
    return pack_headed(_INNER_MAGIC, head, b"".join(digests) + b"".join(records))


def decode_checkpoint_chunk(value: bytes) -> tuple[CheckpointHeader, memoryview]:
    """The clear header and the (sealed, or for version 1 plain) payload of a checkpoint chunk;
    :class:`~ldp_core.wire.framing.FramingError` if ``value`` is not a whole chunk frame,
    :class:`~ldp_core.errors.FrameError` if its header is malformed."""
    version = value[4] if len(value) > HEAD_SIZE else CHECKPOINT_VERSION
    version = 1 if version == 1 else CHECKPOINT_VERSION
    head, payload = unpack_headed(value, _CKPT_MAGIC, "shuffler checkpoint chunk", version=version)
    try:
        obj = json.loads(head)
        if version == 1:
            legacy = {
                "newest_day": int(obj.pop("newest_day")),
                "ids": int(obj.pop("ids")),
                "pieces": tuple(tuple(p) for p in obj.pop("pieces")),
            }
            header = CheckpointHeader(**obj, version=1, legacy=legacy)
        else:
            header = CheckpointHeader(**obj)
            if header.to_json() != head:
                raise ValueError("the header is not in its canonical form")
    except (ValueError, TypeError, KeyError) as exc:
        raise FrameError(f"checkpoint header is malformed: {exc}") from None
    return header, payload


def decode_checkpoint_body(
    body: bytes,
) -> tuple[tuple[Piece, ...], list[bytes], int, memoryview, dict[str, int]]:
    """``(pieces, batch-id digests, how many of them are the older set's, records payload, counter totals)`` of a
    chunk's plaintext (the totals are empty on all but the first chunk, and in chunks written before them)."""
    head, payload = unpack_headed(body, _INNER_MAGIC, "shuffler checkpoint body")
    try:
        obj = json.loads(head)
        pieces = tuple((str(m), dict(s), int(d), int(c)) for m, s, d, c in obj["pieces"])
        n = int(obj["ids"])
        previous = int(obj["previous"])
        totals = {str(k): int(v) for k, v in dict(obj.get("totals", {})).items()}
    except (ValueError, TypeError, KeyError) as exc:
        raise FrameError(f"checkpoint body header is malformed: {exc}") from None
    if 16 * n > len(payload):
        raise FrameError("checkpoint body is truncated")
    return pieces, [bytes(payload[16 * i : 16 * i + 16]) for i in range(n)], previous, payload[16 * n :], totals


# -- per-partition state -----------------------------------------------------------------


class _Group:
    """Buffered reports of one (metric, spec, day): record arrays with per-record source (upload) numbers.

    Sources are numbered densely per group (0, 1, ...), so the distinct
    uploads in a released batch are counted with one ``bincount``. They live
    in memory only: a checkpoint holds no source numbers (nor any order), so
    the records restored from one count as a single source and
    :attr:`~pipeline.envelope.ShuffleMeta.sources` is a lower bound.
    """

    __slots__ = ("spec", "parts", "n", "next_source")

    def __init__(self, spec: ReportSpec) -> None:
        self.spec = spec
        self.parts: list[tuple[np.ndarray, np.ndarray | int]] = []
        self.n = 0
        self.next_source = 0

    def add_upload(self, records: np.ndarray) -> None:
        self.parts.append((records, self.next_source))
        self.next_source += 1
        self.n += int(records.size)

    def add_restored(self, records: np.ndarray) -> None:
        """Records read from a checkpoint (before any upload of this process): together, source 0."""
        self.parts.append((records, 0))
        self.n += int(records.size)
        self.next_source = max(self.next_source, 1)

    def records(self) -> np.ndarray:
        if len(self.parts) == 1:
            return self.parts[0][0]
        # as bytes: concatenating structured arrays field by field is ~20x slower
        dtype = self.parts[0][0].dtype
        return np.concatenate([np.ascontiguousarray(r).view(np.uint8) for r, _ in self.parts]).view(dtype)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        recs = self.records()
        if all(isinstance(s, int) for _, s in self.parts):
            src = np.repeat(np.array([s for _, s in self.parts], dtype=np.uint32), [r.size for r, _ in self.parts])
        else:
            src = np.concatenate(
                [np.full(r.size, s, dtype=np.uint32) if isinstance(s, int) else s for r, s in self.parts]
            )
        return recs, src

    def keep(self, records: np.ndarray, sources: np.ndarray) -> None:
        """Replace the buffer by ``records`` (a random remainder), renumbering their sources densely."""
        uniq, dense = np.unique(sources, return_inverse=True)
        self.parts = [(records, dense.astype(np.uint32).reshape(-1))]
        self.n = int(records.size)
        self.next_source = int(uniq.size)


class _IdWindow:
    """Digests of recent upload batch ids, in no order: two sets, the current one and the one before.

    An id goes into ``current``; once it holds ``half = ceil(limit / 2)``
    digests it becomes ``previous`` (the old ``previous`` is forgotten). So
    at least the last ``half`` and at most ``limit`` ids are remembered, and
    within each set nothing tells which id came first.
    """

    __slots__ = ("limit", "half", "current", "previous")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.half = max(1, -(-limit // 2))
        self.current: set[bytes] = set()
        self.previous: set[bytes] = set()

    def __contains__(self, digest: bytes) -> bool:
        return digest in self.current or digest in self.previous

    def __len__(self) -> int:
        return len(self.current) + len(self.previous)

    def add(self, digest: bytes) -> None:
        if not self.limit:
            return
        self.current.add(digest)
        if len(self.current) >= self.half:
            self.previous, self.current = self.current, set()

    def clear(self) -> None:
        self.current.clear()
        self.previous.clear()

    def serialized(self) -> tuple[list[bytes], int]:
        """Every digest, each set sorted by value (``previous`` first), and how many are ``previous``."""
        return sorted(self.previous) + sorted(self.current), len(self.previous)

    def restore(self, digests: Sequence[bytes], previous: int) -> None:
        self.previous = set(digests[:previous])
        self.current = set(digests[previous:])
        if len(self.current) >= self.half:  # a smaller window than the checkpoint's writer had
            self.previous, self.current = self.current, set()


class _Partition:
    """What the shuffler holds for one raw partition (and its state partition of the same number)."""

    def __init__(self, index: int, committed: int | None, dedup_window: int) -> None:
        self.index = index
        self.live = committed is None
        self.committed = committed  # raw offset the restore looks for
        self.restore_since = time.monotonic()
        #: snapshot -> chunk -> (header, payload, state offset)
        self.assembling: dict[str, dict[int, tuple[CheckpointHeader, memoryview, int]]] = {}
        self.held: list[Record] = []
        self.groups: dict[_GroupKey, _Group] = {}
        self.ids = _IdWindow(dedup_window)
        self.raw_next: int | None = committed
        self.dirty = False
        self.pending_reports = 0
        self.delta: collections.Counter[str] = collections.Counter()  # stats, counted once committed
        self.writing: str | None = None  # snapshot id of the checkpoint in the open transaction
        self.latest: str | None = None  # snapshot id of the latest committed checkpoint (written or restored)
        self.foreign = False  # another group's chunks share this state partition: delete nothing
        self.totals: collections.Counter[str] = collections.Counter()  # committed counters since the first record

    def buffered(self) -> int:
        return sum(g.n for g in self.groups.values())


def _gather(records: np.ndarray, perm: np.ndarray) -> np.ndarray:
    """``records[perm]`` for fixed-width records, as a row gather over their bytes (several times faster
    than fancy indexing a structured dtype)."""
    raw = np.ascontiguousarray(records).view(np.uint8).reshape(records.size, records.dtype.itemsize)
    return np.take(raw, perm, axis=0).reshape(-1).view(records.dtype)


def _state_keys(partitions: int) -> list[bytes]:
    """For each state partition ``p``, a record key that :func:`partition_for` maps to ``p``."""
    keys: dict[int, bytes] = {}
    for i in itertools.count():
        key = f"shuffler-state-{i}".encode()
        keys.setdefault(partition_for(key, partitions), key)
        if len(keys) == partitions:
            return [keys[p] for p in range(partitions)]
    raise AssertionError("unreachable")


class Shuffler(StreamProcessor):
    """One shuffler worker. ``run()`` loops until stopped; ``close()`` leaves the group.

    It runs the transactional loop of :class:`~pipeline.processor.StreamProcessor`:
    the per-record step applies a raw upload or a checkpoint chunk, the
    checkpoint publishes every changed partition's checkpoint into the open
    transaction and commits it (see the module docstring).

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

    def _open_chunk(
        self, header: CheckpointHeader, payload: memoryview
    ) -> tuple[tuple[Piece, ...], list[bytes], int, memoryview, dict[str, int]]:
        """``(pieces, batch-id digests, how many digests are of the older set, records, counter totals)`` of a
        chunk of the checkpoint being restored; a version 1 chunk's raw batch ids are digested here (it has no
        totals: they start from 0)."""
        if header.version == 1:
            assert header.legacy is not None
            n = int(header.legacy["ids"])
            ids = [self._keys.digest(bytes(payload[16 * i : 16 * i + 16])) for i in range(n)]
            pieces = tuple((str(m), dict(sd), int(d), int(c)) for m, sd, d, c in header.legacy["pieces"])
            return pieces, ids, len(ids), payload[16 * n :], {}
        if header.key_id != self._keys.key_id:
            raise ShufflerStateError(
                f"partition {header.partition}: the checkpoint to restore (raw offset {header.raw_offset}) is sealed "
                f"under another shuffler key (id {header.key_id}, this process has {self._keys.key_id}). Every "
                f"member of group {self.settings.group!r} must read the same key_file "
                f"({self.settings.key_file!r}); without that key the buffered reports cannot be restored."
            )
        try:
            pieces, ids, previous, rest, totals = decode_checkpoint_body(self._keys.open(header.to_json(), payload))
        except FrameError as exc:
            raise ShufflerStateError(
                f"partition {header.partition}: the checkpoint to restore (raw offset {header.raw_offset}) is "
                f"damaged: {exc}"
            ) from None
        return pieces, ids, previous, rest, totals

    def _load(self, part: _Partition, chunks: list[tuple[CheckpointHeader, memoryview, int]]) -> None:
        part.groups.clear()
        part.ids.clear()
        specs: dict[str, ReportSpec] = {}
        digests: list[bytes] = []
        previous = 0
        version = chunks[0][0].version
        for i, (header, payload, _) in enumerate(chunks):
            pieces, ids, prev, rest, totals = self._open_chunk(header, payload)
            if i == 0:
                part.totals = collections.Counter({k: v for k, v in totals.items() if k in _TOTALS})
                self._totals[part.index] = part.totals.copy()
            digests.extend(ids)
            previous += prev
            pos = 0
            for metric, spec_dict, day, count in pieces:
                key_id = json.dumps(spec_dict, sort_keys=True)
                spec = specs.get(key_id)
                if spec is None:
                    plain = {k: v for k, v in spec_dict.items() if k != "sealed"}
                    spec = spec_from_dict(plain)
                    spec = specs[key_id] = SealedSpec.of(spec) if spec_dict.get("sealed") else spec
                recs = np.frombuffer(rest, dtype=spec.record_dtype, count=count, offset=pos).copy()
                pos += count * spec.record_size
                if version == 1:
                    pos += 4 * count  # the upload numbers of the old format: not restored
                key = (metric, spec.spec_id, int(day))
                group = part.groups.get(key)
                if group is None:
                    group = part.groups[key] = _Group(spec)
                group.add_restored(recs)
        part.ids.restore(digests, previous)
        part.live = True
        part.assembling.clear()
        part.raw_next = part.committed
        part.latest = chunks[0][0].snapshot
        self._supersede(part, chunks[0][2])
        held, part.held = part.held, []
        log.info(
            "partition %d restored at raw offset %s (checkpoint format %d): %d reports buffered, %d ids",
            part.index,
            part.committed,
            version,
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
        out_key = metric_day_key(metric, day)
        tx = self.transaction()
        pos = 0
        for size in sizes:
            chunk = np.ascontiguousarray(recs[pos : pos + size])
            sources = int(np.count_nonzero(np.bincount(src[pos : pos + size], minlength=1)))
            pos += size
            bid = self.new_batch_id()
            eps, delta, bound = self._central(size, spec.epsilon, self._reports_per_person.get(metric))
            meta = ShuffleMeta(
                shuffle_id=bid.hex(),
                n=size,
                epsilon0=float(spec.epsilon),
                central_epsilon=eps,
                central_delta=delta,
                bound=bound,
                sources=sources,
            )
            tx.publish(s.shuffled_topic, out_key, encode_envelope(meta, ReportBatch(metric, spec, day, chunk, bid)))
            part.pending_reports += size
            part.delta["released_batches"] += 1
            part.delta["released_reports"] += size
        if pos < recs.size:
            group.keep(recs[pos:].copy(), src[pos:])
        else:
            del part.groups[key]

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

    def _chunks(self, part: _Partition) -> Iterator[bytes]:
        """The checkpoint of ``part`` as chunks of at most about ``max_batch_bytes``: each group's buffer
        freshly permuted (so the stored order says nothing of the arrival order), no upload numbers, the
        batch-id window as keyed digests in no order, everything but the clear header sealed."""
        budget = self.settings.max_batch_bytes
        snapshot = secrets.token_hex(8)
        part.writing = snapshot
        digests, previous = part.ids.serialized()
        pieces: list[list[tuple[Piece, bytes]]] = [[]]
        sizes = [16 * len(digests)]
        for (metric, _, day), group in sorted(part.groups.items()):
            recs = group.records()
            recs = _gather(recs, csprng_permutation(recs.size, self.words))
            spec_dict = group.spec.to_dict()
            if isinstance(group.spec, SealedSpec):  # the records are sealed: restored as such
                spec_dict = {**spec_dict, "sealed": True}
            per = group.spec.record_size
            pos = 0
            while pos < recs.size:
                if sizes[-1] >= budget:
                    pieces.append([])
                    sizes.append(0)
                take = min(max(1, (budget - sizes[-1]) // per), recs.size - pos)
                pieces[-1].append(((metric, spec_dict, day, take), recs[pos : pos + take].tobytes()))
                sizes[-1] += take * per
                pos += take
        total = len(pieces)
        for i, chunk in enumerate(pieces):
            header = CheckpointHeader(
                group=self.settings.group,
                partition=part.index,
                raw_offset=int(part.raw_next or 0),
                snapshot=snapshot,
                chunk=i,
                chunks=total,
                key_id=self._keys.key_id,
            )
            body = encode_checkpoint_body(
                [p for p, _ in chunk],
                digests if i == 0 else [],
                previous if i == 0 else 0,
                [b for _, b in chunk],
                {k: int(v) for k, v in (part.totals + part.delta).items() if k in _TOTALS} if i == 0 else None,
            )
            yield encode_checkpoint_chunk(header, body, self._keys)

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
        for p in self._parts.values():
            p.writing = None
            if p.dirty and p.raw_next is not None:
                for chunk in self._chunks(p):
                    tx.publish(self.settings.state_topic, self._state_keys[p.index], chunk)
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
