"""OLH support counts of an arbitrary list of candidate items (PEM's levels).

:func:`estimator.kernels.olh.olh_support_counts` counts every item of a
domain ``0 .. d-1``; PEM instead asks, at each level, about a few thousand
candidate prefix keys scattered over [0, 2^31). Same test, same tiles: report
i supports key x when ``reduce_range(xxh32_u32(x, seed_i), g) == y_i``, which
with the per-item constant ``K_x = x·P3 + P5 + 4`` and the per-report
interval ``(lo_i, width_i)`` is ``(avalanche(rotl(seed_i + K_x, 17)·P4) - lo_i)
mod 2^32 <= width_i`` (:mod:`estimator.kernels.olh`). Work units are chunks of
candidates, spread over the numba threads with ``prange``.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from estimator.kernels.olh import ITEM_CHUNK, PARALLEL_MIN_HASHES, TILE, _count_tile, report_intervals
from estimator.kernels.xxh32 import _P3, _P5_PLUS_4, reduce_range, xxh32_u32

__all__ = ["olh_candidate_support", "sketch_row_means"]


@nb.njit(cache=True, inline="always")
def _candidate_unit(
    u: int, keys: np.ndarray, seeds: np.ndarray, lo: np.ndarray, width: np.ndarray, out: np.ndarray
) -> None:
    n = seeds.shape[0]
    x0 = u * ITEM_CHUNK
    x1 = min(keys.shape[0], x0 + ITEM_CHUNK)
    for t0 in range(0, n, TILE):
        t1 = min(n, t0 + TILE)
        s_t = seeds[t0:t1]
        lo_t = lo[t0:t1]
        w_t = width[t0:t1]
        for x in range(x0, x1):
            k = np.uint32(np.uint32(np.uint32(keys[x]) * _P3) + _P5_PLUS_4)
            out[x] += _count_tile(k, s_t, lo_t, w_t)


@nb.njit(cache=True)
def _candidates(keys: np.ndarray, seeds: np.ndarray, lo: np.ndarray, width: np.ndarray, out: np.ndarray) -> None:
    for u in range((keys.shape[0] + ITEM_CHUNK - 1) // ITEM_CHUNK):
        _candidate_unit(u, keys, seeds, lo, width, out)


@nb.njit(cache=True, parallel=True)
def _candidates_parallel(
    keys: np.ndarray, seeds: np.ndarray, lo: np.ndarray, width: np.ndarray, out: np.ndarray
) -> None:
    for u in nb.prange((keys.shape[0] + ITEM_CHUNK - 1) // ITEM_CHUNK):
        _candidate_unit(u, keys, seeds, lo, width, out)


def olh_candidate_support(seeds: np.ndarray, ys: np.ndarray, g: int, keys: np.ndarray) -> np.ndarray:
    """``C_x = #{i : reduce_range(xxh32_u32(keys[x], seeds[i]), g) == ys[i]}`` for each candidate (int64).

    Every ``ys[i]`` must be below ``g`` (the caller checks the records)."""
    k = np.ascontiguousarray(keys, dtype=np.uint32)
    out = np.zeros(k.shape[0], dtype=np.int64)
    if seeds.shape[0] == 0 or k.shape[0] == 0:
        return out
    s = np.ascontiguousarray(seeds, dtype=np.uint32)
    lo, width = report_intervals(ys, g)
    small = nb.get_num_threads() == 1 or s.shape[0] * k.shape[0] < PARALLEL_MIN_HASHES
    (_candidates if small else _candidates_parallel)(k, s, lo, width, out)
    return out


@nb.njit(cache=True, parallel=True)
def _sketch_means(sketch: np.ndarray, row_seeds: np.ndarray, keys: np.ndarray, out: np.ndarray) -> None:
    k, m = sketch.shape
    mm = np.uint64(m)
    for x in nb.prange(keys.shape[0]):
        acc = 0.0
        key = np.uint32(keys[x])
        for j in range(k):
            acc += sketch[j, reduce_range(xxh32_u32(key, np.uint32(row_seeds[j])), mm)]
        out[x] = acc / k


def sketch_row_means(sketch: np.ndarray, row_seeds: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``(1/k) Σ_j M[j, h_j(x)]`` for each key x, with ``h_j(x) = reduce_range(xxh32_u32(x, seed_j), m)``
    (the CMS/HCMS hash family of :mod:`ldp_core.mechanisms.cms`): a count-mean sketch's raw means."""
    out = np.empty(keys.shape[0], dtype=np.float64)
    _sketch_means(
        np.ascontiguousarray(sketch, dtype=np.float64),
        np.ascontiguousarray(row_seeds, dtype=np.uint32),
        np.ascontiguousarray(keys, dtype=np.uint32),
        out,
    )
    return out
