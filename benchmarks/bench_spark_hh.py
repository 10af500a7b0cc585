"""Heavy-hitter discovery (PEM) on the default engine and on Spark ``local[2]``, side by side.

A seeded population of 1,000 random lower-case words of 3-8 letters, Zipf(1.1) over the words,
reports ``--reports`` times through PEM (ε = 4, 8 bytes, 12 + 13 × 4 bits:
14 levels, 4,096 first-level keys, then 2 × top kept prefixes × 16), in part files of ``--file-reports`` reports over ``--days`` days,
written as :mod:`benchmarks.bench_spark` writes its own. Three engines
discover the top ``--top`` words over all days:

* **default**: :func:`estimator.jobs.heavy_hitters.discover_dataset` in this process;
* **spark**: :func:`estimator.jobs.heavy_hitters_spark.discover_spark` with
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
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from estimator.jobs.heavy_hitters import discover_dataset
from estimator.jobs.heavy_hitters_spark import discover_spark
from estimator.mechanisms.heavy_hitters import Discovery
from ldp_core.mechanisms.heavy_hitters import PEMSpec, pad_values
from pipeline.dataset import FORMAT, PartFile, list_parts

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import spark_common as common  # noqa: E402

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
    for i, start in enumerate(range(0, reports, per_file)):
        n = min(per_file, reports - start)
        rng = np.random.default_rng([seed, i])
        items = common.zipf_items(rng, words.shape[0], n)
        common.write_part(root, METRIC, SPEC, common.FIRST_DAY + i % days, i, SPEC.encode(words[items], rng))
    stamp.write_text(json.dumps(want))
    return want


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    common.add_common_args(ap, reports=1_000_000, data=".cache/bench-spark-hh", out="benchmarks/results/spark_hh.json")
    ap.add_argument("--top", type=int, default=10)
    args = ap.parse_args()
    repeats = common.repeats_per_size(ap, args)

    spark, engine, startup = common.start_spark(args.master, "bench-spark-hh")
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
        load = [os.getloadavg()[0]]

        def check_run(name: str, got: list[tuple[Any, ...]], want: list[tuple[Any, ...]] = want) -> None:
            check(name, got, want)

        times = common.timed_runs(runs, reps, check_run, f"bench_spark_hh: n={reports:,}", load)
        sizes[str(reports)] = {
            "params": {**params, "repeats": reps, "dataset_s": made, "files": len(parts), "top": args.top},
            "found": len(want),  # words in the top list, with their estimates checked equal
            "load_avg_1m": load,
            "results": common.medians(times, reports),
        }
        if args.delete:
            shutil.rmtree(root)
    spark.stop()
    common.save_record(
        args.out, {"spec": SPEC.to_dict(), "master": args.master, "spark_startup_s": startup, "sizes": sizes}
    )
    rows = [(int(reports), (name,), x) for reports, size in sizes.items() for name, x in size["results"].items()]
    common.print_table([("engine", 13)], rows, startup)


def found(disc: Discovery, top: int) -> list[tuple[Any, ...]]:
    """The top words with their estimates and intervals: what must be equal bit for bit."""
    return [(h.raw, h.estimate, h.variance, h.ci_low, h.ci_high) for h in disc.top(top)]


def check(name: str, got: list[tuple[Any, ...]], want: list[tuple[Any, ...]]) -> None:
    if got != want:
        raise AssertionError(f"{name}: the discovery differs from the default engine's")


if __name__ == "__main__":
    main()
