"""Stable hashing shared by devices and servers.

Every hash in the protocol is XXH32 (Collet's xxHash, 32-bit variant) so that
a device and the estimator agree bit for bit on every platform and process;
Python's built-in ``hash`` is salted per process and is never used.

Two forms are provided:

* :func:`xxh32_u32` -- XXH32 of the 4-byte little-endian encoding of each
  ``uint32`` in an array, vectorized in numpy (wrap-around ``uint32``
  arithmetic). This is the hot path of the encoders (OLH, CMS, RAPPOR).
  The estimator carries a numba twin in ``estimator.kernels.xxh32``; golden
  tests pin all three (this, numba and the ``xxhash`` package) together.
* :func:`hash_bytes` -- XXH32 of arbitrary bytes via the ``xxhash`` package,
  used to map strings of an open (hashed) domain to indices.

Reducing a 32-bit hash to ``[0, g)`` uses the multiply-shift map
``(h * g) >> 32`` (Lemire 2019) rather than ``h % g``: it is as uniform for
g much smaller than 2**32 and avoids an integer division in the server's
inner loops. Both sides call :func:`reduce_range`.
"""

from __future__ import annotations

import numpy as np
import xxhash

__all__ = [
    "PRIME32_1",
    "PRIME32_2",
    "PRIME32_3",
    "PRIME32_4",
    "PRIME32_5",
    "xxh32_u32",
    "reduce_range",
    "hash_bytes",
    "hash_to_range",
]

PRIME32_1 = 0x9E3779B1
PRIME32_2 = 0x85EBCA77
PRIME32_3 = 0xC2B2AE3D
PRIME32_4 = 0x27D4EB2F
PRIME32_5 = 0x165667B1

_U32 = np.uint32


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << _U32(r)) | (x >> _U32(32 - r))


def xxh32_u32(values: np.ndarray | np.integer | int, seeds: np.ndarray | np.integer | int) -> np.ndarray:
    """XXH32 of each value's 4-byte little-endian form under the matching seed.

    ``values`` and ``seeds`` broadcast against each other; both are taken
    modulo 2**32. Returns a ``uint32`` array equal, element for element, to
    ``xxhash.xxh32_intdigest(int(v).to_bytes(4, "little"), seed=int(s))``.
    """
    v = np.asarray(values).astype(_U32, copy=False)
    s = np.asarray(seeds).astype(_U32, copy=False)
    with np.errstate(over="ignore"):
        h = s + _U32((PRIME32_5 + 4) & 0xFFFFFFFF)
        h = h + v * _U32(PRIME32_3)
        h = _rotl(h, 17) * _U32(PRIME32_4)
        h ^= h >> _U32(15)
        h *= _U32(PRIME32_2)
        h ^= h >> _U32(13)
        h *= _U32(PRIME32_3)
        h ^= h >> _U32(16)
    return np.asarray(h, dtype=_U32)


def reduce_range(h: np.ndarray | np.integer | int, g: int) -> np.ndarray:
    """Map 32-bit hashes to ``[0, g)`` by ``(h * g) >> 32`` (multiply-shift)."""
    return ((np.asarray(h).astype(np.uint64) * np.uint64(g)) >> np.uint64(32)).astype(np.uint32)


def hash_to_range(values: np.ndarray | np.integer | int, seeds: np.ndarray | np.integer | int, g: int) -> np.ndarray:
    """``reduce_range(xxh32_u32(values, seeds), g)``: a seeded hash into ``[0, g)``."""
    return reduce_range(xxh32_u32(values, seeds), g)


def hash_bytes(data: bytes, seed: int = 0) -> int:
    """XXH32 of arbitrary bytes (via the ``xxhash`` package)."""
    return xxhash.xxh32_intdigest(data, seed=seed & 0xFFFFFFFF)
