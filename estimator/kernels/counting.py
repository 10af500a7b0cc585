"""Counting kernels: histograms of narrow unsigned integer columns.

Batches of at most :data:`SMALL_VALUES` values are counted with ``np.bincount``; larger ones with a
numba loop (:mod:`estimator.kernels.histogram_jit`, which reads narrow columns in place instead of
widening them to int64), imported on first use so that a small job does not pay numba's start-up.
"""

from __future__ import annotations

import numpy as np

__all__ = ["histogram", "SMALL_VALUES"]

#: At most this many values are counted with numpy.
SMALL_VALUES = 1 << 16


def histogram(values: np.ndarray, out: np.ndarray) -> None:
    """Add the histogram of ``values`` into ``out`` (values must be < len(out);
    the decoder already checked them; any that are not are left out)."""
    values = np.ascontiguousarray(values)
    if values.shape[0] <= SMALL_VALUES and values.dtype.kind == "u" and np.can_cast(values.dtype, np.intp):
        out += np.bincount(values, minlength=out.shape[0])[: out.shape[0]]
        return
    from estimator.kernels.histogram_jit import histogram_jit

    histogram_jit(values, out)
