"""The numba histogram kernel behind :func:`estimator.kernels.counting.histogram` for large batches."""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["histogram_jit"]


@nb.njit(cache=True, nogil=True)
def histogram_jit(values: np.ndarray, out: np.ndarray) -> None:
    """``out[v] += 1`` for every ``v`` of ``values`` below ``len(out)``."""
    d = out.shape[0]
    for i in range(values.shape[0]):
        v = values[i]
        if v < d:
            out[v] += 1
