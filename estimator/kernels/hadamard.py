"""Fast Walsh–Hadamard transform (Sylvester order, unnormalized).

``fwht(a)`` returns ``a @ H_K`` along the last axis, where ``H_K[i, j] =
(-1)^popcount(i & j)`` and K (a power of two) is the length of that axis.
H_K is symmetric and ``H_K @ H_K = K I``, so the same transform divided by
K inverts it. The butterfly takes K log2 K additions per row instead of
the K² of a matrix product (the standard in-place radix-2 scheme).
Integer input stays integer, so transforms of counts are exact.
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["fwht", "fwht_inplace"]


@nb.njit(cache=True, nogil=True)
def _fwht_rows(a: np.ndarray) -> None:
    rows, size = a.shape
    for r in range(rows):
        h = 1
        while h < size:
            for start in range(0, size, 2 * h):
                for t in range(start, start + h):
                    x = a[r, t]
                    y = a[r, t + h]
                    a[r, t] = x + y
                    a[r, t + h] = x - y
            h *= 2


def _check_length(size: int) -> None:
    if size < 1 or size & (size - 1):
        raise ValueError(f"the Walsh–Hadamard transform needs a power-of-two length, got {size}")


def fwht_inplace(a: np.ndarray) -> np.ndarray:
    """Transform a C-contiguous 1-d or 2-d (row-wise) array in place; returns it."""
    if a.ndim not in (1, 2) or not a.flags.c_contiguous or not a.flags.writeable:
        raise ValueError("fwht_inplace needs a writeable C-contiguous 1-d or 2-d array")
    _check_length(a.shape[-1])
    _fwht_rows(a.reshape(-1, a.shape[-1]))
    return a


def fwht(a: np.ndarray) -> np.ndarray:
    """``a @ H_K`` along the last axis (a new array; int64 for integer input, else float64)."""
    arr = np.asarray(a)
    dtype = np.int64 if arr.dtype.kind in "iub" else np.float64
    out = np.array(arr, dtype=dtype, order="C", copy=True)
    _check_length(out.shape[-1])
    shape = out.shape
    _fwht_rows(out.reshape(-1, shape[-1]))
    return out.reshape(shape)
