"""Entries of the Sylvester Hadamard matrix without materializing it.

The Sylvester construction ``H_1 = [1]``, ``H_{2K} = [[H_K, H_K], [H_K, -H_K]]``
has the closed form ``H[i, j] = (-1)^popcount(i & j)`` for ``0 <= i, j < K``
(K a power of two). Device-side encoders of HCMS and Hadamard response need
single entries of it, so they use the parity of ``i & j``; the estimator's
fast Walsh–Hadamard transform (``estimator.kernels.hadamard``) multiplies by
the whole matrix in O(K log K).
"""

from __future__ import annotations

import numpy as np

__all__ = ["parity", "hadamard_bit", "hadamard_entry", "lowest_set_bit"]

_U32 = np.uint32
#: 16-entry table of the parity of a nibble, as the bits of 0x6996
_NIBBLE_PARITY = 0x6996


def parity(x: np.ndarray | int) -> np.ndarray:
    """Parity (popcount mod 2) of each value's low 32 bits, as ``uint8`` 0/1."""
    v = np.asarray(x).astype(_U32)
    v = v ^ (v >> _U32(16))
    v ^= v >> _U32(8)
    v ^= v >> _U32(4)
    return ((_U32(_NIBBLE_PARITY) >> (v & _U32(0xF))) & _U32(1)).astype(np.uint8)


def hadamard_bit(i: np.ndarray | int, j: np.ndarray | int) -> np.ndarray:
    """``b`` with ``H[i, j] = (-1)^b``: the parity of ``i & j`` (broadcasting)."""
    return parity(np.bitwise_and(np.asarray(i).astype(_U32), np.asarray(j).astype(_U32)))


def hadamard_entry(i: np.ndarray | int, j: np.ndarray | int) -> np.ndarray:
    """``H[i, j]`` in {-1, +1} as ``int8`` (broadcasting)."""
    return (1 - 2 * hadamard_bit(i, j).astype(np.int8)).astype(np.int8)


def lowest_set_bit(x: np.ndarray | int) -> np.ndarray:
    """``x & -x`` on ``uint32``: the lowest set bit of each value (0 for 0)."""
    v = np.asarray(x).astype(_U32)
    with np.errstate(over="ignore"):
        return v & (~v + _U32(1))
