"""Batch estimation on the default engine and on Spark ``local[2]``, side by side, on one dataset.

A seeded population (Zipf(1.1) over ``--d`` items) reports ``--reports``
times per metric through two mechanisms, OLH (d = ``--d``) and HCMS (the
same d, 256 rows of width 1,024), spread over ``--days`` days in part files
of ``--file-reports`` reports each, written in the Parquet sink's format
(:mod:`pipeline.dataset`: the same columns, names and footer metadata; the
reports are made by the real encoders, not passed through a transport and
the sink, which would take longer than the benchmark). Both engines then
run :func:`estimator.jobs.batch.estimate_dataset` over every day of each metric:

* **default**: :func:`estimator.jobs.batch.accumulate` in this process (numba's
  parallel kernels on every core);
* **spark**: :class:`estimator.jobs.spark.SparkEngine` on a ``local[2]`` session
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
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from estimator.jobs.batch import BatchResult, accumulate, estimate_dataset
from estimator.jobs.spark import SparkEngine
from ldp_core.mechanisms import make_spec
from ldp_core.mechanisms.base import MechanismSpec
from pipeline.dataset import FORMAT

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import spark_common as common  # noqa: E402


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
    items = common.zipf_items(rng, d, n)
    common.write_part(root, metric, spec, common.FIRST_DAY + i % days, i, spec.encode(items, rng))


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
        load: list[float] = [os.getloadavg()[0]]
        want: BatchResult | None = None
        if warm_up:
            want = estimate_dataset(root, metric, progress=False)  # numba cache load, page cache
            got = estimate_dataset(root, metric, progress=False, engine=engine)  # JVM, workers
            assert got.n == want.n == reports

        def check(name: str, res: BatchResult) -> None:
            nonlocal want
            assert res.n == reports
            if want is None:
                want = res  # the default engine's, which runs first
            np.testing.assert_array_equal(res.table["estimate"].to_numpy(), want.table["estimate"].to_numpy())

        runs = {
            name: (lambda m=metric, e=eng: estimate_dataset(root, m, progress=False, engine=e))
            for name, eng in (("default", accumulate), ("spark", engine))
        }
        times = common.timed_runs(runs, repeats, check, f"bench_spark: n={reports:,} {metric}", load)
        results[metric] = common.medians(times, reports)
        assert want is not None
        results[metric]["files"] = want.files
        results[metric]["load_avg_1m"] = load
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    common.add_common_args(ap, reports=10_000_000, data=".cache/bench-spark", out="benchmarks/results/spark.json")
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes writing the dataset")
    args = ap.parse_args()
    repeats = common.repeats_per_size(ap, args)

    spark, engine, startup = common.start_spark(args.master, "bench-spark")
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
    common.save_record(
        args.out, {"master": args.master, "reader": engine.reader, "spark_startup_s": startup, "sizes": sizes}
    )
    rows = [
        (int(reports), (metric, name), r[name])
        for reports, size in sizes.items()
        for metric, r in size["results"].items()
        for name in ("default", "spark")
    ]
    common.print_table([("metric", 6), ("engine", 8)], rows, startup)


if __name__ == "__main__":
    main()
