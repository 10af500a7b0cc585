"""Removing secure-aggregation masks on several cores.

Unmasking a SecAgg+ round is keystream generation: one AES-256-CTR stream of
d words per surviving client (its self mask) and per (dropped client,
surviving neighbour) pair — for 1,000 clients, d = 10^6 and 10 % dropped
about 2,700 streams, 11 GB of keystream (benchmarks/bench_secagg.py). The
``cryptography`` package holds the GIL while it encrypts, so threads do not
help; processes do. The vector is cut into contiguous slices at multiples of
4 words (one AES block); a slice starting at word s takes every keystream
from counter block s/4 (:func:`client_sdk.fl.secagg.add_masks` with
``start``), so each slice is masked on its own and the result equals the
one-process result word for word (tested).

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
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Sequence

import numpy as np

from client_sdk.fl.errors import SecAggError
from client_sdk.fl.secagg import add_masks

__all__ = ["add_masks_parallel", "warm_pool", "slices"]

_POOLS: dict[int, ProcessPoolExecutor] = {}


def _pool(processes: int) -> ProcessPoolExecutor:
    pool = _POOLS.get(processes)
    if pool is None:
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        pool = _POOLS[processes] = ProcessPoolExecutor(max_workers=processes, mp_context=ctx)
    return pool


def _masks_of_slice(masks: Sequence[tuple[bytes, int]], start: int, n: int) -> np.ndarray:
    return add_masks(np.zeros(n, np.uint32), masks, start=start)


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
    """acc ← acc + Σ sign·PRG(seed) (mod 2^32) in place, as :func:`client_sdk.fl.secagg.add_masks`,
    with the vector split over ``workers`` processes (this one included)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise SecAggError(f"workers must be an integer >= 1, got {workers!r}")
    if acc.dtype != np.uint32 or acc.ndim != 1 or not acc.flags.c_contiguous:
        raise SecAggError("the accumulator must be a contiguous 1-d uint32 array")
    parts = slices(acc.shape[0], workers)
    if len(parts) == 1:
        return add_masks(acc, masks)
    masks = list(masks)
    pool = _pool(workers - 1)
    futures: list[tuple[int, int, Future]] = [(s, e, pool.submit(_masks_of_slice, masks, s, e - s)) for s, e in parts[1:]]
    s0, e0 = parts[0]
    add_masks(acc[s0:e0], masks, start=s0)
    for s, e, f in futures:
        part = acc[s:e]
        np.add(part, f.result(), out=part)
    return acc
