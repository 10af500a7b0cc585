"""The repeated-collection mechanisms: 1BitMean, dBitFlip (Ding et al. 2017) and LOLOHA (Arcolezi et al. 2023).

Statistical tests use fixed seeds and tolerances from the stated variance formulas; each has a negative
control (a wrong formula or constant is rejected by the same test). Privacy audits follow
tests/mechanisms/test_privacy_audit.py (one-sided Clopper–Pearson bounds, union bound, ALPHA = 1e-6).
Longitudinal tests run a real TelemetryClient for 200 simulated days and attack its outbox.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client_sdk.client import TelemetryClient
from client_sdk.config import ClientConfig
from client_sdk.memo import MemoStore
from client_sdk.policy import LocalPolicy
from client_sdk.store import Store
from estimator.mechanisms.repeated import DBitFlipAccumulator, OneBitMeanAccumulator
from estimator.oracles.loloha import LolohaAccumulator
from ldp_core.errors import BudgetError, FrameError, SpecError
from ldp_core.hashing import hash_to_range
from ldp_core.mechanisms.loloha import LolohaSpec, irr_epsilon, optimal_g
from ldp_core.mechanisms.repeated import DBitFlipSpec, OneBitMeanSpec
from ldp_core.metrics import FORMAT, parse_metrics
from tests.mechanisms.test_privacy_audit import ALPHA, cp_lower, cp_upper

N = 200_000
DAY = 86400.0
DAYS = 200


def _ratio_bounds(k1: int, k2: int, n: int) -> tuple[float, float]:
    a = ALPHA / 4
    l1, u1, l2, u2 = cp_lower(k1, n, a), cp_upper(k1, n, a), cp_lower(k2, n, a), cp_upper(k2, n, a)
    return (l1 / u2 if u2 > 0 else math.inf), (u1 / l2 if l2 > 0 else math.inf)


# -- 1BitMean ----------------------------------------------------------------------------------


def _summands(spec: OneBitMeanSpec, bits: np.ndarray) -> np.ndarray:
    e = spec.exp_epsilon
    return (bits.astype(np.float64) * (e + 1.0) - 1.0) / (e - 1.0)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
@pytest.mark.parametrize("granularity", [1, 4, 16])
@pytest.mark.parametrize("t", [0.0, 0.3, 0.5, 0.97])
def test_1bitmean_summand_is_unbiased_with_the_stated_variance(epsilon: float, granularity: int, t: float) -> None:
    """Y = (b(e+1) − 1)/(e − 1) over fresh α and bits: E[Y] = t and Var[Y] = the rounding-free formula."""
    spec = OneBitMeanSpec(epsilon=epsilon, low=0, high=1, granularity=granularity)
    y = _summands(spec, spec.encode(np.full(N, t), np.random.default_rng([31, granularity, int(100 * t)]))["bit"])
    var = float(spec.summand_variance(t))
    e = spec.exp_epsilon
    rng_y = (e + 1) / (e - 1)  # Y's two values are this far apart: Var[sample var] ≤ rng_y⁴/(4N)-ish
    assert abs(y.mean() - t) < 5 * math.sqrt(var / N)
    assert abs(y.var() - var) < 5 * rng_y**2 / (2 * math.sqrt(N))


def test_1bitmean_rounding_adds_no_variance_and_the_naive_formula_is_rejected() -> None:
    """Negative control: at s = 1, t = ½ the rounding's own variance r(1 − r)/s² = ¼ is cancelled exactly
    (module docstring); the naive Var_unrounded + ¼ is outside the band the test above uses."""
    spec = OneBitMeanSpec(epsilon=1.0, low=0, high=1, granularity=1)
    y = _summands(spec, spec.encode(np.full(N, 0.5), np.random.default_rng(37))["bit"])
    e = spec.exp_epsilon
    band = 5 * ((e + 1) / (e - 1)) ** 2 / (2 * math.sqrt(N))
    assert abs(y.var() - float(spec.summand_variance(0.5))) < band
    assert abs(y.var() - (float(spec.summand_variance(0.5)) + 0.25)) > band


def test_1bitmean_rounding_is_unbiased_over_alpha() -> None:
    spec = OneBitMeanSpec(epsilon=1.0, low=0, high=10, granularity=4)
    rng = np.random.default_rng(41)
    t = np.full(N, 0.3)  # t s = 1.2: grid 1 w.p. 0.8, grid 2 w.p. 0.2
    j = spec.round_to_grid(t, rng.random(N))
    assert set(np.unique(j).tolist()) == {1, 2}
    assert abs((j == 2).mean() - 0.2) < 5 * math.sqrt(0.16 / N)
    assert spec.round_to_grid(np.array([0.0, 1.0]), 0.999).tolist() == [0, 4]


def test_1bitmean_confidence_intervals_cover() -> None:
    """300 trials of 3,000 devices (beta(2,5) on [0, 60]): coverage within 0.95 ± 3 binomial sd."""
    spec = OneBitMeanSpec(epsilon=1.0, low=0, high=60)
    rng = np.random.default_rng(43)
    trials, hits = 300, 0
    for _ in range(trials):
        v = rng.beta(2, 5, 3000) * 60
        acc = OneBitMeanAccumulator(spec)
        acc.update(spec.encode(v, rng))
        est = acc.estimate()
        hits += int(est.ci_low[0] <= v.mean() <= est.ci_high[0])
    sd = math.sqrt(0.95 * 0.05 / trials)
    assert 0.95 - 3 * sd <= hits / trials <= 0.95 + 3 * sd


def test_1bitmean_estimated_variance_matches_the_formula_and_merges_exactly() -> None:
    spec = OneBitMeanSpec(epsilon=2.0, low=-5, high=5)
    rng = np.random.default_rng(47)
    v = rng.uniform(-5, 5, N)
    rec = spec.encode(v, rng)
    whole = OneBitMeanAccumulator(spec)
    whole.update(rec)
    parts = [OneBitMeanAccumulator(spec) for _ in range(3)]
    for i, p in enumerate(parts):
        p.update(rec[i::3])
    merged = parts[2].merge(parts[0]).merge(parts[1])
    assert merged.sums["ones"].tolist() == whole.sums["ones"].tolist() and merged.n == whole.n
    est = whole.estimate()
    t = spec.unit(v)
    theory = float(spec.summand_variance(t).sum()) / N**2 * 100.0
    assert abs(est.mean[0] - v.mean()) < 5 * math.sqrt(theory)
    # the sample variance of the summands also holds the spread of the devices' own values (Σ(t_i − t̄)²):
    # conservative for these devices' mean, exact for a mean over a population they are drawn from
    assert est.variance[0] == pytest.approx(theory + float(t.var()) / N * 100.0, rel=0.03)


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_1bitmean_passes_the_privacy_audit(epsilon: float) -> None:
    """Event {b = 1} for x = high against x' = low: the ratio is e^ε exactly (tight), never provably above."""
    spec = OneBitMeanSpec(epsilon=epsilon, low=0, high=1)
    rng = np.random.default_rng([53, int(10 * epsilon)])
    n = 400_000
    k1 = int(spec.encode(np.ones(n), rng)["bit"].sum())
    k2 = int(spec.encode(np.zeros(n), rng)["bit"].sum())
    for a, b in ((k1, k2), (n - k2, n - k1)):
        low, high = _ratio_bounds(a, b, n)
        assert low <= math.exp(epsilon) <= high


