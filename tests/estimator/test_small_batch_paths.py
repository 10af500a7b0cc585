"""The numpy paths for small batches count exactly what the numba kernels count (issue 31, start-up).

Small batches of OLH/LOLOHA support counts, OUE bit counts and GRR/HR histograms are counted with
numpy so that a small job does not import numba; the counts are integers, so old == new exactly,
checked on random batches of random shapes (hypothesis, fixed derandomized seed). The OUE kernel's
block path is checked the same way against the byte-lane kernel and ``np.unpackbits``.
"""

from __future__ import annotations

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import estimator.oracles.oue as oue_oracle
from estimator.kernels.counting import histogram
from estimator.kernels.histogram_jit import histogram_jit
from estimator.kernels.olh import olh_support_counts as olh_numba
from estimator.kernels.sketch import PARALLEL_MIN_REPORTS, cms_add, cms_add_bytes
from estimator.kernels.support import SMALL_HASHES, olh_support_counts, olh_support_counts_numpy
from estimator.oracles import accumulator_for
from ldp_core.mechanisms import make_spec

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True)


@SETTINGS
@given(
    n=st.integers(0, 3000),
    d=st.integers(1, 300),
    g=st.sampled_from([2, 3, 8, 255, 1 << 16, (1 << 32) - 1]),
    seed=st.integers(0, 2**32 - 1),
)
def test_olh_numpy_counts_equal_the_numba_kernel(n: int, d: int, g: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    seeds = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    ys = rng.integers(0, g, size=n, dtype=np.uint64).astype(np.uint32)
    start = rng.integers(0, 5, size=d).astype(np.int64)
    expected = olh_numba(seeds, ys, g, d, out=start.copy())
    np.testing.assert_array_equal(olh_support_counts_numpy(seeds, ys, g, d, out=start.copy()), expected)


def test_olh_dispatch_takes_the_kernel_above_the_threshold() -> None:
    rng = np.random.default_rng(7)
    d = 64
    n = SMALL_HASHES // d + 1
    seeds = rng.integers(0, 2**32, size=n, dtype=np.uint64).astype(np.uint32)
    ys = rng.integers(0, 4, size=n).astype(np.uint8)
    np.testing.assert_array_equal(olh_support_counts(seeds, ys, 4, d), olh_support_counts_numpy(seeds, ys, 4, d))


@SETTINGS
@given(n=st.integers(0, 2000), d=st.integers(2, 300), seed=st.integers(0, 2**32 - 1))
def test_oue_numpy_counts_equal_the_numba_kernel(n: int, d: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    spec = make_spec("oue", epsilon=1.0, domain_size=d)
    rec = np.zeros(n, dtype=spec.record_dtype)
    rec["bits"] = rng.integers(0, 256, size=rec["bits"].shape, dtype=np.uint8)
    if d % 8:
        rec["bits"][:, -1] &= np.uint8((1 << (d % 8)) - 1)
    small = accumulator_for(spec)
    small.update(rec)
    saved = oue_oracle.SMALL_BITS
    try:
        oue_oracle.SMALL_BITS = -1  # every batch to the numba kernel
        kernel = accumulator_for(spec)
        kernel.update(rec)
    finally:
        oue_oracle.SMALL_BITS = saved
    np.testing.assert_array_equal(small.sums["ones"], kernel.sums["ones"])
    assert small.n == kernel.n == n


@SETTINGS
@given(
    n=st.integers(0, 5000),
    d=st.integers(1, 70000),
    dtype=st.sampled_from([np.uint8, np.uint16, np.uint32]),
    seed=st.integers(0, 2**32 - 1),
)
def test_histogram_bincount_equals_the_numba_loop(n: int, d: int, dtype: type, seed: int) -> None:
    rng = np.random.default_rng(seed)
    hi = min(d, int(np.iinfo(dtype).max) + 1)
    values = rng.integers(0, hi, size=n).astype(dtype)
    got = np.arange(d, dtype=np.int64)
    want = got.copy()
    histogram(values, got)
    histogram_jit(values, want)
    np.testing.assert_array_equal(got, want)


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    n=st.sampled_from([0, 1, 15, 16, 17, 31, 1000, 16 * 63 * 4 + 5, 16 * 63 * 4 * 2 + 16, PARALLEL_MIN_REPORTS + 37]),
    words=st.integers(1, 17),
    threads=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**32 - 1),
)
def test_oue_block_kernel_equals_byte_lanes_and_unpackbits(n: int, words: int, threads: int, seed: int) -> None:
    """The single-row path of ``cms_add`` (Harley-Seal blocks of 16 reports, the rest one by one,
    the plane and lane flushes at 63 blocks and 4 flushes) against the byte-lane kernel and numpy;
    the sizes cross every block and flush boundary, and the last one the threaded path."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 256, size=(n, 8 * words), dtype=np.uint8)
    rows = np.zeros(n, dtype=np.uint8)
    start = rng.integers(0, 9, size=(1, 64 * words)).astype(np.int64)
    got, want = start.copy(), start.copy()
    got_n, want_n = np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    saved = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        cms_add(rows, bits, got, got_n)
    finally:
        numba.set_num_threads(saved)
    cms_add_bytes(rows, bits, want, want_n)
    np.testing.assert_array_equal(got, want)
    assert got_n[0] == want_n[0] == n
    unpacked = np.unpackbits(bits, axis=1, bitorder="little").sum(axis=0, dtype=np.int64)
    np.testing.assert_array_equal(got[0] - start[0], unpacked)
