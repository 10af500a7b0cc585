"""A Prio3 metric, its wire spec and one report: shard on the device, each input share sealed to its aggregator.

**One report** (fixed width for a metric: every size below is fixed by the Prio3 configuration)::

    offset        size        field
    0             16          report id: the VDAF nonce, 16 bytes from the OS CSPRNG (also the anti-replay id)
    16            P           the public share (Prio3's joint-randomness parts; empty for count)
    16+P          32+L+16     the leader's input share, HPKE-sealed to the leader's key (enc, ciphertext, tag)
    ...           32+H+16     the helper's input share, HPKE-sealed to the helper's key

Sealing is single-shot HPKE base mode (DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, AES-128-GCM, RFC 9180:
the project's :mod:`ldp_core.wire.hpke`) with ``info`` = ``"ldp-prio3-share/1"``, the role, the metric's
task id (its wire spec id), the day and the report id, and ``aad`` = the public share: a share moved to
another report, metric, day or role, or paired with another public share, does not open. So the
collector and the log carry ciphertexts only, and each aggregator opens its own share and nothing else.

The report travels as the records of a normal wire frame (:mod:`ldp_core.wire.frames`) under a
:class:`Prio3Spec`: an opaque fixed-width record whose spec id binds the configuration and both
aggregators' key ids, so a device holding stale keys is refused by the collector (``spec_mismatch``).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import os
import struct
from collections.abc import Mapping
from functools import cached_property
from typing import Any, ClassVar

import numpy as np

from ldp_core.errors import SpecError
from ldp_core.mechanisms.base import ReportSpec
from ldp_core.prio3.vdaf import NONCE_SIZE, Prio3, VdafFailure
from ldp_core.wire.sealed import AnalyzerPublicKey

__all__ = [
    "ROLES",
    "Prio3Spec",
    "Prio3Metric",
    "Layout",
    "ReportParts",
    "make_report",
    "split_report",
    "open_share",
    "share_info",
]

ROLES = ("leader", "helper")
_INFO = b"ldp-prio3-share/1"
_ENC = 32
_TAG = 16
_FIELDS = ("kind", "description", "owner", "expires", "prio3", "max_reports_per_day")
_CTX = b"ldp-telemetry prio3/1"  #: the VDAF application context string


def share_info(role: int, spec_id: str, day: int, report_id: bytes) -> bytes:
    """HPKE ``info`` of one sealed input share: what it is bound to."""
    return _INFO + bytes([role]) + bytes.fromhex(spec_id) + struct.pack("<I", day) + report_id


@dataclasses.dataclass(frozen=True)
class Prio3Spec(ReportSpec):
    """The wire layout of a Prio3 metric's reports: opaque records, no local privacy (``epsilon`` 0).

    Nothing is estimated from it: the aggregators verify and sum the shares, the collector unshards.
    """

    epsilon: float = 0.0
    type: str = "count"
    max_measurement: int = 0
    length: int = 0
    chunk_length: int = 0
    leader_key_id: str = ""
    helper_key_id: str = ""

    name: ClassVar[str] = "prio3"
    kind: ClassVar[str] = "prio3"

    def __post_init__(self) -> None:  # no ε to check: Prio3 reports are not locally private, they are shares
        if self.epsilon != 0.0:
            raise SpecError("prio3: a Prio3 report has no local ε (its protection is the split between two servers)")
        self.config  # noqa: B018 -- validates the configuration
        for f in ("leader_key_id", "helper_key_id"):
            v = getattr(self, f)
            if not (isinstance(v, str) and len(v) == 8 and all(c in "0123456789abcdef" for c in v)):
                raise SpecError(f"prio3: {f} must be 8 lowercase hex digits, got {v!r}")

    @property
    def config(self) -> Prio3:
        return Prio3(self.type, self.max_measurement, self.length, self.chunk_length)

    def params(self) -> dict[str, Any]:
        return {
            **self.config.to_dict(),
            "leader_key_id": self.leader_key_id,
            "helper_key_id": self.helper_key_id,
        }

    @cached_property
    def layout(self) -> Layout:
        return Layout.of(self.config)

    @property
    def record_dtype(self) -> np.dtype:
        return np.dtype([("report", np.uint8, (self.layout.size,))])

    def check_records(self, records: np.ndarray) -> None:
        """Nothing to check without the keys: the frame decoder has checked the width."""

    def encode(self, values: Any, rng: np.random.Generator) -> np.ndarray:
        raise SpecError("prio3: reports are made by ldp_core.prio3.report.make_report (shard, then seal)")


@dataclasses.dataclass(frozen=True)
class Layout:
    """Sizes of one report's parts (fixed by the configuration; measured once by sharding a zero)."""

    public: int
    leader: int
    helper: int

    @classmethod
    def of(cls, config: Prio3) -> Layout:
        v = config.vdaf()
        zero = config.empty_result() if config.type == "sumvec" else 0
        public, (leader, helper) = v.shard(zero, bytes(NONCE_SIZE), _CTX)
        return cls(len(public), len(leader), len(helper))

    @property
    def size(self) -> int:
        return NONCE_SIZE + self.public + (_ENC + self.leader + _TAG) + (_ENC + self.helper + _TAG)


