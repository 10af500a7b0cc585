"""Wire format v1: one report batch = one metric, one spec, one day, n records.

Binary frame (all integers little-endian)::

    offset size field
    0      4    magic b"LDPB"
    4      1    version (1)
    5      1    flags: 0 (plain records) or 1 (FLAG_SEALED: sealed records); other bits must be 0
    6      2    metric name length L (1..255)
    8      8    spec_id (the spec's 16 hex digits, as 8 bytes)
    16     4    day (days since 1970-01-01, UTC)
    20     4    record size R in bytes (the spec's; for a sealed frame the spec's + 52)
    24     4    number of records n
    28     16   batch id (idempotency key; not linked to the sender)
    44     L    metric name, UTF-8
    44+L   n*R  records, the spec's fixed-width dtype
    ...    4    CRC-32 (zlib) of every byte before it

A **sealed frame** (flag 1) carries the records of a metric declared
``"sealed": true``, each encrypted to the analyzer's key
(:mod:`ldp_core.wire.sealing`: key id, ephemeral key, ciphertext; the spec's
record size + :data:`~ldp_core.wire.sealing.SEALED_OVERHEAD` bytes each). The
header stays readable (metric, spec id, day, sizes: what the collector
checks); the records do not. A resolver that returns a
:class:`~ldp_core.wire.sealing.SealedSpec` for a metric refuses plain frames of it;
a sealed frame decodes to a batch whose spec is the ``SealedSpec`` of the
resolved one. Sealed frames travel in the binary form only.

Decoding checks every field and the exact length; a malformed frame raises
:class:`~ldp_core.errors.FrameError` naming the part at fault, and a frame
made under another spec raises :class:`~ldp_core.errors.SpecMismatchError`.
Nothing is truncated or padded silently.

The JSON form carries the same fields: ``{"version": 1, "metric", "spec_id",
"day", "batch_id" (32 hex digits), "records": [[field, ...], ...]}``; integer
fields are numbers and byte-array fields (packed bits) are hex strings.

Over HTTP the binary frame travels as :data:`FRAME_CONTENT_TYPE`
(``application/vnd.ldp.frame``), its one name; the JSON form as
``application/json``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import uuid
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ldp_core.errors import FrameError, SpecMismatchError
from ldp_core.mechanisms.base import ReportSpec
from ldp_core.wire.sealed import SealedSpec

__all__ = [
    "FRAME_CONTENT_TYPE",
    "MAGIC",
    "VERSION",
    "FLAG_SEALED",
    "HEADER_SIZE",
    "MAX_RECORDS",
    "ReportBatch",
    "FrameHeader",
    "encode_frame",
    "frame_head",
    "decode_frame",
    "decode_verified",
    "read_header",
    "encode_json",
    "decode_json",
    "batch_to_json_obj",
]

#: The media type of a binary frame, sent by the SDK and named first by the collector. A vendor-tree name (RFC 6838), like the FL upload's
#: ``application/vnd.ldp.fl-upload``; the ``x-`` prefix is deprecated (RFC 6648).
FRAME_CONTENT_TYPE = "application/vnd.ldp.frame"
MAGIC = b"LDPB"
VERSION = 1
#: frame flag: the records are sealed (ldp_core.wire.sealing)
FLAG_SEALED = 0x01
_HEADER = struct.Struct("<4sBBH8sIII16s")
HEADER_SIZE = _HEADER.size  # 44
_CRC = struct.Struct("<I")
MAX_RECORDS = 1 << 24
_METRIC_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,255}$")

SpecResolver = Mapping[str, ReportSpec] | Callable[[str, str], ReportSpec] | ReportSpec


def _check_metric(metric: str) -> str:
    if not isinstance(metric, str) or not _METRIC_RE.match(metric):
        raise FrameError(f"metric name {metric!r} is invalid: use 1-255 characters from letters, digits and _ . : -")
    return metric


@dataclasses.dataclass(frozen=True)
class ReportBatch:
    """Privatized reports of one metric, under one spec, for one UTC day."""

    metric: str
    spec: ReportSpec
    day: int
    records: np.ndarray
    batch_id: bytes = dataclasses.field(default_factory=lambda: uuid.uuid4().bytes)

    def __post_init__(self) -> None:
        _check_metric(self.metric)
        if isinstance(self.day, bool) or not isinstance(self.day, (int, np.integer)) or not 0 <= self.day < 2**32:
            raise FrameError(f"day must be an integer number of days since 1970-01-01, got {self.day!r}")
        object.__setattr__(self, "day", int(self.day))
        if not isinstance(self.batch_id, (bytes, bytearray)) or len(self.batch_id) != 16:
            raise FrameError(f"batch_id must be 16 bytes, got {self.batch_id!r}")
        object.__setattr__(self, "batch_id", bytes(self.batch_id))
        recs = np.asarray(self.records)
        if recs.dtype != self.spec.record_dtype or recs.ndim != 1:
            raise SpecMismatchError(
                f"records have dtype {recs.dtype} and shape {recs.shape}; spec {self.spec.name} "
                f"({self.spec.spec_id}) needs a 1-d array of {self.spec.record_dtype}"
            )
        if recs.size > MAX_RECORDS:
            raise FrameError(f"a batch holds at most {MAX_RECORDS} records, got {recs.size}")
        object.__setattr__(self, "records", recs)

    @classmethod
    def _checked(cls, metric: str, spec: ReportSpec, day: int, records: np.ndarray, batch_id: bytes) -> ReportBatch:
        """A batch from fields :func:`decode_frame` has checked already (the metric name, a ``uint32`` day, 16
        bytes of batch id, a 1-d view of ``spec.record_dtype`` within :data:`MAX_RECORDS`), without checking
        them a second time in ``__post_init__`` (an upload's frame is decoded on the collector's event loop)."""
        batch = object.__new__(cls)
        fields = batch.__dict__  # filled directly: a third of five frozen-dataclass object.__setattr__ calls
        fields["metric"] = metric
        fields["spec"] = spec
        fields["day"] = day
        fields["records"] = records
        fields["batch_id"] = batch_id
        return batch

    def __len__(self) -> int:
        return int(self.records.size)

    @property
    def sealed(self) -> bool:
        """Whether the records are sealed to the analyzer's key (the spec is a :class:`SealedSpec`)."""
        return isinstance(self.spec, SealedSpec)


