"""Heavy-hitter discovery (PEM) on the default engine and on Spark ``local[2]``, side by side.

A seeded population of 1,000 random lower-case words of 3-8 letters, Zipf(1.1) over the words,
reports ``--reports`` times through PEM (ε = 4, 8 bytes, 12 + 13 × 4 bits:
14 levels, 4,096 first-level keys, then 2 × top kept prefixes × 16), in part files of ``--file-reports`` reports over ``--days`` days,
written as :mod:`benchmarks.bench_spark` writes its own. Three engines
discover the top ``--top`` words over all days:

* **default**: :func:`estimator.heavy_hitters_batch.discover_dataset` in this process;
* **spark**: :func:`estimator.heavy_hitters_spark.discover_spark` with
  ``cache_levels=False``: one job per level, each reading every file again;
* **spark-cached**: the same with ``cache_levels=True`` (the default): one
  job reads the files and keeps the reports in the executors split by level,
  then one job per level over that level's cached arrays.

An untimed run of each comes first; then ``--repeats`` timed runs alternate
between the three. Each run's table is checked against the default engine's
(exactly). Medians go to ``benchmarks/results/spark_hh.json``.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_spark_hh.py --reports 1000000 10000000 --repeats 3 2 --delete
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

from client_sdk.heavy_hitters import PEMSpec, pad_values
from estimator.heavy_hitters import Discovery
from estimator.heavy_hitters_batch import discover_dataset
from estimator.heavy_hitters_spark import discover_spark
from estimator.spark import SparkEngine, spark_session
from pipeline.dataset import FORMAT, PartFile, list_parts, part_name, records_to_table, write_table_atomic

FIRST_DAY = 20400
METRIC = "search"
SPEC = PEMSpec(epsilon=4.0, length=8, start_bits=12, step_bits=4)


def vocabulary(rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` distinct lower-case ASCII words of 3 to 8 letters, padded (PEM discovers valid padded UTF-8)."""
    words: set[str] = set()
    while len(words) < size:
        n = int(rng.integers(3, SPEC.length + 1))
        words.add("".join(chr(97 + int(c)) for c in rng.integers(0, 26, size=n)))
    return pad_values(sorted(words), SPEC.length)


def write_dataset(root: Path, reports: int, days: int, per_file: int, seed: int) -> dict[str, Any]:
    want = {"reports": reports, "days": days, "per_file": per_file, "seed": seed, "format": FORMAT, "gen": 2}
    stamp = root / "_bench.json"
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return want
    shutil.rmtree(root, ignore_errors=True)
    words = vocabulary(np.random.default_rng(seed), 1000)
    w = 1.0 / np.arange(1, words.shape[0] + 1) ** 1.1
    cdf = np.cumsum(w / w.sum())
    for i, start in enumerate(range(0, reports, per_file)):
        n = min(per_file, reports - start)
        rng = np.random.default_rng([seed, i])
        items = np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), words.shape[0] - 1)
        day = FIRST_DAY + i % days
        table = records_to_table(SPEC.encode(words[items], rng), SPEC).replace_schema_metadata(
            {
                "ldp.format": FORMAT,
                "ldp.metric": METRIC,
                "ldp.day": str(day),
                "ldp.spec": json.dumps(SPEC.to_dict(), sort_keys=True),
                "ldp.spec_id": SPEC.spec_id,
                "ldp.source": json.dumps({"topic": "bench", "partition": 0, "first": i, "last": i}),
                "ldp.shuffles": json.dumps([{"offset": i, "reports": n}], sort_keys=True),
            }
        )
        write_table_atomic(root / f"metric={METRIC}" / f"day={day}" / part_name("bench", 0, i, i, SPEC.spec_id), table)
    stamp.write_text(json.dumps(want))
    return want


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--reports", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--repeats", type=int, nargs="+", default=[3])
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--days", type=int, default=4)
    ap.add_argument("--file-reports", type=int, default=250_000)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--data", default=".cache/bench-spark-hh")
    ap.add_argument("--delete", action="store_true", help="delete each dataset after its runs")
    ap.add_argument("--out", default="benchmarks/results/spark_hh.json")
    args = ap.parse_args()
    repeats = args.repeats * len(args.reports) if len(args.repeats) == 1 else args.repeats
    if len(repeats) != len(args.reports):
        ap.error("--repeats takes one count, or one per --reports size")

    t0 = time.perf_counter()
    spark = spark_session(args.master, app_name="bench-spark-hh", conf={"spark.driver.memory": "2g"})
    startup = time.perf_counter() - t0
    engine = SparkEngine(spark)
    sizes: dict[str, Any] = {}
    for k, (reports, reps) in enumerate(zip(args.reports, repeats)):
        root = Path(args.data) / f"n{reports}"
        t0 = time.perf_counter()
        params = write_dataset(root, reports, args.days, args.file_reports, seed=11)
        made = time.perf_counter() - t0
        parts = list_parts(root, METRIC)

        def default(root: Path = root) -> list[tuple[Any, ...]]:
            return found(discover_dataset(root, METRIC, None, top=args.top).discovery, args.top)

        def on_spark(cache: bool, parts: list[PartFile] = parts) -> list[tuple[Any, ...]]:
            disc, _ = discover_spark(engine, METRIC, SPEC, parts, args.top, cache_levels=cache)
            return found(disc, args.top)

        runs = {"default": default, "spark": lambda: on_spark(False), "spark-cached": lambda: on_spark(True)}
        want = default()
        if not want:
            raise SystemExit("bench_spark_hh: the default engine found no word: nothing to compare")
        if k == 0:
            for run in runs.values():
                run()  # warm-up
        times: dict[str, list[float]] = {name: [] for name in runs}
        load = [os.getloadavg()[0]]
        for _ in range(reps):
            for name, run in runs.items():
                t = time.perf_counter()
                got = run()
                times[name].append(time.perf_counter() - t)
                load.append(os.getloadavg()[0])
                check(name, got, want)
            print(f"bench_spark_hh: n={reports:,}: {times} load {load}", file=sys.stderr)
        sizes[str(reports)] = {
            "params": {**params, "repeats": reps, "dataset_s": made, "files": len(parts), "top": args.top},
            "found": len(want),  # words in the top list, with their estimates checked equal
            "load_avg_1m": load,
            "results": {
                name: {
                    "seconds": ts,
                    "median_s": statistics.median(ts),
                    "reports_per_s": reports / statistics.median(ts),
                }
                for name, ts in times.items()
            },
        }
        if args.delete:
            shutil.rmtree(root)
    spark.stop()
    record = {
        "spec": SPEC.to_dict(),
        "master": args.master,
        "spark_startup_s": startup,
        "sizes": sizes,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0]},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    print(f"{'reports':>12} {'engine':13} {'median s':>9} {'reports/s':>12} runs")
    for reports, size in sizes.items():
        for name, x in size["results"].items():
            n = int(reports)
            print(f"{n:12,} {name:13} {x['median_s']:9.2f} {x['reports_per_s']:12,.0f} {len(x['seconds'])}")
    print(f"spark session start-up: {startup:.1f} s")


def found(disc: Discovery, top: int) -> list[tuple[Any, ...]]:
    """The top words with their estimates and intervals: what must be equal bit for bit."""
    return [(h.raw, h.estimate, h.variance, h.ci_low, h.ci_high) for h in disc.top(top)]


def check(name: str, got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    if got != want:
        raise AssertionError(f"{name}: the discovery differs from the default engine's")


if __name__ == "__main__":
    main()