@dataclasses.dataclass(frozen=True)
class ReportParts:
    report_id: bytes
    public_share: bytes
    sealed: tuple[bytes, bytes]  #: the leader's and the helper's sealed input shares


@dataclasses.dataclass(frozen=True)
class Prio3Metric:
    """A metric declared ``"kind": "prio3"`` in the metrics file::

    "visits": {"kind": "prio3", "prio3": {"type": "sum", "max_measurement": 255},
               "description": ..., "owner": ..., "expires": "2027-12-31", "max_reports_per_day": 1}
    """

    name: str
    config: Prio3
    owner: str
    description: str
    expires: _dt.date
    max_reports_per_day: int

    kind: ClassVar[str] = "prio3"
    sealed: ClassVar[bool] = False  #: not analyzer-sealed: its shares are sealed to the aggregators instead

    def is_expired(self, day: int) -> bool:
        return day > self.expires_day

    @classmethod
    def from_dict(cls, name: str, data: Any) -> Prio3Metric:
        if not isinstance(data, Mapping):
            raise SpecError("the definition must be an object")
        unknown = sorted(set(data) - set(_FIELDS))
        missing = sorted(set(_FIELDS) - set(data))
        if unknown or missing:
            raise SpecError(
                f"a prio3 metric has exactly the fields {list(_FIELDS)} (unknown {unknown}, missing {missing})"
            )
        try:
            expires = _dt.date.fromisoformat(data["expires"])
        except (TypeError, ValueError):
            raise SpecError(f"'expires' must be an ISO date, got {data['expires']!r}") from None
        r = data["max_reports_per_day"]
        if isinstance(r, bool) or not isinstance(r, int) or not 1 <= r <= 10_000:
            raise SpecError(f"'max_reports_per_day' must be an integer in [1, 10000], got {r!r}")
        for f in ("owner", "description"):
            if not isinstance(data[f], str) or not data[f].strip():
                raise SpecError(f"'{f}' must be a non-empty string")
        return cls(name, Prio3.from_dict(dict(data["prio3"])), data["owner"], data["description"], expires, r)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "prio3",
            "description": self.description,
            "owner": self.owner,
            "expires": self.expires.isoformat(),
            "prio3": self.config.to_dict(),
            "max_reports_per_day": self.max_reports_per_day,
        }

    @property
    def expires_day(self) -> int:
        return (self.expires - _dt.date(1970, 1, 1)).days

    def wire_spec(self, leader: AnalyzerPublicKey, helper: AnalyzerPublicKey) -> Prio3Spec:
        c = self.config
        return Prio3Spec(0.0, c.type, c.max_measurement, c.length, c.chunk_length, leader.key_id, helper.key_id)


def make_report(spec: Prio3Spec, value: Any, day: int, leader: AnalyzerPublicKey, helper: AnalyzerPublicKey) -> bytes:
    """The device's work: shard ``value`` (a fresh report id and the VDAF's randomness from the OS CSPRNG),
    then seal each input share to its aggregator. Raises :class:`VdafFailure` for an invalid value."""
    from ldp_core.wire import hpke

    if (leader.key_id, helper.key_id) != (spec.leader_key_id, spec.helper_key_id):
        raise SpecError("prio3: the aggregator keys are not the ones the metric's spec names")
    config = spec.config
    measurement = config.check(value)
    report_id = os.urandom(NONCE_SIZE)
    public, shares = config.vdaf().shard(measurement, report_id, _CTX)
    suite = hpke.Suite()
    out = bytearray(report_id + public)
    for role, (key, share) in enumerate(zip((leader, helper), shares, strict=True)):
        out += suite.seal(key.public_key, share_info(role, spec.spec_id, day, report_id), share, aad=public)
    if len(out) != spec.layout.size:  # cannot happen short of a changed crate: sizes are fixed by the configuration
        raise VdafFailure(f"prio3: report is {len(out)} bytes, the layout says {spec.layout.size}")
    return bytes(out)


def split_report(spec: Prio3Spec, report: bytes) -> ReportParts:
    lay = spec.layout
    if len(report) != lay.size:
        raise VdafFailure(f"prio3: a report of this metric is {lay.size} bytes, got {len(report)}")
    p = NONCE_SIZE + lay.public
    mid = p + _ENC + lay.leader + _TAG
    return ReportParts(report[:NONCE_SIZE], report[NONCE_SIZE:p], (report[p:mid], report[mid:]))


def open_share(key: Any, role: int, spec: Prio3Spec, day: int, parts: ReportParts) -> bytes:
    """One aggregator's input share (``key``: its :class:`~ldp_core.wire.sealing.AnalyzerKey`);
    :class:`VdafFailure` when it does not open (altered bytes, another key, report, day or public share)."""
    from ldp_core.wire import hpke

    try:
        return hpke.Suite().open(
            key.private,
            key.public_key,
            share_info(role, spec.spec_id, day, parts.report_id),
            parts.sealed[role],
            aad=parts.public_share,
        )
    except hpke.HPKEError as exc:
        raise VdafFailure(f"prio3: the {ROLES[role]}'s share does not open: {exc}") from None


CTX = _CTX