@dataclasses.dataclass(frozen=True)
class FrameHeader:
    """The parsed fixed header of a binary frame."""

    version: int
    metric: str
    spec_id: str
    day: int
    record_size: int
    n_records: int
    batch_id: bytes
    sealed: bool = False

    @property
    def frame_size(self) -> int:
        return HEADER_SIZE + len(self.metric.encode()) + self.record_size * self.n_records + _CRC.size


def frame_head(batch: ReportBatch) -> bytes:
    """The bytes of ``batch``'s v1 frame before its records: the header and the metric name."""
    metric = batch.metric.encode()
    return (
        _HEADER.pack(
            MAGIC,
            VERSION,
            FLAG_SEALED if batch.sealed else 0,
            len(metric),
            bytes.fromhex(batch.spec.spec_id),
            batch.day,
            batch.spec.record_size,
            len(batch),
            batch.batch_id,
        )
        + metric
    )


def encode_frame(batch: ReportBatch) -> bytes:
    """Serialize ``batch`` as a v1 binary frame."""
    body = frame_head(batch) + np.ascontiguousarray(batch.records).tobytes()
    return body + _CRC.pack(zlib.crc32(body))


def read_header(data: bytes | bytearray | memoryview) -> FrameHeader:
    """Parse and check a frame's header and length (not its records)."""
    data = memoryview(data).cast("B")
    if len(data) < HEADER_SIZE:
        raise FrameError(f"frame is truncated: {len(data)} bytes, the header alone is {HEADER_SIZE}")
    magic, version, flags, mlen, spec_id, day, rsize, n, batch_id = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r}: not an LDP report frame (expected {MAGIC!r})")
    if version != VERSION:
        raise FrameError(f"unsupported frame version {version}; this reader understands version {VERSION}")
    if flags & ~FLAG_SEALED:
        raise FrameError(
            f"unknown flags 0x{flags:02x}; version {VERSION} frames have flags 0 (plain) or 1 (sealed records)"
        )
    if not 1 <= mlen <= 255:
        raise FrameError(f"metric name length {mlen} must be between 1 and 255")
    if rsize == 0:
        raise FrameError("record size 0 is invalid")
    if n > MAX_RECORDS:
        raise FrameError(f"frame declares {n} records; at most {MAX_RECORDS} are allowed")
    expected = HEADER_SIZE + mlen + rsize * n + _CRC.size
    if len(data) < expected:
        raise FrameError(f"frame is truncated: {len(data)} bytes, its header declares {expected}")
    if len(data) > expected:
        raise FrameError(f"frame has {len(data) - expected} trailing bytes after the declared {expected}")
    try:
        metric = bytes(data[HEADER_SIZE : HEADER_SIZE + mlen]).decode("utf-8")
    except UnicodeDecodeError:
        raise FrameError("metric name is not valid UTF-8") from None
    _check_metric(metric)
    return FrameHeader(VERSION, metric, bytes(spec_id).hex(), day, rsize, n, bytes(batch_id), bool(flags & FLAG_SEALED))


