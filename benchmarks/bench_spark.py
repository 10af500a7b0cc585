"""Batch estimation on the default engine and on Spark ``local[2]``, side by side, on one dataset.

A seeded population (Zipf(1.1) over ``--d`` items) reports ``--reports``
times per metric through two mechanisms, OLH (d = ``--d``) and HCMS (the
same d, 256 rows of width 1,024), spread over ``--days`` days in part files
of ``--file-reports`` reports each, written in the Parquet sink's format
(:mod:`pipeline.dataset`: the same columns, names and footer metadata; the
reports are made by the real encoders, not passed through a transport and
the sink, which would take longer than the benchmark). Both engines then
run :func:`estimator.batch.estimate_dataset` over every day of each metric:

* **default**: :func:`estimator.batch.accumulate` in this process (numba's
  parallel kernels on every core);
* **spark**: :class:`estimator.spark.SparkEngine` on a ``local[2]`` session
  (two task slots, one numba thread each).

One untimed run of each comes first (numba compile or cache load, JVM and
worker warm-up); then ``--repeats`` timed runs alternate between the
engines, so load from other processes falls on both alike. The figure is
the median wall time and reports per second; the session's start-up time
is measured once and reported apart. Every Spark run's counts are checked
against the default engine's (bit for bit).

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_spark.py --reports 10000000 --repeats 3

Results go to ``benchmarks/results/spark.json``; a table to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from client_sdk.mechanisms import make_spec
from client_sdk.mechanisms.base import MechanismSpec
from estimator.batch import accumulate, estimate_dataset
from estimator.spark import SparkEngine, spark_session
from pipeline.dataset import FORMAT, part_name, records_to_table, write_table_atomic

FIRST_DAY = 20400


def specs(d: int) -> dict[str, MechanismSpec]:
    return {
        "olh": make_spec("olh", epsilon=2.0, domain_size=d),  # type: ignore[dict-item]
        "hcms": make_spec("hcms", epsilon=2.0, domain_size=d, num_hashes=256, width=1024),  # type: ignore[dict-item]
    }


def write_dataset(root: Path, reports: int, d: int, days: int, per_file: int, seed: int) -> dict[str, Any]:
    """The dataset (see the module docstring); kept and reused when its ``_bench.json`` matches."""
    want = {"reports": reports, "d": d, "days": days, "per_file": per_file, "seed": seed, "format": FORMAT}
    stamp = root / "_bench.json"
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return want
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, d + 1) ** 1.1
    p = w / w.sum()
    for metric, spec in specs(d).items():
        left, i = reports, 0
        while left:
            n = min(per_file, left)
            day = FIRST_DAY + i % days
            table = records_to_table(spec.encode(rng.choice(d, size=n, p=p), rng), spec)
            table = table.replace_schema_metadata(
                {
                    "ldp.format": FORMAT,
                    "ldp.metric": metric,
                    "ldp.day": str(day),
                    "ldp.spec": json.dumps(spec.to_dict(), sort_keys=True),
                    "ldp.spec_id": spec.spec_id,
                    "ldp.source": json.dumps({"topic": "bench", "partition": 0, "first": i, "last": i}),
                    "ldp.shuffles": json.dumps([{"offset": i, "reports": n}], sort_keys=True),
                }
            )
            name = part_name("bench", 0, i, i, spec.spec_id)
            write_table_atomic(root / f"metric={metric}" / f"day={day}" / name, table)
            left -= n
            i += 1
        print(f"bench_spark: wrote {reports:,} {metric} reports", file=sys.stderr)
    stamp.write_text(json.dumps(want))
    return want


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--reports", type=int, default=10_000_000, help="reports per metric")
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--days", type=int, default=4)
    ap.add_argument("--file-reports", type=int, default=250_000, help="reports per part file")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--data", default=".cache/bench-spark", help="where the dataset is kept between runs")
    ap.add_argument("--out", default="benchmarks/results/spark.json")
    args = ap.parse_args()

    root = Path(args.data) / f"n{args.reports}-d{args.d}"
    t0 = time.perf_counter()
    params = write_dataset(root, args.reports, args.d, args.days, args.file_reports, seed=7)
    print(f"bench_spark: dataset ready in {time.perf_counter() - t0:.1f} s at {root}", file=sys.stderr)

    t0 = time.perf_counter()
    spark = spark_session(args.master, app_name="bench-spark", conf={"spark.driver.memory": "2g"})
    startup = time.perf_counter() - t0
    engine = SparkEngine(spark)
    results: dict[str, Any] = {}
    for metric in specs(args.d):
        times: dict[str, list[float]] = {"default": [], "spark": []}
        want = estimate_dataset(root, metric, progress=False)  # warm-up (numba cache load, page cache)
        got = estimate_dataset(root, metric, progress=False, engine=engine)  # warm-up (JVM, workers)
        assert got.n == want.n == args.reports
        for _ in range(args.repeats):
            for name, eng in (("default", accumulate), ("spark", engine)):
                t = time.perf_counter()
                res = estimate_dataset(root, metric, progress=False, engine=eng)
                times[name].append(time.perf_counter() - t)
                np.testing.assert_array_equal(res.table["estimate"].to_numpy(), want.table["estimate"].to_numpy())
            print(f"bench_spark: {metric}: {times}", file=sys.stderr)
        results[metric] = {
            name: {
                "seconds": ts,
                "median_s": statistics.median(ts),
                "reports_per_s": args.reports / statistics.median(ts),
            }
            for name, ts in times.items()
        }
        results[metric]["files"] = want.files
    spark.stop()
    record = {
        "params": {**params, "repeats": args.repeats, "master": args.master},
        "spark_startup_s": startup,
        "results": results,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0]},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"{'metric':8} {'engine':8} {'median s':>9} {'reports/s':>12}")
    for metric, r in results.items():
        for name in ("default", "spark"):
            print(f"{metric:8} {name:8} {r[name]['median_s']:9.2f} {r[name]['reports_per_s']:12,.0f}")
    print(f"spark session start-up: {startup:.1f} s")


if __name__ == "__main__":
    main()
