"""Counting kernels: histograms of narrow unsigned integer columns."""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["histogram"]


@nb.njit(cache=True, nogil=True)
def _histogram(values: np.ndarray, out: np.ndarray) -> None:
    d = out.shape[0]
    for i in range(values.shape[0]):
        v = values[i]
        if v < d:
            out[v] += 1


def histogram(values: np.ndarray, out: np.ndarray) -> None:
    """Add the histogram of ``values`` into ``out`` (values must be < len(out);
    the decoder already checked them)."""
    _histogram(np.ascontiguousarray(values), out)
