"""OLH support counts for batches of any size: numpy for small ones, the numba kernel for the rest.

:func:`estimator.kernels.olh.olh_support_counts` is fast once running, but a process pays about half a
second to import numba and load its cached machine code before the first call: more than the whole
of a small job (``ldp simulate --users 1000`` evaluates 10^6 hashes, about 10 ms in numpy). So batches
of at most :data:`SMALL_HASHES` hash evaluations are counted here with numpy, and numba is imported
only for a larger batch. Both give the same integer counts (tests/mechanisms/test_olh.py compares
them on random batches).

The hash is the XXH32 of a 4-byte input, ``avalanche(rotl(seed + K_x, 17) * P4)`` with the per-item
constant ``K_x = x * P3 + P5 + 4`` (:mod:`estimator.kernels.xxh32`), in wrap-around ``uint32``
arithmetic, and a report supports x when ``(h * g) >> 32 == y``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["olh_support_counts", "olh_support_counts_numpy", "SMALL_HASHES"]

#: At most this many hash evaluations (n reports x d items) are counted with numpy.
SMALL_HASHES = 1 << 22
#: Hash evaluations per numpy block (a few MiB of temporaries).
_BLOCK = 1 << 18

_P2 = np.uint32(0x85EBCA77)
_P3 = np.uint32(0xC2B2AE3D)
_P4 = np.uint32(0x27D4EB2F)
_P5_PLUS_4 = np.uint32(0x165667B5)


def _avalanche(h: np.ndarray) -> np.ndarray:
    h ^= h >> np.uint32(15)
    h *= _P2
    h ^= h >> np.uint32(13)
    h *= _P3
    h ^= h >> np.uint32(16)
    return h


def olh_support_counts_numpy(
    seeds: np.ndarray, ys: np.ndarray, g: int, domain_size: int, out: np.ndarray | None = None
) -> np.ndarray:
    """:func:`olh_support_counts` in numpy only, in blocks of items (any size; slow for large ones)."""
    if out is None:
        out = np.zeros(domain_size, dtype=np.int64)
    n = seeds.shape[0]
    if n == 0:
        return out
    seeds = np.ascontiguousarray(seeds, dtype=np.uint32)
    target = np.asarray(ys, dtype=np.uint64)
    gg = np.uint64(g)
    per_block = max(1, _BLOCK // n)
    for x0 in range(0, domain_size, per_block):
        xs = np.arange(x0, min(domain_size, x0 + per_block), dtype=np.uint32)
        k = xs * _P3 + _P5_PLUS_4
        h = seeds[None, :] + k[:, None]
        h = (h << np.uint32(17)) | (h >> np.uint32(15))
        h *= _P4
        h = _avalanche(h)
        hits = (h.astype(np.uint64) * gg) >> np.uint64(32) == target[None, :]
        out[x0 : x0 + xs.shape[0]] += hits.sum(axis=1)
    return out


def olh_support_counts(
    seeds: np.ndarray, ys: np.ndarray, g: int, domain_size: int, out: np.ndarray | None = None
) -> np.ndarray:
    """Add ``C_x = #{i : reduce_range(xxh32_u32(x, seeds[i]), g) == ys[i]}`` for every ``x`` in
    ``[0, domain_size)`` into ``out`` (int64, allocated if None) and return it; every ``ys[i]`` must be
    below ``g``. numpy for at most :data:`SMALL_HASHES` evaluations, else the numba kernel."""
    if seeds.shape[0] * domain_size <= SMALL_HASHES:
        return olh_support_counts_numpy(seeds, ys, g, domain_size, out)
    from estimator.kernels.olh import olh_support_counts as kernel

    return kernel(seeds, ys, g, domain_size, out)
