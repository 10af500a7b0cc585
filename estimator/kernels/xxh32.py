"""XXH32 in numba, bit for bit equal to the ``xxhash`` package.

XXH32 is Yann Collet's 32-bit xxHash (specification: ``doc/xxhash_spec.md``
of the xxHash repository, "XXH32 algorithm description"). Every step works
on 32-bit words with wrap-around arithmetic. numba widens integer arithmetic
to 64 bits, so each step here is truncated back with ``np.uint32(...)``;
the low 32 bits of a 64-bit sum, product or left shift are those of the
32-bit operation, so the result is exact, and LLVM narrows the operations
back to 32-bit lanes when it vectorizes.

Two entry points match :mod:`ldp_core.hashing`:

* :func:`xxh32_u32` -- XXH32 of the 4-byte little-endian form of a ``uint32``
  (the spec's "input length < 16" path with one 4-byte lane and no 1-byte
  tail), the hash every encoder applies to domain indices;
* :func:`xxh32_bytes` -- XXH32 of an arbitrary byte string (all branches:
  16-byte stripes with four accumulators, 4-byte and 1-byte tails).

:func:`reduce_range` is the multiply-shift map ``(h * g) >> 32`` onto
``[0, g)`` (Lemire, "Fast Random Integer Generation in an Interval", 2019),
and :func:`support_interval` turns "``reduce_range(h, g) == y``" into the
equivalent 32-bit test ``h - lo <= width`` used by the OLH kernel.
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = [
    "xxh32_u32",
    "xxh32_u32_array",
    "xxh32_bytes",
    "reduce_range",
    "reduce_range_array",
    "support_interval",
]

_P1 = np.uint32(0x9E3779B1)
_P2 = np.uint32(0x85EBCA77)
_P3 = np.uint32(0xC2B2AE3D)
_P4 = np.uint32(0x27D4EB2F)
_P5 = np.uint32(0x165667B1)
#: PRIME32_5 + 4: the constant added for a 4-byte input.
_P5_PLUS_4 = np.uint32(0x165667B5)
_U32_0 = np.uint32(0)
_SH32 = np.uint64(32)
_U64_1 = np.uint64(1)


@nb.njit(cache=True, inline="always")
def _rotl(x: np.uint32, r: int) -> np.uint32:
    x = np.uint32(x)
    return np.uint32(np.uint32(x << np.uint32(r)) | np.uint32(x >> np.uint32(32 - r)))


@nb.njit(cache=True, inline="always")
def _avalanche(h: np.uint32) -> np.uint32:
    h = np.uint32(h)
    h = np.uint32(h ^ np.uint32(h >> np.uint32(15)))
    h = np.uint32(h * _P2)
    h = np.uint32(h ^ np.uint32(h >> np.uint32(13)))
    h = np.uint32(h * _P3)
    h = np.uint32(h ^ np.uint32(h >> np.uint32(16)))
    return h


@nb.njit(cache=True, inline="always")
def _round(acc: np.uint32, lane: np.uint32) -> np.uint32:
    acc = np.uint32(acc + np.uint32(lane * _P2))
    return np.uint32(_rotl(acc, 13) * _P1)


@nb.njit(cache=True, inline="always")
def _read_u32le(data: np.ndarray, i: int) -> np.uint32:
    return np.uint32(
        np.uint32(data[i])
        | np.uint32(np.uint32(data[i + 1]) << np.uint32(8))
        | np.uint32(np.uint32(data[i + 2]) << np.uint32(16))
        | np.uint32(np.uint32(data[i + 3]) << np.uint32(24))
    )


@nb.njit(cache=True, inline="always")
def xxh32_u32(value: np.uint32, seed: np.uint32) -> np.uint32:
    """XXH32 of the 4 little-endian bytes of ``value`` under ``seed``.

    For a 4-byte input the specification reduces to
    ``h = seed + P5 + 4``; ``h = rotl(h + value·P3, 17)·P4``; avalanche.
    """
    h = np.uint32(np.uint32(seed) + _P5_PLUS_4)
    h = np.uint32(h + np.uint32(np.uint32(value) * _P3))
    h = np.uint32(_rotl(h, 17) * _P4)
    return _avalanche(h)


@nb.njit(cache=True)
def xxh32_u32_array(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """Element-wise :func:`xxh32_u32` of two equally long ``uint32`` arrays."""
    n = values.shape[0]
    out = np.empty(n, dtype=np.uint32)
    for i in range(n):
        out[i] = xxh32_u32(values[i], seeds[i])
    return out


@nb.njit(cache=True)
def xxh32_bytes(data: np.ndarray, seed: np.uint32) -> np.uint32:
    """XXH32 of the bytes in the ``uint8`` array ``data`` under ``seed``.

    Inputs of 16 bytes or more are consumed in 16-byte stripes by four
    accumulators (seeded ``seed+P1+P2``, ``seed+P2``, ``seed``, ``seed-P1``)
    that are then merged by rotations 1, 7, 12, 18; shorter inputs start
    from ``seed + P5``. Then the length is added, the remaining 4-byte words
    (``rotl(h + w·P3, 17)·P4``) and single bytes (``rotl(h + b·P5, 11)·P1``)
    are folded in, and the avalanche finishes.
    """
    seed = np.uint32(seed)
    n = data.shape[0]
    i = 0
    if n >= 16:
        v1 = np.uint32(np.uint32(seed + _P1) + _P2)
        v2 = np.uint32(seed + _P2)
        v3 = seed
        v4 = np.uint32(seed - _P1)
        limit = n - 16
        while i <= limit:
            v1 = _round(v1, _read_u32le(data, i))
            v2 = _round(v2, _read_u32le(data, i + 4))
            v3 = _round(v3, _read_u32le(data, i + 8))
            v4 = _round(v4, _read_u32le(data, i + 12))
            i += 16
        h = np.uint32(np.uint32(np.uint32(_rotl(v1, 1) + _rotl(v2, 7)) + _rotl(v3, 12)) + _rotl(v4, 18))
    else:
        h = np.uint32(seed + _P5)
    h = np.uint32(h + np.uint32(n & 0xFFFFFFFF))
    while i + 4 <= n:
        h = np.uint32(h + np.uint32(_read_u32le(data, i) * _P3))
        h = np.uint32(_rotl(h, 17) * _P4)
        i += 4
    while i < n:
        h = np.uint32(h + np.uint32(np.uint32(data[i]) * _P5))
        h = np.uint32(_rotl(h, 11) * _P1)
        i += 1
    return _avalanche(h)


@nb.njit(cache=True, inline="always")
def reduce_range(h: np.uint32, g: np.uint64) -> np.uint32:
    """``(h · g) >> 32`` in 64-bit arithmetic: a 32-bit hash mapped to ``[0, g)``."""
    return np.uint32((np.uint64(h) * np.uint64(g)) >> _SH32)


@nb.njit(cache=True)
def reduce_range_array(hashes: np.ndarray, g: np.uint64) -> np.ndarray:
    """Element-wise :func:`reduce_range` of a ``uint32`` array."""
    n = hashes.shape[0]
    out = np.empty(n, dtype=np.uint32)
    gg = np.uint64(g)
    for i in range(n):
        out[i] = reduce_range(hashes[i], gg)
    return out


@nb.njit(cache=True, inline="always")
def support_interval(y: np.uint32, g: np.uint64) -> tuple[np.uint32, np.uint32]:
    """``(lo, width)`` such that, for every 32-bit ``h``,
    ``reduce_range(h, g) == y``  iff  ``(h - lo) mod 2**32 <= width``.

    ``floor(h·g / 2**32) = y`` iff ``y·2**32 <= h·g <= (y+1)·2**32 - 1`` iff
    ``ceil(y·2**32 / g) <= h <= floor(((y+1)·2**32 - 1) / g)``. For
    ``y < g < 2**32`` both ends lie in ``[0, 2**32)`` and the interval holds
    ``floor(2**32 / g)`` or ``ceil(2**32 / g)`` values. Requires ``y < g``.
    """
    gg = np.uint64(g)
    yy = np.uint64(y)
    lo = ((yy << _SH32) + gg - _U64_1) // gg
    hi = (((yy + _U64_1) << _SH32) - _U64_1) // gg
    return np.uint32(lo), np.uint32(hi - lo)
