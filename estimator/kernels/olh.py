"""The OLH support-count kernel: n reports × d domain items XXH32 evaluations.

An OLH report ``(seed_i, y_i)`` supports item ``x`` when
``reduce_range(xxh32_u32(x, seed_i), g) == y_i`` (Wang et al., "Locally
Differentially Private Protocols for Frequency Estimation", USENIX Security
2017, Sec. 4.4). The support count ``C_x = #{i : report i supports x}`` is
OLH's linear sufficient statistic; exact estimation needs it for every x, so
this is the estimator's hottest loop.

How the loop is made fast:

* XXH32 of a 4-byte input is ``avalanche(rotl(seed + K_x, 17) · P4)`` with the
  per-item constant ``K_x = x·P3 + P5 + 4`` (:mod:`estimator.kernels.xxh32`),
  so the item enters only through one hoisted 32-bit constant.
* The multiply-shift test ``(h·g) >> 32 == y_i`` is replaced by the equivalent
  32-bit interval test ``h - lo_i <= width_i`` with ``(lo_i, width_i)``
  precomputed per report (:func:`estimator.kernels.xxh32.support_interval`),
  so the inner loop over reports is branch-free 32-bit integer arithmetic
  that LLVM vectorizes (8 lanes with AVX2).
* Reports are processed in tiles small enough that the tile's three
  ``uint32`` columns stay in L1 cache while every item of a chunk of items is
  run over it; (item chunk, report part) work units are spread over the
  numba threads with ``prange``. Each unit writes its own row of counts, so
  there are no races, and the rows are summed at the end.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from estimator.kernels.xxh32 import _P3, _P4, _P5_PLUS_4, _avalanche, _rotl, support_interval

__all__ = [
    "olh_support_counts",
    "report_intervals",
    "TILE",
    "ITEM_CHUNK",
    "PARALLEL_MIN_HASHES",
    "PARALLEL_MIN_REPORTS",
]

#: Reports per tile: 3 uint32 columns × 2048 = 24 KiB, inside a 32 KiB L1d.
TILE = 2048
#: Domain items per work unit.
ITEM_CHUNK = 64
#: Below this many hash evaluations (a few milliseconds of one core) the
#: kernel runs on the calling thread: starting the thread pool costs more.
PARALLEL_MIN_HASHES = 1 << 24
#: Below this many reports their intervals are computed on the calling thread.
PARALLEL_MIN_REPORTS = 1 << 18


# Separate functions, not one Python function compiled twice: numba's on-disk
# cache keys entries by function and signature, not by the parallel flag.
@nb.njit(cache=True)
def _report_intervals(ys: np.ndarray, g: np.uint64, lo: np.ndarray, width: np.ndarray) -> None:
    for i in range(ys.shape[0]):
        lo[i], width[i] = support_interval(np.uint32(ys[i]), g)


@nb.njit(cache=True, parallel=True)
def _report_intervals_parallel(ys: np.ndarray, g: np.uint64, lo: np.ndarray, width: np.ndarray) -> None:
    for i in nb.prange(ys.shape[0]):
        lo[i], width[i] = support_interval(np.uint32(ys[i]), g)


def report_intervals(ys: np.ndarray, g: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-report ``(lo, width)`` (uint32) such that report i supports a hash h
    iff ``(h - lo_i) mod 2**32 <= width_i``. Requires every ``y < g < 2**32``."""
    n = ys.shape[0]
    lo = np.empty(n, dtype=np.uint32)
    width = np.empty(n, dtype=np.uint32)
    kernel = _report_intervals_parallel if n >= PARALLEL_MIN_REPORTS else _report_intervals
    # one compiled signature whatever the record's y width
    kernel(np.ascontiguousarray(ys, dtype=np.uint32), np.uint64(g), lo, width)
    return lo, width