def test_1bitmean_audit_catches_a_leak() -> None:
    """Power: a 1BitMean whose bit follows 2ε while claiming ε is caught."""

    class Leaky(OneBitMeanSpec):
        def bit_probability(self, t: Any) -> np.ndarray:
            e = math.exp(2 * self.epsilon)
            return 1.0 / (e + 1.0) + np.asarray(t, dtype=np.float64) * (e - 1.0) / (e + 1.0)

    spec = Leaky(epsilon=1.0, low=0, high=1)
    rng = np.random.default_rng(59)
    n = 400_000
    k1 = int(spec.encode(np.ones(n), rng)["bit"].sum())
    k2 = int(spec.encode(np.zeros(n), rng)["bit"].sum())
    assert _ratio_bounds(k1, k2, n)[0] > math.exp(1.0)


def test_1bitmean_memoized_bits_are_exactly_bernoulli() -> None:
    """Across 40,000 device keys, a grid point's memoized bit is 1 with probability p(j/s), and α is uniform."""
    spec = OneBitMeanSpec(epsilon=1.0, low=0, high=1, granularity=4)
    keys = [i.to_bytes(4, "little") * 8 for i in range(40_000)]
    bits = np.array([spec.grid_bit(3, k) for k in keys])
    p = float(spec.bit_probability(0.75))
    assert abs(bits.mean() - p) < 5 * math.sqrt(p * (1 - p) / len(keys))
    alphas = np.array([spec.device_alpha(k) for k in keys[:10_000]])
    assert abs(alphas.mean() - 0.5) < 5 * math.sqrt(1 / 12 / alphas.size)


