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
  m = 1024). With a single row (OUE) reports are added 16 at a time by Harley
  and Seal's carry-save tree (:func:`_single_row_blocks`: per coordinate a
  count modulo 16 in four bit-sliced words, and one word of carries of weight
  16 per block rippled into the planes); the last n mod 16 reports one by one.
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


#: reports per block of the single-row (OUE) path
_BLOCK = 16


@nb.njit(cache=True, nogil=True, inline="always")
def _csa(a: np.uint64, b: np.uint64, c: np.uint64) -> tuple[np.uint64, np.uint64]:
    """Carry-save adder of three words, bit by bit: (sum, carry) with a + b + c = sum + 2·carry."""
    u = a ^ b
    return u ^ c, (a & b) | (u & c)


@nb.njit(cache=True, nogil=True, inline="always")
def _single_row_blocks(words: np.ndarray, ones: np.ndarray, spread: np.ndarray, stop: int) -> int:
    """Add reports ``[0, stop)`` (a multiple of :data:`_BLOCK`) of one row into ``ones[0]``; returns ``stop``.

    Harley and Seal's carry-save tree over 16 reports at a time, kept per bit position: four
    bit-sliced words hold each coordinate's count modulo 16 with weights 1, 2, 4, 8 (``low``), and
    each block of 16 reports is folded into them with 15 carry-save adders, which leave one word of
    carries of weight 16. That word is rippled into six planes of a 6-bit counter of sixteens per
    coordinate (``high``), emptied into byte lanes every 63 blocks and the lanes into ``sixteens``
    every 4 plane flushes, as :func:`_words_part` does for single reports. About 16 bitwise
    operations per report word against about 20 for pairs of reports, and one ripple per 16
    reports instead of one per 2. At the end ``ones[0] += 16·sixteens + low``."""
    nw = words.shape[1]
    m = ones.shape[1]
    low = np.zeros((1, _PLANES * nw), dtype=np.uint64)
    high = np.zeros((1, _PLANES * nw), dtype=np.uint64)
    lanes = np.zeros((1, 8 * nw), dtype=np.uint64)
    sixteens = np.zeros((1, m), dtype=np.int64)
    carry = np.empty(nw, dtype=np.uint64)
    pending = 0
    flushes = 0
    for i in range(0, stop, _BLOCK):
        for w in range(nw):
            o = low[0, w]
            t = low[0, nw + w]
            f = low[0, 2 * nw + w]
            e = low[0, 3 * nw + w]
            o, ta = _csa(o, words[i, w], words[i + 1, w])
            o, tb = _csa(o, words[i + 2, w], words[i + 3, w])
            t, fa = _csa(t, ta, tb)
            o, ta = _csa(o, words[i + 4, w], words[i + 5, w])
            o, tb = _csa(o, words[i + 6, w], words[i + 7, w])
            t, fb = _csa(t, ta, tb)
            f, ea = _csa(f, fa, fb)
            o, ta = _csa(o, words[i + 8, w], words[i + 9, w])
            o, tb = _csa(o, words[i + 10, w], words[i + 11, w])
            t, fa = _csa(t, ta, tb)
            o, ta = _csa(o, words[i + 12, w], words[i + 13, w])
            o, tb = _csa(o, words[i + 14, w], words[i + 15, w])
            t, fb = _csa(t, ta, tb)
            f, eb = _csa(f, fa, fb)
            e, c16 = _csa(e, ea, eb)
            low[0, w] = o
            low[0, nw + w] = t
            low[0, 2 * nw + w] = f
            low[0, 3 * nw + w] = e
            carry[w] = c16
        for level in range(_PLANES):
            base = level * nw
            for w in range(nw):
                c = high[0, base + w]
                high[0, base + w] = c ^ carry[w]
                carry[w] = c & carry[w]
        pending += 1
        if pending == _PLANE_FLUSH:
            pending = 0
            _planes_to_lanes(high, lanes, 0, spread)
            flushes += 1
            if flushes == _LANE_FLUSH:
                flushes = 0
                _flush_row(lanes, 0, sixteens)
    _planes_to_lanes(high, lanes, 0, spread)
    _flush_row(lanes, 0, sixteens)
    for a in range(m):
        ones[0, a] += 16 * sixteens[0, a]
    _planes_to_lanes(low, lanes, 0, spread)  # counts below 16: at most 15 per lane
    _flush_row(lanes, 0, ones)
    return stop


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
    if k == 1 and n >= _BLOCK:
        first = _single_row_blocks(words, ones, spread, n - n % _BLOCK)
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
