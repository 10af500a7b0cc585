"""Optimized unary encoding: layout, padding, decoding, constants, a quick
seeded unbiasedness check and merging. (The generic suites in
test_mechanism_statistics.py and test_privacy_audit.py cover its variance,
intervals and privacy through tests/support/profiles/oue.py.)"""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from scipy import stats

from estimator.kernels.sketch import PARALLEL_MIN_REPORTS
from estimator.oracles import accumulator_for
from estimator.oracles.oue import OUEAccumulator
from ldp_core.errors import DomainError, FrameError, SpecError, SpecMismatchError
from ldp_core.mechanisms import make_spec, spec_from_dict
from ldp_core.mechanisms.oue import MAX_OUE_DOMAIN, OUESpec
from ldp_core.wire.frames import ReportBatch, decode_frame, decode_json, encode_frame, encode_json

DAY = 19_500


def unpack(records: np.ndarray, nbits: int) -> np.ndarray:
    return np.unpackbits(records["bits"], axis=1, bitorder="little")[:, :nbits].astype(bool)


def test_registry_defaults_and_round_trip() -> None:
    spec = make_spec("oue", epsilon=2.0, domain_size=1024)
    assert isinstance(spec, OUESpec)
    assert spec.record_dtype.itemsize == 128
    assert spec_from_dict(spec.to_dict()) == spec
    assert spec.p == 0.5
    assert spec.q == pytest.approx(1.0 / (math.e**2 + 1.0), rel=1e-15)


def test_spec_validation() -> None:
    with pytest.raises(SpecError, match="domain_size"):
        OUESpec(epsilon=1.0, domain_size=MAX_OUE_DOMAIN + 1)
    with pytest.raises(SpecError, match="epsilon"):
        OUESpec(epsilon=-1.0, domain_size=8)
    with pytest.raises(DomainError, match="outside the domain"):
        OUESpec(epsilon=1.0, domain_size=8).encode([0, 8], np.random.default_rng(0))


def test_layout_one_bit_per_value_little_endian() -> None:
    """At ε = 25 (q = 1/(e^25+1) ≈ 1.4e-11) the other bits are all 0: the chance that
    any of the 4000 × 20 is 1 is ≈ 1e-6. Bit v is a fair coin: Binomial(4000, 1/2),
    sd 31.6, accepted within 5 sd."""
    spec = OUESpec(epsilon=25.0, domain_size=21)
    rng = np.random.default_rng(11)
    values = rng.integers(0, 21, size=4000)
    rec = spec.encode(values, rng)
    assert rec.dtype == np.dtype([("bits", "u1", (3,))])
    bits = np.unpackbits(rec["bits"], axis=1, bitorder="little").astype(bool)
    assert not bits[:, 21:].any(), "padding bits must be 0"
    rows = np.arange(values.size)
    kept = bits[rows, values]
    others = bits[:, :21].copy()
    others[rows, values] = False
    assert not others.any()
    assert abs(int(kept.sum()) - 2000) < 5 * math.sqrt(4000 * 0.25)


@pytest.mark.parametrize("eps,d", [(0.7, 13), (2.0, 70)])
def test_bit_frequencies(eps: float, d: int) -> None:
    """Every bit other than v is 1 with probability q, bit v with 1/2; each count is
    Binomial(n, ·), accepted within 5 sd (Bonferroni-safe for ≤ 70 bits)."""
    spec = OUESpec(epsilon=eps, domain_size=d)
    n, v = 30_000, d // 3
    bits = unpack(spec.encode(np.full(n, v), np.random.default_rng(5)), d)
    counts = bits.sum(axis=0)
    expect = np.full(d, n * spec.q)
    expect[v] = n * 0.5
    sd = np.sqrt(expect * (1.0 - expect / n))
    assert np.all(np.abs(counts - expect) < 5.0 * sd), (counts - expect) / sd


def test_encoder_is_deterministic_given_the_generator() -> None:
    spec = OUESpec(epsilon=1.0, domain_size=50)
    a = spec.encode(np.arange(50), np.random.default_rng(3))
    b = spec.encode(np.arange(50), np.random.default_rng(3))
    assert np.array_equal(a, b)
    one = spec.encode_one(7, np.random.default_rng(3))
    assert one.shape == (1,) and one.dtype == spec.record_dtype


def test_padding_bits_rejected_on_decode() -> None:
    spec = OUESpec(epsilon=1.0, domain_size=13)  # 2 bytes, bits 13..15 are padding
    rec = spec.encode(np.arange(13), np.random.default_rng(0))
    batch = ReportBatch("app.oue", spec, DAY, rec)
    assert np.array_equal(decode_frame(encode_frame(batch), spec).records, rec)
    assert np.array_equal(decode_json(encode_json(batch), spec).records, rec)
    bad = rec.copy()
    bad["bits"][5, 1] |= np.uint8(1 << 5)  # bit 13
    with pytest.raises(FrameError, match="record 5 sets padding bits above bit 12"):
        decode_frame(encode_frame(ReportBatch("app.oue", spec, DAY, bad)), spec)
    with pytest.raises(FrameError, match="padding"):
        decode_json(encode_json(ReportBatch("app.oue", spec, DAY, bad)), spec)


def test_no_padding_when_domain_fills_the_bytes() -> None:
    spec = OUESpec(epsilon=1.0, domain_size=16)
    rec = np.zeros(2, dtype=spec.record_dtype)
    rec["bits"][:] = 0xFF
    spec.check_records(rec)  # every bit is a real coordinate