# -- dBitFlip ----------------------------------------------------------------------------------


def _wrong_variance(spec: DBitFlipSpec, counts: np.ndarray) -> np.ndarray:
    """The published pitfall: q(1 − q)/(p − q) in place of q(1 − q)/(p − q)² (and likewise for holders)."""
    n = float(counts.sum())
    p, q, r = spec.p, spec.q, spec.k / spec.d
    hold = r * (p * (1 - p) / (p - q) + 1.0) - 1.0
    other = r * q * (1 - q) / (p - q)
    return (counts * hold + (n - counts) * other) / n**2


def test_dbitflip_is_unbiased_with_the_exact_variance_and_rejects_the_pitfall() -> None:
    """300 trials of 4,000 devices, k = 8, d = 2, ε = 2: each bucket's share estimate has mean n_v/n and the
    spread of the exact variance (chi-square band on the sample variance, 300 − 1 dof, ±5 sd), and the
    (p − q) variant lies outside that band for every bucket (it understates by the factor p − q)."""
    spec = DBitFlipSpec(epsilon=2.0, low=0, high=8, buckets=8, sample=2)
    rng = np.random.default_rng(61)
    v = np.repeat(np.arange(8) + 0.5, [1600, 800, 500, 400, 300, 200, 150, 50])
    counts = np.bincount(spec.bucket_of(v), minlength=8)
    trials = 300
    h = np.empty((trials, 8))
    for i in range(trials):
        acc = DBitFlipAccumulator(spec)
        acc.update(spec.encode(v, rng))
        h[i] = acc.shares()
    var = spec.share_variance(counts)
    truth = counts / counts.sum()
    assert np.all(np.abs(h.mean(axis=0) - truth) < 5 * np.sqrt(var / trials))
    ratio = h.var(axis=0, ddof=1) / var
    band = 5 * math.sqrt(2 / (trials - 1))
    assert np.all(np.abs(ratio - 1) < band), ratio
    wrong = _wrong_variance(spec, counts)
    assert np.all(np.abs(h.var(axis=0, ddof=1) / wrong - 1) > band)
    # bins are uncorrelated (DBitFlipAccumulator docstring): every pairwise correlation within 5/sqrt(trials)
    corr = np.corrcoef(h.T)[np.triu_indices(8, 1)]
    assert np.all(np.abs(corr) < 5 / math.sqrt(trials))


def test_dbitflip_bands_and_quantiles_cover() -> None:
    """200 trials: per-bucket 95% bands cover the true shares in 0.95 ± 3 sd of the (trial, bucket) pairs,
    and the median's Monte Carlo interval covers the bucketed truth's median in at least 0.90."""
    spec = DBitFlipSpec(epsilon=3.0, low=0, high=60, buckets=16, sample=4)
    rng = np.random.default_rng(67)
    trials, cover, total, med = 200, 0, 0, 0
    for _ in range(trials):
        v = rng.beta(2, 5, 20_000) * 60
        acc = DBitFlipAccumulator(spec)
        acc.update(spec.encode(v, rng))
        est = acc.estimate(quantiles=(0.5,), draws=100, rng=rng)
        truth = np.bincount(spec.bucket_of(v), minlength=16) / v.size
        cover += int(np.sum((est.hist_low <= truth) & (truth <= est.hist_high)))
        total += 16
        med += int(est.quantiles_low[0] <= np.median(v) <= est.quantiles_high[0])
    sd = math.sqrt(0.95 * 0.05 / total)
    assert 0.95 - 3 * sd <= cover / total <= 0.95 + 3 * sd
    assert med / trials >= 0.90


