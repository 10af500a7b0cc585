"""Optimal Local Hashing: spec, encoder, support-count kernel, accumulator.

Probabilities used below come from Wang et al., USENIX Security 2017,
Sec. 4.4: g = round(e^ε) + 1 by default, p = e^ε / (e^ε + g - 1), q* = 1/g.
"""

from __future__ import annotations

import math
import subprocess
import sys
from statistics import NormalDist

import numba
import numpy as np
import pytest

from estimator.kernels.olh import ITEM_CHUNK, TILE, olh_support_counts
from estimator.oracles import accumulator_for
from estimator.oracles.olh import OLHAccumulator
from ldp_core.errors import FrameError, SpecError, SpecMismatchError
from ldp_core.hashing import hash_to_range
from ldp_core.mechanisms import make_spec, spec_from_dict
from ldp_core.mechanisms.olh import MAX_G, OLHSpec
from ldp_core.wire.frames import ReportBatch, decode_frame, encode_frame


def paper_p(epsilon: float, g: int) -> float:
    e = math.exp(epsilon)
    return e / (e + g - 1)


# -- spec ---------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0, 4.0, 8.0])
def test_default_g_is_normalized(epsilon: float) -> None:
    g = int(round(math.exp(epsilon))) + 1
    implicit = make_spec("olh", epsilon=epsilon, domain_size=100)
    explicit = OLHSpec(epsilon=epsilon, domain_size=100, g=g)
    assert implicit.g == g
    assert implicit == explicit and implicit.spec_id == explicit.spec_id
    assert spec_from_dict(implicit.to_dict()).spec_id == implicit.spec_id
    assert OLHSpec(epsilon=epsilon, domain_size=100, g=g + 1).spec_id != implicit.spec_id


def test_default_g_is_capped() -> None:
    assert OLHSpec(epsilon=20.0, domain_size=10).g == MAX_G
    assert OLHSpec(epsilon=30.0, domain_size=10).g == MAX_G


@pytest.mark.parametrize("bad", [1, 0, -3, 2.5, "4", True, MAX_G + 1])
def test_invalid_g_is_refused(bad: object) -> None:
    with pytest.raises(SpecError, match="g must be"):
        OLHSpec(epsilon=1.0, domain_size=10, g=bad)  # type: ignore[arg-type]


def test_probabilities_layout_and_variance() -> None:
    spec = OLHSpec(epsilon=1.5, domain_size=40, g=6)
    p = paper_p(1.5, 6)
    assert spec.support_probabilities() == pytest.approx((p, 1 / 6), rel=1e-15)
    assert p / spec.q == pytest.approx(math.exp(1.5))
    assert spec.record_dtype.names == ("seed", "y")
    assert spec.record_dtype["seed"] == np.dtype("<u4")
    assert spec.record_dtype["y"].itemsize == 1
    assert OLHSpec(epsilon=1.0, domain_size=4, g=300).record_dtype["y"].itemsize == 2
    assert OLHSpec(epsilon=1.0, domain_size=4, g=70_000).record_dtype["y"].itemsize == 4
    assert spec.record_bounds() == {"y": 6}
    counts = np.array([0, 5, 100, 895] + [0] * 36)
    n = counts.sum()
    q = 1 / 6
    expected = (counts * p * (1 - p) + (n - counts) * q * (1 - q)) / (p - q) ** 2
    np.testing.assert_allclose(spec.count_variance(counts), expected, rtol=1e-12)


def test_client_import_does_not_load_numba() -> None:
    code = "import sys, ldp_core.mechanisms.olh; assert 'numba' not in sys.modules, 'numba imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


# -- encoder ------------------------------------------------------------------


