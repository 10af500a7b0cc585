"""Removing secure-aggregation masks on several cores.

Unmasking a SecAgg+ round is keystream generation: one AES-256-CTR stream of
d words per surviving client (its self mask) and per (dropped client,
surviving neighbour) pair — for 1,000 clients, d = 10^6 and 10 % dropped
about 2,700 streams, 11 GB of keystream (benchmarks/bench_secagg.py). The
``cryptography`` package holds the GIL while it encrypts, so threads do not
help; processes do. The vector is cut into contiguous slices at multiples of
4 words (one AES block); a slice starting at word s takes every keystream
from counter block s/4 (:func:`ldp_core.fl.secagg.add_masks` with
``start``), so each slice is masked on its own and the result equals the
one-process result word for word (tested). Keystreams are added four at a
time by a numba kernel (:func:`add_masks_server`).

The worker processes are started once per worker count and kept (a server
runs round after round); :func:`warm_pool` starts them ahead of the first
round so that their start-up (importing numpy and cryptography, about a
second) does not fall inside a round. The start method is ``forkserver``
where it exists (never ``fork``: a server process has threads), else ``spawn``;
as with any such start method, a script that uses more than one worker must
keep its top-level code under ``if __name__ == "__main__":``.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from estimator.kernels.masks import accumulate4
from ldp_core.fl.errors import SecAggError

__all__ = ["add_masks_server", "add_masks_parallel", "warm_pool", "slices"]

_CHUNK = 1 << 15
_NEG = np.uint32(0xFFFFFFFF)


def add_masks_server(acc: np.ndarray, masks: Sequence[tuple[bytes, int]], start: int = 0) -> np.ndarray:
    """The server's :func:`ldp_core.fl.secagg.add_masks` (same result, word for word):
    keystreams four at a time into a cache-sized buffer, added in one pass by the numba
    kernel :func:`estimator.kernels.masks.accumulate4`."""
    if acc.dtype != np.uint32 or acc.ndim != 1 or not acc.flags.c_contiguous:
        raise SecAggError("the accumulator must be a contiguous 1-d uint32 array")
    if isinstance(start, bool) or not isinstance(start, int) or start < 0 or start % 4:
        raise SecAggError(f"start must be a non-negative multiple of 4 words (one AES block), got {start!r}")
    counter = (start // 4).to_bytes(16, "big")
    encs: list[Any] = []  # AES-CTR encryptors, padded with None to a multiple of four
    mult: list[np.uint32] = []
    for seed, sign in masks:
        if len(seed) != 32 or sign not in (1, -1):
            raise SecAggError("each mask needs a 32-byte seed and a sign of +1 or -1")
        encs.append(Cipher(algorithms.AES(seed), modes.CTR(counter)).encryptor())
        mult.append(np.uint32(1) if sign > 0 else _NEG)
    while len(encs) % 4:
        encs.append(None)
        mult.append(np.uint32(0))
    d = acc.shape[0]
    rows = np.zeros((4, _CHUNK + 4), np.uint32)
    raws = [memoryview(rows[g]).cast("B") for g in range(4)]
    zeros = memoryview(bytes(4 * _CHUNK))
    swap = sys.byteorder == "big"
    for s in range(0, d, _CHUNK):
        n = min(_CHUNK, d - s)
        a, z = acc[s : s + n], zeros[: 4 * n]
        for g0 in range(0, len(encs), 4):
            for g in range(4):
                enc = encs[g0 + g]
                if enc is not None:
                    enc.update_into(z, raws[g])
                    if swap:
                        rows[g, :n].byteswap(inplace=True)
            accumulate4(a, rows[0], rows[1], rows[2], rows[3], mult[g0], mult[g0 + 1], mult[g0 + 2], mult[g0 + 3], n)
    return acc


_POOLS: dict[int, ProcessPoolExecutor] = {}


def _pool(processes: int) -> ProcessPoolExecutor:
    pool = _POOLS.get(processes)
    if pool is None:
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        pool = _POOLS[processes] = ProcessPoolExecutor(max_workers=processes, mp_context=ctx)
    return pool


def _masks_of_slice(masks: Sequence[tuple[bytes, int]], start: int, n: int) -> np.ndarray:
    return add_masks_server(np.zeros(n, np.uint32), masks, start=start)


def _ready() -> int:
    return 0


def warm_pool(workers: int) -> None:
    """Start the ``workers − 1`` helper processes now (and wait until they answer)."""
    if workers > 1:
        pool = _pool(workers - 1)
        for f in [pool.submit(_ready) for _ in range(workers - 1)]:
            f.result()


def slices(d: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous (start, stop) ranges covering [0, d), starts at multiples of 4."""
    if parts < 1:
        raise SecAggError(f"parts must be >= 1, got {parts}")
    step = -(-d // parts)
    step += -step % 4
    return [(s, min(s + step, d)) for s in range(0, d, step)] or [(0, 0)]


def add_masks_parallel(acc: np.ndarray, masks: Sequence[tuple[bytes, int]], workers: int) -> np.ndarray:
    """acc ← acc + Σ sign·PRG(seed) (mod 2^32) in place, as :func:`ldp_core.fl.secagg.add_masks`,
    with the vector split over ``workers`` processes (this one included; 1: no helper)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise SecAggError(f"workers must be an integer >= 1, got {workers!r}")
    if acc.dtype != np.uint32 or acc.ndim != 1 or not acc.flags.c_contiguous:
        raise SecAggError("the accumulator must be a contiguous 1-d uint32 array")
    parts = slices(acc.shape[0], workers)
    if len(parts) == 1:
        return add_masks_server(acc, masks)
    masks = list(masks)
    pool = _pool(workers - 1)
    futures: list[tuple[int, int, Future]] = [
        (s, e, pool.submit(_masks_of_slice, masks, s, e - s)) for s, e in parts[1:]
    ]
    s0, e0 = parts[0]
    add_masks_server(acc[s0:e0], masks, start=s0)
    for s, e, f in futures:
        part = acc[s:e]
        np.add(part, f.result(), out=part)
    return acc