def test_decoding_errors() -> None:
    spec = OUESpec(epsilon=1.0, domain_size=20)
    frame = encode_frame(ReportBatch("app.oue", spec, DAY, spec.encode(np.arange(20), np.random.default_rng(0))))
    with pytest.raises(SpecMismatchError):
        decode_frame(frame, OUESpec(epsilon=2.0, domain_size=20))
    with pytest.raises(FrameError, match="truncated"):
        decode_frame(frame[:-7], spec)
    with pytest.raises(FrameError, match="CRC"):
        corrupt = bytearray(frame)
        corrupt[-10] ^= 0x01
        decode_frame(bytes(corrupt), spec)
    with pytest.raises(SpecMismatchError):
        accumulator_for(spec).update(np.zeros(3, dtype=OUESpec(epsilon=1.0, domain_size=30).record_dtype))


def test_variance_is_the_papers() -> None:
    """Wang et al. 2017, Sec. 4.3: for an item nobody holds, Var = 4 n e^ε / (e^ε - 1)^2;
    for an item everybody holds, n p(1-p)/(p-q)^2 = n / (4 (1/2 - q)^2)."""
    for eps in (0.5, 1.0, 3.0):
        spec = OUESpec(epsilon=eps, domain_size=4)
        n = 1000.0
        e = math.exp(eps)
        var = spec.count_variance(np.array([n, 0, 0, 0]))
        assert var[1] == pytest.approx(4 * n * e / (e - 1) ** 2, rel=1e-12)
        assert var[0] == pytest.approx(n / (4 * (0.5 - 1 / (e + 1)) ** 2), rel=1e-12)


@pytest.mark.parametrize("d", [1000, 1024, 61])
def test_accumulator_counts_match_unpacked_bits(d: int) -> None:
    """The kernel's per-bit counts equal a plain unpackbits sum, on arbitrary bytes
    (widths that are and are not whole 64-bit words)."""
    spec = OUESpec(epsilon=1.0, domain_size=d)
    rng = np.random.default_rng(8)
    rec = np.zeros(3001, dtype=spec.record_dtype)
    rec["bits"] = rng.integers(0, 256, size=rec["bits"].shape, dtype=np.uint8)
    if d % 8:
        rec["bits"][:, -1] &= np.uint8((1 << (d % 8)) - 1)
    acc = OUEAccumulator(spec)
    acc.update(rec)
    assert np.array_equal(acc.sums["ones"], unpack(rec, d).sum(axis=0))
    assert acc.n == 3001


@pytest.mark.parametrize("threads", [1, 2])
def test_accumulator_parallel_path_matches_unpacked_bits(threads: int) -> None:
    """A batch above the kernel's serial/parallel threshold (odd size, so the
    per-thread parts differ), d = 1024, 1 and 2 numba threads: counts equal an
    unpackbits sum, and a second update adds to the first."""
    spec = OUESpec(epsilon=2.0, domain_size=1024)
    rng = np.random.default_rng(31 + threads)
    rec = np.zeros(PARALLEL_MIN_REPORTS + 4097, dtype=spec.record_dtype)
    rec["bits"] = rng.integers(0, 256, size=rec["bits"].shape, dtype=np.uint8)
    acc = OUEAccumulator(spec)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        acc.update(rec)
        acc.update(rec[::5])
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(acc.sums["ones"], unpack(rec, 1024).sum(axis=0) + unpack(rec[::5], 1024).sum(axis=0))
    assert acc.n == rec.size + rec[::5].size


def test_merge_equals_one_pass() -> None:
    spec = OUESpec(epsilon=1.5, domain_size=40)
    rng = np.random.default_rng(21)
    rec = spec.encode(rng.integers(0, 40, size=5000), rng)
    whole = accumulator_for(spec)
    whole.update(rec)
    parts = [accumulator_for(spec) for _ in range(3)]
    for part, chunk in zip(parts, np.array_split(rec, 3)):
        part.update(chunk)
    merged = parts[0].merge(parts[1]).merge(parts[2])
    assert merged.n == whole.n
    assert np.array_equal(merged.sums["ones"], whole.sums["ones"])
    assert np.array_equal(merged.estimate().counts, whole.estimate().counts)
    restored = OUEAccumulator.from_state(spec, whole.state())
    assert np.array_equal(restored.estimate().variance, whole.estimate().variance)


def test_quick_unbiasedness_and_variance() -> None:
    """T = 400 trials of n = 2000 users over d = 12 items, ε = 1.5.

    z = (ĉ_v - c_v)/sqrt(V_v) with V_v = count_variance(c)_v. OUE's bit counts are
    independent across items (bits of a report are independent, reports are
    independent), so the T·d values of z are independent with mean 0, variance 1:
    * per item, sqrt(T) |mean z| is |N(0,1)|: reject above Φ⁻¹(1 - 1e-4/(2d)) ≈ 4.3;
    * mean of z² over all T·d = 4800 values is χ²_4800/4800, sd sqrt(2/4800) = 0.020:
      reject outside the two-sided 1e-4 quantiles (±0.08). A variance off by 25 %
      would move it by 0.2."""
    spec = OUESpec(epsilon=1.5, domain_size=12)
    true = np.array([700, 400, 300, 200, 120, 100, 80, 50, 30, 15, 5, 0])
    values = np.repeat(np.arange(12), true)
    var = spec.count_variance(true)
    rng = np.random.default_rng(2024)
    trials = 400
    z = np.empty((trials, 12))
    for t in range(trials):
        acc = accumulator_for(spec)
        acc.update(spec.encode(values, rng))
        z[t] = (acc.estimate().counts - true) / np.sqrt(var)
    assert np.max(np.sqrt(trials) * np.abs(z.mean(axis=0))) < stats.norm.isf(1e-4 / 24)
    dof = z.size
    q = float((z**2).mean())
    assert stats.chi2.ppf(5e-5, dof) / dof < q < stats.chi2.isf(5e-5, dof) / dof
