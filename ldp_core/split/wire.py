"""The split-learning message: ``LDPS``, a 4-byte big-endian header length, a JSON header
``{"meta": {...}, "arrays": [{"name", "dtype", "shape"}, ...]}``, then each array's raw bytes in order.

Only little-endian float32 (``<f4``) and int64 (``<i8``) arrays are allowed; every size is checked
against the body before an array is built, so a malformed message is a :class:`SplitWireError` (a
``ValueError``), never a crash or a huge allocation.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from ldp_core.errors import LDPError

__all__ = ["SPLIT_CONTENT_TYPE", "SplitWireError", "encode_message", "decode_message"]

SPLIT_CONTENT_TYPE = "application/vnd.ldp.split"
_MAGIC = b"LDPS"
_DTYPES: dict[str, np.dtype[Any]] = {"<f4": np.dtype("<f4"), "<i8": np.dtype("<i8")}
_MAX_HEADER = 1 << 16


class SplitWireError(LDPError, ValueError):
    """A split-learning message that cannot be read."""


def encode_message(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """The message of ``meta`` (JSON-serializable) and ``arrays`` (float arrays sent as ``<f4``, integer
    ones as ``<i8``)."""
    parts: list[bytes] = []
    spec = []
    for name, a in arrays.items():
        arr = np.asarray(a)
        dt = "<i8" if np.issubdtype(arr.dtype, np.integer) else "<f4"
        raw = np.ascontiguousarray(arr, dtype=_DTYPES[dt]).tobytes()
        spec.append({"name": name, "dtype": dt, "shape": list(arr.shape)})
        parts.append(raw)
    header = json.dumps({"meta": dict(meta), "arrays": spec}, separators=(",", ":")).encode()
    return _MAGIC + struct.pack(">I", len(header)) + header + b"".join(parts)


def _shape(obj: object) -> tuple[int, ...]:
    if not isinstance(obj, list) or len(obj) > 4 or not all(isinstance(d, int) and 0 <= d < 1 << 31 for d in obj):
        raise SplitWireError(f"an array's shape must be a list of at most 4 non-negative ints, got {obj!r}")
    return tuple(obj)


def decode_message(body: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(meta, arrays) of a message; :class:`SplitWireError` on anything malformed."""
    if len(body) < 8 or body[:4] != _MAGIC:
        raise SplitWireError("not a split-learning message (no LDPS magic)")
    (n,) = struct.unpack(">I", body[4:8])
    if n > _MAX_HEADER or 8 + n > len(body):
        raise SplitWireError("the message's header is truncated or too long")
    try:
        header = json.loads(body[8 : 8 + n])
    except (ValueError, UnicodeDecodeError) as exc:
        raise SplitWireError(f"the message's header is not JSON: {exc}") from None
    if (
        not isinstance(header, dict)
        or not isinstance(header.get("meta"), dict)
        or not isinstance(header.get("arrays"), list)
    ):
        raise SplitWireError("the message's header needs a 'meta' object and an 'arrays' list")
    pos = 8 + n
    arrays: dict[str, np.ndarray] = {}
    for entry in header["arrays"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or entry.get("dtype") not in _DTYPES:
            raise SplitWireError(f"a bad array entry {entry!r} (dtype must be <f4 or <i8)")
        shape = _shape(entry.get("shape"))
        dt = _DTYPES[entry["dtype"]]
        size = math.prod(shape) * dt.itemsize
        if pos + size > len(body):
            raise SplitWireError(f"array {entry['name']!r} is truncated")
        arrays[entry["name"]] = np.frombuffer(body, dtype=dt, count=math.prod(shape), offset=pos).reshape(shape)
        pos += size
    if pos != len(body):
        raise SplitWireError(f"{len(body) - pos} bytes after the last array")
    return header["meta"], arrays
