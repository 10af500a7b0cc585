"""Count Mean Sketch and Hadamard Count Mean Sketch: specs, encoders, kernels, estimators.

Statistical tests use fixed seeds; each states its tolerance and where it
comes from. References are written independently of the code under test:
hashes through the ``xxhash`` package, sketches through ``np.unpackbits`` and
``np.add.at``, Hadamard products through an explicit Sylvester matrix.
"""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numba
import numpy as np
import pytest
import xxhash

from estimator.kernels.sketch import PARALLEL_MIN_REPORTS, cms_add, cms_add_bytes, hcms_add
from estimator.oracles import accumulator_for
from estimator.oracles.cms import CMSAccumulator, HCMSAccumulator
from ldp_core.bernoulli import bernoulli_words, probability_digits
from ldp_core.errors import DomainError, FrameError, SpecError
from ldp_core.mechanisms import make_spec
from ldp_core.mechanisms.cms import CMSSpec, HCMSSpec
from ldp_core.wire.frames import ReportBatch, decode_frame, decode_json, encode_frame, encode_json


def sylvester(size: int) -> np.ndarray:
    """The Sylvester Hadamard matrix by repeated Kronecker products."""
    h = np.array([[1]], dtype=np.int64)
    while h.shape[0] < size:
        h = np.kron(np.array([[1, 1], [1, -1]], dtype=np.int64), h)
    return h


def reference_positions(spec: CMSSpec | HCMSSpec, items: np.ndarray) -> np.ndarray:
    """h_j(x) from the documented definition, via the xxhash package."""
    seeds = [xxhash.xxh32_intdigest(j.to_bytes(4, "little"), seed=spec.hash_seed) for j in range(spec.num_hashes)]
    out = np.empty((spec.num_hashes, len(items)), dtype=np.int64)
    for j, s in enumerate(seeds):
        for i, x in enumerate(items):
            h = xxhash.xxh32_intdigest(int(x).to_bytes(4, "little"), seed=s)
            out[j, i] = (h * spec.width) >> 32
    return out


def unpacked(spec: CMSSpec, records: np.ndarray) -> np.ndarray:
    """(n, m) 0/1 matrix of the reported sketch rows."""
    return np.unpackbits(records["bits"], axis=1, bitorder="little")[:, : spec.width]


# -- specs -----------------------------------------------------------------


@pytest.mark.parametrize("name", ["cms", "hcms"])
def test_defaults_build_from_epsilon_and_domain(name: str) -> None:
    spec = make_spec(name, epsilon=2.0, domain_size=1024)
    assert (spec.num_hashes, spec.width, spec.hash_seed) == (256, 1024, 0)
    assert make_spec(name, **{k: v for k, v in spec.to_dict().items() if k != "mechanism"}) == spec


@pytest.mark.parametrize(
    "name,params,fragment",
    [
        ("hcms", {"width": 1000}, "power of two"),
        ("cms", {"num_hashes": 0}, "num_hashes"),
        ("cms", {"width": 1}, "width"),
        ("cms", {"num_hashes": 65536, "width": 1024}, "sketch cells"),
        ("cms", {"hash_seed": 2**32}, "hash_seed"),
        ("hcms", {"hash_seed": -1}, "hash_seed"),
        ("cms", {"width": 8.0}, "integer"),
    ],
)
def test_invalid_parameters_are_refused(name: str, params: dict, fragment: str) -> None:
    with pytest.raises(SpecError, match=fragment):
        make_spec(name, epsilon=1.0, domain_size=10, **params)


def test_hash_seed_changes_spec_id_and_positions() -> None:
    a = CMSSpec(epsilon=1.0, domain_size=50, num_hashes=4, width=64, hash_seed=1)
    b = dataclasses.replace(a, hash_seed=2)
    assert a.spec_id != b.spec_id
    assert not np.array_equal(a.hash_positions(np.arange(50)), b.hash_positions(np.arange(50)))


@pytest.mark.parametrize("cls", [CMSSpec, HCMSSpec])
def test_hash_family_matches_documented_definition(cls: type) -> None:
    spec = cls(epsilon=1.0, domain_size=300, num_hashes=5, width=256, hash_seed=123456789)
    items = np.arange(0, 300, 7)
    np.testing.assert_array_equal(spec.hash_positions(items), reference_positions(spec, items))