def test_dbitflip_passes_the_privacy_audit() -> None:
    """k = d = 2 (both buckets sampled): the event 'bit of x's bucket = 1 and bit of x''s = 0' has ratio
    (p/q)² = e^ε for x, x' in different buckets: tight, never provably above."""
    eps = 1.0
    spec = DBitFlipSpec(epsilon=eps, low=0, high=2, buckets=2, sample=2)
    rng = np.random.default_rng(71)
    n = 400_000

    def hits(x: float) -> int:
        rec = spec.encode(np.full(n, x), rng)
        bits = spec.bits_of(rec)
        b = rec["bucket"]
        bit_of = {j: np.where(b[:, 0] == j, bits[:, 0], bits[:, 1]) for j in (0, 1)}
        return int(((bit_of[0] == 1) & (bit_of[1] == 0)).sum())

    k1, k2 = hits(0.5), hits(1.5)
    low, high = _ratio_bounds(k1, k2, n)
    assert low <= math.exp(eps) <= high


def test_dbitflip_audit_catches_a_leak() -> None:
    class Leaky(DBitFlipSpec):
        @property
        def e_half(self) -> float:  # flips at e^ε per bit, claiming e^{ε/2}
            return math.exp(self.epsilon)

    spec = Leaky(epsilon=1.0, low=0, high=2, buckets=2, sample=2)
    rng = np.random.default_rng(73)
    n = 400_000
    out = []
    for x in (0.5, 1.5):
        rec = spec.encode(np.full(n, x), rng)
        bits, b = spec.bits_of(rec), rec["bucket"]
        b0 = np.where(b[:, 0] == 0, bits[:, 0], bits[:, 1])
        b1 = np.where(b[:, 0] == 1, bits[:, 0], bits[:, 1])
        out.append(int(((b0 == 1) & (b1 == 0)).sum()))
    assert _ratio_bounds(out[0], out[1], n)[0] > math.exp(1.0)


def test_dbitflip_records_and_device_buckets() -> None:
    spec = DBitFlipSpec(epsilon=1.0, low=0, high=1, buckets=300, sample=9)
    assert spec.record_dtype["bucket"].subdtype[0] == np.dtype("<u2")  # type: ignore[index]
    rng = np.random.default_rng(79)
    rec = spec.encode(rng.random(1000), rng)
    spec.check_records(rec)
    bad = rec.copy()
    bad["bucket"][0, 1] = bad["bucket"][0, 0]
    with pytest.raises(FrameError, match="twice"):
        spec.check_records(bad)
    bad = rec.copy()
    bad["bits"][0, -1] |= 0x80
    with pytest.raises(FrameError, match="padding"):
        spec.check_records(bad)
    # a device's buckets: distinct, fixed per key, and uniform over keys (each bucket ~ d/k of devices)
    key = b"k" * 32
    assert np.array_equal(spec.device_buckets(key), spec.device_buckets(key))
    small = DBitFlipSpec(epsilon=1.0, low=0, high=1, buckets=6, sample=2)
    picks = np.array([small.device_buckets(i.to_bytes(4, "little") * 8) for i in range(12_000)])
    assert np.all(picks[:, 0] != picks[:, 1])
    freq = np.bincount(picks.reshape(-1), minlength=6) / 12_000
    assert np.all(np.abs(freq - 2 / 6) < 5 * math.sqrt((1 / 3) * (2 / 3) / 12_000))
    with pytest.raises(SpecError):
        DBitFlipSpec(epsilon=1.0, low=0, high=1, buckets=4, sample=5)


# -- LOLOHA ------------------------------------------------------------------------------------


@pytest.mark.parametrize("eps_inf,eps_one,g", [(2.0, 1.0, None), (4.0, 1.0, 5), (1.0, 0.3, 2), (6.0, 5.0, None)])
def test_loloha_chain_is_exactly_eps_one(eps_inf: float, eps_one: float, g: int | None) -> None:
    spec = LolohaSpec(epsilon=eps_inf, domain_size=10, epsilon_one=eps_one, g=g)
    gg = spec.hash_range
    assert spec.p_star == pytest.approx(math.exp(eps_one) / (math.exp(eps_one) + gg - 1), rel=1e-12)
    assert spec.p_star - 1 / gg == pytest.approx((spec.p1 - 1 / gg) * (spec.p2 - spec.q2), rel=1e-12)
    if gg == 2:  # L-GRR's closed form
        e1, ei = math.exp(eps_one), math.exp(eps_inf)
        assert spec.irr_epsilon == pytest.approx(math.log((ei * e1 - 1) / (ei - e1)))
    assert spec.epsilon_total == gg * eps_inf
    with pytest.raises(SpecError):
        irr_epsilon(1.0, 1.0, 4)
    with pytest.raises(SpecError):
        LolohaSpec(epsilon=1.0, domain_size=4, epsilon_one=1.5)