@pytest.mark.parametrize("epsilon,g", [(1.0, None), (3.0, None), (0.5, 2), (2.0, 300)])
def test_encoder_randomized_response_probabilities(epsilon: float, g: int | None) -> None:
    """The reported y equals the hash of the value with probability p and each
    other value of [0, g) with probability (1-p)/(g-1) = 1/(e^ε + g - 1).

    Each frequency over n reports is binomial; it is accepted within
    5 sqrt(π(1-π)/n) (5 standard deviations) of the theoretical π."""
    spec = OLHSpec(epsilon=epsilon, domain_size=50, g=g)
    gg = spec.hash_range
    n = 200_000
    rng = np.random.default_rng([17, int(epsilon * 10), gg])
    values = rng.integers(0, 50, size=n)
    rec = spec.encode(values, rng)
    assert rec.dtype == spec.record_dtype and rec.shape == (n,)
    assert int(rec["y"].max()) < gg
    h = hash_to_range(values, rec["seed"], gg).astype(np.int64)
    offset = (rec["y"].astype(np.int64) - h) % gg
    p = paper_p(epsilon, gg)
    freq0 = float(np.mean(offset == 0))
    assert abs(freq0 - p) <= 5 * math.sqrt(p * (1 - p) / n)
    pi = (1 - p) / (gg - 1)
    for k in range(1, min(gg, 6)):
        fk = float(np.mean(offset == k))
        assert abs(fk - pi) <= 5 * math.sqrt(pi * (1 - pi) / n), (k, fk, pi)
    # a fresh seed per report
    assert np.unique(rec["seed"]).size > 0.99 * n


def test_encoder_reproducible_and_checks_domain() -> None:
    spec = OLHSpec(epsilon=1.0, domain_size=10)
    a = spec.encode(np.arange(10), np.random.default_rng(3))
    b = spec.encode(np.arange(10), np.random.default_rng(3))
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="outside the domain"):
        spec.encode([10], np.random.default_rng(0))


def test_encode_one_distribution() -> None:
    """Scalar path: P[y = H_s(v)] = p, accepted within 5 binomial standard deviations."""
    spec = OLHSpec(epsilon=1.0, domain_size=1000)
    rng = np.random.default_rng(99)
    n = 20_000
    seeds = np.empty(n, dtype=np.uint32)
    ys = np.empty(n, dtype=np.int64)
    for i in range(n):
        r = spec.encode_one(777, rng)
        assert r.dtype == spec.record_dtype and r.shape == (1,)
        seeds[i], ys[i] = r["seed"][0], r["y"][0]
    assert int(ys.max()) < spec.g
    p = spec.p
    freq = float(np.mean(hash_to_range(777, seeds, spec.hash_range) == ys))
    assert abs(freq - p) <= 5 * math.sqrt(p * (1 - p) / n)


# -- kernel -------------------------------------------------------------------


def reference_support(seeds: np.ndarray, ys: np.ndarray, g: int, d: int) -> np.ndarray:
    """C_x = #{i : reduce_range(xxh32(x, seed_i), g) == y_i}, one item at a time in numpy."""
    ys = ys.astype(np.int64)
    return np.array([int(np.sum(hash_to_range(x, seeds, g) == ys)) for x in range(d)], dtype=np.int64)


KERNEL_CASES = [
    (0, 5, 4),
    (1, 1, 2),
    (5, 3000, 4),  # few reports, many items
    (50_000, 3, 2),  # many reports, few items: the reports are split between threads
    (2 * TILE + 17, 2 * ITEM_CHUNK + 5, 3),
    (10_000, 100, 56),
    (7_000, 37, 1000),
    (3_000, 70, 2**24),
]


@pytest.mark.parametrize("n,d,g", KERNEL_CASES)
def test_kernel_equals_reference(n: int, d: int, g: int) -> None:
    rng = np.random.default_rng([n, d, g])
    seeds = rng.integers(0, 2**32, size=n, dtype=np.uint32)
    ys = rng.integers(0, g, size=n).astype(np.uint32 if g > 65536 else np.uint16)
    expected = reference_support(seeds, ys, g, d)
    threads_before = numba.get_num_threads()
    try:
        for threads in sorted({1, min(2, numba.config.NUMBA_NUM_THREADS)}):
            numba.set_num_threads(threads)
            np.testing.assert_array_equal(olh_support_counts(seeds, ys, g, d), expected)
    finally:
        numba.set_num_threads(threads_before)
    out = np.full(d, 7, dtype=np.int64)
    olh_support_counts(seeds, ys, g, d, out=out)
    np.testing.assert_array_equal(out, expected + 7)


def test_kernel_on_encoded_reports() -> None:
    """On real reports the support counts carry the signal (item 0 is held by half the users)."""
    spec = OLHSpec(epsilon=2.0, domain_size=200)
    rng = np.random.default_rng(8)
    values = np.where(rng.random(20_000) < 0.5, 0, rng.integers(0, 200, size=20_000))
    rec = spec.encode(values, rng)
    got = olh_support_counts(rec["seed"], rec["y"], spec.hash_range, spec.domain_size)
    np.testing.assert_array_equal(got, reference_support(rec["seed"], rec["y"], spec.hash_range, spec.domain_size))
    assert got[0] == got.max()