def test_record_layouts_are_compact() -> None:
    assert CMSSpec(epsilon=1.0, domain_size=8).record_size == 1 + 128
    assert CMSSpec(epsilon=1.0, domain_size=8, num_hashes=300, width=20).record_size == 2 + 3
    assert HCMSSpec(epsilon=1.0, domain_size=8).record_size == 1 + 2 + 1
    assert HCMSSpec(epsilon=1.0, domain_size=8, num_hashes=16, width=256).record_size == 3


# -- encoders --------------------------------------------------------------


def test_cms_without_noise_is_the_one_hot_of_the_hashed_value() -> None:
    """At ε = 30 a flip has probability 1/(1+e^15) ≈ 3.1e-7, so the 2000·100 coordinates
    hold Poisson(0.06) flips: the bit at h_j(x) is set in every report (fails w.p. 6e-4)
    and at most 3 other bits are set in all (fails w.p. < 1e-6)."""
    spec = CMSSpec(epsilon=30.0, domain_size=200, num_hashes=7, width=100, hash_seed=5)
    rng = np.random.default_rng(1)
    values = rng.integers(0, 200, size=2000)
    rec = spec.encode(values, rng)
    bits = unpacked(spec, rec)
    pos = reference_positions(spec, np.arange(200))
    hit = pos[rec["row"], values]
    assert np.all(bits[np.arange(values.size), hit] == 1)
    assert int(bits.sum()) - values.size <= 3
    assert np.all(rec["bits"][:, -1] >> 4 == 0), "padding bits above coordinate 99 must be 0"


def test_cms_flip_rate_and_row_choice() -> None:
    """Each coordinate disagrees with the one-hot w.p. q = 1/(1+e^{ε/2}); rows are uniform.

    Over N = n·m coordinates the disagreement share has sd sqrt(q(1-q)/N); the
    tolerance is 5 sd. Row counts: 5 sd of Binomial(n, 1/k) each."""
    spec = CMSSpec(epsilon=1.5, domain_size=30, num_hashes=8, width=96, hash_seed=9)
    rng = np.random.default_rng(2)
    n = 20_000
    values = rng.integers(0, 30, size=n)
    rec = spec.encode(values, rng)
    onehot = np.zeros((n, spec.width), dtype=np.uint8)
    onehot[np.arange(n), reference_positions(spec, np.arange(30))[rec["row"], values]] = 1
    q = 1 / (1 + math.exp(0.75))
    share = float((unpacked(spec, rec) != onehot).mean())
    assert abs(share - q) < 5 * math.sqrt(q * (1 - q) / (n * spec.width))
    rows = np.bincount(rec["row"], minlength=8)
    assert np.all(np.abs(rows - n / 8) < 5 * math.sqrt(n * (1 / 8) * (7 / 8)))


def test_hcms_without_noise_reports_the_hadamard_coefficient() -> None:
    spec = HCMSSpec(epsilon=30.0, domain_size=100, num_hashes=6, width=64, hash_seed=3)
    rng = np.random.default_rng(3)
    values = rng.integers(0, 100, size=3000)
    rec = spec.encode(values, rng)
    h = sylvester(64)
    pos = reference_positions(spec, np.arange(100))
    coef = h[pos[rec["row"], values], rec["col"]]
    np.testing.assert_array_equal(rec["bit"], (coef < 0).astype(np.uint8))


def test_hcms_flip_rate_and_uniform_row_and_column() -> None:
    """The coefficient is flipped w.p. f = 1/(1+e^ε) (tolerance 5 binomial sd)."""
    spec = HCMSSpec(epsilon=1.0, domain_size=50, num_hashes=4, width=32, hash_seed=4)
    rng = np.random.default_rng(4)
    n = 200_000
    values = rng.integers(0, 50, size=n)
    rec = spec.encode(values, rng)
    pos = reference_positions(spec, np.arange(50))
    truth = (sylvester(32)[pos[rec["row"], values], rec["col"]] < 0).astype(np.uint8)
    f = 1 / (1 + math.e)
    share = float((rec["bit"] != truth).mean())
    assert abs(share - f) < 5 * math.sqrt(f * (1 - f) / n)
    for field, size in (("row", 4), ("col", 32)):
        cnt = np.bincount(rec[field], minlength=size)
        assert np.all(np.abs(cnt - n / size) < 5 * math.sqrt(n / size))


