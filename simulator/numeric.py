"""Simulated collections of numbers: populations over a range, the real encoders and estimators.

``ldp simulate --mechanism {duchi,pm,hm,sw,1bitmean,dbitflip} --range LO:HI`` runs :func:`simulate_numeric`
(1bitmean and dbitflip with their batch encoders: one report per distinct simulated device).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from estimator.mechanisms.numeric import MeanAccumulator, SquareWaveAccumulator
from estimator.mechanisms.repeated import DBitFlipAccumulator, OneBitMeanAccumulator
from ldp_core.mechanisms import NUMERIC_MECHANISMS
from ldp_core.mechanisms.numeric import MEAN_MECHANISMS, MeanSpec
from ldp_core.mechanisms.repeated import DBitFlipSpec, OneBitMeanSpec
from ldp_core.mechanisms.square_wave import SquareWaveSpec
from simulator.population import Distribution

__all__ = ["NUMERIC_MECHANISMS", "NumericPopulation", "parse_range", "numeric_spec", "simulate_numeric"]

QUANTILES = (0.5, 0.9, 0.99)
CHUNK = 1 << 18


def parse_range(text: str) -> tuple[float, float]:
    """``"LO:HI"`` with finite LO < HI."""
    m = re.fullmatch(r"\s*([-+]?[0-9.eE+-]+)\s*:\s*([-+]?[0-9.eE+-]+)\s*", text or "")
    try:
        lo, hi = (float(m.group(1)), float(m.group(2))) if m else (None, None)
    except ValueError:
        lo = hi = None
    if lo is None or hi is None or not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
        raise ValueError(f"--range must be LO:HI with finite numbers LO < HI, got {text!r}")
    return lo, hi


class NumericPopulation:
    """Who holds which number in ``[low, high]``: ``uniform``, ``beta:A,B``, ``normal:MU,SD`` (clipped to the
    range) or ``zipf:S`` (1,024 evenly spaced values, the k-th with probability ∝ 1/k^S)."""

    def __init__(self, text: str, low: float, high: float) -> None:
        self.text, self.low, self.high = text, float(low), float(high)
        self._zipf: Distribution | None = None
        self.params: tuple[float, ...] = ()
        if text == "uniform":
            self.kind = "uniform"
            return
        m = re.fullmatch(r"(beta|normal|zipf):(.+)", text)
        if not m:
            raise ValueError(f"distribution must be uniform, beta:A,B, normal:MU,SD or zipf:S, got {text!r}")
        kind = m.group(1)
        try:
            params = tuple(float(x) for x in m.group(2).split(","))
        except ValueError:
            raise ValueError(f"distribution {text!r} has a parameter that is not a number") from None
        want = {"beta": 2, "normal": 2, "zipf": 1}[kind]
        if len(params) != want or not all(np.isfinite(params)):
            raise ValueError(f"distribution {kind} takes {want} finite parameter(s), got {text!r}")
        if (
            kind == "beta"
            and min(params) <= 0
            or kind == "normal"
            and params[1] <= 0
            or kind == "zipf"
            and params[0] <= 0
        ):
            raise ValueError(f"distribution {text!r}: parameters must be positive (a normal's mean may be any)")
        self.kind, self.params = kind, params
        if kind == "zipf":
            self._zipf = Distribution("zipf", 1024, params[0])

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        lo, hi = self.low, self.high
        if self.kind == "uniform":
            return rng.uniform(lo, hi, n)
        if self.kind == "beta":
            return lo + (hi - lo) * rng.beta(self.params[0], self.params[1], n)
        if self.kind == "normal":
            return np.clip(rng.normal(self.params[0], self.params[1], n), lo, hi)
        assert self._zipf is not None
        k = self._zipf.sample(n, rng)
        return lo + (hi - lo) * k / 1023.0

    def __str__(self) -> str:
        return self.text


NumericSimSpec = MeanSpec | SquareWaveSpec | OneBitMeanSpec | DBitFlipSpec


def numeric_spec(mechanism: str, epsilon: float, low: float, high: float, bins: int | None) -> NumericSimSpec:
    if mechanism == "sw":
        return SquareWaveSpec(epsilon=epsilon, low=low, high=high, **({} if bins is None else {"bins": bins}))
    if mechanism == "dbitflip":
        return DBitFlipSpec(epsilon=epsilon, low=low, high=high, **({} if bins is None else {"buckets": bins}))
    if bins is not None:
        raise ValueError(f"--bins applies to sw and dbitflip (distributions), not to the mean mechanism {mechanism}")
    if mechanism == "1bitmean":
        return OneBitMeanSpec(epsilon=epsilon, low=low, high=high)
    return MEAN_MECHANISMS[mechanism](epsilon=epsilon, low=low, high=high)


def simulate_numeric(
    spec: NumericSimSpec,
    users: int,
    population: NumericPopulation,
    rng: np.random.Generator,
    *,
    seed: int | None = None,
    bootstrap: int = 50,
    progress: Callable[[int], Any] | None = None,
) -> dict[str, Any]:
    """Draw ``users`` values, privatize them in chunks, estimate; the JSON object of ``ldp simulate --json``."""
    acc: MeanAccumulator | SquareWaveAccumulator | OneBitMeanAccumulator | DBitFlipAccumulator
    if isinstance(spec, SquareWaveSpec):
        acc = SquareWaveAccumulator(spec)
    elif isinstance(spec, DBitFlipSpec):
        acc = DBitFlipAccumulator(spec)
    elif isinstance(spec, OneBitMeanSpec):
        acc = OneBitMeanAccumulator(spec)
    else:
        acc = MeanAccumulator(spec)
    seconds = {"encode": 0.0, "aggregate": 0.0, "estimate": 0.0}
    total = 0.0
    total_sq_var = 0.0  # Σ Var[summand] (normalized), for the theoretical variance of the mean
    hist_true = np.zeros(spec.bins, dtype=np.int64) if isinstance(spec, (SquareWaveSpec, DBitFlipSpec)) else None
    sorted_values: list[np.ndarray] = []
    done = 0
    while done < users:
        m = min(CHUNK, users - done)
        values = population.sample(m, rng)
        total += float(values.sum())
        if isinstance(spec, MeanSpec):
            total_sq_var += float(spec.summand_variance(spec.normalize(values)).sum())
        elif isinstance(spec, OneBitMeanSpec):
            total_sq_var += float(spec.summand_variance(spec.unit(values)).sum())
        else:
            assert hist_true is not None
            bins_of = spec.input_bins(values) if isinstance(spec, SquareWaveSpec) else spec.bucket_of(values)
            hist_true += np.bincount(bins_of, minlength=spec.bins)
            sorted_values.append(values)
        t0 = time.perf_counter()
        rec = spec.encode(values, rng)
        t1 = time.perf_counter()
        acc.update(rec)
        t2 = time.perf_counter()
        seconds["encode"] += t1 - t0
        seconds["aggregate"] += t2 - t1
        done += m
        if progress is not None:
            progress(m)
    out: dict[str, Any] = {
        "mechanism": spec.name,
        "epsilon": spec.epsilon,
        "users": users,
        "seed": seed,
        "range": [spec.low, spec.high],
        "distribution": str(population),
        "spec": spec.to_dict(),
        "spec_id": spec.spec_id,
    }
    t0 = time.perf_counter()
    if isinstance(acc, (MeanAccumulator, OneBitMeanAccumulator)):
        assert isinstance(spec, (MeanSpec, OneBitMeanSpec))
        est = acc.estimate()
        seconds["estimate"] = time.perf_counter() - t0
        # summand variances are in normalized units: half-widths for MeanSpec, the whole width for 1bitmean
        unit = spec.half_width if isinstance(spec, MeanSpec) else 2.0 * spec.half_width
        out.update(
            true_mean=total / users,
            mean=float(est.mean[0]),
            mean_variance=total_sq_var / users**2 * unit**2,
            estimated_variance=float(est.variance[0]),
            ci_low=float(est.ci_low[0]),
            ci_high=float(est.ci_high[0]),
        )
    else:
        if isinstance(acc, DBitFlipAccumulator):
            dist = acc.estimate(quantiles=QUANTILES, rng=rng)
        else:
            dist = acc.estimate(quantiles=QUANTILES, bootstrap=bootstrap, rng=rng)
        seconds["estimate"] = time.perf_counter() - t0
        assert hist_true is not None and isinstance(spec, (SquareWaveSpec, DBitFlipSpec))
        values = np.concatenate(sorted_values)
        out.update(
            bins=spec.bins,
            edges=dist.edges.tolist(),
            true_hist=(hist_true / users).tolist(),
            hist=dist.hist.tolist(),
            hist_low=dist.hist_low.tolist(),
            hist_high=dist.hist_high.tolist(),
            quantiles={
                f"p{round(q * 100):g}": {"value": float(v), "ci_low": float(lo), "ci_high": float(hi)}
                for q, v, lo, hi in zip(QUANTILES, dist.quantiles, dist.quantiles_low, dist.quantiles_high)
            },
            true_quantiles={
                f"p{round(q * 100):g}": float(v) for q, v in zip(QUANTILES, np.quantile(values, QUANTILES))
            },
            iterations=dist.iterations,
            bootstrap=dist.bootstrap,
        )
    out["seconds"] = seconds
    return out