# -- accumulator ----------------------------------------------------------------


def test_merge_equals_one_pass() -> None:
    spec = OLHSpec(epsilon=1.0, domain_size=300)
    rng = np.random.default_rng(21)
    rec = spec.encode(rng.integers(0, 300, size=30_000), rng)
    whole = accumulator_for(spec)
    assert isinstance(whole, OLHAccumulator)
    whole.update(rec)
    parts = [OLHAccumulator(spec) for _ in range(3)]
    for acc, chunk in zip(parts, np.array_split(rec, [7_001, 7_002])):
        acc.update(ReportBatch("m", spec, 1, chunk))
    merged = parts[0].merge(parts[1]).merge(parts[2])
    assert merged.n == whole.n == 30_000
    np.testing.assert_array_equal(merged.sums["support"], whole.sums["support"])
    np.testing.assert_array_equal(merged.estimate().counts, whole.estimate().counts)
    restored = OLHAccumulator.from_state(spec, merged.state())
    np.testing.assert_array_equal(restored.sums["support"], whole.sums["support"])
    with pytest.raises(SpecMismatchError):
        whole.merge(OLHAccumulator(OLHSpec(epsilon=1.0, domain_size=300, g=5)))


def test_estimates_unbiased_and_wrong_q_detected() -> None:
    """Seeded check of E[ĉ_x] = c_x.

    Over T trials of n users with fixed counts c, the mean estimate of item x
    has standard deviation sqrt(V_x / T), with V_x = [c_x p(1-p) + (n - c_x)
    q*(1-q*)] / (p - q*)^2 (Wang et al. 2017, Sec. 3). Every item must satisfy
    |mean - c_x| <= z sqrt(V_x / T) with z = Φ⁻¹(1 - α/(2d)), α = 1e-4
    (Bonferroni over the d items). Power: unbiasing with GRR's q = 1/(e^ε+g-1)
    instead of q* = 1/g shifts the mean estimate of x by
    c_x ((p - q*)/(p - q) - 1) + n (q* - q)/(p - q), 67 to 100 standard
    deviations of the mean here, so the same test must reject it.
    """
    d, n, trials = 16, 4000, 150
    spec = OLHSpec(epsilon=1.0, domain_size=d)
    counts = np.array([1200, 800, 600, 400, 300, 200, 150, 100, 80, 60, 40, 30, 20, 10, 10, 0])
    assert counts.sum() == n
    values = np.repeat(np.arange(d), counts)
    rng = np.random.default_rng(20250101)
    supports = np.empty((trials, d))
    estimates = np.empty((trials, d))
    for t in range(trials):
        acc = OLHAccumulator(spec)
        acc.update(spec.encode(values, rng))
        supports[t] = acc.sums["support"]
        estimates[t] = acc.estimate().counts
    g = spec.hash_range
    p = paper_p(1.0, g)
    sd_mean = np.sqrt(spec.count_variance(counts) / trials)
    z = NormalDist().inv_cdf(1 - 1e-4 / (2 * d))
    assert np.all(np.abs(estimates.mean(axis=0) - counts) <= z * sd_mean)
    wrong_q = 1.0 / (math.exp(1.0) + g - 1)
    wrong = (supports - n * wrong_q) / (p - wrong_q)
    assert np.any(np.abs(wrong.mean(axis=0) - counts) > z * sd_mean)


def test_decode_bounds() -> None:
    """A y outside [0, g) cannot come from the spec: decoding and updating refuse it."""
    spec = OLHSpec(epsilon=1.0, domain_size=20)  # g = 4
    rec = spec.encode(np.arange(20), np.random.default_rng(1))
    frame = encode_frame(ReportBatch("olh_metric", spec, 19000, rec))
    assert decode_frame(frame, spec).records.tobytes() == rec.tobytes()
    bad = rec.copy()
    bad["y"][3] = spec.g
    with pytest.raises(FrameError, match="y=4"):
        spec.check_records(bad)
    with pytest.raises(FrameError):
        decode_frame(encode_frame(ReportBatch("olh_metric", spec, 19000, bad)), spec)
    acc = OLHAccumulator(spec)
    with pytest.raises(FrameError):
        acc.update(bad)
    assert acc.n == 0 and not acc.sums["support"].any()
