"""SFP's word-sketch estimates of words nobody typed: their stated variance, and collisions with heavy words.

``ldp simulate --mechanism sfp`` reports a word when it passes Bonferroni over every word ranked
(``SFP_REPORT_CONFIDENCE``); that rule holds only if an untyped word's z = estimate / std_error is about
N(0, 1). Two things broke that before: the variance plugged every candidate's clipped estimate in as a
count, so the counts added up to several n (:func:`tail_counts`), and an untyped word sharing a cell with
a heavy word carries n_heavy / k of it (:func:`without_heavy_collisions`). Fixed seeds; each bound is set
for a false failure probability below 1e-6, from the formula named in the test.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from estimator.mechanisms.heavy_hitters import (
    _Sketch,
    add_sketch,
    sketch_sums,
    tail_counts,
    without_heavy_collisions,
)
from ldp_core.mechanisms.cms import CMSSpec
from ldp_core.mechanisms.heavy_hitters import KEY_DOMAIN

Z_1E6 = stats.norm.isf(0.5e-6)  # two-sided 1e-6


def _sketch_of(spec: CMSSpec, items: np.ndarray, seed: int) -> _Sketch:
    sums = sketch_sums(spec)
    add_sketch(spec, spec.encode(items, np.random.default_rng(seed)), sums)
    return _Sketch(spec, int(items.size), sums)


def _untyped_keys(count: int, typed: np.ndarray, seed: int) -> np.ndarray:
    keys = np.unique(np.random.default_rng(seed).integers(0, KEY_DOMAIN, size=count + typed.size))
    return keys[~np.isin(keys, typed)][:count].astype(np.uint32)


def test_untyped_words_variance_is_the_stated_one() -> None:
    """At a word ε of 0.25 (SFP's quarter of ε = 1), N = 4,000 untyped keys' estimates E_i with stated
    variances V_i: Σ E_i² / V_i is χ²(N) if they are unbiased, normal and independent (distinct keys share a
    cell in some row with probability about k/m; the hash-averaged collision term is in V). The ratio
    Σ(E²/V)/N is checked against χ²(N)/N at 1e-6 two-sided. The old plug-in (every clipped estimate a
    count, so 4,000 candidates' positive noise summed to about 94 n) stated V 94× too large."""
    n, typed = 20_000, np.arange(1, 41, dtype=np.int64)
    spec = CMSSpec(epsilon=0.25, domain_size=KEY_DOMAIN, num_hashes=16, width=1024, hash_seed=7)
    weights = 1.0 / np.arange(1, typed.size + 1) ** 1.1
    items = np.random.default_rng(3).choice(typed, size=n, p=weights / weights.sum())
    sketch = _sketch_of(spec, items, 4)
    keys = _untyped_keys(4_000, typed, 5)
    est = sketch.counts(keys)
    var = np.asarray(spec.count_variance(tail_counts(est, n)))
    ratio = float(np.sum(est**2 / var)) / keys.size
    lo, hi = (stats.chi2.ppf(q, keys.size) / keys.size for q in (0.5e-6, 1 - 0.5e-6))
    assert lo < ratio < hi, f"Σ E²/V / N = {ratio:.3f} outside [{lo:.3f}, {hi:.3f}]"
    clipped = np.clip(est, 0, n)
    old = np.asarray(spec.count_variance(np.concatenate([clipped, np.ones(max(0, n - int(clipped.sum())))])))
    assert float(np.sum(est**2 / old)) / keys.size < lo, "the test must tell the old plug-in from the new"


def test_tail_counts_adds_up_to_n() -> None:
    est = np.array([5_000.0, 300.0, -40.0, 2_000.0])
    assert tail_counts(est, 10_000).sum() == 10_000 and tail_counts(est, 10_000).size == 4 + 10_000 - 7_300
    many = np.full(1_000, 500.0)  # 1,000 candidates' noise: 5 n if plugged in as counts
    counts = tail_counts(many, 100_000)
    assert math.isclose(counts.sum(), 100_000) and np.all(counts >= 0) and counts.size == many.size


def test_collisions_with_a_heavy_word_are_taken_out() -> None:
    """One word held by 15,000 of n = 100,000 (the rest by distinct words), word ε = 1, CMS 16 × 1024 (SFP's
    word sketch at ε = 4). Untyped keys that share a cell with it in some row have, given the hash family,
    mean m/(m-1)·15,000·(r - 1/m) ≈ 940 per shared row (1.5 standard deviations): a few of hundreds of
    candidates pass a per-word test that way. After :func:`without_heavy_collisions` their mean is 0: the
    bound is 4.9 standard errors (sd from ``count_variance``, over the colliding keys), and the raw mean
    must be far above it. Keys that share no cell move by n̂_heavy/(m-1) each."""
    n, heavy = 100_000, 15_000
    spec = CMSSpec(epsilon=1.0, domain_size=KEY_DOMAIN, num_hashes=16, width=1024, hash_seed=11)
    items = np.concatenate([np.full(heavy, 123_456_789), 2_000_000_000 - np.arange(n - heavy)])
    sketch = _sketch_of(spec, items, 12)
    keys = np.concatenate([[np.uint32(123_456_789)], _untyped_keys(100_000, items, 13)]).astype(np.uint32)
    est = sketch.counts(keys)
    var = np.asarray(spec.count_variance(tail_counts(est, n)))
    fixed = without_heavy_collisions(spec, keys, est, var)
    pos = spec.hash_positions(keys)
    shared = (pos[:, 1:] == pos[:, :1]).any(axis=0)
    se = math.sqrt(float(var[1:][shared].mean()) / int(shared.sum()))
    assert int(shared.sum()) > 1_000
    assert abs(float(fixed[1:][shared].mean())) < Z_1E6 * se, (fixed[1:][shared].mean(), se)
    assert float(est[1:][shared].mean()) > 10 * Z_1E6 * se, "the collision bias must be there to remove"
    assert fixed[0] == est[0], "the heavy word's own estimate is left alone"
    assert np.all(np.abs(fixed[1:][~shared] - est[1:][~shared]) <= est[0] / 1023 + 1e-6)