def _resolve(specs: SpecResolver, metric: str, spec_id: str) -> ReportSpec:
    spec: ReportSpec | None
    if isinstance(specs, ReportSpec):
        spec = specs
    elif callable(specs):
        spec = specs(metric, spec_id)
    else:
        spec = specs.get(spec_id)
        if spec is None:
            raise SpecMismatchError(f"metric {metric!r}: unknown spec_id {spec_id}")
    if spec_id != spec.spec_id:
        raise SpecMismatchError(
            f"metric {metric!r}: frame was made under spec {spec_id}, expected {spec.spec_id} ({spec.name})"
        )
    return spec


def decode_frame(
    data: bytes | bytearray | memoryview,
    specs: SpecResolver,
    header: FrameHeader | None = None,
    *,
    crc_checked: bool = False,
    records_checked: bool = False,
) -> ReportBatch:
    """Parse a binary frame; ``specs`` maps spec ids to specs (or is one spec, or a
    callable ``(metric, spec_id) -> spec``). The records are a read-only view of ``data``.
    ``header``: what :func:`read_header` answered for ``data`` already (it is not parsed twice).

    ``crc_checked`` and ``records_checked``: the caller has verified the CRC, or the records against the spec's
    checks (:meth:`ReportSpec.check_records`), already (the collector's native front does both on the thread
    that read the body, see native/front/src/frames.rs); they are not verified a second time."""
    if header is None:
        header = read_header(data)
    buf = memoryview(data).cast("B")
    if not crc_checked:
        body_end = header.frame_size - _CRC.size
        (crc,) = _CRC.unpack_from(buf, body_end)
        if zlib.crc32(buf[:body_end]) != crc:
            raise FrameError("CRC-32 mismatch: the frame was corrupted in transit")
    h = header
    return _batch(
        buf, specs, h.metric, h.spec_id, h.day, h.record_size, h.n_records, h.batch_id, h.sealed, records_checked
    )


#: :func:`decode_verified`'s cache: the spec and records' offset of a frame's ``(metric, spec_id, sealed,
#: record_size)``, for one resolver
VerifiedSpecs = dict[tuple[str, str, bool, int], tuple[ReportSpec, int]]


def decode_verified(
    data: bytes,
    specs: SpecResolver,
    fields: tuple[str, str, int, int, int, bytes, bool, bool],
    cache: VerifiedSpecs | None = None,
) -> ReportBatch:
    """:func:`decode_frame` of a frame whose header, length and CRC the caller verified already, from its header
    ``fields`` ``(metric, spec_id, day, record_size, n_records, batch_id, sealed, records_checked)`` (what the
    collector's native front gives, native/front/src/frames.rs); the records are checked unless
    ``records_checked``.

    ``cache``: kept by the caller for ``specs`` alone (a resolver that answers the same for the same metric and
    spec id, as a declared metric set does). A frame whose metric, spec id, sealing and record size resolved
    once is not resolved again (nor its :class:`SealedSpec` made again, nor its record size compared): those
    checks depend on nothing else, and they passed."""
    metric, spec_id, day, rsize, n, batch_id, sealed, records_checked = fields
    if cache is None:
        return _batch(data, specs, metric, spec_id, day, rsize, n, batch_id, sealed, records_checked)
    known = cache.get((metric, spec_id, sealed, rsize))
    if known is None:
        batch = _batch(data, specs, metric, spec_id, day, rsize, n, batch_id, sealed, records_checked)
        cache[(metric, spec_id, sealed, rsize)] = (batch.spec, HEADER_SIZE + len(metric.encode()))
        return batch
    spec, offset = known
    records = np.frombuffer(data, dtype=spec.record_dtype, count=n, offset=offset)
    if not records_checked:
        spec.check_records(records)
    return ReportBatch._checked(metric, spec, day, records, batch_id)


def _batch(
    buf: bytes | memoryview,
    specs: SpecResolver,
    metric: str,
    spec_id: str,
    day: int,
    record_size: int,
    n_records: int,
    batch_id: bytes,
    sealed: bool,
    records_checked: bool,
) -> ReportBatch:
    """The batch of a frame whose header is parsed and checked: its spec resolved and matched, its records."""
    spec = _resolve(specs, metric, spec_id)
    if sealed:
        spec = SealedSpec.of(spec)
    elif isinstance(spec, SealedSpec):
        raise SpecMismatchError(
            f"metric {metric!r} is sealed: its records must be sealed to the analyzer's key "
            "(GET /v1/metrics names it); a plain frame is refused"
        )
    if record_size != spec.record_size:
        raise SpecMismatchError(f"record size {record_size} does not match spec {spec.name}'s {spec.record_size}")
    records = np.frombuffer(buf, dtype=spec.record_dtype, count=n_records, offset=HEADER_SIZE + len(metric.encode()))
    if not records_checked:
        spec.check_records(records)
    return ReportBatch._checked(metric, spec, day, records, batch_id)


