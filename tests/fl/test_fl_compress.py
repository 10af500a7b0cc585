"""Compressed updates (ldp_core/fl/compress.py, issue 18): stochastic quantization, the public rotation,
top-k with error feedback, and which of them compose with SecAgg and DP."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ldp_core.fl.compress import (
    CountSketch,
    RotatedQuantizer,
    StochasticQuantizer,
    TopKErrorFeedback,
    check_composition,
)
from ldp_core.fl.errors import ModelError

TRIALS = 20_000
Z = 5.0  # tolerance in standard errors; with ≤ 64 coordinates a false failure is ~ 64 · 6e-7


def _points(q: StochasticQuantizer) -> np.ndarray:
    """Points across [−c, c]: grid points, the ends, and fractions 0.1 … 0.9 of the way between neighbours."""
    lo = -q.clip + q.step * np.arange(q.levels - 1)
    fracs = np.array([0.0, 0.1, 0.25, 0.5, 0.75, 0.9])
    return np.concatenate([(lo[:, None] + fracs[None, :] * q.step).ravel(), [q.clip]])


@pytest.mark.parametrize("bits", [1, 2, 3])
def test_stochastic_rounding_is_unbiased_with_variance_lo_hi(bits: int) -> None:
    q = StochasticQuantizer(bits, clip=1.5)
    x = _points(q)
    rng = np.random.default_rng(bits)
    draws = q.dequantize(q.quantize(np.broadcast_to(x, (TRIALS, x.size)), rng))
    assert set(np.unique(np.round((draws + q.clip) / q.step, 9))) <= set(range(q.levels))
    # q = lo + Δ·B, B ~ Bernoulli(p), p = (x − lo)/Δ: E[q] = x and Var[q] = p(1 − p)Δ² = (x − lo)(hi − x)
    var = q.variance(x)
    lo = -q.clip + q.step * np.floor((x + q.clip) / q.step + 1e-12)
    np.testing.assert_allclose(var, np.clip((x - lo) * (lo + q.step - x), 0, None), atol=1e-12)
    mean = draws.mean(axis=0)
    # the sample mean's standard error is √(Var/T); on grid points Var = 0 and q = x exactly
    assert np.all(np.abs(mean - x) <= Z * np.sqrt(var / TRIALS) + 1e-12)
    # the unbiased sample variance has Var[s²] = (μ₄ − σ⁴(T − 3)/(T − 1))/T, with the two-point law's
    # fourth central moment μ₄ = p(1 − p)((1 − p)³ + p³)Δ⁴
    p = (x - lo) / q.step
    mu4 = p * (1 - p) * ((1 - p) ** 3 + p**3) * q.step**4
    se_var = np.sqrt(np.clip(mu4 - var**2 * (TRIALS - 3) / (TRIALS - 1), 0, None) / TRIALS)
    s2 = draws.var(axis=0, ddof=1)
    assert np.all(np.abs(s2 - var) <= Z * se_var + 1e-12)
    # the grid's ends are exactly ±c (b = 1 is {−c, c}): c and −c are sent as the last and first code
    ends = q.quantize(np.array([-q.clip, q.clip] * 100), rng)
    np.testing.assert_array_equal(ends, [0, q.levels - 1] * 100)
    np.testing.assert_allclose(q.dequantize(np.array([0, q.levels - 1])), [-q.clip, q.clip], atol=1e-15)
    assert q.step == pytest.approx(2 * q.clip / (2**bits - 1), rel=1e-15)


def test_quantized_norm_stays_within_the_sensitivity_bound() -> None:
    rng = np.random.default_rng(7)
    q = StochasticQuantizer(2, clip=0.5)
    d, clip_norm = 210, 1.0
    for _ in range(200):
        x = rng.normal(size=d)
        x *= clip_norm / np.linalg.norm(x)
        assert np.linalg.norm(q.dequantize(q.quantize(x, rng))) <= q.norm_bound(clip_norm, d)


@pytest.mark.parametrize("bits", [1, 3, 8, 13, 16])
def test_pack_round_trips_in_ceil_db_over_8_bytes(bits: int) -> None:
    q = StochasticQuantizer(bits, clip=1.0)
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, q.levels, size=210).astype(np.uint32)
    data = q.pack(codes)
    assert len(data) == math.ceil(210 * bits / 8) == q.payload_bytes(210)
    np.testing.assert_array_equal(q.unpack(data, 210), codes)
    with pytest.raises(ModelError):
        q.unpack(data + b"\0", 210)


def test_codes_sum_in_the_secagg_ring_and_decode_to_the_sum() -> None:
    rng = np.random.default_rng(3)
    q = StochasticQuantizer(8, clip=0.25)
    n, d = 40, 210
    xs = rng.uniform(-0.3, 0.3, size=(n, d))
    codes = q.quantize(xs, rng)
    # pairwise masks m_uv added by u and subtracted by v cancel in Z_{2^32}, as in SecAgg
    masked = codes.copy()
    for u in range(n):
        for v in range(u + 1, n):
            m = rng.integers(0, 2**32, size=d, dtype=np.uint64).astype(np.uint32)
            masked[u] += m
            masked[v] -= m
    total = masked.sum(axis=0, dtype=np.uint32)
    np.testing.assert_allclose(q.decode_sum(total, n), q.dequantize(codes).sum(axis=0), atol=1e-9)
    assert q.max_summands() == (2**32 - 1) // 255
    with pytest.raises(ModelError, match="does not fit"):
        StochasticQuantizer(16, clip=1.0).decode_sum(total, 2**16 + 2)


def test_rotation_is_orthogonal_and_exactly_inverted() -> None:
    rq = RotatedQuantizer(StochasticQuantizer(4, clip=0.3), rotation_seed=11)
    d = 210
    columns = np.stack([rq.rotated(e) for e in np.eye(d)], axis=1)  # 256 × 210
    assert columns.shape == (256, d)
    np.testing.assert_allclose(columns.T @ columns, np.eye(d), atol=1e-12)
    x = np.random.default_rng(0).normal(size=d)
    y = rq.rotated(x)
    assert np.linalg.norm(y) == pytest.approx(np.linalg.norm(x), rel=1e-12)
    np.testing.assert_allclose(rq.unrotate(y, d), x, atol=1e-12)
    other = RotatedQuantizer(rq.quantizer, rotation_seed=12).rotated(x)
    assert not np.allclose(other, y)
    np.testing.assert_array_equal(RotatedQuantizer(rq.quantizer, 11).rotated(x), y)


def test_rotated_quantization_is_unbiased_with_the_transported_variance() -> None:
    rng = np.random.default_rng(5)
    d = 60
    x = rng.normal(size=d)
    x *= 1.0 / np.linalg.norm(x)
    rq = RotatedQuantizer(StochasticQuantizer(2, clip=0.4), rotation_seed=3)
    y = rq.rotated(x)
    assert np.abs(y).max() < 0.4  # no coordinate clipped, so the decode is unbiased
    trials = 4_000
    dec = np.stack([rq.decode(rq.encode(x, rng), d) for _ in range(trials)])
    # x̂ = Rᵀ q: Var[x̂_i] = Σ_j R_ji² Var[q_j], Var[q_j] = (y_j − lo_j)(hi_j − y_j)
    r = np.stack([rq.rotated(e) for e in np.eye(d)], axis=1)
    var = (r**2).T @ rq.quantizer.variance(y)
    assert np.all(np.abs(dec.mean(axis=0) - x) <= Z * np.sqrt(var / trials))
    np.testing.assert_allclose(dec.var(axis=0), var, rtol=Z * math.sqrt(2 / trials))
    assert rq.payload_bytes(210) == 256 * 2 // 8


def test_error_feedback_keeps_every_input_and_bounds_the_residual() -> None:
    rng = np.random.default_rng(9)
    d, k, g_norm = 210, 21, 1.0
    ef = TopKErrorFeedback(d, k)
    bound = ef.residual_bound(g_norm)
    total_in = np.zeros(d)
    total_sent = np.zeros(d)
    largest = 0.0
    for _ in range(300):
        # correlated inputs (a fixed direction plus noise) make the residual grow the most
        g = 0.7 * np.ones(d) / math.sqrt(d) + rng.normal(size=d) * 0.05
        g *= g_norm / np.linalg.norm(g)
        a = g + ef.residual
        sparse = ef.step(g)
        assert len(sparse.indices) == k and sparse.payload_bytes == 8 * k
        kept = np.delete(np.abs(a), sparse.indices)
        assert np.abs(a[sparse.indices]).min() >= kept.max()
        assert np.linalg.norm(ef.residual) <= math.sqrt(1 - k / d) * np.linalg.norm(a) + 1e-6
        total_in += g
        total_sent += sparse.dense()
        largest = max(largest, float(np.linalg.norm(ef.residual)))
        np.testing.assert_allclose(total_sent + ef.residual, total_in, atol=1e-9)
    assert largest <= bound
    assert largest > 0.5 * g_norm  # the residual really carries mass across rounds


def test_bad_parameters_are_refused() -> None:
    for bits in (0, 17, True, 2.0):
        with pytest.raises(ModelError):
            StochasticQuantizer(bits, clip=1.0)  # type: ignore[arg-type]
    for clip in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ModelError):
            StochasticQuantizer(4, clip=clip)
    with pytest.raises(ModelError):
        RotatedQuantizer(StochasticQuantizer(4, 1.0), rotation_seed=-1)
    with pytest.raises(ModelError):
        TopKErrorFeedback(10, 11)
    with pytest.raises(ModelError):
        TopKErrorFeedback(10, 2).step(np.zeros(9))


def test_composition_refuses_data_dependent_selection_under_secagg_and_noise() -> None:
    for kind in ("none", "quantize", "rotate_quantize"):
        check_composition(kind, secagg=True, distributed_noise=True, local_noise=True)
    check_composition("topk", secagg=False, distributed_noise=False)
    with pytest.raises(ModelError, match="SecAgg"):
        check_composition("topk", secagg=True, distributed_noise=False)
    with pytest.raises(ModelError, match="SecAgg"):
        check_composition("topk", secagg=False, distributed_noise=True)
    with pytest.raises(ModelError, match="before any data-dependent"):
        check_composition("topk", secagg=False, distributed_noise=False, local_noise=True)
    with pytest.raises(ModelError, match="unknown"):
        check_composition("sketch", secagg=False, distributed_noise=False)


def test_count_sketch_is_linear_so_sketch_sums_are_sketches_of_sums() -> None:
    cs = CountSketch(d=210, rows=5, cols=32, seed=7)
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(40, 210))
    np.testing.assert_allclose(sum(cs.sketch(x) for x in xs), cs.sketch(xs.sum(axis=0)), atol=1e-9)
    # the same public seed gives the server the same hashes; another seed gives other ones
    np.testing.assert_array_equal(CountSketch(210, 5, 32, 7).sketch(xs[0]), cs.sketch(xs[0]))
    assert not np.allclose(CountSketch(210, 5, 32, 8).sketch(xs[0]), cs.sketch(xs[0]))
    for x in xs:
        assert np.linalg.norm(cs.sketch(x)) <= cs.norm_bound(float(np.linalg.norm(x))) + 1e-9
    assert cs.payload_bytes() == 4 * 5 * 32


def test_count_sketch_mean_decoding_is_unbiased_with_variance_rest_over_rows_cols() -> None:
    rows, cols, d, trials = 3, 16, 48, 4000
    x = np.random.default_rng(1).normal(size=d)
    x[:3] = [6.0, -4.0, 3.0]  # a few heavy coordinates: their collisions dominate the others' variance
    est = np.array(
        [
            CountSketch(d, rows, cols, seed).unsketch(CountSketch(d, rows, cols, seed).sketch(x))
            for seed in range(trials)
        ]
    )
    # per row, s_r(i)·S[r, h_r(i)] = x_i + Σ_{j≠i} 1[h_r(j) = h_r(i)]·s_r(i)s_r(j)·x_j: mean x_i, variance
    # Σ_{j≠i} x_j²/cols; rows are independent, so the row mean has variance Σ_{j≠i} x_j²/(rows·cols)
    var = (np.sum(x**2) - x**2) / (rows * cols)
    assert np.all(np.abs(est.mean(axis=0) - x) <= Z * np.sqrt(var / trials))
    # the sample variance against the formula, within Z standard errors √((μ₄ − σ⁴)/n) of a sample variance
    dev = est - x
    m4 = np.mean(dev**4, axis=0)
    assert np.all(np.abs(np.mean(dev**2, axis=0) - var) <= Z * np.sqrt((m4 - var**2) / trials))
    # a wrong constant (variance over cols only, forgetting the rows) is far outside that band
    assert np.all(np.abs(np.mean(dev**2, axis=0) - var * rows) > Z * np.sqrt((m4 - var**2) / trials))


def test_count_sketch_heavy_decoding_recovers_the_heavy_coordinates() -> None:
    d, k = 20_000, 10
    rng = np.random.default_rng(3)
    x = rng.normal(scale=0.01, size=d)
    support = rng.choice(d, size=k, replace=False)
    x[support] = rng.choice([-1.0, 1.0], size=k) * rng.uniform(1.0, 2.0, size=k)
    # 3584 cells for 20,000 coordinates (5.6× fewer floats). A light coordinate's median goes wrong only if
    # ≥ 4 of its 7 rows hit one of the 10 heavy buckets (p ≈ 10/512 per row): C(7,4)·p⁴ ≈ 5e-6 each
    cs = CountSketch(d, rows=7, cols=512, seed=11)
    h = cs.heavy(cs.sketch(x), k)
    assert set(np.flatnonzero(h)) == set(support)
    # each heavy estimate is off by collisions with the light mass only (√(Σ light²/cols) ≈ 0.06 per row)
    np.testing.assert_allclose(h[support], x[support], atol=0.35)


def test_count_sketch_cells_sum_in_the_secagg_ring_after_quantization() -> None:
    cs = CountSketch(d=210, rows=3, cols=32, seed=5)
    q = StochasticQuantizer(8, clip=4.0)
    rng = np.random.default_rng(9)
    xs = rng.normal(scale=0.3, size=(30, 210))
    codes = [q.quantize(cs.sketch(x), rng) for x in xs]
    ring = np.zeros((3, 32), dtype=np.uint64)
    for c in codes:
        ring = (ring + c) % (1 << 32)
    est = cs.unsketch(q.decode_sum(ring, len(xs)))
    exact = cs.unsketch(cs.sketch(xs.sum(axis=0)))
    # rounding noise: Σ over 30 devices of Var ≤ Δ²/4 per cell, averaged over 3 rows: sd ≤ Δ·√(30/4/3)
    assert np.max(np.abs(est - exact)) <= Z * q.step * math.sqrt(30 / 4 / 3)
    check_composition("count_sketch", secagg=True, distributed_noise=True)


def test_count_sketch_refuses_bad_parameters() -> None:
    for bad in ({"d": 0}, {"rows": 1.5}, {"cols": True}, {"seed": -1}):
        with pytest.raises(ModelError):
            CountSketch(**{"d": 10, "rows": 3, "cols": 8, "seed": 0, **bad})  # type: ignore[arg-type]
    cs = CountSketch(10, 3, 8, 0)
    with pytest.raises(ModelError, match="shape"):
        cs.sketch(np.zeros(9))
    with pytest.raises(ModelError, match="shape"):
        cs.unsketch(np.zeros((3, 7)))
    with pytest.raises(ModelError, match="k must"):
        cs.heavy(np.zeros((3, 8)), 11)
