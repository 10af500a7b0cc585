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

``--reports`` takes several sizes, run one after the other in one Spark
session (``--repeats``: one count, or one per size). One untimed run of
each engine comes before the first size only (numba compile or cache load,
JVM and worker warm-up); then the timed runs alternate between the engines,
so load from other processes falls on both alike, and the load average is
recorded before and after each. Part files are written by ``--jobs``
processes, each file from its own generator seeded by (seed, metric, file). The figure is
the median wall time and reports per second; the session's start-up time
is measured once and reported apart. Every Spark run's counts are checked
against the default engine's (bit for bit).

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_spark.py --reports 10000000 100000000 --repeats 3 1 --delete

Results go to ``benchmarks/results/spark.json``; a table to stdout. ``--delete``
removes each dataset after its runs (10⁸ reports per metric are about 0.9 GB).
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
from concurrent.futures import ProcessPoolExecutor
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


def _write_part(root: Path, metric: str, d: int, days: int, seed: int, i: int, n: int) -> None:
    """Part file ``i`` of ``metric``: its own generator, seeded by (seed, metric, i), so files can be written
    in any order and in parallel and the dataset is the same."""
    spec = specs(d)[metric]
    rng = np.random.default_rng([seed, list(specs(d)).index(metric), i])
    w = 1.0 / np.arange(1, d + 1) ** 1.1
    cdf = np.cumsum(w / w.sum())
    items = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), d - 1)  # inverse-CDF Zipf draw
    day = FIRST_DAY + i % days
    table = records_to_table(spec.encode(items, rng), spec)
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


def write_dataset(
    root: Path, reports: int, d: int, days: int, per_file: int, seed: int, jobs: int = 1
) -> dict[str, Any]:
    """The dataset (see the module docstring), written by ``jobs`` processes, one part file per call;
    kept and reused when its ``_bench.json`` matches."""
    want = {"reports": reports, "d": d, "days": days, "per_file": per_file, "seed": seed, "format": FORMAT, "gen": 2}
    stamp = root / "_bench.json"
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return want
    shutil.rmtree(root, ignore_errors=True)
    sizes = [min(per_file, reports - start) for start in range(0, reports, per_file)]
    work = [(metric, i, n) for metric in specs(d) for i, n in enumerate(sizes)]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(_write_part, root, metric, d, days, seed, i, n) for metric, i, n in work]
        for k, fut in enumerate(futures, 1):
            fut.result()
            if k % 40 == 0 or k == len(futures):
                print(f"bench_spark: wrote {k}/{len(futures)} part files", file=sys.stderr)
    stamp.write_text(json.dumps(want))
    return want


def run_size(engine: SparkEngine, root: Path, reports: int, d: int, repeats: int, warm_up: bool) -> dict[str, Any]:
    """Both engines over every metric of the dataset at ``root``: ``repeats`` timed runs each, alternating."""
    results: dict[str, Any] = {}
    for metric in specs(d):
        times: dict[str, list[float]] = {"default": [], "spark": []}
        load: list[float] = [os.getloadavg()[0]]
        want = None
        if warm_up:
            want = estimate_dataset(root, metric, progress=False)  # numba cache load, page cache
            got = estimate_dataset(root, metric, progress=False, engine=engine)  # JVM, workers
            assert got.n == want.n == reports
        for _ in range(repeats):
            for name, eng in (("default", accumulate), ("spark", engine)):
                t = time.perf_counter()
                res = estimate_dataset(root, metric, progress=False, engine=eng)
                times[name].append(time.perf_counter() - t)
                load.append(os.getloadavg()[0])
                assert res.n == reports
                if want is None:
                    want = res  # the default engine's, which runs first
                np.testing.assert_array_equal(res.table["estimate"].to_numpy(), want.table["estimate"].to_numpy())
            print(f"bench_spark: n={reports:,} {metric}: {times} load {load}", file=sys.stderr)
        results[metric] = {
            name: {
                "seconds": ts,
                "median_s": statistics.median(ts),
                "reports_per_s": reports / statistics.median(ts),
            }
            for name, ts in times.items()
        }
        assert want is not None
        results[metric]["files"] = want.files
        results[metric]["load_avg_1m"] = load
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--reports", type=int, nargs="+", default=[10_000_000], help="reports per metric (sizes)")
    ap.add_argument("--repeats", type=int, nargs="+", default=[3], help="timed runs, one per size or one for all")
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--days", type=int, default=4)
    ap.add_argument("--file-reports", type=int, default=250_000, help="reports per part file")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes writing the dataset")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--data", default=".cache/bench-spark", help="where the datasets are kept between runs")
    ap.add_argument("--delete", action="store_true", help="delete each dataset after its runs")
    ap.add_argument("--out", default="benchmarks/results/spark.json")
    args = ap.parse_args()
    repeats = args.repeats * len(args.reports) if len(args.repeats) == 1 else args.repeats
    if len(repeats) != len(args.reports):
        ap.error("--repeats takes one count, or one per --reports size")

    t0 = time.perf_counter()
    spark = spark_session(args.master, app_name="bench-spark", conf={"spark.driver.memory": "2g"})
    startup = time.perf_counter() - t0
    engine = SparkEngine(spark)
    sizes: dict[str, Any] = {}
    for k, (reports, reps) in enumerate(zip(args.reports, repeats)):
        root = Path(args.data) / f"n{reports}-d{args.d}"
        t0 = time.perf_counter()
        params = write_dataset(root, reports, args.d, args.days, args.file_reports, seed=7, jobs=args.jobs)
        made = time.perf_counter() - t0
        print(f"bench_spark: dataset ready in {made:.1f} s at {root}", file=sys.stderr)
        # one untimed run of each engine before the first size only: later sizes reuse the warm process
        sizes[str(reports)] = {
            "params": {**params, "repeats": reps, "dataset_s": made},
            "results": run_size(engine, root, reports, args.d, reps, warm_up=k == 0),
        }
        if args.delete:
            shutil.rmtree(root)
    spark.stop()
    record = {
        "master": args.master,
        "reader": engine.reader,
        "spark_startup_s": startup,
        "sizes": sizes,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0]},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"{'reports':>12} {'metric':6} {'engine':8} {'median s':>9} {'reports/s':>12} runs")
    for reports, size in sizes.items():
        for metric, r in size["results"].items():
            for name in ("default", "spark"):
                x = r[name]
                n = int(reports)
                print(
                    f"{n:12,} {metric:6} {name:8} {x['median_s']:9.2f} {x['reports_per_s']:12,.0f} {len(x['seconds'])}"
                )
    print(f"spark session start-up: {startup:.1f} s")


if __name__ == "__main__":
    main()