def _record_to_json(rec: np.void, names: tuple[str, ...]) -> list[Any]:
    out: list[Any] = []
    for name in names:
        val = rec[name]
        out.append(val.tobytes().hex() if isinstance(val, np.ndarray) else int(val))
    return out


def batch_to_json_obj(batch: ReportBatch) -> dict[str, Any]:
    """The JSON form of ``batch`` as a Python object (plain batches only)."""
    if batch.sealed:
        raise FrameError("sealed batches travel as binary frames only")
    names = batch.records.dtype.names or ()
    return {
        "version": VERSION,
        "metric": batch.metric,
        "spec_id": batch.spec.spec_id,
        "day": batch.day,
        "batch_id": batch.batch_id.hex(),
        "records": [_record_to_json(r, names) for r in batch.records],
    }


def encode_json(batch: ReportBatch) -> str:
    """Serialize ``batch`` in the JSON form."""
    return json.dumps(batch_to_json_obj(batch), separators=(",", ":"))


def decode_json(data: str | bytes | Mapping[str, Any], specs: SpecResolver) -> ReportBatch:
    """Parse the JSON form (a string, bytes or an already parsed object)."""
    if isinstance(data, (str, bytes, bytearray)):
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise FrameError(f"JSON frame does not parse: {exc}") from None
    else:
        obj = data
    if not isinstance(obj, Mapping):
        raise FrameError("JSON frame must be an object")
    missing = {"version", "metric", "spec_id", "day", "batch_id", "records"} - set(obj)
    if missing:
        raise FrameError(f"JSON frame lacks {sorted(missing)}")
    if obj["version"] != VERSION:
        raise FrameError(f"unsupported frame version {obj['version']!r}; expected {VERSION}")
    metric, spec_id = obj["metric"], obj["spec_id"]
    _check_metric(metric)
    if not isinstance(spec_id, str) or not re.fullmatch(r"[0-9a-f]{16}", spec_id):
        raise FrameError(f"spec_id must be 16 lowercase hex digits, got {spec_id!r}")
    try:
        batch_id = bytes.fromhex(obj["batch_id"])
    except (TypeError, ValueError):
        raise FrameError(f"batch_id must be 32 hex digits, got {obj['batch_id']!r}") from None
    spec = _resolve(specs, metric, spec_id)
    if isinstance(spec, SealedSpec):
        raise SpecMismatchError(
            f"metric {metric!r} is sealed: send its records sealed, in a binary frame ({FRAME_CONTENT_TYPE})"
        )
    rows = obj["records"]
    if not isinstance(rows, list):
        raise FrameError("records must be a list")
    if len(rows) > MAX_RECORDS:
        raise FrameError(f"a batch holds at most {MAX_RECORDS} records, got {len(rows)}")
    dtype = spec.record_dtype
    names = dtype.names or ()
    fields: Mapping[str, tuple[Any, ...]] = dtype.fields or {}  # a record dtype is structured: names and fields are set
    records = np.zeros(len(rows), dtype=dtype)
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(names):
            raise FrameError(f"record {i} must be a list of {len(names)} fields {list(names)}")
        for name, val in zip(names, row):
            ftype = fields[name][0]
            if ftype.subdtype is not None:
                try:
                    raw = bytes.fromhex(val)
                except (TypeError, ValueError):
                    raise FrameError(f"record {i} field {name} must be a hex string") from None
                if len(raw) != ftype.itemsize:
                    raise FrameError(f"record {i} field {name} has {len(raw)} bytes, expected {ftype.itemsize}")
                records[i][name] = np.frombuffer(raw, dtype=ftype.subdtype[0]).reshape(ftype.shape)
            else:
                if isinstance(val, bool) or not isinstance(val, int):
                    raise FrameError(f"record {i} field {name} must be an integer, got {val!r}")
                info = np.iinfo(ftype)
                if not info.min <= val <= info.max:
                    raise FrameError(f"record {i} field {name}={val} does not fit {ftype}")
                records[i][name] = val
    spec.check_records(records)
    try:
        return ReportBatch(metric, spec, obj["day"], records, batch_id)
    except FrameError:
        raise
