"""The shuffler's checkpoint format and its secret.

A checkpoint of a raw partition is one or more chunks in the state topic, each a
:mod:`ldp_core.wire.framing` frame: a clear :class:`CheckpointHeader` (group, partition, raw offset, snapshot,
chunk, key id; nothing about the reports) and a body sealed with AES-256-GCM under a subkey of the shuffler's
secret (:class:`_Keys`), the header as associated data. The body (:func:`encode_checkpoint_body`) holds the
pieces of buffered records, the batch-id window as keyed digests, and on the first chunk the partition's
counter totals. :func:`_state_keys` gives the record key that lands a chunk in its state partition.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import itertools
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from collector.errors import ConfigError, ShufflerStateError
from ldp_core.errors import FrameError
from ldp_core.files import load_or_create_private
from ldp_core.wire.framing import pack_headed, unpack_headed
from pipeline.transport import partition_for

__all__ = [
    "CHECKPOINT_VERSION",
    "CheckpointHeader",
    "Piece",
    "OpenedChunk",
    "encode_checkpoint_chunk",
    "decode_checkpoint_chunk",
    "encode_checkpoint_body",
    "decode_checkpoint_body",
    "open_checkpoint_chunk",
    "load_or_create_key",
]

KEY_BYTES = 32

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


_CKPT_MAGIC = b"LDPQ"
_INNER_MAGIC = b"LDPq"
#: format of the checkpoints written and restored: sealed, permuted, no upload numbers (format 1, written in the
#: clear by early shufflers, is no longer read)
CHECKPOINT_VERSION = 2


@dataclasses.dataclass(frozen=True)
class CheckpointHeader:
    """The clear header of a checkpoint chunk: which group, partition and input offset it belongs to, nothing
    about its reports. ``key_id`` names the key the payload is sealed with."""

    group: str
    partition: int
    raw_offset: int
    snapshot: str
    chunk: int
    chunks: int
    key_id: str = ""

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":")).encode()


#: ``[metric, spec dict, day, count]`` of one run of records in a checkpoint body
Piece = tuple[str, dict[str, Any], int, int]

#: what an opened chunk holds: ``(pieces, batch-id digests, how many of them are the older set's, records
#: payload, counter totals)``
OpenedChunk = tuple[tuple[Piece, ...], list[bytes], int, memoryview, dict[str, int]]


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
    """The clear header and the sealed payload of a checkpoint chunk;
    :class:`~ldp_core.wire.framing.FramingError` if ``value`` is not a whole chunk frame of
    :data:`CHECKPOINT_VERSION`, :class:`~ldp_core.errors.FrameError` if its header is malformed."""
    head, payload = unpack_headed(value, _CKPT_MAGIC, "shuffler checkpoint chunk", version=CHECKPOINT_VERSION)
    try:
        header = CheckpointHeader(**json.loads(head))
        if header.to_json() != head:
            raise ValueError("the header is not in its canonical form")
    except (ValueError, TypeError, KeyError) as exc:
        raise FrameError(f"checkpoint header is malformed: {exc}") from None
    return header, payload


def decode_checkpoint_body(body: bytes) -> OpenedChunk:
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


def open_checkpoint_chunk(header: CheckpointHeader, payload: memoryview, keys: _Keys, *, key_file: str) -> OpenedChunk:
    """The body of a chunk of the checkpoint being restored, unsealed with ``keys``.

    :class:`~collector.errors.ShufflerStateError` if it is sealed under another key (``key_file`` names the
    file this process read, for the message) or does not authenticate: restoring without it would lose the
    buffered reports, so the shuffler stops.
    """
    if header.key_id != keys.key_id:
        raise ShufflerStateError(
            f"partition {header.partition}: the checkpoint to restore (raw offset {header.raw_offset}) is sealed "
            f"under another shuffler key (id {header.key_id}, this process has {keys.key_id}). Every "
            f"member of group {header.group!r} must read the same key_file "
            f"({key_file!r}); without that key the buffered reports cannot be restored."
        )
    try:
        return decode_checkpoint_body(keys.open(header.to_json(), payload))
    except FrameError as exc:
        raise ShufflerStateError(
            f"partition {header.partition}: the checkpoint to restore (raw offset {header.raw_offset}) is "
            f"damaged: {exc}"
        ) from None


def _state_keys(partitions: int) -> list[bytes]:
    """For each state partition ``p``, a record key that :func:`partition_for` maps to ``p``."""
    keys: dict[int, bytes] = {}
    for i in itertools.count():
        key = f"shuffler-state-{i}".encode()
        keys.setdefault(partition_for(key, partitions), key)
        if len(keys) == partitions:
            return [keys[p] for p in range(partitions)]
    raise AssertionError("unreachable")