def test_loloha_irr_epsilon_near_zero_is_finite_and_meets_the_closed_form_limit() -> None:
    """At ε∞ = 2·2⁻⁵² and ε1 = 2⁻⁵² e^ε rounds to 1 and the plain formula's numerator to 0 or below (a
    ``math domain error`` hypothesis found); the expm1 form gives the limit log((a + (g-1)·b) / (a - b)) with
    a = 2b: log(g + 1)."""
    tiny = 2.0**-52
    assert irr_epsilon(2 * tiny, tiny, 1024) == pytest.approx(math.log(1025), rel=1e-9)
    spec = LolohaSpec(epsilon=2 * tiny, domain_size=10)  # accepted or refused, never a ValueError
    assert spec.epsilon == 2 * tiny


def test_loloha_default_g_follows_the_paper() -> None:
    assert optimal_g(1.0, 0.5) == 2
    assert LolohaSpec(epsilon=1.0, domain_size=8).g == optimal_g(1.0, 0.5)
    assert 2 < optimal_g(6.0, 3.0) <= 64


def test_loloha_counts_are_unbiased_with_the_pure_variance() -> None:
    """150 trials of 6,000 devices over 12 items: standardized errors have mean 0 and variance 1 (±5 sd), and
    the OLH variance at ε∞ (a wrong constant) is rejected."""
    spec = LolohaSpec(epsilon=3.0, domain_size=12, epsilon_one=1.5)
    rng = np.random.default_rng(83)
    v = np.repeat(np.arange(12), [2000, 1200, 800, 600, 400, 300, 250, 200, 100, 80, 50, 20])
    counts = np.bincount(v, minlength=12)
    trials = 150
    est = np.empty((trials, 12))
    for i in range(trials):
        acc = LolohaAccumulator(spec)
        acc.update(spec.encode(v, rng))
        est[i] = acc.estimate().counts
    var = spec.count_variance(counts)
    z = (est - counts) / np.sqrt(var)
    assert abs(z.mean()) < 5 / math.sqrt(z.size)
    band = 5 * math.sqrt(2 / (z.size - 1))
    assert abs(z.var() - 1) < band
    e = math.exp(3.0)
    p_wrong = e / (e + spec.hash_range - 1)  # as if one report were GRR at ε∞
    wrong = (counts * p_wrong * (1 - p_wrong) + (counts.sum() - counts) * (1 / 3) * (2 / 3)) / (p_wrong - 1 / 3) ** 2
    assert abs(((est - counts) ** 2 / wrong).mean() - 1) > band


def test_loloha_one_report_audit_attains_eps_one() -> None:
    """OLH's event on one report: the two-sided interval contains e^{ε1} (so the chain is ε1-LDP, tightly)."""
    spec = LolohaSpec(epsilon=3.0, domain_size=16, epsilon_one=1.2, g=6)
    rng = np.random.default_rng(89)
    n = 600_000
    k = []
    for x in (3, 7):
        rec = spec.encode(np.full(n, x), rng)
        s, y = rec["seed"], rec["y"].astype(np.uint32)
        k.append(int(((hash_to_range(3, s, 6) == y) & (hash_to_range(7, s, 6) != y)).sum()))
    low, high = _ratio_bounds(k[0], k[1], n)
    assert low <= math.exp(1.2) <= high


# -- longitudinal: a real client, 200 days, the averaging attack ------------------------------


def _doc(name: str, mechanism: dict[str, Any], domain: dict[str, Any]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "metrics": {
            name: {
                "description": "repeated",
                "owner": "t@example.org",
                "expires": "2099-01-01",
                "mechanism": mechanism,
                "domain": domain,
                "max_reports_per_day": 1,
            }
        },
    }


