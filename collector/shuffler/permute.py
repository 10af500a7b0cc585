"""Uniform random permutations driven by the operating system's CSPRNG.

The shuffler's permutation must be unpredictable to an adversary who sees
the output and may have planted some of the input: with numpy's fast bit
generators (PCG64, Philox) the permutation is a function of a small state
that outputs may reveal, and nothing vouches for their secrecy. Here every
random word comes from ``os.urandom`` (``getrandom(2)`` on Linux, a
ChaCha20-based CSPRNG), drawn in bulk, so the cost is one system call per
permutation and the permutation is a deterministic function of CSPRNG
output alone.

The permutation is Durstenfeld's in-place Fisher-Yates shuffle (Knuth, TAOCP
vol. 2, Algorithm 3.4.2 P): for ``i = n-1 .. 1`` swap position ``i`` with a
uniform ``j`` in ``[0, i]``. Each ``j`` comes from one 32-bit word ``x`` by
Lemire's multiply-and-reject method (D. Lemire, "Fast Random Integer
Generation in an Interval", ACM TOMACS 29(1), 2019): with ``s = i + 1``,
``m = x * s``; reject when ``m mod 2**32 < 2**32 mod s``; otherwise
``j = m >> 32`` is exactly uniform. Every accepted draw is uniform whatever
number of rejections preceded it, and the rejection count is independent of
the accepted values, so restarting with fresh words in the (vanishingly
rare) case the drawn slack runs out leaves the permutation exactly uniform.
The kernel is numba-compiled (one pass, no Python per element).
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["WordSource", "urandom_words", "csprng_permutation", "fisher_yates", "warm_up"]

#: ``k -> k`` uniformly random uint32 words
WordSource = Callable[[int], np.ndarray]


def urandom_words(k: int) -> np.ndarray:
    """``k`` uint32 words from the OS CSPRNG."""
    return np.frombuffer(os.urandom(4 * int(k)), dtype=np.uint32)


def _fisher_yates(perm: np.ndarray, words: np.ndarray) -> int:
    n = perm.shape[0]
    k = 0
    nw = words.shape[0]
    mask = np.uint64(0xFFFFFFFF)
    for i in range(n - 1, 0, -1):
        s = np.uint64(i + 1)
        while True:
            if k >= nw:
                return -1
            m = np.uint64(words[k]) * s
            k += 1
            low = m & mask
            if low >= s:
                break
            t = (np.uint64(0x100000000) - s) % s
            if low >= t:
                break
        j = np.int64(m >> np.uint64(32))
        tmp = perm[i]
        perm[i] = perm[j]
        perm[j] = tmp
    return k


_KERNEL_LOCK = threading.Lock()


@functools.cache
def _compiled() -> Any:
    import numba as nb  # compiled on first use: importing this module stays light

    kernel = nb.njit(cache=True, nogil=True)(_fisher_yates)
    kernel(np.arange(2, dtype=np.int64), np.zeros(4, dtype=np.uint32))
    return kernel


def _kernel() -> Any:
    with _KERNEL_LOCK:
        return _compiled()


def warm_up() -> None:
    """Import numba and load (or compile) the kernel now, e.g. on a thread while a worker starts."""
    _kernel()


def fisher_yates(perm: np.ndarray, words: np.ndarray) -> int:
    """Shuffle the int64 array ``perm`` in place with the uint32 ``words``; return the words used, or -1 if they ran out."""
    return int(_kernel()(perm, words))


def csprng_permutation(n: int, words: WordSource = urandom_words) -> np.ndarray:
    """A uniformly random permutation of ``range(n)`` (int64), from ``words`` (default: the OS CSPRNG).

    Tests pass a seeded word source to make statistical checks reproducible.
    """
    if n < 0 or n > 1 << 32:
        raise ValueError(f"n must be between 0 and 2**32, got {n}")
    while True:
        perm = np.arange(n, dtype=np.int64)
        if n < 2:
            return perm
        drawn = np.ascontiguousarray(words(n + 64 + n // 16), dtype=np.uint32)
        if fisher_yates(perm, drawn) >= 0:
            return perm
