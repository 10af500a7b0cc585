"""What ``bench_spark.py`` and ``bench_spark_hh.py`` share: their common flags, the Spark session,
part files in the Parquet sink's format, the alternating timed runs, the record and the table.

Not a benchmark of its own; the two scripts import it (``from benchmarks.spark_common import ...``,
with the repository root on ``sys.path``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from estimator.jobs.spark import SparkEngine, spark_session
from ldp_core.mechanisms.base import ReportSpec
from pipeline.dataset import FORMAT, part_name, records_to_table, write_table_atomic

FIRST_DAY = 20400

T = TypeVar("T")


def add_common_args(ap: argparse.ArgumentParser, *, reports: int, data: str, out: str) -> None:
    """The flags both scripts take, with the script's own defaults for ``--reports``, ``--data`` and ``--out``."""
    ap.add_argument("--reports", type=int, nargs="+", default=[reports], help="reports per metric (sizes)")
    ap.add_argument("--repeats", type=int, nargs="+", default=[3], help="timed runs, one per size or one for all")
    ap.add_argument("--days", type=int, default=4)
    ap.add_argument("--file-reports", type=int, default=250_000, help="reports per part file")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--data", default=data, help="where the datasets are kept between runs")
    ap.add_argument("--delete", action="store_true", help="delete each dataset after its runs")
    ap.add_argument("--out", default=out)


def repeats_per_size(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    """``--repeats``: one count for every ``--reports`` size, or one per size (an error otherwise)."""
    repeats: list[int] = args.repeats * len(args.reports) if len(args.repeats) == 1 else args.repeats
    if len(repeats) != len(args.reports):
        ap.error("--repeats takes one count, or one per --reports size")
    return repeats


def start_spark(master: str, app_name: str) -> tuple[Any, SparkEngine, float]:
    """The session (2 GB driver), its engine, and the seconds the start-up took."""
    t0 = time.perf_counter()
    spark = spark_session(master, app_name=app_name, conf={"spark.driver.memory": "2g"})
    return spark, SparkEngine(spark), time.perf_counter() - t0


def zipf_items(rng: np.random.Generator, d: int, n: int) -> np.ndarray:
    """``n`` draws of Zipf(1.1) over ``0..d-1`` (inverse-CDF draw)."""
    w = 1.0 / np.arange(1, d + 1) ** 1.1
    cdf = np.cumsum(w / w.sum())
    return np.minimum(np.searchsorted(cdf, rng.random(n), side="right"), d - 1)


def write_part(root: Path, metric: str, spec: ReportSpec, day: int, i: int, records: np.ndarray) -> None:
    """Part file ``i`` of ``metric`` on ``day`` with the sink's columns, name and footer metadata."""
    table = records_to_table(records, spec).replace_schema_metadata(
        {
            "ldp.format": FORMAT,
            "ldp.metric": metric,
            "ldp.day": str(day),
            "ldp.spec": json.dumps(spec.to_dict(), sort_keys=True),
            "ldp.spec_id": spec.spec_id,
            "ldp.source": json.dumps({"topic": "bench", "partition": 0, "first": i, "last": i}),
            "ldp.shuffles": json.dumps([{"offset": i, "reports": len(records)}], sort_keys=True),
        }
    )
    write_table_atomic(root / f"metric={metric}" / f"day={day}" / part_name("bench", 0, i, i, spec.spec_id), table)


def timed_runs(
    runs: Mapping[str, Callable[[], T]],
    repeats: int,
    check: Callable[[str, T], None],
    label: str,
    load: list[float],
) -> dict[str, list[float]]:
    """``repeats`` rounds of every run in turn (so load from other processes falls on all alike), each
    checked with ``check(name, result)``; the 1-minute load average is appended to ``load`` after each."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            t = time.perf_counter()
            got = run()
            times[name].append(time.perf_counter() - t)
            load.append(os.getloadavg()[0])
            check(name, got)
        print(f"{label}: {times} load {load}", file=sys.stderr)
    return times


def medians(times: Mapping[str, list[float]], reports: int) -> dict[str, dict[str, Any]]:
    """Per engine: the run times, their median and the reports per second at the median."""
    return {
        name: {"seconds": ts, "median_s": statistics.median(ts), "reports_per_s": reports / statistics.median(ts)}
        for name, ts in times.items()
    }


def save_record(path: str, record: dict[str, Any]) -> None:
    """``record`` and the machine (CPUs, Python, load average now) as JSON at ``path``."""
    record = {
        **record,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0]},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(record, indent=2) + "\n")


def print_table(
    labels: Sequence[tuple[str, int]], rows: Iterable[tuple[int, Sequence[str], Mapping[str, Any]]], startup: float
) -> None:
    """The medians' table: one row per (size, labels), label columns of the given widths; then the start-up."""
    print(
        f"{'reports':>12} " + "".join(f"{name:{w}} " for name, w in labels) + f"{'median s':>9} {'reports/s':>12} runs"
    )
    for n, keys, x in rows:
        cols = "".join(f"{k:{w}} " for k, (_, w) in zip(keys, labels))
        print(f"{n:12,} {cols}{x['median_s']:9.2f} {x['reports_per_s']:12,.0f} {len(x['seconds'])}")
    print(f"spark session start-up: {startup:.1f} s")
