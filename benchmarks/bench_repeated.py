"""dBitFlip side by side with multi-freq-ldpy's dBitFlipPM (Ding et al. 2017), in one run.

    bash benchmarks/mfl_env.sh                           # once: the baseline's own virtualenv
    .venv/bin/python benchmarks/bench_repeated.py        # table + benchmarks/results/repeated.json

Both sides privatize the same users' bucket indices (beta(2, 5) values over [0, 60] in ``--buckets``
buckets, ``--sample`` of them reported per user, ε = ``--epsilon``), for ``--repeats`` runs; the table
quotes medians. Ours encodes a batch with numpy and aggregates with integer sums; multi-freq-ldpy's client
takes one user per call (a numba function called from Python) and its aggregator loops over reports in
Python. Accuracy: the mean squared error of each side's estimated shares against the users' true shares,
next to the exact variance of our unbiased shares (DBitFlipSpec.share_variance summed over the buckets).
multi-freq-ldpy clips negative shares and renormalizes (its estimator is then biased), ours reports the
unbiased shares; the table shows ours both ways, the clipped one with multi-freq-ldpy's post-processing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from estimator.mechanisms.repeated import DBitFlipAccumulator
from ldp_core.mechanisms.repeated import DBitFlipSpec

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=20_000, help="users on both sides (the baseline is slow)")
    ap.add_argument("--ours-users", type=int, default=1_000_000, help="users for our throughput alone")
    ap.add_argument("--buckets", type=int, default=32)
    ap.add_argument("--sample", type=int, default=4)
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "repeated.json"))
    args = ap.parse_args()
    spec = DBitFlipSpec(epsilon=args.epsilon, low=0, high=60, buckets=args.buckets, sample=args.sample)
    rng = np.random.default_rng(args.seed)
    values = rng.beta(2, 5, args.users) * 60
    buckets = spec.bucket_of(values)
    truth = np.bincount(buckets, minlength=spec.k) / args.users
    theory = float(spec.share_variance(np.bincount(buckets, minlength=spec.k)).sum())

    ours = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        rec = spec.encode(values, rng)
        t1 = time.perf_counter()
        acc = DBitFlipAccumulator(spec)
        acc.update(rec)
        shares = acc.shares()
        t2 = time.perf_counter()
        clipped = np.clip(shares, 0, None)
        clipped = clipped / clipped.sum() if clipped.sum() > 0 else clipped  # multi-freq-ldpy's post-processing
        ours.append(
            {
                "encode": t1 - t0,
                "aggregate": t2 - t1,
                "mse": float(np.sum((shares - truth) ** 2)),
                "mse_clipped": float(np.sum((clipped - truth) ** 2)),
            }
        )
    big = rng.beta(2, 5, args.ours_users) * 60
    t0 = time.perf_counter()
    rec = spec.encode(big, rng)
    t1 = time.perf_counter()
    acc = DBitFlipAccumulator(spec)
    acc.update(rec)
    acc.shares()
    t2 = time.perf_counter()
    ours_rate = {"encode": args.ours_users / (t1 - t0), "aggregate": args.ours_users / (t2 - t1)}

    py = subprocess.run(["bash", str(ROOT / "benchmarks" / "mfl_env.sh")], capture_output=True, text=True, check=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "buckets.npy"
        np.save(data, buckets.astype(np.int64))
        job = Path(tmp) / "job.json"
        out = Path(tmp) / "out.json"
        job.write_text(
            json.dumps(
                {
                    "data": str(data),
                    "b": spec.k,
                    "d": spec.d,
                    "epsilon": args.epsilon,
                    "repeats": args.repeats,
                    "seed": args.seed,
                    "out": str(out),
                }
            )
        )
        subprocess.run(
            [py.stdout.strip().splitlines()[-1], str(ROOT / "benchmarks" / "mfl_side.py"), str(job)], check=True
        )
        theirs = json.loads(out.read_text())["runs"]
    for r in theirs:
        r["mse"] = float(np.sum((np.array(r["shares"]) - truth) ** 2))
        del r["shares"]

    def med(runs: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    n = args.users
    rows = {
        "ours": {
            "encode_per_s": n / med(ours, "encode"),
            "aggregate_per_s": n / med(ours, "aggregate"),
            "mse": med(ours, "mse"),
            "mse_clipped": med(ours, "mse_clipped"),
        },
        "multi-freq-ldpy": {
            "encode_per_s": n / med(theirs, "encode"),
            "aggregate_per_s": n / med(theirs, "aggregate"),
            "mse": med(theirs, "mse"),
        },
    }
    print(
        f"dBitFlip, {n:,} users, k = {spec.k} buckets, d = {spec.d}, ε = {args.epsilon:g}, "
        f"median of {args.repeats} (theory: Σ Var = {theory:.3g})"
    )
    print(f"{'':>16} {'encode users/s':>15} {'aggregate users/s':>18} {'MSE unbiased':>13} {'MSE clipped':>12}")
    o = rows["ours"]
    print(
        f"{'ours':>16} {o['encode_per_s']:>15,.0f} {o['aggregate_per_s']:>18,.0f} {o['mse']:>13.3g} "
        f"{o['mse_clipped']:>12.3g}"
    )
    t = rows["multi-freq-ldpy"]
    print(
        f"{'multi-freq-ldpy':>16} {t['encode_per_s']:>15,.0f} {t['aggregate_per_s']:>18,.0f} {'-':>13} {t['mse']:>12.3g}"
    )
    print(
        f"ratios (ours / theirs): encode {o['encode_per_s'] / t['encode_per_s']:.0f}x, "
        f"aggregate {o['aggregate_per_s'] / t['aggregate_per_s']:.0f}x; ours alone at {args.ours_users:,} users: "
        f"encode {ours_rate['encode'] / 1e6:.2f} M/s, aggregate {ours_rate['aggregate'] / 1e6:.1f} M/s"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"args": vars(args), "theory_mse": theory, "rows": rows, "ours_alone": ours_rate}, indent=1)
    )


if __name__ == "__main__":
    main()
