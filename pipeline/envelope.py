"""The shuffled-batch envelope: what the shuffler publishes and sinks read.

A shuffled batch is one wire frame (``ldp_core.wire.frames``; one metric, spec and
day; records in a CSPRNG-permuted order under a fresh batch id) together with
what the shuffler knows about it: how many reports it holds, the local ε₀
of each, and the central (ε, δ) guarantee that shuffling gives against the
analyzer (computed by an injected function; ``None`` when not computed).

Layout (little-endian)::

    0   4  magic b"LDPS"
    4   1  version (1)
    5   1  reserved (0)
    6   4  metadata length M
    10  M  metadata, UTF-8 JSON object (see ShuffleMeta)
    10+M   the wire frame, to the end

A sealed metric's shuffled frame carries sealed records (the shuffler never
opens them); :func:`open_sealed` opens them in the processes that hold the
analyzer's keys (the sink, the streaming estimator).
"""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any

from ldp_core.errors import FrameError
from ldp_core.wire.frames import ReportBatch, SpecResolver, decode_frame, encode_frame
from ldp_core.wire.sealing import BatchOpener

__all__ = ["ENVELOPE_MAGIC", "ShuffleMeta", "ShuffledBatch", "encode_envelope", "decode_envelope", "open_sealed"]

ENVELOPE_MAGIC = b"LDPS"
_HEAD = struct.Struct("<4sBBI")


@dataclasses.dataclass(frozen=True)
class ShuffleMeta:
    """What travels beside a shuffled frame."""

    shuffle_id: str  # hex; equals the frame's batch id
    n: int  # reports in the batch
    epsilon0: float  # local ε of each report (the spec's)
    central_epsilon: float | None = None  # after shuffling, against the analyzer
    central_delta: float | None = None
    bound: str | None = None  # which bound produced the central figure
    sources: int = 0  # how many uploaded batches were mixed into it
    # a part of a released batch that the shuffler split by the records' encapsulated keys (a sealed metric,
    # issue 31): the whole release's id and size (what was shuffled together, and what ``central_epsilon``,
    # ``central_delta`` are computed for), this part's sub-key index and the number of sub-keys; ``None`` for
    # a batch released whole (and then absent from the JSON, so that such envelopes read as before)
    release_id: str | None = None
    release_n: int | None = None
    part: int | None = None
    parts: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for k in _RELEASE_FIELDS:
            if out[k] is None:
                del out[k]
        return out


_RELEASE_FIELDS = ("release_id", "release_n", "part", "parts")


@dataclasses.dataclass(frozen=True)
class ShuffledBatch:
    meta: ShuffleMeta
    batch: ReportBatch


def encode_envelope(meta: ShuffleMeta, batch: ReportBatch) -> bytes:
    if meta.n != len(batch):
        raise FrameError(f"envelope says n={meta.n} but the batch holds {len(batch)} reports")
    m = json.dumps(meta.to_json(), separators=(",", ":")).encode()
    return _HEAD.pack(ENVELOPE_MAGIC, 1, 0, len(m)) + m + encode_frame(batch)


def _split(data: bytes | memoryview) -> tuple[ShuffleMeta, memoryview]:
    buf = memoryview(data).cast("B")
    if len(buf) < _HEAD.size:
        raise FrameError(f"envelope is truncated: {len(buf)} bytes")
    magic, version, reserved, mlen = _HEAD.unpack_from(buf, 0)
    if magic != ENVELOPE_MAGIC:
        raise FrameError(f"bad envelope magic {bytes(magic)!r}, expected {ENVELOPE_MAGIC!r}")
    if version != 1 or reserved != 0:
        raise FrameError(f"unsupported envelope version {version} / reserved byte {reserved}")
    if _HEAD.size + mlen > len(buf):
        raise FrameError("envelope metadata runs past the end of the message")
    try:
        obj = json.loads(bytes(buf[_HEAD.size : _HEAD.size + mlen]))
        meta = ShuffleMeta(**obj)
    except (ValueError, TypeError) as exc:
        raise FrameError(f"envelope metadata is malformed: {exc}") from None
    return meta, buf[_HEAD.size + mlen :]


def decode_envelope(data: bytes | memoryview, specs: SpecResolver) -> ShuffledBatch:
    meta, frame = _split(data)
    batch = decode_frame(frame, specs)
    if meta.n != len(batch):
        raise FrameError(f"envelope says n={meta.n} but the frame holds {len(batch)} reports")
    return ShuffledBatch(meta, batch)


class SealedWithoutKeysError(FrameError):
    """A shuffled batch is sealed and this process has no analyzer keys: it is kept as undecodable."""


def open_sealed(
    sb: ShuffledBatch, opener: BatchOpener | None, source: object | None = None
) -> tuple[ShuffledBatch, int, int]:
    """``sb`` with its sealed records opened (``n`` is then the opened count), how many did not open, and
    how many opened records were dropped as replays (their encapsulated key was already counted from
    another ``source``, e.g. another log record: see :class:`~ldp_core.wire.sealing.ReplayGuard`).
    A plain batch comes back as is."""
    if not sb.batch.sealed:
        return sb, 0, 0
    if opener is None:
        raise SealedWithoutKeysError(
            f"metric {sb.batch.metric!r}: the batch is sealed and this process has no analyzer keys "
            "(--analyzer-keys DIR or $LDP_ANALYZER_KEYS)"
        )
    res = opener.open_batch(sb.batch, source)
    return ShuffledBatch(dataclasses.replace(sb.meta, n=len(res.batch)), res.batch), res.failed, res.replayed