def test_encoders_refuse_values_outside_the_domain() -> None:
    for spec in (CMSSpec(epsilon=1.0, domain_size=10), HCMSSpec(epsilon=1.0, domain_size=10)):
        with pytest.raises(DomainError):
            spec.encode([3, 10], np.random.default_rng(0))


def test_encode_one_gives_one_valid_record() -> None:
    spec = CMSSpec(epsilon=2.0, domain_size=10, num_hashes=4, width=20)
    rec = spec.encode_one(3, np.random.default_rng(0))
    assert rec.shape == (1,) and rec.dtype == spec.record_dtype
    spec.check_records(rec)


# -- biased bits -------------------------------------------------------------


@pytest.mark.parametrize("q", [0.5, 0.25, 1 / (1 + math.e), 0.0123, 1 / (1 + math.exp(15.0))])
def test_bernoulli_words_have_probability_q(q: float) -> None:
    """The share of ones among N bits is within 5 sd = 5 sqrt(q(1-q)/N) of q; pairs of
    neighboring bits are both 1 with probability q² (5 sd of that share)."""
    n_words = 40_000
    bits = np.unpackbits(bernoulli_words(q, n_words, np.random.default_rng(5)).view(np.uint8))
    n = bits.size
    assert abs(bits.mean() - q) <= 5 * math.sqrt(q * (1 - q) / n) + 1e-12
    pairs = bits[0::2] & bits[1::2]
    assert abs(pairs.mean() - q * q) <= 5 * math.sqrt(q * q * (1 - q * q) / pairs.size) + 1e-12


def test_bernoulli_words_with_a_32_bit_generator() -> None:
    """MT19937's raw output has 32 bits; the sampler must not use it as 64."""
    q = 0.3
    bits = np.unpackbits(bernoulli_words(q, 20_000, np.random.Generator(np.random.MT19937(6))).view(np.uint8))
    assert abs(bits.mean() - q) <= 5 * math.sqrt(q * (1 - q) / bits.size)


def test_probability_digits_are_exact() -> None:
    for q in (0.5, 0.375, 1 / (1 + math.e)):
        digits = probability_digits(q)
        assert sum(b * 2.0 ** -(i + 1) for i, b in enumerate(digits)) == q
    assert probability_digits(0.0) == []
    assert np.all(bernoulli_words(0.0, 10, np.random.default_rng(0)) == 0)


# -- kernels against references ------------------------------------------------


@pytest.mark.parametrize("width", [256, 64, 60, 13])
@pytest.mark.parametrize("kernel", [cms_add, cms_add_bytes], ids=["auto", "bytes"])
@pytest.mark.parametrize("step", [1, 3], ids=["contiguous", "strided"])
def test_cms_kernel_matches_unpacked_reference(width: int, kernel: object, step: int) -> None:
    """About 1700 reports per row exercise every flush of both schemes
    (byte lanes every 255 reports, carry-save planes every 63, lanes every 4 of those);
    a strided record view (every third report) must give the same sums."""
    spec = CMSSpec(epsilon=1.0, domain_size=40, num_hashes=3, width=width, hash_seed=1)
    rng = np.random.default_rng(7)
    rec = spec.encode(rng.integers(0, 40, size=15_000), rng)[::step]
    ones = np.zeros((3, width), dtype=np.int64)
    rows = np.zeros(3, dtype=np.int64)
    kernel(rec["row"], rec["bits"], ones, rows)  # type: ignore[operator]
    ref = np.zeros((3, width), dtype=np.int64)
    np.add.at(ref, rec["row"], unpacked(spec, rec).astype(np.int64))
    np.testing.assert_array_equal(ones, ref)
    np.testing.assert_array_equal(rows, np.bincount(rec["row"], minlength=3))


