"""Golden tests: the numba XXH32 equals the ``xxhash`` package and the numpy
path of :mod:`ldp_core.hashing` bit for bit; the numba multiply-shift
reduction and its interval form equal ``ldp_core.hashing.reduce_range``."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash

from estimator.kernels.xxh32 import (
    reduce_range,
    reduce_range_array,
    support_interval,
    xxh32_bytes,
    xxh32_u32,
    xxh32_u32_array,
)
from ldp_core import hashing

SEEDS = [0, 1, 2**31 - 1, 2**31, 0x9E3779B1, 2**32 - 1]


def test_published_vector_empty_input() -> None:
    """XXH32 of the empty input under seed 0 is 0x02CC5D05 (the value listed in
    the xxHash specification's test vectors); the package agrees too."""
    assert xxh32_bytes(np.zeros(0, dtype=np.uint8), np.uint32(0)) == 0x02CC5D05
    assert xxhash.xxh32_intdigest(b"", seed=0) == 0x02CC5D05


@pytest.mark.parametrize("seed", SEEDS)
def test_bytes_all_lengths_match_xxhash(seed: int) -> None:
    """Every length 0..100 covers the <16-byte path, 16-byte stripes, and every
    combination of 0-3 four-byte words and 0-3 single-byte tail bytes."""
    rng = np.random.default_rng([11, seed])
    for length in range(101):
        data = rng.integers(0, 256, size=length, dtype=np.uint8)
        expected = xxhash.xxh32_intdigest(data.tobytes(), seed=seed)
        got = xxh32_bytes(data, np.uint32(seed))
        assert int(got) == expected, f"length {length}, seed {seed}"


@pytest.mark.parametrize("seed", SEEDS)
def test_bytes_structured_inputs_match_xxhash(seed: int) -> None:
    """All-zero and all-0xFF inputs (carries and wrap-arounds in every lane) and longer inputs."""
    for length in [0, 1, 3, 4, 15, 16, 17, 31, 32, 33, 64, 255, 1000]:
        for fill in (0x00, 0xFF):
            data = np.full(length, fill, dtype=np.uint8)
            assert int(xxh32_bytes(data, np.uint32(seed))) == xxhash.xxh32_intdigest(data.tobytes(), seed=seed)


def test_u32_matches_numpy_path_and_package() -> None:
    rng = np.random.default_rng(2024)
    values = rng.integers(0, 2**32, size=20_000, dtype=np.uint32)
    seeds = rng.integers(0, 2**32, size=20_000, dtype=np.uint32)
    edge = np.array([0, 1, 2**31, 2**32 - 1], dtype=np.uint32)
    values = np.concatenate([values, np.repeat(edge, 4)])
    seeds = np.concatenate([seeds, np.tile(edge, 4)])
    numba_h = xxh32_u32_array(values, seeds)
    np.testing.assert_array_equal(numba_h, hashing.xxh32_u32(values, seeds))
    for v, s, h in zip(values[-400:], seeds[-400:], numba_h[-400:]):
        assert int(h) == xxhash.xxh32_intdigest(int(v).to_bytes(4, "little"), seed=int(s))
        assert int(xxh32_u32(v, s)) == int(h)


def test_u32_equals_general_bytes_version() -> None:
    rng = np.random.default_rng(5)
    for v, s in rng.integers(0, 2**32, size=(300, 2), dtype=np.uint32):
        data = np.frombuffer(int(v).to_bytes(4, "little"), dtype=np.uint8)
        assert int(xxh32_u32(v, s)) == int(xxh32_bytes(data, s))


@pytest.mark.parametrize("g", [2, 3, 4, 7, 56, 1000, 65_537, 2**24, 2**31 + 11, 2**32 - 1])
def test_reduce_range_matches_client(g: int) -> None:
    rng = np.random.default_rng([3, g])
    h = np.concatenate(
        [rng.integers(0, 2**32, size=5000, dtype=np.uint32), np.array([0, 1, 2**32 - 1, 2**31], dtype=np.uint32)]
    )
    got = reduce_range_array(h, np.uint64(g))
    np.testing.assert_array_equal(got, hashing.reduce_range(h, g))
    assert int(got.max()) < g
    assert int(reduce_range(np.uint32(h[0]), np.uint64(g))) == int(got[0])


@pytest.mark.parametrize("g", [2, 3, 5, 56, 1000, 2**24, 2**31 + 11])
def test_support_interval_equals_multiply_shift(g: int) -> None:
    """``reduce_range(h, g) == y`` iff ``h - lo <= width`` (mod 2**32), checked on
    random hashes and on each interval's ends and their neighbours."""
    rng = np.random.default_rng([4, g])
    ys = np.unique(np.concatenate([[0, g - 1, g // 2], rng.integers(0, g, size=20)])).astype(np.uint32)
    h_random = rng.integers(0, 2**32, size=4000, dtype=np.uint32)
    for y in ys:
        lo, width = support_interval(np.uint32(y), np.uint64(g))
        ends = np.array([int(lo) + k for k in (-1, 0, 1)] + [int(lo) + int(width) + k for k in (-1, 0, 1)])
        h = np.concatenate([h_random, (ends % 2**32).astype(np.uint32)])
        in_interval = (h - np.uint32(lo)) <= np.uint32(width)
        np.testing.assert_array_equal(in_interval, hashing.reduce_range(h, g) == y)
        # the interval is exactly the bucket: floor(2**32/g) or ceil(2**32/g) values
        assert (2**32) // g <= int(width) + 1 <= -(-(2**32) // g)