@nb.njit(cache=True, inline="always")
def _count_tile(k: np.uint32, seeds: np.ndarray, lo: np.ndarray, width: np.ndarray) -> np.uint32:
    # a loop from 0 over views: with a variable start LLVM does not vectorize it
    c = np.uint32(0)
    for i in range(seeds.shape[0]):
        h = np.uint32(seeds[i] + k)
        h = _avalanche(np.uint32(_rotl(h, 17) * _P4))
        c = np.uint32(c + np.uint32(np.uint32(h - lo[i]) <= width[i]))
    return c


@nb.njit(cache=True, inline="always")
def _run_unit(
    u: int,
    seeds: np.ndarray,
    lo: np.ndarray,
    width: np.ndarray,
    d: int,
    tile: int,
    chunk: int,
    n_parts: int,
    out: np.ndarray,
) -> None:
    """Work unit u: item chunk ``u % n_chunks`` over report part ``u // n_chunks``."""
    n = seeds.shape[0]
    n_chunks = (d + chunk - 1) // chunk
    per_part = (n + n_parts - 1) // n_parts
    part = u // n_chunks
    x0 = (u % n_chunks) * chunk
    x1 = min(d, x0 + chunk)
    r0 = part * per_part
    r1 = min(n, r0 + per_part)
    for t0 in range(r0, r1, tile):
        t1 = min(r1, t0 + tile)
        s_t = seeds[t0:t1]
        lo_t = lo[t0:t1]
        w_t = width[t0:t1]
        for x in range(x0, x1):
            k = np.uint32(np.uint32(np.uint32(x) * _P3) + _P5_PLUS_4)
            out[part, x] += _count_tile(k, s_t, lo_t, w_t)


@nb.njit(cache=True)
def _support_kernel(
    seeds: np.ndarray, lo: np.ndarray, width: np.ndarray, d: int, tile: int, chunk: int, n_parts: int, out: np.ndarray
) -> None:
    for u in range(((d + chunk - 1) // chunk) * n_parts):
        _run_unit(u, seeds, lo, width, d, tile, chunk, n_parts, out)


@nb.njit(cache=True, parallel=True)
def _support_kernel_parallel(
    seeds: np.ndarray, lo: np.ndarray, width: np.ndarray, d: int, tile: int, chunk: int, n_parts: int, out: np.ndarray
) -> None:
    for u in nb.prange(((d + chunk - 1) // chunk) * n_parts):
        _run_unit(u, seeds, lo, width, d, tile, chunk, n_parts, out)


def olh_support_counts(
    seeds: np.ndarray,
    ys: np.ndarray,
    g: int,
    domain_size: int,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Add ``C_x = #{i : reduce_range(xxh32_u32(x, seeds[i]), g) == ys[i]}`` for
    every ``x`` in ``[0, domain_size)`` into ``out`` (int64, allocated if None)
    and return it. Every ``ys[i]`` must be below ``g`` (checked by the caller)."""
    if out is None:
        out = np.zeros(domain_size, dtype=np.int64)
    n = seeds.shape[0]
    if n == 0:
        return out
    seeds = np.ascontiguousarray(seeds, dtype=np.uint32)
    lo, width = report_intervals(ys, g)
    threads = nb.get_num_threads()
    if threads == 1 or n * domain_size < PARALLEL_MIN_HASHES:
        rows = np.zeros((1, domain_size), dtype=np.int64)
        _support_kernel(seeds, lo, width, domain_size, TILE, ITEM_CHUNK, 1, rows)
        out += rows[0]
        return out
    n_chunks = -(-domain_size // ITEM_CHUNK)
    n_tiles = -(-n // TILE)
    # enough work units for every thread; split the reports only when the items alone are too few
    n_parts = max(1, min(n_tiles, -(-4 * threads // n_chunks)))
    rows = np.zeros((n_parts, domain_size), dtype=np.int64)
    _support_kernel_parallel(seeds, lo, width, domain_size, TILE, ITEM_CHUNK, n_parts, rows)
    out += rows.sum(axis=0)
    return out