def _run_days(tmp_path: Path, doc: dict[str, Any], metric: str, values: list[Any]) -> tuple[Any, bytes, np.ndarray]:
    """Record ``values[d]`` on day d with a real TelemetryClient; return (spec, metric key, outbox records)."""
    clock = [20_000 * DAY]
    c = TelemetryClient(
        tmp_path,
        None,
        LocalPolicy(per_metric_daily=8.0, total_daily=8.0),
        doc,
        config=ClientConfig(upload=False, clock=lambda: clock[0]),
    )
    try:
        for d, x in enumerate(values):
            clock[0] = (20_000 + d) * DAY + 3600.0
            c.record(metric, x)
            assert c.flush(10)
        m = c.metrics[metric]
        key = c._memo.metric_secret(metric, m.spec.memo_derivation_id)
        rows = Store(tmp_path).connection().execute("SELECT day, record FROM outbox ORDER BY id").fetchall()
    finally:
        c.close()
    assert [r[0] for r in rows] == list(range(20_000, 20_000 + len(values)))
    return m.spec, key, np.frombuffer(b"".join(r[1] for r in rows), dtype=m.spec.record_dtype)


def test_1bitmean_device_sends_one_bit_forever(tmp_path: Path) -> None:
    """A device records 37.3 minutes every day for 200 days: all 200 reports are the same bit (the memoized
    bit of its rounded grid point), so the average of its reports is that bit, which is ε-LDP about the value.
    Without memoization (the batch encoder: fresh α and bit per day) the same averaging recovers the value
    within a few minutes: the attack the memo defeats."""
    doc = _doc(
        "minutes", {"mechanism": "1bitmean", "epsilon": 1.0, "granularity": 16}, {"kind": "range", "low": 0, "high": 60}
    )
    spec, key, rec = _run_days(tmp_path, doc, "minutes", [37.3] * DAYS)
    assert isinstance(spec, OneBitMeanSpec)
    j = int(spec.round_to_grid(spec.unit([37.3]), spec.device_alpha(key))[0])
    assert set(rec["bit"].tolist()) == {spec.grid_bit(j, key)}
    # the attacker's average of the device's summands says nothing beyond one bit
    e = spec.exp_epsilon
    avg = float(((rec["bit"] * (e + 1) - 1) / (e - 1)).mean()) * 60
    assert min(abs(avg - 60 * e / (e - 1)), abs(avg + 60 / (e - 1))) < 1e-9
    # negative control: fresh randomness per day lets the average converge to the value
    fresh = spec.encode(np.full(DAYS, 37.3), np.random.default_rng(97))["bit"]
    est = float(((fresh * (e + 1) - 1) / (e - 1)).mean()) * 60
    sd = math.sqrt(float(spec.summand_variance(37.3 / 60)) / DAYS) * 60
    assert abs(est - 37.3) < 5 * sd and 5 * sd < 60 * e / (e - 1) - 37.3


def test_dbitflip_device_sends_one_report_forever(tmp_path: Path) -> None:
    doc = _doc(
        "latency",
        {"mechanism": "dbitflip", "epsilon": 1.0, "buckets": 16, "sample": 4},
        {"kind": "range", "low": 0, "high": 400},
    )
    values = [103.0 + (d % 7) for d in range(DAYS)]  # moves within bucket 4, [100, 125)
    spec, key, rec = _run_days(tmp_path, doc, "latency", values)
    assert isinstance(spec, DBitFlipSpec)
    assert len({r.tobytes() for r in rec}) == 1  # 200 identical reports: the history is one report
    sampled = spec.device_buckets(key)
    assert np.array_equal(rec["bucket"][0], sampled)
    assert np.array_equal(spec.bits_of(rec[:1])[0], spec.memoized_bits(4, sampled, key))


def _loloha_log_posterior_ratio(spec: LolohaSpec, seed: int, ys: np.ndarray, x: int, xp: int) -> float:
    """log P[reports | x] − log P[reports | x'] for an attacker who knows the mechanism and the device's seed
    and sees every report: the permanent output is a hidden GRR of H_s(value), then one GRR per day."""
    g = spec.hash_range
    counts = np.bincount(ys.astype(np.int64), minlength=g)

    def loglik(value: int) -> float:
        h = int(hash_to_range(value, np.uint32(seed), g))
        terms = []
        for perm in range(g):
            lp1 = math.log(spec.p1 if perm == h else spec.q1)
            lp2 = float(np.sum(counts * np.where(np.arange(g) == perm, math.log(spec.p2), math.log(spec.q2))))
            terms.append(lp1 + lp2)
        m = max(terms)
        return m + math.log(sum(math.exp(t - m) for t in terms))

    return loglik(x) - loglik(xp)