@pytest.mark.parametrize(
    "n",
    [PARALLEL_MIN_REPORTS - 1, PARALLEL_MIN_REPORTS, 2 * PARALLEL_MIN_REPORTS + 7],
    ids=["below", "at", "odd-above"],
)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("step", [1, 3], ids=["contiguous", "strided"])
@pytest.mark.parametrize("k", [1, 7], ids=["one-row", "rows"])
def test_cms_kernel_parallel_path_matches_reference(n: int, threads: int, step: int, k: int) -> None:
    """Batch sizes on both sides of the serial/parallel threshold, odd sizes (parts of
    different lengths, a report left over from the pairs of the one-row path), 1 and 2
    numba threads, contiguous and strided record views, one row (the paired path) and
    several: the counts equal an unpackbits sum. Random bytes in a CMS-like record
    (1-byte row first, so words are unaligned), rows of 128 bits; counts are added to
    nonzero starting values."""
    rng = np.random.default_rng(n + threads)
    rec = np.zeros(step * n, dtype=[("row", "u1"), ("bits", "u1", (16,))])
    rec["row"] = rng.integers(0, k, size=rec.size)
    rec["bits"] = rng.integers(0, 256, size=rec["bits"].shape, dtype=np.uint8)
    view = rec[::step]
    start = rng.integers(0, 1000, size=(k, 128))
    ones = start.copy()
    rows = np.full(k, 5, dtype=np.int64)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        cms_add(view["row"], view["bits"], ones, rows)
    finally:
        numba.set_num_threads(before)
    ref = start.copy()
    np.add.at(ref, view["row"], np.unpackbits(view["bits"], axis=1, bitorder="little").astype(np.int64))
    np.testing.assert_array_equal(ones, ref)
    np.testing.assert_array_equal(rows, 5 + np.bincount(view["row"], minlength=k))


def test_hcms_kernel_matches_reference() -> None:
    spec = HCMSSpec(epsilon=1.0, domain_size=40, num_hashes=5, width=16)
    rng = np.random.default_rng(8)
    rec = spec.encode(rng.integers(0, 40, size=4000), rng)
    signed = np.zeros((5, 16), dtype=np.int64)
    hcms_add(rec["row"], rec["col"], rec["bit"], signed)
    ref = np.zeros((5, 16), dtype=np.int64)
    np.add.at(ref, (rec["row"], rec["col"]), 1 - 2 * rec["bit"].astype(np.int64))
    np.testing.assert_array_equal(signed, ref)


def reference_cms_estimate(spec: CMSSpec, records: np.ndarray) -> np.ndarray:
    """A_server-CMS written out: x̃ = k(c_ε/2 ṽ + 1/2) added to row j, then the count mean."""
    k, m = spec.num_hashes, spec.width
    e = math.exp(spec.epsilon / 2)
    c = (e + 1) / (e - 1)
    v = 2.0 * unpacked(spec, records) - 1.0
    sketch = np.zeros((k, m))
    np.add.at(sketch, records["row"], k * (c / 2 * v + 0.5))
    pos = reference_positions(spec, np.arange(spec.domain_size))
    mean = sketch[np.arange(k)[:, None], pos].mean(axis=0)
    return m / (m - 1) * (mean - records.size / m)


def reference_hcms_estimate(spec: HCMSSpec, records: np.ndarray) -> np.ndarray:
    """A_server-HCMS written out: x̃ = k c_ε w̃ at (j, l), M = M_H H_mᵀ, then the count mean."""
    k, m = spec.num_hashes, spec.width
    c = (math.exp(spec.epsilon) + 1) / (math.exp(spec.epsilon) - 1)
    sketch_h = np.zeros((k, m))
    np.add.at(sketch_h, (records["row"], records["col"]), k * c * (1.0 - 2.0 * records["bit"]))
    sketch = sketch_h @ sylvester(m).T
    pos = reference_positions(spec, np.arange(spec.domain_size))
    mean = sketch[np.arange(k)[:, None], pos].mean(axis=0)
    return m / (m - 1) * (mean - records.size / m)


@pytest.mark.parametrize(
    "spec",
    [
        CMSSpec(epsilon=1.0, domain_size=30, num_hashes=6, width=20, hash_seed=2),
        HCMSSpec(epsilon=1.5, domain_size=30, num_hashes=6, width=32, hash_seed=2),
    ],
    ids=["cms", "hcms"],
)
def test_estimate_matches_the_paper_server_algorithm(spec: CMSSpec | HCMSSpec) -> None:
    rng = np.random.default_rng(9)
    rec = spec.encode(rng.integers(0, 30, size=3000), rng)
    acc = accumulator_for(spec)
    acc.update(rec)
    ref = reference_cms_estimate(spec, rec) if isinstance(spec, CMSSpec) else reference_hcms_estimate(spec, rec)
    np.testing.assert_allclose(acc.estimate().counts, ref, rtol=1e-9, atol=1e-6)


