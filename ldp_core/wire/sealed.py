"""What a sealed record is: its spec (:class:`SealedSpec`), the analyzer's public key and key id, and the
HPKE ``info`` string that binds a ciphertext to its metric, spec, day and key.

The report frames (:mod:`ldp_core.wire.frames`) need these to parse a sealed frame; sealing and opening
records (:mod:`ldp_core.wire.sealing`) build on them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import struct
from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from ldp_core.errors import SpecError
from ldp_core.mechanisms.base import MechanismSpec, ReportSpec

__all__ = [
    "KEY_ID_SIZE",
    "ENC_SIZE",
    "TAG_SIZE",
    "SEALED_OVERHEAD",
    "KEY_FILE_FORMAT",
    "SealingError",
    "key_id_of",
    "sealed_info",
    "AnalyzerPublicKey",
    "SealedSpec",
]

KEY_ID_SIZE = 4
ENC_SIZE = 32
TAG_SIZE = 16
#: bytes a sealed record carries beyond the plain one: key id, enc, AEAD tag
SEALED_OVERHEAD = KEY_ID_SIZE + ENC_SIZE + TAG_SIZE
_KEY_ID_LABEL = b"ldp-analyzer-key/1"
_INFO_LABEL = b"ldp-sealed-report/1"
KEY_FILE_FORMAT = "ldp-analyzer-key/1"
_KEY_ID_RE = re.compile(r"^[0-9a-f]{8}$")


class SealingError(SpecError):
    """A key, a key file or a sealed metric's configuration is unusable; the message says which and why."""


def key_id_of(public_key: bytes) -> str:
    """The 8-hex-digit id of an analyzer public key (raw 32-byte X25519)."""
    return hashlib.sha256(_KEY_ID_LABEL + bytes(public_key)).digest()[:KEY_ID_SIZE].hex()


def sealed_info(metric: str, spec_id: str, day: int, key_id: str) -> bytes:
    """HPKE ``info`` of a sealed record: what it is bound to."""
    m = metric.encode()
    return _INFO_LABEL + bytes([len(m)]) + m + bytes.fromhex(spec_id) + struct.pack("<I", day) + bytes.fromhex(key_id)


@dataclasses.dataclass(frozen=True)
class AnalyzerPublicKey:
    """An analyzer public key as the metrics file names it: ``{"key_id": ..., "public_key": <64 hex>}``."""

    key_id: str
    public_key: bytes

    def __post_init__(self) -> None:
        if not isinstance(self.public_key, (bytes, bytearray)) or len(self.public_key) != 32:
            raise SealingError("an analyzer public key is 32 bytes (X25519)")
        if key_id_of(self.public_key) != self.key_id:
            raise SealingError(
                f"analyzer key id {self.key_id!r} does not match its public key (its id is "
                f"{key_id_of(self.public_key)}); copy both from `ldp keys new`"
            )

    @classmethod
    def from_dict(cls, data: Any) -> AnalyzerPublicKey:
        if not isinstance(data, Mapping) or set(data) != {"key_id", "public_key"}:
            raise SealingError(
                'an analyzer key is {"key_id": "<8 hex>", "public_key": "<64 hex>"} and nothing else '
                "(private keys never go in the metrics file)"
            )
        kid, pub = data["key_id"], data["public_key"]
        if not isinstance(kid, str) or not _KEY_ID_RE.match(kid):
            raise SealingError(f"analyzer key_id must be 8 lowercase hex digits, got {kid!r}")
        if not isinstance(pub, str) or not re.fullmatch(r"[0-9a-f]{64}", pub):
            raise SealingError(f"analyzer key {kid}: public_key must be 64 lowercase hex digits")
        return cls(kid, bytes.fromhex(pub))

    def to_dict(self) -> dict[str, str]:
        return {"key_id": self.key_id, "public_key": self.public_key.hex()}


def _sealed_dtype(width: int) -> np.dtype:
    return np.dtype([("sealed", np.uint8, (width,))])


@dataclasses.dataclass(frozen=True)
class SealedSpec(MechanismSpec):
    """The layout of a sealed metric's records: opaque ``inner.record_size + 52`` bytes.

    It stands in for the metric's spec wherever records are only carried
    (the wire frame, the collector, the shuffler): it has the inner spec's
    ids and ε, and a fixed-width opaque record dtype. Nothing can be
    decoded or estimated from it; :func:`open_batch` gives back the inner
    spec's records.
    """

    inner: ReportSpec = dataclasses.field(default=None)  # type: ignore[assignment]

    name: ClassVar[str] = "sealed"

    @classmethod
    def of(cls, inner: ReportSpec) -> SealedSpec:
        if isinstance(inner, SealedSpec):
            return inner
        return cls(inner.epsilon, int(getattr(inner, "domain_size", 2)), inner)

    def _validate(self) -> None:
        if not isinstance(self.inner, ReportSpec) or isinstance(self.inner, SealedSpec):
            raise SpecError("a sealed spec wraps one plain spec")

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.inner.kind

    @property
    def spec_id(self) -> str:
        return self.inner.spec_id

    @property
    def memo_derivation_id(self) -> str:
        return self.inner.memo_derivation_id

    def to_dict(self) -> dict[str, Any]:
        return self.inner.to_dict()

    @cached_property
    def _dtype(self) -> np.dtype:
        return _sealed_dtype(self.inner.record_size + SEALED_OVERHEAD)

    @property
    def record_dtype(self) -> np.dtype:
        return self._dtype

    def check_records(self, records: np.ndarray) -> None:
        """Nothing to check without the key: the frame decoder has checked the width."""

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        raise SpecError("a sealed spec does not privatize: encode with the inner spec, then seal")

    def count_variance(self, true_counts: np.ndarray) -> np.ndarray:
        raise SpecError("a sealed spec has no estimator: open the records first")


# -- device side ---------------------------------------------------------------------------------------------------
