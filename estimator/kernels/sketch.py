"""Accumulation kernels of the count-mean sketches (CMS, HCMS).

CMS reports carry m packed bits. Unpacking them one bit at a time costs m
operations per report; :func:`cms_add` instead adds each byte as eight
8-bit lanes of one ``uint64`` (a 256-entry table spreads bit t of the byte
to bit 8t of the word), so a report costs m/8 table lookups and additions.
A lane holds at most 255, so a row's lane words are flushed into the int64
counts every 255 reports of that row and at the end of the batch.
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["cms_add", "hcms_add", "SPREAD_BYTE"]


def _spread_table() -> np.ndarray:
    b = np.arange(256, dtype=np.uint64)
    out = np.zeros(256, dtype=np.uint64)
    for t in range(8):
        out |= ((b >> np.uint64(t)) & np.uint64(1)) << np.uint64(8 * t)
    return out


#: SPREAD_BYTE[b] has bit 8t set iff bit t of b is set
SPREAD_BYTE: np.ndarray = _spread_table()


@nb.njit(cache=True, nogil=True)
def _flush_row(lanes: np.ndarray, j: int, ones: np.ndarray) -> None:
    m = ones.shape[1]
    for b in range(lanes.shape[1]):
        w = lanes[j, b]
        if w:
            base = 8 * b
            for t in range(8):
                a = base + t
                if a < m:
                    ones[j, a] += np.int64((w >> np.uint64(8 * t)) & np.uint64(0xFF))
            lanes[j, b] = 0


@nb.njit(cache=True, nogil=True)
def _cms_add(rows: np.ndarray, bits: np.ndarray, ones: np.ndarray, row_counts: np.ndarray, spread: np.ndarray) -> None:
    n, nbytes = bits.shape
    k = ones.shape[0]
    lanes = np.zeros((k, nbytes), dtype=np.uint64)
    pending = np.zeros(k, dtype=np.int64)
    for i in range(n):
        j = rows[i]
        for b in range(nbytes):
            lanes[j, b] += spread[bits[i, b]]
        row_counts[j] += 1
        pending[j] += 1
        if pending[j] == 255:
            _flush_row(lanes, j, ones)
            pending[j] = 0
    for j in range(k):
        if pending[j]:
            _flush_row(lanes, j, ones)


def cms_add(rows: np.ndarray, bits: np.ndarray, ones: np.ndarray, row_counts: np.ndarray) -> None:
    """Add CMS reports: ``ones[j, a] += #{i: rows[i] = j, bit a of report i is 1}`` and
    ``row_counts[j] += #{i: rows[i] = j}``. ``bits`` is ``(n, ceil(m/8))`` ``uint8``,
    bit a in byte a // 8 at position a % 8; rows must be < k (checked on decode).
    Strided views (record fields) are read in place, without a copy."""
    _cms_add(rows, bits, ones, row_counts, SPREAD_BYTE)


@nb.njit(cache=True, nogil=True)
def _hcms_add(rows: np.ndarray, cols: np.ndarray, bits: np.ndarray, signed: np.ndarray) -> None:
    for i in range(rows.shape[0]):
        signed[rows[i], cols[i]] += 1 - 2 * np.int64(bits[i])


def hcms_add(rows: np.ndarray, cols: np.ndarray, bits: np.ndarray, signed: np.ndarray) -> None:
    """Add HCMS reports: ``signed[row, col] += (-1)^bit``."""
    _hcms_add(rows, cols, bits, signed)