# -- linear state --------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        CMSSpec(epsilon=2.0, domain_size=50, num_hashes=4, width=40, hash_seed=3),
        HCMSSpec(epsilon=2.0, domain_size=50, num_hashes=4, width=64, hash_seed=3),
    ],
    ids=["cms", "hcms"],
)
def test_merge_and_state_equal_one_pass(spec: CMSSpec | HCMSSpec) -> None:
    rng = np.random.default_rng(10)
    rec = spec.encode(rng.integers(0, 50, size=3001), rng)
    whole = accumulator_for(spec)
    whole.update(rec)
    parts = [accumulator_for(spec) for _ in range(3)]
    for part, chunk in zip(parts, np.array_split(rec, 3)):
        part.update(chunk)
    merged = parts[0].merge(parts[1]).merge(parts[2])
    assert merged.n == whole.n == 3001
    for key in whole.sums:
        np.testing.assert_array_equal(merged.sums[key], whole.sums[key])
    np.testing.assert_array_equal(merged.estimate().counts, whole.estimate().counts)
    restored = type(whole).from_state(spec, whole.state())
    np.testing.assert_array_equal(restored.estimate().counts, whole.estimate().counts)


def test_accumulators_refuse_other_specs() -> None:
    a = CMSAccumulator(CMSSpec(epsilon=1.0, domain_size=10, width=16, num_hashes=2))
    b = CMSAccumulator(CMSSpec(epsilon=1.0, domain_size=10, width=16, num_hashes=2, hash_seed=1))
    with pytest.raises(FrameError):
        a.merge(b)
    with pytest.raises(TypeError):
        HCMSAccumulator(CMSSpec(epsilon=1.0, domain_size=10))


# -- statistics ----------------------------------------------------------------


def run_trials(spec: CMSSpec | HCMSSpec, true: np.ndarray, trials: int, seed: int) -> np.ndarray:
    """Estimates (trials, d), each trial under a fresh hash family."""
    values = np.repeat(np.arange(true.size), true)
    rng = np.random.default_rng(seed)
    out = np.empty((trials, true.size))
    for t in range(trials):
        s = dataclasses.replace(spec, hash_seed=(seed * 7919 + t) % 2**32)
        acc = accumulator_for(s)
        acc.update(s.encode(values, rng))
        out[t] = acc.estimate().counts
    return out


@pytest.mark.parametrize(
    "spec",
    [
        CMSSpec(epsilon=3.0, domain_size=8, num_hashes=4, width=8),
        HCMSSpec(epsilon=3.0, domain_size=8, num_hashes=4, width=8),
    ],
    ids=["cms", "hcms"],
)
def test_unbiased_with_exact_variance_including_collisions(spec: CMSSpec | HCMSSpec) -> None:
    """Over T = 1500 trials with fresh hash families, per item d:

    * mean: the trial mean of f̂(d) - n_d has sd sqrt(V_d / T) with V_d =
      count_variance; tolerance 5 sd (Bonferroni over 8 items, p < 1e-5).
    * variance: s² / V_d ≈ 1. Collisions make f̂ far from normal (a few large
      jumps), so the sd of s² is taken from the sample fourth moment,
      sd(s²) ≈ sqrt((μ₄ - s⁴) / T); tolerance 5 sd.

    The spec (m = 8, k = 4, ε = 3, skewed counts) makes the hash-collision terms
    most of V_d, and the test asserts that leaving them out would fail."""
    true = np.array([200, 120, 60, 40, 30, 20, 20, 10])
    trials = 1500
    est = run_trials(spec, true, trials, seed=11)
    var = spec.count_variance(true)
    err = est - true
    assert np.all(np.abs(err.mean(axis=0)) < 5 * np.sqrt(var / trials)), (err.mean(axis=0), np.sqrt(var / trials))
    s2 = err.var(axis=0, ddof=1)
    dev = err - err.mean(axis=0)
    sd_s2 = np.sqrt(((dev**4).mean(axis=0) - s2**2) / trials)
    assert np.all(np.abs(s2 - var) < 5 * sd_s2), (s2 / var, sd_s2 / var)
    no_collisions = noise_only_variance(spec, true)
    assert np.all(no_collisions < 0.6 * var)
    assert np.any(np.abs(s2 - no_collisions) > 5 * sd_s2), "the test could not tell the collision terms apart"


