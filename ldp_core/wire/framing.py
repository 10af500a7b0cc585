"""One binary framing for the project's headed records (standard library only).

``magic`` (4 bytes), ``version`` (1 byte), a reserved zero byte, the header
length (uint32, little-endian), the header (JSON text, parsed by the caller),
then the payload. Used by FL uploads (``LDPU``), FL chunk records (``LDPF``)
and shuffler checkpoint chunks (``LDPQ``).

A record that is not such a frame raises :class:`FramingError`, a
:class:`~ldp_core.errors.FrameError` (hence an ``LDPError`` and a
``ValueError``), so code that already refuses malformed frames refuses these
too. A caller whose readers expect an error of its own passes it as
``unpack_headed(..., error=ChunkError)``: the record is refused once, with
that type, and nothing is caught and raised again.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from ldp_core.errors import FrameError

__all__ = ["FramingError", "HEAD_SIZE", "pack_headed", "unpack_headed", "has_magic"]

_HEAD = struct.Struct("<4sBBI")
#: bytes before the header
HEAD_SIZE = _HEAD.size


class FramingError(FrameError):
    """A record that is not a whole frame of the expected kind and version."""


def pack_headed(magic: bytes, header: bytes, payload: bytes = b"", version: int = 1) -> bytes:
    """The frame of ``header`` (JSON bytes) and ``payload`` under ``magic``."""
    if len(magic) != 4:
        raise ValueError(f"magic must be 4 bytes, got {magic!r}")
    return _HEAD.pack(magic, version, 0, len(header)) + header + payload


def has_magic(value: bytes | bytearray | memoryview, magic: bytes) -> bool:
    return bytes(value[:4]) == magic


def unpack_headed(
    value: bytes | bytearray | memoryview,
    magic: bytes,
    what: str,
    version: int = 1,
    error: Callable[[str], Exception] = FramingError,
) -> tuple[bytes, memoryview]:
    """``(header bytes, payload view)`` of a frame; ``error`` (an exception type or a factory taking the
    message; default :class:`FramingError`) naming ``what`` if it is truncated, of another kind or version,
    or its header runs past the end."""
    buf = memoryview(value).cast("B")
    if len(buf) < HEAD_SIZE:
        raise error(f"{what} is truncated ({len(buf)} bytes)")
    got_magic, got_version, _, hlen = _HEAD.unpack_from(buf, 0)
    if got_magic != magic or got_version != version:
        raise error(
            f"not a {what} (magic {bytes(got_magic)!r}, version {got_version}; expected {magic!r} version {version})"
        )
    end = HEAD_SIZE + hlen
    if end > len(buf):
        raise error(f"{what}: the header length {hlen} runs past the record ({len(buf)} bytes)")
    return bytes(buf[HEAD_SIZE:end]), buf[end:]