def test_loloha_attackers_posterior_stays_within_eps_inf(tmp_path: Path) -> None:
    """A device reports the same item for 200 days through a real client. The attacker's exact log-likelihood
    ratio between the true item and any item hashing elsewhere is at most ε∞ (the permanent GRR bounds it,
    however many days are seen), and it does approach ε∞ (the instantaneous noise averages away). Negative
    control: with a fresh permanent response per day (the batch encoder, seed held fixed), the same attack's
    ratio grows far beyond ε∞."""
    mech = {"mechanism": "loloha", "epsilon": 2.0, "epsilon_one": 1.0, "g": 4}
    doc = _doc("page", mech, {"kind": "dictionary", "values": [f"p{i}" for i in range(10)]})
    spec, key, rec = _run_days(tmp_path, doc, "page", ["p3"] * DAYS)
    assert isinstance(spec, LolohaSpec)
    seed = spec.device_seed(key)
    assert set(rec["seed"].tolist()) == {seed}
    x = 3
    others = [
        v for v in range(10) if int(hash_to_range(v, np.uint32(seed), 4)) != int(hash_to_range(x, np.uint32(seed), 4))
    ]
    assert others
    ratios = [abs(_loloha_log_posterior_ratio(spec, seed, rec["y"], x, xp)) for xp in others]
    assert max(ratios) <= spec.epsilon + 1e-9
    # fresh permanent responses per day: simulate the same device without memoization
    rng = np.random.default_rng(101)
    h = int(hash_to_range(x, np.uint32(seed), 4))
    fresh = LolohaSpec._grr(LolohaSpec._grr(np.full(DAYS, h), spec.p1, 4, rng), spec.p2, 4, rng)
    # under fresh PRRs every day is one independent GRR at ε1: the attacker's log-ratio sums per day
    ps = spec.p_star
    qs = (1 - ps) / 3
    hp = int(hash_to_range(others[0], np.uint32(seed), 4))
    llr = float(
        np.sum(np.where(fresh == h, math.log(ps), math.log(qs)) - np.where(fresh == hp, math.log(ps), math.log(qs)))
    )
    assert llr > 10 * spec.epsilon


# -- policy and metrics ----------------------------------------------------------------------


def test_policy_bounds_the_repeated_mechanisms() -> None:
    policy = LocalPolicy(per_metric_daily=50.0, total_daily=50.0)
    ok = {
        "a": ({"mechanism": "1bitmean", "epsilon": 1.0, "granularity": 64}, {"kind": "range", "low": 0, "high": 1}),
        "b": (
            {"mechanism": "dbitflip", "epsilon": 1.0, "buckets": 1024, "sample": 32},
            {"kind": "range", "low": 0, "high": 1},
        ),
        "c": ({"mechanism": "loloha", "epsilon": 2.0, "g": 64}, {"kind": "dictionary", "values": ["x", "y"]}),
    }
    bad = {
        "a": ({"mechanism": "1bitmean", "epsilon": 1.0, "granularity": 65}, {"kind": "range", "low": 0, "high": 1}),
        "b": (
            {"mechanism": "dbitflip", "epsilon": 1.0, "buckets": 1024, "sample": 33},
            {"kind": "range", "low": 0, "high": 1},
        ),
        "b2": (
            {"mechanism": "dbitflip", "epsilon": 1.0, "buckets": 1025, "sample": 4},
            {"kind": "range", "low": 0, "high": 1},
        ),
        "c": ({"mechanism": "loloha", "epsilon": 2.0, "g": 65}, {"kind": "dictionary", "values": ["x", "y"]}),
    }
    for name, (mech, dom) in ok.items():
        policy.check_metric(parse_metrics(_doc(name, mech, dom))[name])
    for name, (mech, dom) in bad.items():
        m = parse_metrics(_doc(name, mech, dom))[name]
        assert MemoStore.supports(m.spec)
        with pytest.raises(BudgetError, match="asks more than this device allows"):
            policy.check_metric(m)