def noise_only_variance(spec: CMSSpec | HCMSSpec, true: np.ndarray) -> np.ndarray:
    """The variance with a collision-free hash (only the privacy noise), for the power check."""
    m, n = spec.width, float(true.sum())
    if isinstance(spec, CMSSpec):
        e = math.exp(spec.epsilon / 2)
        var_a = n * e / (e - 1) ** 2
    else:
        c = (math.exp(spec.epsilon) + 1) / (math.exp(spec.epsilon) - 1)
        var_a = n * c * c - true
    return (m / (m - 1)) ** 2 * var_a


@pytest.mark.parametrize("name", ["cms", "hcms"])
def test_default_spec_unbiased_on_a_large_domain(name: str) -> None:
    """Defaults (k = 256, m = 1024) at d = 1024, n = 20 000 Zipf users, 40 trials:
    the standardized errors z = (f̂ - n_d)/sqrt(V_d) pooled over items and trials have
    mean 0 (sd of the trial means of z̄ at most 1/sqrt(T), tolerance 5/sqrt(T)) and
    mean z² within 1 ± 5 sqrt(2/T) (trial means of z² are independent across trials,
    each with variance at most 2 for correlated normal z)."""
    spec = make_spec(name, epsilon=2.0, domain_size=1024)
    w = 1.0 / np.arange(1, 1025) ** 1.1
    true = np.floor(20_000 * w / w.sum()).astype(np.int64)
    trials = 40
    est = run_trials(spec, true, trials, seed=12)
    z = (est - true) / np.sqrt(spec.count_variance(true))
    assert abs(z.mean()) < 5 / math.sqrt(trials)
    assert abs((z**2).mean() - 1) < 5 * math.sqrt(2 / trials)


# -- decoding ---------------------------------------------------------------------


def test_decode_refuses_rows_columns_bits_and_padding_out_of_range() -> None:
    cms = CMSSpec(epsilon=1.0, domain_size=10, num_hashes=3, width=12)
    hcms = HCMSSpec(epsilon=1.0, domain_size=10, num_hashes=3, width=16)
    rng = np.random.default_rng(13)
    cases = []
    good = cms.encode(np.arange(10), rng)
    bad = good.copy()
    bad["row"][4] = 3
    cases.append((cms, bad, "row"))
    bad = good.copy()
    bad["bits"][2, 1] |= 0x10
    cases.append((cms, bad, "padding"))
    good_h = hcms.encode(np.arange(10), rng)
    for field, value in (("row", 3), ("col", 16), ("bit", 2)):
        bad = good_h.copy()
        bad[field][5] = value
        cases.append((hcms, bad, field))
    for spec, records, fragment in cases:
        frame = encode_frame(ReportBatch("m.x", spec, 20000, records))
        with pytest.raises(FrameError, match=fragment):
            decode_frame(frame, spec)
    for spec, records in ((cms, good), (hcms, good_h)):
        batch = ReportBatch("m.x", spec, 20000, records)
        np.testing.assert_array_equal(decode_frame(encode_frame(batch), spec).records, records)
        np.testing.assert_array_equal(decode_json(encode_json(batch), spec).records, records)


def test_client_side_does_not_import_server_libraries() -> None:
    code = (
        "import sys, ldp_core.mechanisms.cms, ldp_core.mechanisms.hr;"
        "bad = {'numba', 'pandas', 'pyarrow', 'fastapi', 'kafka'} & set(sys.modules);"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name", ["cms", "hcms"])
def test_cached_and_chunked_count_mean_agree(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-spec cached gather and the chunked path compute the same f̂(d)."""
    import estimator.oracles.cms as cms_oracle

    spec = make_spec(name, epsilon=2.0, domain_size=3000, num_hashes=16, width=256)
    sketch = np.random.default_rng(5).normal(size=(16, 256))
    cached = cms_oracle.count_mean(sketch, spec, 1000)
    monkeypatch.setattr(cms_oracle, "_CACHE_ENTRIES", 0)
    monkeypatch.setattr(cms_oracle, "_ITEM_CHUNK", 1000)
    chunked = cms_oracle.count_mean(sketch, spec, 1000)
    np.testing.assert_allclose(cached, chunked, rtol=1e-12, atol=1e-9)
