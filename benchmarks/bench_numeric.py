"""Numeric mechanisms: device encode and server aggregate rates, EMS time, and Square Wave's calibration.

    .venv/bin/python benchmarks/bench_numeric.py                 # rates and EMS time (medians of --repeat runs)
    .venv/bin/python benchmarks/bench_numeric.py --calibration   # coverage and bias of SW's quantile intervals
    .venv/bin/python benchmarks/bench_numeric.py --accuracy      # MSE of the mean mechanisms against theory

Rates are reports per second on one core (numpy and the accumulators are single-threaded), the median of
``--repeat`` runs; the machine is shared, so medians, not bests. The calibration runs ``--trials`` collections
of ``--users`` beta(2, 5) values on [0, 60] and reports how often each 95% interval covers the users' true
quantile, and the mean error (docs/NUMERIC.md quotes it).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from estimator.mechanisms.numeric import MeanAccumulator, SquareWaveAccumulator, SquareWaveOperator, ems
from ldp_core.mechanisms.numeric import MEAN_MECHANISMS
from ldp_core.mechanisms.square_wave import SquareWaveSpec


def rates(n: int, repeat: int, epsilon: float) -> None:
    rng = np.random.default_rng(1)
    values = rng.beta(2, 5, n) * 60
    print(
        f"{'mechanism':<10} {'encode M/s':>11} {'aggregate M/s':>14}   (n = {n:,}, ε = {epsilon:g}, median of {repeat})"
    )
    specs = [cls(epsilon=epsilon, low=0, high=60) for cls in MEAN_MECHANISMS.values()]
    specs.append(SquareWaveSpec(epsilon=epsilon, low=0, high=60, bins=1024))  # type: ignore[arg-type]
    for spec in specs:
        enc, agg = [], []
        for _ in range(repeat):
            t0 = time.perf_counter()
            rec = spec.encode(values, rng)
            t1 = time.perf_counter()
            acc = SquareWaveAccumulator(spec) if isinstance(spec, SquareWaveSpec) else MeanAccumulator(spec)
            acc.update(rec)
            t2 = time.perf_counter()
            enc.append(n / (t1 - t0) / 1e6)
            agg.append(n / (t2 - t1) / 1e6)
        print(f"{spec.name:<10} {statistics.median(enc):>11.1f} {statistics.median(agg):>14.1f}")
    spec = SquareWaveSpec(epsilon=epsilon, low=0, high=60, bins=1024)
    acc = SquareWaveAccumulator(spec)
    acc.update(spec.encode(values, rng))
    op = SquareWaveOperator(spec)
    times, steps = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        _, steps = ems(acc.sums["bins"], op)
        times.append(time.perf_counter() - t0)
    dense_t0 = time.perf_counter()
    _, dense_steps = ems(acc.sums["bins"], spec.transition_matrix(), accelerate=False)
    dense = time.perf_counter() - dense_t0
    print(
        f"EMS at B = 1,024: {statistics.median(times):.3f} s ({steps} steps, fast operator + SQUAREM); "
        f"dense matrix, plain EMS: {dense:.2f} s ({dense_steps} steps)"
    )


def calibration(users: int, trials: int, bootstrap: int, bins: int, epsilons: list[float]) -> None:
    rng = np.random.default_rng(123)
    levels = (0.5, 0.9, 0.99)
    print(f"beta(2,5) on [0, 60], {users:,} users, B = {bins}, {bootstrap} resamples, {trials} trials")
    print("| ε | coverage p50 / p90 / p99 | mean error p50 / p90 / p99 |")
    print("|---:|---|---|")
    for eps in epsilons:
        spec = SquareWaveSpec(epsilon=eps, low=0, high=60, bins=bins)
        hits = np.zeros(3)
        errors = []
        for _ in range(trials):
            v = rng.beta(2, 5, users) * 60
            acc = SquareWaveAccumulator(spec)
            acc.update(spec.encode(v, rng))
            e = acc.estimate(bootstrap=bootstrap, rng=rng, quantiles=levels)
            truth = np.quantile(v, levels)
            hits += (e.quantiles_low <= truth) & (truth <= e.quantiles_high)
            errors.append(e.quantiles - truth)
        cov = " / ".join(f"{h / trials:.2f}" for h in hits)
        err = " / ".join(f"{x:+.2f}" for x in np.mean(errors, axis=0))
        print(f"| {eps:g} | {cov} | {err} |")


def accuracy(users: int, trials: int, epsilons: list[float]) -> None:
    """Empirical MSE of each mean mechanism's estimate over ``trials`` collections, against the theoretical
    variance of the mean at those users' values (MeanSpec.summand_variance): a ratio near 1 says the stated
    variance is the real one."""
    rng = np.random.default_rng(321)
    print(f"beta(2,5) on [0, 60], {users:,} users, {trials} trials per cell; MSE / theory (and RMSE)")
    print("| ε | " + " | ".join(MEAN_MECHANISMS) + " |")
    print("|---:|" + "---|" * len(MEAN_MECHANISMS))
    for eps in epsilons:
        cells = []
        for cls in MEAN_MECHANISMS.values():
            spec = cls(epsilon=eps, low=0, high=60)
            err2, theory = [], []
            for _ in range(trials):
                v = rng.beta(2, 5, users) * 60
                acc = MeanAccumulator(spec)
                acc.update(spec.encode(v, rng))
                err2.append((float(acc.estimate().mean[0]) - v.mean()) ** 2)
                theory.append(float(spec.summand_variance(spec.normalize(v)).sum()) / users**2 * spec.half_width**2)
            mse, th = float(np.mean(err2)), float(np.mean(theory))
            cells.append(f"{mse / th:.2f} ({np.sqrt(mse):.3f})")
        print(f"| {eps:g} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--calibration", action="store_true")
    ap.add_argument("--accuracy", action="store_true", help="MSE of the mean mechanisms against their theory")
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--bootstrap", type=int, default=40)
    ap.add_argument("--bins", type=int, default=64)
    ap.add_argument("--epsilons", default="1,2")
    args = ap.parse_args()
    if args.accuracy:
        accuracy(min(args.users, 10_000), args.trials, [0.5, 1.0, 2.0, 4.0])
    elif args.calibration:
        calibration(
            min(args.users, 100_000),
            args.trials,
            args.bootstrap,
            args.bins,
            [float(e) for e in args.epsilons.split(",")],
        )
    else:
        rates(args.users, args.repeat, args.epsilon)


if __name__ == "__main__":
    main()
