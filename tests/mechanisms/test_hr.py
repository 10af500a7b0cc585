"""Hadamard response, the Walsh–Hadamard transform and the Hadamard helpers.

References are independent of the code under test: an explicit Sylvester
matrix built by Kronecker products, support sets read off its rows, and a
brute-force count of T_x = #{i: y_i ∈ C_x}.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimator.kernels.hadamard import fwht, fwht_inplace
from estimator.oracles import accumulator_for
from ldp_core.errors import DomainError, FrameError, SpecError
from ldp_core.hadamard import hadamard_bit, hadamard_entry, lowest_set_bit, parity
from ldp_core.mechanisms import make_spec
from ldp_core.mechanisms.hr import HRSpec
from ldp_core.wire.frames import ReportBatch, decode_frame, encode_frame


def sylvester(size: int) -> np.ndarray:
    h = np.array([[1]], dtype=np.int64)
    while h.shape[0] < size:
        h = np.kron(np.array([[1, 1], [1, -1]], dtype=np.int64), h)
    return h


# -- Hadamard helpers and the transform ---------------------------------------


def test_hadamard_entries_match_sylvester_matrix() -> None:
    h = sylvester(64)
    i, j = np.meshgrid(np.arange(64), np.arange(64), indexing="ij")
    np.testing.assert_array_equal(hadamard_entry(i, j), h)
    np.testing.assert_array_equal(hadamard_bit(i, j), (h < 0).astype(np.uint8))


def test_parity_and_lowest_bit_on_random_words() -> None:
    x = np.random.default_rng(0).integers(0, 2**32, size=5000, dtype=np.uint64)
    expected = np.array([bin(int(v)).count("1") % 2 for v in x], dtype=np.uint8)
    np.testing.assert_array_equal(parity(x), expected)
    low = np.array([int(v) & -int(v) for v in x], dtype=np.uint64)
    np.testing.assert_array_equal(lowest_set_bit(x).astype(np.uint64), low)


@pytest.mark.parametrize("size", [1, 2, 8, 256])
def test_fwht_equals_matrix_product(size: int) -> None:
    rng = np.random.default_rng(size)
    ints = rng.integers(-1000, 1000, size=(5, size))
    floats = rng.standard_normal((3, size))
    h = sylvester(size)
    out = fwht(ints)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, ints @ h)
    np.testing.assert_allclose(fwht(floats), floats @ h, rtol=1e-12, atol=1e-9)
    np.testing.assert_array_equal(fwht(ints[0]), ints[0] @ h)
    np.testing.assert_array_equal(fwht(fwht(ints)), size * ints)
    buf = ints.astype(np.int64, copy=True)
    assert fwht_inplace(buf) is buf
    np.testing.assert_array_equal(buf, ints @ h)


def test_fwht_refuses_other_lengths() -> None:
    with pytest.raises(ValueError, match="power-of-two"):
        fwht(np.ones(12))
    with pytest.raises(ValueError, match="contiguous"):
        fwht_inplace(np.ones((4, 8))[:, ::2])


# -- spec and encoder -------------------------------------------------------------


@pytest.mark.parametrize("d,k", [(2, 4), (3, 4), (4, 8), (1023, 1024), (1024, 2048), (1025, 2048)])
def test_output_size_is_next_power_of_two_above_d(d: int, k: int) -> None:
    assert HRSpec(epsilon=1.0, domain_size=d).output_size == k


def test_spec_defaults_and_limits() -> None:
    spec = make_spec("hr", epsilon=2.0, domain_size=1024)
    assert spec.record_dtype.itemsize == 2 and spec.support_probabilities() == (spec.p, 0.5)
    assert make_spec("hr", epsilon=1.0, domain_size=200).record_dtype.itemsize == 1
    with pytest.raises(SpecError, match="outputs exceed"):
        HRSpec(epsilon=1.0, domain_size=1 << 26)
    with pytest.raises(SpecError, match="variant"):
        HRSpec(epsilon=1.0, domain_size=10, variant="fancy")
    with pytest.raises(SpecError, match="pure protocol"):
        HRSpec(epsilon=4.0, domain_size=10, variant="blocks").support_probabilities()
    with pytest.raises(DomainError):
        spec.encode([1024], np.random.default_rng(0))


def test_support_sets_are_halves_from_rows_x_plus_1() -> None:
    spec = HRSpec(epsilon=1.0, domain_size=20)
    h = sylvester(32)
    np.testing.assert_array_equal(spec.support_sets(np.arange(20)), h[1:21] == 1)
    assert np.all(spec.support_sets(np.arange(20)).sum(axis=1) == 16)


def test_output_distribution_is_exactly_two_levels() -> None:
    """For one input x, y has probability 2p/K on C_x and 2(1-p)/K elsewhere.
    With N draws, each of the K cells is within 5 binomial sd of its expectation
    (Bonferroni over 16 cells)."""
    spec = HRSpec(epsilon=1.3, domain_size=9)
    k, n, x = 16, 400_000, 5
    rng = np.random.default_rng(1)
    y = spec.encode(np.full(n, x), rng)["y"]
    counts = np.bincount(y, minlength=k)
    inside = sylvester(k)[x + 1] == 1
    prob = np.where(inside, 2 * spec.p / k, 2 * (1 - spec.p) / k)
    assert np.all(np.abs(counts - n * prob) < 5 * np.sqrt(n * prob * (1 - prob))), counts / n / prob


def test_large_epsilon_lands_in_the_support_set() -> None:
    spec = HRSpec(epsilon=30.0, domain_size=300)
    rng = np.random.default_rng(2)
    values = rng.integers(0, 300, size=5000)
    y = spec.encode(values, rng)["y"].astype(np.int64)
    assert np.all(sylvester(512)[values + 1, y] == 1)


# -- server ---------------------------------------------------------------------


def test_support_counts_match_brute_force_and_merge_equals_one_pass() -> None:
    spec = HRSpec(epsilon=1.0, domain_size=50)
    rng = np.random.default_rng(3)
    rec = spec.encode(rng.integers(0, 50, size=7001), rng)
    whole = accumulator_for(spec)
    whole.update(rec)
    member = sylvester(64)[1:51] == 1
    brute = member[:, rec["y"].astype(np.int64)].sum(axis=1)
    np.testing.assert_array_equal(whole.support_counts(), brute)
    p = math.e / (1 + math.e)
    np.testing.assert_allclose(whole.estimate().counts, (brute - rec.size / 2) / (p - 0.5), rtol=1e-12)
    parts = [accumulator_for(spec) for _ in range(3)]
    for part, chunk in zip(parts, np.array_split(rec, 3)):
        part.update(chunk)
    merged = parts[0].merge(parts[1]).merge(parts[2])
    np.testing.assert_array_equal(merged.sums["hist"], whole.sums["hist"])
    np.testing.assert_array_equal(merged.estimate().counts, whole.estimate().counts)
    restored = type(whole).from_state(spec, whole.state())
    np.testing.assert_array_equal(restored.estimate().counts, whole.estimate().counts)


@pytest.mark.parametrize("eps,d", [(0.7, 12), (4.0, 100)])
def test_unbiased_with_pure_protocol_variance(eps: float, d: int) -> None:
    """T = 600 trials of n = 3000 Zipf(1.1) users. Per item, the trial mean of
    n̂_x - n_x has sd sqrt(V_x/T), V_x = [n_x p(1-p) + (n-n_x)/4]/(p-1/2)²;
    tolerance 5 sd (Bonferroni over ≤ 100 items). The estimate is a sum of n
    bounded independent terms, close to normal, so s²/V_x has sd sqrt(2/(T-1))
    = 0.058; tolerance 5 sd, so a variance off by 30 % fails (the generic
    statistical suite checks it more tightly). A wrong debiasing constant
    (e.g. 2p-1 for p-1/2) scales estimates by 2 and fails the mean check."""
    spec = HRSpec(epsilon=eps, domain_size=d)
    w = 1.0 / np.arange(1, d + 1) ** 1.1
    true = np.floor(3000 * w / w.sum()).astype(np.int64)
    values = np.repeat(np.arange(d), true)
    rng = np.random.default_rng(4)
    trials = 600
    est = np.empty((trials, d))
    for t in range(trials):
        acc = accumulator_for(spec)
        acc.update(spec.encode(values, rng))
        est[t] = acc.estimate().counts
    var = spec.count_variance(true)
    p = math.exp(eps) / (1 + math.exp(eps))
    n = true.sum()
    np.testing.assert_allclose(var, (true * p * (1 - p) + (n - true) / 4) / (p - 0.5) ** 2)
    err = est - true
    assert np.all(np.abs(err.mean(axis=0)) < 5 * np.sqrt(var / trials))
    ratio = err.var(axis=0, ddof=1) / var
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(2 / (trials - 1))), ratio


def test_decode_refuses_outputs_outside_k() -> None:
    spec = HRSpec(epsilon=1.0, domain_size=100)
    rec = spec.encode(np.arange(100), np.random.default_rng(5))
    np.testing.assert_array_equal(decode_frame(encode_frame(ReportBatch("m.y", spec, 1, rec)), spec).records, rec)
    rec = rec.copy()
    rec["y"][7] = 128
    with pytest.raises(FrameError, match="y=128"):
        decode_frame(encode_frame(ReportBatch("m.y", spec, 1, rec)), spec)


# -- block version ------------------------------------------------------------------


@pytest.mark.parametrize(
    "eps,d,blocks,size",
    [(0.5, 10, 1, 16), (2.0, 1024, 4, 512), (4.0, 100, 32, 8), (3.0, 10, 16, 2), (8.0, 1000, 1024, 2)],
)
def test_block_layout(eps: float, d: int, blocks: int, size: int) -> None:
    """B is the largest power of two below min(e^ε, 2d); b the smallest power of two above ⌈d/B⌉."""
    spec = HRSpec(epsilon=eps, domain_size=d, variant="blocks")
    assert (spec.num_blocks, spec.block_size) == (blocks, size)
    assert blocks < min(math.exp(eps), 2 * d) <= 2 * blocks
    assert size > -(-d // blocks) >= size // 2
    member = spec.support_sets(np.arange(d))
    assert np.all(member.sum(axis=1) == size // 2)


def test_block_version_with_one_block_is_the_basic_version() -> None:
    basic = HRSpec(epsilon=0.6, domain_size=40)
    blocks = HRSpec(epsilon=0.6, domain_size=40, variant="blocks")
    assert blocks.num_blocks == 1 and blocks.output_size == basic.output_size
    assert blocks.gain == pytest.approx(2 * basic.p - 1)
    true = np.arange(40)
    np.testing.assert_allclose(blocks.count_variance(true), basic.count_variance(true))


@pytest.mark.parametrize("eps,d,x", [(4.0, 100, 13), (3.0, 10, 4), (2.5, 37, 36)])
def test_block_output_distribution_is_two_levels(eps: float, d: int, x: int) -> None:
    """Each output has probability e^ε p₀ in C_x and p₀ elsewhere, p₀ = 1/((b/2)e^ε + K - b/2).
    Every cell is within 5 binomial sd of N times its probability: over at most 256 cells a
    correct encoder fails with probability below 256 · 5.7e-7 ≈ 1.5e-4 (normal approximation)."""
    spec = HRSpec(epsilon=eps, domain_size=d, variant="blocks")
    n, k, b = 400_000, spec.output_size, spec.block_size
    y = spec.encode(np.full(n, x), np.random.default_rng(6))["y"]
    counts = np.bincount(y, minlength=k)
    p0 = 1 / (b / 2 * math.exp(eps) + k - b / 2)
    prob = np.where(spec.support_sets([x])[0], math.exp(eps) * p0, p0)
    assert prob.sum() == pytest.approx(1.0)
    assert np.all(np.abs(counts - n * prob) < 5 * np.sqrt(n * prob * (1 - prob))), counts / n / prob


def test_block_estimate_matches_brute_force() -> None:
    """n̂_x = (T_x - (N_β - T_x)) / g with T_x and N_β counted directly."""
    spec = HRSpec(epsilon=4.0, domain_size=100, variant="blocks")
    rng = np.random.default_rng(7)
    rec = spec.encode(rng.integers(0, 100, size=5000), rng)
    acc = accumulator_for(spec)
    acc.update(rec)
    y = rec["y"].astype(np.int64)
    t = spec.support_sets(np.arange(100))[:, y].sum(axis=1)
    n_block = np.bincount(y // spec.block_size, minlength=spec.num_blocks)[np.arange(100) // (spec.block_size - 1)]
    np.testing.assert_array_equal(acc.support_counts(), t)
    np.testing.assert_allclose(acc.estimate().counts, (2 * t - n_block) / spec.gain, rtol=1e-12)


@pytest.mark.parametrize("eps,d", [(4.0, 100), (3.0, 10)])
def test_block_version_unbiased_with_its_variance(eps: float, d: int) -> None:
    """As the basic test above (T = 600 trials, tolerances 5 sd for means and for s²/V),
    with V from the block formula [n_β a + (n - n_β)c - n_x g²]/g²."""
    spec = HRSpec(epsilon=eps, domain_size=d, variant="blocks")
    w = 1.0 / np.arange(1, d + 1) ** 1.1
    true = np.floor(3000 * w / w.sum()).astype(np.int64)
    values = np.repeat(np.arange(d), true)
    rng = np.random.default_rng(8)
    trials = 600
    est = np.empty((trials, d))
    for t in range(trials):
        acc = accumulator_for(spec)
        acc.update(spec.encode(values, rng))
        est[t] = acc.estimate().counts
    var = spec.count_variance(true)
    err = est - true
    assert np.all(np.abs(err.mean(axis=0)) < 5 * np.sqrt(var / trials))
    ratio = err.var(axis=0, ddof=1) / var
    assert np.all(np.abs(ratio - 1) < 5 * math.sqrt(2 / (trials - 1))), ratio
