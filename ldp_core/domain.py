"""Mapping application values to domain indices, stably across processes.

Mechanisms see only indices ``0 .. d-1``. A metric declares how its values
map to indices:

* :class:`Dictionary` -- an explicit list of values (strings or integers),
  optionally followed by an "other" bucket that collects every undeclared
  value; without it an undeclared value is a :class:`DomainError`.
* :class:`HashedDomain` -- an open domain (URLs, words, emoji) hashed into
  ``size`` buckets with seeded XXH32 over a canonical byte form of the value.
  Python's ``hash`` is never used: it differs between processes.

Numeric metrics (means, distributions) take numbers, not indices:

* :class:`NumberRange` -- a declared range ``[low, high]``; a value outside
  it is clamped to the nearest end or refused (``out_of_range``), and a
  non-finite value (NaN, ±inf) is always refused.

Heavy-hitter metrics (docs/HEAVY_HITTERS.md) take strings nobody listed:

* :class:`StringDomain` -- UTF-8 strings of at most ``length`` bytes, padded
  with 0x00; a longer value is truncated at a character boundary or refused
  (``overflow``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import struct
from collections.abc import Sequence
from typing import Any

from ldp_core.errors import DomainError, SpecError
from ldp_core.hashing import hash_bytes

__all__ = [
    "Dictionary",
    "HashedDomain",
    "NumberRange",
    "StringDomain",
    "Domain",
    "canonical_bytes",
    "domain_from_dict",
]

Value = str | int


def canonical_bytes(value: Value) -> bytes:
    """A type-tagged byte form: ``b"s" + UTF-8`` for strings, ``b"i" + int64 LE`` for
    integers. ``"1"`` and ``1`` are different values."""
    if isinstance(value, str):
        return b"s" + value.encode("utf-8")
    if isinstance(value, bool) or not isinstance(value, int):
        raise DomainError(f"values must be str or int, got {type(value).__name__}")
    if not -(2**63) <= value < 2**63:
        raise DomainError(f"integer value {value} does not fit in 64 bits")
    return b"i" + struct.pack("<q", value)


@dataclasses.dataclass(frozen=True)
class Dictionary:
    """An explicit, ordered list of values; index = position (``other`` last)."""

    values: tuple[Value, ...]
    other: bool = False

    def __post_init__(self) -> None:
        vals = tuple(self.values)
        for v in vals:
            canonical_bytes(v)
        if len(set(vals)) != len(vals):
            raise SpecError("dictionary values must be distinct")
        if len(vals) + int(self.other) < 2:
            raise SpecError("a dictionary needs at least 2 entries (counting the 'other' bucket)")
        object.__setattr__(self, "values", vals)
        object.__setattr__(self, "_index", {(type(v), v): i for i, v in enumerate(vals)})

    @property
    def size(self) -> int:
        return len(self.values) + int(self.other)

    @property
    def other_index(self) -> int | None:
        return len(self.values) if self.other else None

    def index_of(self, value: Value) -> int:
        idx = self._index.get((type(value), value))  # type: ignore[attr-defined]
        if idx is not None:
            return idx
        if self.other:
            canonical_bytes(value)
            return len(self.values)
        raise DomainError(f"value {value!r} is not in the metric's dictionary and it has no 'other' bucket")

    def label(self, index: int) -> str:
        if index == self.other_index:
            return "(other)"
        return str(self.values[index])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "dictionary", "values": list(self.values), "other": self.other}


@dataclasses.dataclass(frozen=True)
class HashedDomain:
    """An open domain hashed into ``size`` buckets: ``xxh32(canonical_bytes(v), seed) mod size``.

    (A modulo here is cheap: it runs once per recorded value, on the device.)"""

    size: int
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or not 2 <= self.size <= 2**31:
            raise SpecError(f"hashed domain size must be an integer in [2, 2**31], got {self.size!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            raise SpecError(f"hashed domain seed must be a 32-bit unsigned integer, got {self.seed!r}")

    def index_of(self, value: Value) -> int:
        return hash_bytes(canonical_bytes(value), self.seed) % self.size

    def label(self, index: int) -> str:
        return f"#{index}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "hashed", "size": self.size, "seed": self.seed}


@dataclasses.dataclass(frozen=True)
class NumberRange:
    """The values of a numeric metric: numbers in ``[low, high]``; ``out_of_range`` is ``"clamp"`` or ``"refuse"``.

    ``dims`` (set from the metric's mechanism, not written in the file's domain) is how many numbers one value
    holds: a metric of several attributes records a sequence of ``dims`` numbers, each in the range.
    """

    low: float
    high: float
    out_of_range: str = "clamp"
    dims: int = 1

    def __post_init__(self) -> None:
        for f in ("low", "high"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise SpecError(f"range domain: '{f}' must be a finite number, got {v!r}")
        if not self.low < self.high:
            raise SpecError(f"range domain: low ({self.low}) must be below high ({self.high})")
        if self.out_of_range not in ("clamp", "refuse"):
            raise SpecError(f"range domain: 'out_of_range' must be 'clamp' or 'refuse', got {self.out_of_range!r}")

    @property
    def size(self) -> int:
        """Not a number of indices: numeric metrics have none (kept so every domain has the attribute)."""
        return 0

    def index_of(self, value: Any) -> float | tuple[float, ...]:
        """The number to privatize (a tuple of ``dims`` numbers with several attributes), clamped into the range
        (or :class:`DomainError`)."""
        return self.prepare(value)[0]

    def prepare(self, value: Any) -> tuple[float | tuple[float, ...], bool]:
        """``(what to privatize, whether a number was clamped)``; :class:`DomainError` for a value refused."""
        if self.dims == 1:
            return self._one(value)
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__"):
            raise DomainError(
                f"this numeric metric has {self.dims} attributes: record a sequence of {self.dims} numbers"
            )
        if len(value) != self.dims:
            raise DomainError(f"this numeric metric has {self.dims} attributes, got {len(value)} numbers")
        parts = [self._one(v) for v in value]
        return tuple(float(x) for x, _ in parts), any(c for _, c in parts)

    def _one(self, value: Any) -> tuple[float, bool]:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's numbers register as Real
            raise DomainError(f"a numeric metric takes a number, got {type(value).__name__}")
        x = float(value)
        if not math.isfinite(x):
            raise DomainError(f"a numeric metric takes a finite number, got {x!r}")
        if x < self.low or x > self.high:
            if self.out_of_range == "refuse":
                raise DomainError(f"value {x!r} is outside [{self.low}, {self.high}]")
            return min(max(x, float(self.low)), float(self.high)), True
        return x, False

    def label(self, index: int) -> str:
        return f"#{index}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "range", "low": self.low, "high": self.high, "out_of_range": self.out_of_range}


@dataclasses.dataclass(frozen=True)
class StringDomain:
    """The values of a heavy-hitter metric: strings of at most ``length`` UTF-8 bytes.

    ``overflow`` is ``"truncate"`` (cut at the last character boundary that fits)
    or ``"refuse"`` (a :class:`DomainError`, which the SDK counts as ``bad_value``). ``end_marker``
    1 also refuses control characters, so 0x00 unambiguously ends a value (docs/HEAVY_HITTERS.md)."""

    length: int
    overflow: str = "truncate"
    end_marker: int = 0

    def __post_init__(self) -> None:
        n = self.length
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
            raise SpecError(f"string domain: 'length' must be an integer from 1 to 64 bytes, got {n!r}")
        if self.overflow not in ("truncate", "refuse"):
            raise SpecError(f"string domain: 'overflow' must be 'truncate' or 'refuse', got {self.overflow!r}")
        from ldp_core.mechanisms.heavy_hitters import check_end_marker

        check_end_marker(self.end_marker, "string domain")

    @property
    def size(self) -> int:
        """Not a number of indices: strings have none (kept so every domain has the attribute)."""
        return 0

    def index_of(self, value: Any) -> bytes:
        """The padded bytes to privatize (:func:`ldp_core.mechanisms.heavy_hitters.pad_value`), or :class:`DomainError`."""
        from ldp_core.mechanisms.heavy_hitters import pad_value

        return pad_value(value, self.length, "refuse" if self.overflow == "refuse" else "truncate", self.end_marker)

    def label(self, index: int) -> str:
        return f"#{index}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "string", "length": self.length, "overflow": self.overflow}
        if self.end_marker:
            out["end_marker"] = self.end_marker
        return out


Domain = Dictionary | HashedDomain | NumberRange | StringDomain


def domain_from_dict(data: dict[str, Any]) -> Domain:
    """Inverse of ``to_dict`` of either domain kind."""
    kind = data.get("kind") if isinstance(data, dict) else None
    if kind == "dictionary":
        vals: Sequence[Value] = data.get("values", [])
        if not isinstance(vals, list):
            raise SpecError("dictionary domain: 'values' must be a list")
        return Dictionary(tuple(vals), bool(data.get("other", False)))
    if kind == "hashed":
        return HashedDomain(int(data["size"]), int(data.get("seed", 0)))
    if kind == "range":
        unknown = sorted(set(data) - {"kind", "low", "high", "out_of_range"})
        if unknown:
            raise SpecError(f"range domain: unknown key(s) {unknown}")
        return NumberRange(data["low"], data["high"], str(data.get("out_of_range", "clamp")))
    if kind == "string":
        unknown = sorted(set(data) - {"kind", "length", "overflow", "end_marker"})
        if unknown:
            raise SpecError(f"string domain: unknown key(s) {unknown}")
        return StringDomain(
            data.get("length"),  # type: ignore[arg-type]
            str(data.get("overflow", "truncate")),
            data.get("end_marker", 0),
        )
    raise SpecError(f"domain kind must be 'dictionary', 'hashed', 'range' or 'string', got {kind!r}")
