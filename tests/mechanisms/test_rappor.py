"""RAPPOR: parameters and their privacy bounds, hashing, layout, memoized permanent
randomized response, least-squares decoding and its exact variance, merging.
(The generic suites cover it through tests/support/profiles/rappor.py.)"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import xxhash
from scipy import stats

from estimator.oracles import accumulator_for
from estimator.oracles.rappor import RapporAccumulator
from ldp_core.errors import DomainError, FrameError, SpecError
from ldp_core.mechanisms import make_spec, spec_from_dict
from ldp_core.mechanisms.rappor import RapporSpec
from ldp_core.wire.frames import ReportBatch, decode_frame, decode_json, encode_frame, encode_json

DAY = 19_600
SECRET = bytes(range(32))


def golden_positions(spec: RapporSpec, value: int, cohort: int) -> list[int]:
    """Filter bits from the documented recipe, via the xxhash package:
    seed = XXH32(le32(c·h + i), hash_seed), pos = (XXH32(le32(value), seed) · k) >> 32."""
    out = []
    for i in range(spec.num_hashes):
        seed = xxhash.xxh32_intdigest((cohort * spec.num_hashes + i).to_bytes(4, "little"), seed=spec.hash_seed)
        hv = xxhash.xxh32_intdigest(int(value).to_bytes(4, "little"), seed=seed)
        out.append((hv * spec.num_bits) >> 32)
    return out


def unpack(records: np.ndarray, nbits: int) -> np.ndarray:
    return np.unpackbits(records["bits"], axis=1, bitorder="little")[:, :nbits].astype(bool)


def identifiable(**params: object) -> RapporSpec:
    """The first hash_seed in 0..199 whose design over the whole domain has full rank."""
    for seed in range(200):
        spec = RapporSpec(**params, hash_seed=seed)  # type: ignore[arg-type]
        try:
            spec.design()
        except SpecError:
            continue
        return spec
    raise AssertionError(f"no identifiable hash seed for {params}")


# -- parameters -----------------------------------------------------------------


@pytest.mark.parametrize("d", [2, 3, 50, 256, 5000])
def test_defaults_scale_with_the_domain(d: int) -> None:
    spec = make_spec("rappor", epsilon=2.0, domain_size=d)
    assert isinstance(spec, RapporSpec)
    assert (spec.num_hashes, spec.p, spec.q) == (2, 0.5, 0.75)
    assert spec.num_cohorts * spec.num_bits >= 8 * d
    assert spec_from_dict(spec.to_dict()) == spec
    assert spec.record_dtype == np.dtype([("cohort", "<u2"), ("bits", "u1", ((spec.num_bits + 7) // 8,))])


@pytest.mark.parametrize("d", [2, 3, 50, 256])
def test_default_designs_are_identifiable(d: int) -> None:
    """Least squares over the whole domain works with the default parameters."""
    spec = make_spec("rappor", epsilon=2.0, domain_size=d)
    var = spec.count_variance(np.full(d, 10))
    assert var.shape == (d,) and np.all(var > 0)


@pytest.mark.parametrize("eps,h", [(0.5, 1), (2.0, 2), (8.0, 4)])
def test_permanent_epsilon_defines_f(eps: float, h: int) -> None:
    """ε∞ = 2h ln((1 - f/2)/(f/2)) (Sec. 3.1), checked by enumerating the PRR's
    outputs for two filters with disjoint h-bit supports."""
    spec = RapporSpec(epsilon=eps, domain_size=2, num_bits=2 * h + 1, num_cohorts=1, num_hashes=h)
    f = spec.f
    assert 2 * h * math.log((1 - f / 2) / (f / 2)) == pytest.approx(eps, rel=1e-12)
    k = 2 * h + 1
    bx = np.array([1] * h + [0] * (h + 1))
    bxp = np.array([0] * h + [1] * h + [0])
    worst = 0.0
    for y in itertools.product((0, 1), repeat=k):
        y_arr = np.array(y)

        def prob(b: np.ndarray, y_arr: np.ndarray = y_arr) -> float:
            p1 = np.where(b == 1, 1 - f / 2, f / 2)
            return float(np.prod(np.where(y_arr == 1, p1, 1 - p1)))

        worst = max(worst, math.log(prob(bx) / prob(bxp)))
    assert worst == pytest.approx(spec.epsilon_permanent, rel=1e-9)


@pytest.mark.parametrize("p,q,h", [(0.5, 0.75, 2), (0.25, 0.75, 3), (0.0, 1.0, 1), (0.1, 0.6, 2)])
def test_one_report_epsilon_by_enumeration(p: float, q: float, h: int) -> None:
    """ε1 = max over report bit strings y of ln P[y | B_x]/P[y | B_x'] for disjoint
    h-bit filters, where P[S_j = 1 | B_j] sums the two stages:
    P[PRR = 1 | B = 1] = 1 - f/2, P[PRR = 1 | B = 0] = f/2, P[S = 1 | PRR] = q or p."""
    spec = RapporSpec(epsilon=3.0, domain_size=2, num_bits=2 * h, num_cohorts=1, num_hashes=h, p=p, q=q)
    f = spec.f
    s1 = {b: (1 - f / 2 if b else f / 2) * q + (f / 2 if b else 1 - f / 2) * p for b in (0, 1)}
    bx = [1] * h + [0] * h
    bxp = [0] * h + [1] * h
    worst = 0.0
    for y in itertools.product((0, 1), repeat=2 * h):
        px = math.prod(s1[b] if s else 1 - s1[b] for s, b in zip(y, bx))
        pxp = math.prod(s1[b] if s else 1 - s1[b] for s, b in zip(y, bxp))
        worst = max(worst, math.log(px / pxp))
    assert spec.epsilon_one_report == pytest.approx(worst, rel=1e-9)
    assert spec.epsilon_one_report <= spec.epsilon * (1 + 1e-12)
    assert spec.q_star == pytest.approx(s1[1]) and spec.p_star == pytest.approx(s1[0])


@pytest.mark.parametrize(
    "params,match",
    [
        (dict(p=0.75, q=0.5), "p < q"),
        (dict(p=0.5, q=0.5), "p < q"),
        (dict(p=-0.1), "in \\[0, 1\\]"),
        (dict(q=1.5), "in \\[0, 1\\]"),
        (dict(p="0.5"), "probability"),
        (dict(num_bits=4, num_cohorts=2), "num_cohorts\\*num_bits = 8"),
        (dict(num_bits=4, num_hashes=5), "num_hashes"),
        (dict(num_bits=0), "num_bits"),
        (dict(num_bits=9000), "num_bits"),
        (dict(num_bits=16.0), "integer"),
        (dict(num_cohorts=70_000), "num_cohorts"),
        (dict(hash_seed=-1), "hash_seed"),
    ],
)
def test_invalid_parameters(params: dict, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        RapporSpec(epsilon=1.0, domain_size=10, **params)


def test_rank_deficient_design_is_refused() -> None:
    """One cohort, one hash, k = d: full rank only if the hash permutes the domain."""
    spec = RapporSpec(epsilon=1.0, domain_size=8, num_bits=8, num_cohorts=1, num_hashes=1)
    assert len({golden_positions(spec, v, 0)[0] for v in range(8)}) < 8
    with pytest.raises(SpecError, match="rank-deficient"):
        spec.count_variance(np.ones(8))
    with pytest.raises(SpecError, match="rank-deficient"):
        RapporAccumulator(spec).estimate()


def test_candidate_errors() -> None:
    spec = RapporSpec(epsilon=2.0, domain_size=40)
    with pytest.raises(SpecError, match="lie in"):
        spec.design([0, 40])
    with pytest.raises(SpecError, match="distinct"):
        spec.design([3, 3])
    with pytest.raises(SpecError, match="non-empty"):
        spec.design([])


# -- hashing and layout -----------------------------------------------------------


def test_bloom_positions_follow_the_documented_recipe() -> None:
    spec = RapporSpec(epsilon=2.0, domain_size=1000, num_bits=40, num_cohorts=30, num_hashes=3, hash_seed=77)
    values = np.array([0, 1, 17, 999])
    for c in (0, 5, 29):
        pos = spec.bloom_positions(values, c)
        for v, row in zip(values, pos):
            assert row.tolist() == golden_positions(spec, int(v), c)


def test_reports_carry_the_filter_without_noise() -> None:
    """p = 0, q = 1 and ε∞ = 30 with h = 1 (f/2 = 1/(1+e^15) ≈ 3e-7): the report is the
    Bloom filter of its cohort (about 0.002 expected flips over the 500 × 12 bits)."""
    spec = RapporSpec(epsilon=30.0, domain_size=20, num_bits=12, num_cohorts=5, num_hashes=1, p=0.0, q=1.0)
    rng = np.random.default_rng(4)
    values = rng.integers(0, 20, size=500)
    rec = spec.encode(values, rng)
    assert not np.unpackbits(rec["bits"], axis=1, bitorder="little")[:, 12:].any()
    bits = unpack(rec, 12)
    for v, c, row in zip(values, rec["cohort"], bits):
        expect = np.zeros(12, dtype=bool)
        expect[golden_positions(spec, int(v), int(c))] = True
        assert np.array_equal(row, expect)
    counts = np.bincount(rec["cohort"], minlength=5)
    assert stats.chisquare(counts).pvalue > 1e-4


def test_batch_reports_have_the_two_stage_bit_probabilities() -> None:
    """A fresh PRR then an IRR: given the filter, bits are independent, 1 w.p.
    q* = (1 - f/2) q + (f/2) p on filter bits and p* = (f/2) q + (1 - f/2) p elsewhere
    (Sec. 4). Per cohort and bit, counts are Binomial; accepted within 5 sd."""
    spec = RapporSpec(epsilon=3.0, domain_size=20, num_bits=24, num_cohorts=2, p=0.25, q=0.75)
    f, p, q = spec.f, spec.p, spec.q
    q_star = (1 - f / 2) * q + (f / 2) * p
    p_star = (f / 2) * q + (1 - f / 2) * p
    rec = spec.encode(np.full(40_000, 9), np.random.default_rng(13))
    bits = unpack(rec, 24)
    for c in range(2):
        rows = bits[rec["cohort"] == c]
        filt = np.zeros(24, dtype=bool)
        filt[golden_positions(spec, 9, c)] = True
        prob = np.where(filt, q_star, p_star)
        n = rows.shape[0]
        assert np.all(np.abs(rows.sum(axis=0) - n * prob) < 5 * np.sqrt(n * prob * (1 - prob)))


def test_decode_rejects_padding_and_cohort() -> None:
    spec = RapporSpec(epsilon=2.0, domain_size=20, num_bits=12, num_cohorts=3)
    rec = spec.encode(np.arange(20), np.random.default_rng(0))
    batch = ReportBatch("app.rappor", spec, DAY, rec)
    assert np.array_equal(decode_frame(encode_frame(batch), spec).records, rec)
    assert np.array_equal(decode_json(encode_json(batch), spec).records, rec)
    bad = rec.copy()
    bad["bits"][2, 1] |= np.uint8(1 << 6)  # bit 14 of a 12-bit filter
    with pytest.raises(FrameError, match="padding bits above bit 11"):
        decode_frame(encode_frame(ReportBatch("app.rappor", spec, DAY, bad)), spec)
    bad = rec.copy()
    bad["cohort"][7] = 3
    with pytest.raises(FrameError, match="cohort=3"):
        decode_frame(encode_frame(ReportBatch("app.rappor", spec, DAY, bad)), spec)


# -- memoized permanent randomized response ----------------------------------------


def test_permanent_bits_are_memoized_across_calls_and_days() -> None:
    """Without IRR (p = 0, q = 1) a report *is* the permanent response: every report
    of one value on every day is identical, and equals permanent_bits."""
    spec = RapporSpec(epsilon=2.0, domain_size=30, num_bits=64, num_cohorts=4, p=0.0, q=1.0)
    cohort = spec.cohort_of(SECRET)
    for v in (0, 7, 29):
        prr = spec.permanent_bits(v, SECRET)
        assert prr.shape == (8,) and prr.dtype == np.uint8
        for day in range(5):
            rec = spec.encode_memoized(np.full(20, v), SECRET, np.random.default_rng(day))
            assert np.all(rec["cohort"] == cohort)
            assert np.all(rec["bits"] == prr)
        assert all(np.array_equal(spec.permanent_bits(v, SECRET), prr) for _ in range(50))
    mixed = spec.encode_memoized(np.array([7, 0, 7, 29]), SECRET, np.random.default_rng(9))
    assert np.array_equal(mixed["bits"][0], spec.permanent_bits(7, SECRET))
    assert np.array_equal(mixed["bits"][3], spec.permanent_bits(29, SECRET))


def test_permanent_bits_differ_between_values_secrets_and_specs() -> None:
    spec = RapporSpec(epsilon=2.0, domain_size=30, num_bits=64, num_cohorts=4)
    prrs = {spec.permanent_bits(v, SECRET).tobytes() for v in range(30)}
    assert len(prrs) == 30
    other = bytes(range(1, 33))
    assert spec.permanent_bits(5, other).tobytes() != spec.permanent_bits(5, SECRET).tobytes()
    respec = RapporSpec(epsilon=2.5, domain_size=30, num_bits=64, num_cohorts=4)
    assert respec.permanent_bits(5, SECRET).tobytes() != spec.permanent_bits(5, SECRET).tobytes()


def test_permanent_bits_have_the_prr_distribution() -> None:
    """Over 3000 device secrets, a filter bit of the PRR is 1 w.p. 1 - f/2 and any other
    bit w.p. f/2 (Sec. 3, step 2). Counts are Binomial; accepted within 5 sd."""
    spec = RapporSpec(epsilon=3.0, domain_size=20, num_bits=32, num_cohorts=4)
    on = on_total = off = off_total = 0
    for s in range(3000):
        secret = s.to_bytes(4, "little") * 8
        bits = np.unpackbits(spec.permanent_bits(11, secret), bitorder="little").astype(bool)
        filt = np.zeros(32, dtype=bool)
        filt[golden_positions(spec, 11, spec.cohort_of(secret))] = True
        on += int(bits[filt].sum())
        on_total += int(filt.sum())
        off += int(bits[~filt].sum())
        off_total += int((~filt).sum())
    half = spec.f / 2
    for k, n, prob in ((on, on_total, 1 - half), (off, off_total, half)):
        assert abs(k - n * prob) < 5 * math.sqrt(n * prob * (1 - prob)), (k, n, prob)


def test_cohorts_from_secrets_are_uniform() -> None:
    """χ² goodness of fit of 4000 secrets' cohorts to uniform on 6 cohorts."""
    spec = RapporSpec(epsilon=2.0, domain_size=20, num_bits=16, num_cohorts=6)
    cohorts = [spec.cohort_of(s.to_bytes(2, "little") * 16) for s in range(4000)]
    counts = np.bincount(cohorts, minlength=6)
    assert stats.chisquare(counts).pvalue > 1e-5


def test_memoized_reports_draw_fresh_irr() -> None:
    """Reports of one device and value: bit j is 1 w.p. q where its PRR bit is 1 and p
    where it is 0, independently per report. 20000 reports; Binomial counts within 5 sd."""
    spec = RapporSpec(epsilon=2.0, domain_size=20, num_bits=32, num_cohorts=4, p=0.25, q=0.75)
    prr = np.unpackbits(spec.permanent_bits(3, SECRET), bitorder="little").astype(bool)
    n = 20_000
    counts = unpack(spec.encode_memoized(np.full(n, 3), SECRET, np.random.default_rng(1)), 32).sum(axis=0)
    prob = np.where(prr, spec.q, spec.p)
    assert np.all(np.abs(counts - n * prob) < 5 * np.sqrt(n * prob * (1 - prob)))


def test_secret_is_checked() -> None:
    spec = RapporSpec(epsilon=2.0, domain_size=20)
    with pytest.raises(DomainError, match="at least 16"):
        spec.permanent_bits(1, b"short")
    with pytest.raises(DomainError, match="bytes"):
        spec.cohort_of("not bytes")  # type: ignore[arg-type]
    with pytest.raises(DomainError, match="outside the domain"):
        spec.encode_memoized([20], SECRET, np.random.default_rng(0))


# -- decoding ---------------------------------------------------------------------


def test_least_squares_matches_a_dense_solver() -> None:
    """design.counts equals m · argmin ||X β - t||² computed by numpy's lstsq on a design
    matrix built from the golden positions."""
    spec = RapporSpec(epsilon=2.0, domain_size=25, num_bits=16, num_cohorts=4, num_hashes=2)
    rng = np.random.default_rng(6)
    acc = RapporAccumulator(spec)
    acc.update(spec.encode(rng.integers(0, 25, size=3000), rng))
    m, k = spec.num_cohorts, spec.num_bits
    x = np.zeros((m * k, 25))
    for c in range(m):
        for v in range(25):
            x[c * k + np.array(golden_positions(spec, v, c)), v] = 1.0
    t = (acc.sums["ones"] - spec.p_star * acc.sums["cohort_counts"][:, None]) / (spec.q_star - spec.p_star)
    beta = np.linalg.lstsq(x, t.reshape(-1), rcond=None)[0]
    assert np.allclose(acc.estimate().counts, m * beta, rtol=1e-9, atol=1e-6)


def exact_moments(spec: RapporSpec, candidates: np.ndarray | None, values: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Exact mean and variance of the least-squares estimate by enumeration.

    The estimate is linear in the reports, so it is a sum of independent per-user
    terms; each user's term takes m · 2^k values: cohort c with probability 1/m and
    report bits y with probability Π_j s_j^{y_j} (1 - s_j)^{1 - y_j}, s_j = q* on the
    user's filter bits in c and p* elsewhere."""
    design = spec.design(candidates)
    m, k = spec.num_cohorts, spec.num_bits
    patterns = ((np.arange(2**k)[:, None] >> np.arange(k)) & 1).astype(np.int64)
    mean = np.zeros(design.candidates.size)
    var = np.zeros(design.candidates.size)
    for v in values:
        terms, probs = [], []
        for c in range(m):
            filt = np.zeros(k, dtype=bool)
            filt[golden_positions(spec, v, c)] = True
            s = np.where(filt, spec.q_star, spec.p_star)
            cohort_counts = np.zeros(m, dtype=np.int64)
            cohort_counts[c] = 1
            for y in patterns:
                ones = np.zeros((m, k), dtype=np.int64)
                ones[c] = y
                terms.append(design.counts(ones, cohort_counts))
                probs.append(float(np.prod(np.where(y == 1, s, 1 - s))) / m)
        t, pr = np.array(terms), np.array(probs)
        assert pr.sum() == pytest.approx(1.0)
        mu = pr @ t
        mean += mu
        var += pr @ (t - mu) ** 2
    return mean, var


@pytest.mark.parametrize(
    "params,values",
    [
        (dict(epsilon=2.0, domain_size=3, num_bits=4, num_cohorts=2, num_hashes=2), [0, 0, 0, 1, 2, 2]),
        (dict(epsilon=1.0, domain_size=4, num_bits=3, num_cohorts=3, num_hashes=1, p=0.0, q=1.0), [0, 1, 1, 3]),
        (dict(epsilon=3.0, domain_size=5, num_bits=5, num_cohorts=2, num_hashes=3, p=0.2, q=0.9), [4, 4, 2, 0, 1, 4]),
    ],
)
def test_estimate_is_unbiased_with_the_stated_variance_exactly(params: dict, values: list[int]) -> None:
    """Enumeration (exact_moments) against the truth and against count_variance."""
    spec = identifiable(**params)
    true = np.bincount(values, minlength=spec.domain_size)
    mean, var = exact_moments(spec, None, values)
    assert np.allclose(mean, true, rtol=1e-9, atol=1e-9)
    assert np.allclose(var, spec.count_variance(true), rtol=1e-9)


def test_candidate_subset_is_unbiased_when_users_hold_candidates() -> None:
    spec = RapporSpec(epsilon=2.0, domain_size=12, num_bits=4, num_cohorts=3, num_hashes=2)
    cands = np.array([3, 7, 11])
    values = [3, 3, 11, 7, 11]
    mean, var = exact_moments(spec, cands, values)
    true = np.array([2, 1, 2])
    assert np.allclose(mean, true, rtol=1e-9, atol=1e-9)
    assert np.allclose(var, spec.design(cands).variance(true), rtol=1e-9)
    acc = RapporAccumulator(spec)
    acc.update(spec.encode(np.repeat(cands, 100), np.random.default_rng(2)))
    est = acc.estimate(candidates=cands)
    assert est.counts.shape == (3,) and np.all(est.ci_low < est.ci_high)


def test_quick_unbiasedness() -> None:
    """T = 300 trials of n = 2000 users, default parameters at ε = 4, d = 10.
    z = (ĉ_v - c_v)/sqrt(count_variance(c)_v); per item sqrt(T)|mean z| is |N(0,1)|
    whatever the correlation between items: reject above Φ⁻¹(1 - 1e-4/(2d)) ≈ 4.4.
    A bias of half a standard error would give ≈ 8.7."""
    spec = RapporSpec(epsilon=4.0, domain_size=10)
    true = np.array([600, 400, 300, 250, 150, 120, 90, 60, 30, 0])
    values = np.repeat(np.arange(10), true)
    sd = np.sqrt(spec.count_variance(true))
    rng = np.random.default_rng(77)
    trials = 300
    z = np.empty((trials, 10))
    for t in range(trials):
        acc = accumulator_for(spec)
        acc.update(spec.encode(values, rng))
        z[t] = (acc.estimate().counts - true) / sd
    assert np.max(np.sqrt(trials) * np.abs(z.mean(axis=0))) < stats.norm.isf(1e-4 / 20)


@pytest.mark.parametrize("k", [90, 128])
def test_accumulator_counts_match_unpacked_bits(k: int) -> None:
    """Per-cohort bit counts equal an unpackbits sum (k = 128: whole words behind the
    2-byte cohort field; k = 90: padding bits)."""
    spec = RapporSpec(epsilon=2.0, domain_size=100, num_bits=k, num_cohorts=7)
    rng = np.random.default_rng(12)
    rec = np.zeros(2500, dtype=spec.record_dtype)
    rec["cohort"] = rng.integers(0, 7, size=2500)
    rec["bits"] = rng.integers(0, 256, size=rec["bits"].shape, dtype=np.uint8)
    if k % 8:
        rec["bits"][:, -1] &= np.uint8((1 << (k % 8)) - 1)
    acc = RapporAccumulator(spec)
    acc.update(rec)
    bits = unpack(rec, k)
    for c in range(7):
        assert np.array_equal(acc.sums["ones"][c], bits[rec["cohort"] == c].sum(axis=0))
    assert np.array_equal(acc.sums["cohort_counts"], np.bincount(rec["cohort"], minlength=7))


def test_merge_equals_one_pass() -> None:
    spec = RapporSpec(epsilon=2.0, domain_size=30)
    rng = np.random.default_rng(31)
    rec = spec.encode(rng.integers(0, 30, size=4000), rng)
    whole = accumulator_for(spec)
    whole.update(rec)
    parts = [accumulator_for(spec) for _ in range(3)]
    for part, chunk in zip(parts, np.array_split(rec, 3)):
        part.update(chunk)
    merged = parts[0].merge(parts[1]).merge(parts[2])
    assert merged.n == whole.n
    for key in ("ones", "cohort_counts"):
        assert np.array_equal(merged.sums[key], whole.sums[key])
    assert np.array_equal(merged.estimate().counts, whole.estimate().counts)
    restored = RapporAccumulator.from_state(spec, whole.state())
    assert np.array_equal(restored.estimate().variance, whole.estimate().variance)
