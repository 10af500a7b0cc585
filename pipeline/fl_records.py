"""Chunked records of the federated topics: job checkpoints (``ldp.fl.state``) and round states (``ldp.fl.rounds``).

A checkpoint or a round state of a large model does not fit one broker record
(Kafka brokers often keep ``message.max.bytes`` at 1 MB). So each one is a
*document* split into chunks of at most ``max_record_bytes``, all published
in the same transaction, and a reader accepts a document only when it holds a
complete, consistent set of its chunks.

Document
--------
``u32 json length (little-endian) | JSON | binary section``. The JSON is the
object with every numpy vector replaced by ``{"$v": i}`` and every ``bytes``
value by ``{"$b": i}``; ``"$blobs"`` (a key of the top-level JSON object)
lists ``[type, count, offset]`` per blob, ``type`` one of ``<f4``, ``<u4``,
``<f8`` (count values) or ``bytes`` (count bytes), ``offset`` into the
binary section. Vectors are their raw little-endian bytes: 4 bytes per
float32 value, not the 5.4 of base64 in JSON.

Chunk record
------------
``magic "LDPF" | version u8 (1) | reserved u8 | header length u32 LE | header JSON | payload`` (:mod:`ldp_core.wire.framing`).
The header (:class:`ChunkHeader`) names the document ``kind``
(``checkpoint``, ``round_state``), the ``task``, a random document ``id``
(fresh for every write), the chunk ``index`` and ``count``, the document's
``size`` in bytes, its SHA-256 ``digest`` and ``meta`` (a checkpoint's
consumer group and update offsets, a round state's ``seq``), repeated in
every chunk. The payload is bytes ``[index·step, …)`` of the document.

:class:`ChunkAssembler` collects chunks by id and yields a document only
when all ``count`` chunks are in, every header agrees, the sizes add up and
the digest matches: a partial or mixed set is never returned. Readers that
also compare offsets (the job's restore) do so on ``meta`` after assembly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import secrets
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from ldp_core.wire.framing import HEAD_SIZE, pack_headed, unpack_headed
from pipeline.errors import ChunkError

__all__ = [
    "MAGIC",
    "ChunkHeader",
    "ChunkError",
    "pack_document",
    "unpack_document",
    "encode_chunks",
    "decode_chunk",
    "is_chunk",
    "ChunkAssembler",
    "Assembled",
    "MIN_RECORD_BYTES",
    "DEFAULT_MAX_RECORD_BYTES",
]

MAGIC = b"LDPF"
_DTYPES = ("<f4", "<u4", "<f8")
#: below this a record cannot hold a header and a useful payload
MIN_RECORD_BYTES = 4096
#: under Kafka's common 1 MB ``message.max.bytes`` with room for the record's own overhead
DEFAULT_MAX_RECORD_BYTES = 900_000
_HEADER_ROOM = 2048


@dataclasses.dataclass(frozen=True)
class ChunkHeader:
    """What every chunk of a document says about the document and about itself."""

    kind: str
    task: str
    id: str
    index: int
    count: int
    size: int
    digest: str
    meta: Mapping[str, Any]

    def same_document(self, other: ChunkHeader) -> bool:
        return (self.kind, self.task, self.id, self.count, self.size, self.digest, dict(self.meta)) == (
            other.kind,
            other.task,
            other.id,
            other.count,
            other.size,
            other.digest,
            dict(other.meta),
        )


# -- documents -----------------------------------------------------------------------------------
def pack_document(obj: Mapping[str, Any]) -> bytes:
    """The document of a JSON-able mapping whose values may include numpy vectors and ``bytes``."""
    blobs: list[list[Any]] = []
    parts: list[bytes] = []
    pos = 0

    def walk(v: Any) -> Any:
        nonlocal pos
        if isinstance(v, np.ndarray):
            dt = np.dtype(v.dtype).newbyteorder("<").str
            if dt not in _DTYPES or v.ndim != 1:
                raise ChunkError(f"vectors must be 1-D of {_DTYPES}, got {v.dtype} with shape {v.shape}")
            raw = np.ascontiguousarray(v, dtype=np.dtype(dt)).tobytes()
            blobs.append([dt, int(v.shape[0]), pos])
        elif isinstance(v, (bytes, bytearray, memoryview)):
            raw = bytes(v)
            blobs.append(["bytes", len(raw), pos])
        elif isinstance(v, Mapping):
            return {str(k): walk(x) for k, x in v.items()}
        elif isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        else:
            return v
        parts.append(raw)
        pos += len(raw)
        return {"$v" if blobs[-1][0] != "bytes" else "$b": len(blobs) - 1}

    skeleton = walk(dict(obj))
    skeleton["$blobs"] = blobs
    head = json.dumps(skeleton, separators=(",", ":")).encode()
    return struct.pack("<I", len(head)) + head + b"".join(parts)


def unpack_document(doc: bytes | memoryview) -> dict[str, Any]:
    """Inverse of :func:`pack_document` (vectors come back as native-endian numpy arrays, copied)."""
    buf = memoryview(doc).cast("B")
    if len(buf) < 4:
        raise ChunkError("document is truncated")
    (hlen,) = struct.unpack_from("<I", buf, 0)
    if 4 + hlen > len(buf):
        raise ChunkError("document header runs past its end")
    try:
        skeleton = json.loads(bytes(buf[4 : 4 + hlen]))
        blobs = skeleton.pop("$blobs")
    except (ValueError, KeyError, AttributeError, TypeError) as exc:
        raise ChunkError(f"document header is malformed: {exc}") from None
    data = buf[4 + hlen :]
    values: list[Any] = []
    for entry in blobs:
        try:
            kind, count, off = entry
            count, off = int(count), int(off)
        except (TypeError, ValueError):
            raise ChunkError(f"bad blob entry {str(entry)[:60]}") from None
        width = 1 if kind == "bytes" else np.dtype(kind).itemsize if kind in _DTYPES else 0
        if width == 0:
            raise ChunkError(f"unknown blob type {str(kind)[:20]!r}")
        if count < 0 or off < 0 or off + width * count > len(data):
            raise ChunkError("a blob runs past the document")
        raw = data[off : off + width * count]
        if kind == "bytes":
            values.append(bytes(raw))
        else:
            values.append(np.frombuffer(raw, dtype=np.dtype(kind)).astype(np.dtype(kind).newbyteorder("=")))

    def walk(v: Any) -> Any:
        if isinstance(v, dict):
            if len(v) == 1 and ("$v" in v or "$b" in v):
                i = v.get("$v", v.get("$b"))
                if not isinstance(i, int) or not 0 <= i < len(values):
                    raise ChunkError(f"blob reference {str(i)[:20]} out of range")
                return values[i]
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    return walk(skeleton)


# -- chunks --------------------------------------------------------------------------------------
def encode_chunks(
    kind: str, task: str, meta: Mapping[str, Any], document: bytes, max_record_bytes: int, doc_id: str | None = None
) -> list[bytes]:
    """``document`` as chunk records of at most ``max_record_bytes`` bytes each (at least one chunk)."""
    if max_record_bytes < MIN_RECORD_BYTES:
        raise ChunkError(f"max_record_bytes must be >= {MIN_RECORD_BYTES}, got {max_record_bytes}")
    step = max_record_bytes - _HEADER_ROOM
    count = max(1, -(-len(document) // step))
    did = doc_id or secrets.token_hex(8)
    digest = hashlib.sha256(document).hexdigest()
    out = []
    for i in range(count):
        h = json.dumps(
            {
                "kind": kind,
                "task": task,
                "id": did,
                "index": i,
                "count": count,
                "size": len(document),
                "digest": digest,
                "meta": dict(meta),
            },
            separators=(",", ":"),
        ).encode()
        if len(h) > _HEADER_ROOM - HEAD_SIZE:
            raise ChunkError(f"chunk header of {len(h)} bytes is too large (meta too big)")
        out.append(pack_headed(MAGIC, h, document[i * step : (i + 1) * step]))
    return out


def is_chunk(value: bytes) -> bool:
    return value[:4] == MAGIC


def decode_chunk(value: bytes) -> tuple[ChunkHeader, memoryview]:
    """The header and payload of one chunk record; :class:`ChunkError` if it is not one."""
    head, payload = unpack_headed(value, MAGIC, "FL chunk record", error=ChunkError)
    try:
        o = json.loads(head)
        h = ChunkHeader(
            kind=str(o["kind"]),
            task=str(o["task"]),
            id=str(o["id"]),
            index=int(o["index"]),
            count=int(o["count"]),
            size=int(o["size"]),
            digest=str(o["digest"]),
            meta=dict(o["meta"]),
        )
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ChunkError(f"chunk header is malformed: {exc}") from None
    if not (0 <= h.index < h.count and h.size >= 0):
        raise ChunkError(f"chunk index {h.index} outside 0..{h.count - 1}")
    return h, payload


@dataclasses.dataclass(frozen=True)
class Assembled:
    """A complete document: its header (index of the first chunk), the document and the offsets of its
    first and last chunk records."""

    header: ChunkHeader
    document: bytes
    first_offset: int
    last_offset: int


class ChunkAssembler:
    """Collects chunks by document id; :meth:`add` returns a document once its set is complete and consistent.

    A chunk whose header disagrees with the chunks already held for its id
    (count, size, digest, meta, kind, task), or repeats an index with other
    bytes, spoils the id: it is never returned. At most ``max_pending``
    incomplete ids are kept (the oldest is dropped first)."""

    def __init__(self, max_pending: int = 64) -> None:
        self.max_pending = max_pending
        self._pending: dict[str, dict[str, Any]] = {}
        self.spoiled: set[str] = set()
        self.rejected = 0

    def pending(self) -> list[ChunkHeader]:
        return [p["header"] for p in self._pending.values()]

    def drop_before(self, offset: int, task: str | None = None) -> None:
        """Forget incomplete sets (of ``task``) whose first chunk came before ``offset``."""
        for did in [
            d for d, p in self._pending.items() if p["first"] < offset and (task is None or p["header"].task == task)
        ]:
            del self._pending[did]

    def add(self, header: ChunkHeader, payload: bytes | memoryview, offset: int) -> Assembled | None:
        if header.id in self.spoiled:
            return None
        p = self._pending.get(header.id)
        if p is None:
            if len(self._pending) >= self.max_pending:
                del self._pending[next(iter(self._pending))]
            p = self._pending[header.id] = {"header": header, "parts": {}, "first": offset, "last": offset}
        if not p["header"].same_document(header) or (
            header.index in p["parts"] and p["parts"][header.index] != bytes(payload)
        ):
            self._spoil(header.id)
            return None
        p["parts"][header.index] = bytes(payload)
        p["first"], p["last"] = min(p["first"], offset), max(p["last"], offset)
        if len(p["parts"]) < header.count:
            return None
        del self._pending[header.id]
        doc = b"".join(p["parts"][i] for i in range(header.count))
        if len(doc) != header.size or hashlib.sha256(doc).hexdigest() != header.digest:
            self.spoiled.add(header.id)
            self.rejected += 1
            return None
        return Assembled(p["header"], doc, p["first"], p["last"])

    def _spoil(self, did: str) -> None:
        self._pending.pop(did, None)
        self.spoiled.add(did)
        self.rejected += 1
