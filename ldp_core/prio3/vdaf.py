"""Prio3 (VDAF draft 18) through the PyO3 binding over Divvi Up's ``prio`` crate (``native/prio3``).

No field arithmetic or proof is written here: :class:`Prio3` only names a configuration and passes
opaque byte strings (the crate's own encodings) to and from the binding ``ldp_prio3``, which
``scripts/bootstrap`` builds (``scripts/build-prio3``). Importing this module does not load the
binding; the first :meth:`Prio3.vdaf` does, and raises :class:`Prio3Unavailable` (naming the fix)
when it is missing.

Four types, two aggregators (0 = leader, 1 = helper):

========  ==============================  ===========================  ==================
type      measurement                     aggregate                    parameters
========  ==============================  ===========================  ==================
count     0 or 1                          the number of 1s             -
sum       integer in [0, max_measurement] the sum                      max_measurement
histogram bucket index in [0, length)     count per bucket             length, chunk_length
sumvec    ``length`` integers in [0, max] the element-wise sum         max_measurement, length, chunk_length
========  ==============================  ===========================  ==================
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ldp_core.errors import SpecError

__all__ = ["TYPES", "Prio3", "Prio3Unavailable", "VdafFailure", "load_binding", "NONCE_SIZE", "VERIFY_KEY_SIZE"]

TYPES = ("count", "sum", "histogram", "sumvec")
NONCE_SIZE = 16
VERIFY_KEY_SIZE = 32
_MAX_LENGTH = 100_000


class Prio3Unavailable(RuntimeError):
    """The native binding ``ldp_prio3`` is not installed in this environment."""


class VdafFailure(ValueError):
    """A Prio3 step failed: a malformed share, a proof that does not verify, a wrong length."""


def load_binding() -> Any:
    try:
        import ldp_prio3
    except ImportError as e:  # pragma: no cover - exercised only on a machine without the build
        raise Prio3Unavailable(
            "the Prio3 binding (ldp_prio3) is not installed: run scripts/bootstrap (it builds native/prio3 "
            "with cargo and maturin; see docs/PRIO3.md)"
        ) from e
    return ldp_prio3


def _chunk(length: int) -> int:
    """The chunk length draft 18 recommends for a ParallelSum over ``length`` (about sqrt(length))."""
    return max(1, math.isqrt(length))


@dataclasses.dataclass(frozen=True)
class Prio3:
    """One Prio3 configuration: its type and parameters (``chunk_length`` 0 means the recommended one)."""

    type: str
    max_measurement: int = 0
    length: int = 0
    chunk_length: int = 0

    def __post_init__(self) -> None:
        if self.type not in TYPES:
            raise SpecError(f"prio3: type must be one of {list(TYPES)}, got {self.type!r}")
        for f in ("max_measurement", "length", "chunk_length"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise SpecError(f"prio3 {self.type}: {f} must be a non-negative integer, got {v!r}")
        if self.type in ("sum", "sumvec") and not 1 <= self.max_measurement < 2**32:
            raise SpecError(f"prio3 {self.type}: max_measurement must be between 1 and 2^32-1")
        if self.type in ("histogram", "sumvec"):
            if not 1 <= self.length <= _MAX_LENGTH:
                raise SpecError(f"prio3 {self.type}: length must be between 1 and {_MAX_LENGTH}")
            if self.chunk_length == 0:
                object.__setattr__(self, "chunk_length", _chunk(self.length))
        if self.type == "count" and (self.max_measurement or self.length):
            raise SpecError("prio3 count: takes no max_measurement or length")

    @classmethod
    def from_dict(cls, d: Any) -> Prio3:
        if not isinstance(d, dict):
            raise SpecError(f"prio3: expected an object, got {d!r}")
        unknown = set(d) - {"type", "max_measurement", "length", "chunk_length"}
        if unknown:
            raise SpecError(f"prio3: unknown field(s) {sorted(unknown)}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type}
        if self.type in ("sum", "sumvec"):
            out["max_measurement"] = self.max_measurement
        if self.type in ("histogram", "sumvec"):
            out["length"] = self.length
            out["chunk_length"] = self.chunk_length
        return out

    def vdaf(self) -> Any:
        """The binding's object for this configuration (loads the binding)."""
        b = load_binding()
        if self.type == "count":
            return b.Prio3Count()
        if self.type == "sum":
            return b.Prio3Sum(self.max_measurement)
        if self.type == "histogram":
            return b.Prio3Histogram(self.length, self.chunk_length)
        return b.Prio3SumVec(self.max_measurement, self.length, self.chunk_length)

    def check(self, value: Any) -> Any:
        """``value`` as the binding's measurement, or :class:`VdafFailure` (the device never shards
        an invalid value: the proof would fail and the report be dropped)."""
        if self.type == "sumvec":
            vals = [int(v) for v in value]
            if len(vals) != self.length or any(not 0 <= v <= self.max_measurement for v in vals):
                raise VdafFailure(f"prio3 sumvec: needs {self.length} integers in [0, {self.max_measurement}]")
            return vals
        if isinstance(value, bool):
            value = int(value)
        if not isinstance(value, int):
            raise VdafFailure(f"prio3 {self.type}: needs an integer, got {value!r}")
        top = {"count": 1, "sum": self.max_measurement, "histogram": self.length - 1}[self.type]
        if not 0 <= value <= top:
            raise VdafFailure(f"prio3 {self.type}: value {value} is outside [0, {top}]")
        return value

    def empty_result(self) -> int | list[int]:
        return [0] * self.length if self.type in ("histogram", "sumvec") else 0
