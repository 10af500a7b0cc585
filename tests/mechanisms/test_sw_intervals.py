"""Square Wave's point estimates lie inside their own intervals (issue 30, item 10), and the quantiles.

Both come from one parametric bootstrap (estimator/mechanisms/numeric.py, docs/NUMERIC.md): the basic
interval [2θ̂ − θ*₀.₉₇₅, 2θ̂ − θ*₀.₀₂₅] and the point 2θ̂ − median(θ*), inside it by construction. The
populations are chosen where EMS's smoothing bias is large (a narrow peak, a thin tail), which is where
EMS's own point fell outside its basic interval; the test checks that it did there, so it would have
failed on the old estimate.
"""

from __future__ import annotations

import numpy as np
import pytest

from estimator.mechanisms.numeric import QUANTILE_LEVELS, SquareWaveAccumulator
from estimator.mechanisms.repeated import DBitFlipAccumulator
from ldp_core.mechanisms.repeated import DBitFlipSpec
from ldp_core.mechanisms.square_wave import SquareWaveSpec


def _values(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "peak":
        return np.clip(rng.normal(30.0, 1.5, size=n), 0, 60)
    if kind == "tail":
        return 60 * rng.beta(2, 12, size=n)
    return 60 * rng.beta(2, 5, size=n)


@pytest.mark.parametrize("kind", ["peak", "tail", "beta"])
@pytest.mark.parametrize("epsilon", [1.0, 3.0])
def test_points_lie_inside_their_intervals(kind: str, epsilon: float) -> None:
    spec = SquareWaveSpec(epsilon=epsilon, low=0, high=60, bins=32)
    rng = np.random.default_rng(11)
    acc = SquareWaveAccumulator(spec)
    acc.update(spec.encode(_values(kind, 20_000, rng), rng))
    est = acc.estimate(bootstrap=30, rng=np.random.default_rng(5))
    assert est.quantile_levels == QUANTILE_LEVELS == (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
    assert np.all(est.hist_low <= est.hist) and np.all(est.hist <= est.hist_high)
    assert np.all(est.quantiles_low <= est.quantiles) and np.all(est.quantiles <= est.quantiles_high)
    assert abs(est.hist.sum() - 1.0) < 1e-9 and np.all(est.hist >= 0)
    assert np.all(np.diff(est.quantiles_ems) >= 0)
    d = est.to_dict()
    assert list(d["quantiles"]) == ["p10", "p25", "p50", "p75", "p90", "p99"]
    assert all(q["ci_low"] <= q["value"] <= q["ci_high"] for q in d["quantiles"].values())


def test_the_old_point_fell_outside_where_this_test_looks() -> None:
    """EMS's own quantiles (what was reported before) lie outside their basic intervals in these populations."""
    outside = 0
    for kind in ("peak", "tail"):
        spec = SquareWaveSpec(epsilon=1.0, low=0, high=60, bins=32)
        rng = np.random.default_rng(11)
        acc = SquareWaveAccumulator(spec)
        acc.update(spec.encode(_values(kind, 20_000, rng), rng))
        est = acc.estimate(bootstrap=30, rng=np.random.default_rng(5))
        assert est.hist_ems is not None and est.quantiles_ems is not None
        outside += int(
            np.count_nonzero((est.quantiles_ems < est.quantiles_low) | (est.quantiles_ems > est.quantiles_high))
        )
    assert outside > 0


def test_without_resamples_the_point_is_ems() -> None:
    spec = SquareWaveSpec(epsilon=2.0, low=0, high=1, bins=16)
    rng = np.random.default_rng(3)
    acc = SquareWaveAccumulator(spec)
    acc.update(spec.encode(rng.random(5000), rng))
    est = acc.estimate(bootstrap=0)
    assert est.hist_ems is not None
    np.testing.assert_array_equal(est.hist, est.hist_ems)
    np.testing.assert_array_equal(est.hist_low, est.hist)


def test_dbitflip_quantiles_lie_inside_their_intervals() -> None:
    spec = DBitFlipSpec(epsilon=1.0, low=0, high=60, buckets=16)
    rng = np.random.default_rng(4)
    acc = DBitFlipAccumulator(spec)
    acc.update(spec.encode(_values("tail", 20_000, rng), rng))
    est = acc.estimate(draws=100, rng=np.random.default_rng(2))
    assert len(est.quantiles) == 6
    assert np.all(est.quantiles_low <= est.quantiles) and np.all(est.quantiles <= est.quantiles_high)
