"""One binary framing for the project's headed records (standard library only).

``magic`` (4 bytes), ``version`` (1 byte), a reserved zero byte, the header
length (uint32, little-endian), the header (JSON text, parsed by the caller),
then the payload. Used by FL uploads (``LDPU``), FL chunk records (``LDPF``)
and shuffler checkpoint chunks (``LDPQ``); each caller turns
:class:`FramingError` into its own error type.
"""

from __future__ import annotations

import struct

__all__ = ["FramingError", "HEAD_SIZE", "pack_headed", "unpack_headed", "has_magic"]

_HEAD = struct.Struct("<4sBBI")
#: bytes before the header
HEAD_SIZE = _HEAD.size


class FramingError(ValueError):
    """A record that is not a whole frame of the expected kind and version."""


def pack_headed(magic: bytes, header: bytes, payload: bytes = b"", version: int = 1) -> bytes:
    """The frame of ``header`` (JSON bytes) and ``payload`` under ``magic``."""
    if len(magic) != 4:
        raise ValueError(f"magic must be 4 bytes, got {magic!r}")
    return _HEAD.pack(magic, version, 0, len(header)) + header + payload


def has_magic(value: bytes | bytearray | memoryview, magic: bytes) -> bool:
    return bytes(value[:4]) == magic


def unpack_headed(value: bytes | bytearray | memoryview, magic: bytes, what: str,
                  version: int = 1) -> tuple[bytes, memoryview]:
    """``(header bytes, payload view)`` of a frame; :class:`FramingError` naming ``what`` if it is truncated,
    of another kind or version, or its header runs past the end."""
    buf = memoryview(value).cast("B")
    if len(buf) < HEAD_SIZE:
        raise FramingError(f"{what} is truncated ({len(buf)} bytes)")
    got_magic, got_version, _, hlen = _HEAD.unpack_from(buf, 0)
    if got_magic != magic or got_version != version:
        raise FramingError(f"not a {what} (magic {bytes(got_magic)!r}, version {got_version}; "
                           f"expected {magic!r} version {version})")
    end = HEAD_SIZE + hlen
    if end > len(buf):
        raise FramingError(f"{what}: the header length {hlen} runs past the record ({len(buf)} bytes)")
    return bytes(buf[HEAD_SIZE:end]), buf[end:]
