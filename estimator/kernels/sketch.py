"""Accumulation kernels of the count-mean sketches (CMS, HCMS).

A CMS report carries m packed bits; the accumulator needs, per row j and
coordinate a, how many reports of row j have bit a set. Unpacking bit by bit
costs m operations per report. Two cheaper schemes are used:

* **Byte lanes** (any width): each byte is added as eight 8-bit lanes of one
  ``uint64`` (a 256-entry table spreads bit t of the byte to bit 8t of the
  word): m/8 table lookups per report. A lane holds at most 255, so a row's
  lanes are flushed into the int64 counts every 255 reports of that row.
* **Carry-save counters** (widths whose packed bytes are a multiple of 8):
  each row keeps a 6-bit counter per coordinate, bit-sliced over 64
  coordinates per word (plane l holds bit l of 64 counters), and a report's
  64-bit word is added with a ripple of AND/XOR over the six planes. Every 63
  reports of a row the planes are emptied into byte lanes (plane l with weight
  2^l), and every 4 such flushes the lanes into the counts. It needs a tenth
  of the table lookups of the byte-lane scheme (about 1.5x faster overall at
  m = 1024). With a single row (OUE) reports are added in pairs: a full adder
  (sum ``c ^ a ^ b``, carry ``(c & a) | ((c ^ a) & b)``) into plane 0, then
  one ripple of the carry from plane 1 up, about 1.4x faster again; planes are
  then emptied after 62 reports.
* **Threads**: batches of at least :data:`PARALLEL_MIN_REPORTS` reports are
  cut into consecutive parts (two per numba thread, handed out one at a time
  so that a thread the shared machine deschedules does not hold the others),
  each with its own planes, lanes and counts, summed at the end. Smaller
  batches run on the calling thread.

Both read the record array's field in place (a strided view), without a copy.
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["cms_add", "cms_add_bytes", "hcms_add", "SPREAD_BYTE", "PARALLEL_MIN_REPORTS"]

_PLANES = 6
_PLANE_FLUSH = (1 << _PLANES) - 1  # reports per row that fill a 5-bit counter
_LANE_FLUSH = 255 // _PLANE_FLUSH  # plane flushes that fit in an 8-bit lane
#: Below this many reports the carry-save kernel runs on the calling thread:
#: starting the thread pool and summing per-thread counts cost more.
PARALLEL_MIN_REPORTS = 1 << 14
_PARTS_PER_THREAD = 2


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


@nb.njit(cache=True, nogil=True)
def _planes_to_lanes(planes: np.ndarray, lanes: np.ndarray, j: int, spread: np.ndarray) -> None:
    nw = lanes.shape[1] // 8
    for level in range(_PLANES):
        for w in range(nw):
            v = planes[j, level * nw + w]
            if v:
                for byte in range(8):
                    lanes[j, 8 * w + byte] += spread[(v >> np.uint64(8 * byte)) & np.uint64(0xFF)] << np.uint64(level)
                planes[j, level * nw + w] = 0


@nb.njit(cache=True, nogil=True, inline="always")
def _words_part(
    rows: np.ndarray, words: np.ndarray, ones: np.ndarray, row_counts: np.ndarray, spread: np.ndarray
) -> None:
    n, nw = words.shape
    k = ones.shape[0]
    planes = np.zeros((k, _PLANES * nw), dtype=np.uint64)
    lanes = np.zeros((k, 8 * nw), dtype=np.uint64)
    pending = np.zeros(k, dtype=np.int64)
    flushes = np.zeros(k, dtype=np.int64)
    carry = np.empty(nw, dtype=np.uint64)
    first = 0
    if k == 1:
        # one row: two reports at a time, a full adder of the pair into plane 0
        # and a ripple of its carry from plane 1 up (half the plane traffic)
        first = n - n % 2
        for t in range(n // 2):
            i = 2 * t
            for w in range(nw):
                a = words[i, w]
                b = words[i + 1, w]
                c = planes[0, w]
                u = c ^ a
                planes[0, w] = u ^ b
                carry[w] = (c & a) | (u & b)
            for level in range(1, _PLANES):
                base = level * nw
                for w in range(nw):
                    c = planes[0, base + w]
                    planes[0, base + w] = c ^ carry[w]
                    carry[w] = c & carry[w]
            pending[0] += 2
            if pending[0] >= _PLANE_FLUSH - 1:
                pending[0] = 0
                _planes_to_lanes(planes, lanes, 0, spread)
                flushes[0] += 1
                if flushes[0] == _LANE_FLUSH:
                    flushes[0] = 0
                    _flush_row(lanes, 0, ones)
        row_counts[0] += first
    for i in range(first, n):
        j = rows[i]
        for w in range(nw):
            carry[w] = words[i, w]
        for level in range(_PLANES):
            base = level * nw
            for w in range(nw):
                c = planes[j, base + w]
                planes[j, base + w] = c ^ carry[w]
                carry[w] = c & carry[w]
        row_counts[j] += 1
        pending[j] += 1
        if pending[j] == _PLANE_FLUSH:
            pending[j] = 0
            _planes_to_lanes(planes, lanes, j, spread)
            flushes[j] += 1
            if flushes[j] == _LANE_FLUSH:
                flushes[j] = 0
                _flush_row(lanes, j, ones)
    for j in range(k):
        _planes_to_lanes(planes, lanes, j, spread)
        _flush_row(lanes, j, ones)


# Separate functions, not one Python function compiled twice: numba's on-disk
# cache keys entries by function and signature, not by the parallel flag.
@nb.njit(cache=True, nogil=True)
def _cms_add_words(
    rows: np.ndarray, words: np.ndarray, ones: np.ndarray, row_counts: np.ndarray, spread: np.ndarray
) -> None:
    _words_part(rows, words, ones, row_counts, spread)


@nb.njit(cache=True, nogil=True, parallel=True)
def _cms_add_words_parallel(
    rows: np.ndarray, words: np.ndarray, ones: np.ndarray, row_counts: np.ndarray, spread: np.ndarray
) -> None:
    """Each part of the reports (one per entry of ``ones``' first axis) adds into its own counts."""
    n = words.shape[0]
    n_parts = ones.shape[0]
    per = (n + n_parts - 1) // n_parts
    for p in nb.prange(n_parts):
        i0 = min(n, p * per)
        i1 = min(n, i0 + per)
        _words_part(rows[i0:i1], words[i0:i1], ones[p], row_counts[p], spread)


def cms_add_bytes(rows: np.ndarray, bits: np.ndarray, ones: np.ndarray, row_counts: np.ndarray) -> None:
    """:func:`cms_add` by byte lanes only (any width, any strides)."""
    _cms_add(rows, bits, ones, row_counts, SPREAD_BYTE)


def cms_add(rows: np.ndarray, bits: np.ndarray, ones: np.ndarray, row_counts: np.ndarray) -> None:
    """Add CMS reports: ``ones[j, a] += #{i: rows[i] = j, bit a of report i is 1}`` and
    ``row_counts[j] += #{i: rows[i] = j}``. ``bits`` is ``(n, ceil(m/8))`` ``uint8``,
    bit a in byte a // 8 at position a % 8; rows must be < k (checked on decode).
    Uses the carry-save scheme when each report's bytes can be read as
    little-endian 64-bit words in place, else byte lanes."""
    if bits.ndim == 2 and bits.shape[1] % 8 == 0 and bits.strides[1] == 1:
        threads = nb.get_num_threads()
        n = bits.shape[0]
        if threads == 1 or n < PARALLEL_MIN_REPORTS:
            _cms_add_words(rows, bits.view("<u8"), ones, row_counts, SPREAD_BYTE)
            return
        # more parts than threads, handed out one at a time, so that a thread the
        # (shared) machine deschedules does not hold the others up
        n_parts = min(_PARTS_PER_THREAD * threads, -(-n // PARALLEL_MIN_REPORTS))
        parts = np.zeros((n_parts,) + ones.shape, dtype=np.int64)
        part_rows = np.zeros((n_parts, row_counts.shape[0]), dtype=np.int64)
        with nb.parallel_chunksize(1):
            _cms_add_words_parallel(rows, bits.view("<u8"), parts, part_rows, SPREAD_BYTE)
        ones += parts.sum(axis=0)
        row_counts += part_rows.sum(axis=0)
    else:
        _cms_add(rows, bits, ones, row_counts, SPREAD_BYTE)


@nb.njit(cache=True, nogil=True)
def _hcms_add(rows: np.ndarray, cols: np.ndarray, bits: np.ndarray, signed: np.ndarray) -> None:
    for i in range(rows.shape[0]):
        signed[rows[i], cols[i]] += 1 - 2 * np.int64(bits[i])


def hcms_add(rows: np.ndarray, cols: np.ndarray, bits: np.ndarray, signed: np.ndarray) -> None:
    """Add HCMS reports: ``signed[row, col] += (-1)^bit``."""
    _hcms_add(rows, cols, bits, signed)
