"""First-estimate cost of RAPPOR decoding in a process: cold vs warm design cache.

For each ``--d`` (default RAPPOR parameters, ε = 2) and each of ``--repeats``
rounds, on a fresh spec object each time (so no per-spec memory cache
helps), the time of one ``RapporAccumulator.estimate()`` over 10,000 reports:

* ``before``: the design built by the numpy reference
  (``ldp_core.mechanisms.rappor.RapporDesign``), what every process paid
  before the disk cache;
* ``cold``: :mod:`estimator.oracles.rappor_design` with an empty cache
  directory (sparse build, Cholesky, inverse from the factor, file written);
* ``warm``: the in-process LRU emptied but the file present (what a new
  process pays once any process has decoded the spec);
* ``memory``: the in-process LRU hit.

Printed: the median and the min of each, in milliseconds. The cache directory is
a temporary one (``LDP_CACHE_DIR`` is set for this process only).

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_rappor_decode.py --d 256,1024 --repeats 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np

from estimator.oracles import rappor_design as rd
from estimator.oracles.rappor import RapporAccumulator
from ldp_core.mechanisms import make_spec
from ldp_core.mechanisms.rappor import RapporDesign


def _timed(fn) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", default="256,1024")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="ldp-bench-rappor-")
    os.environ["LDP_CACHE_DIR"] = root
    try:
        for d in [int(x) for x in args.d.split(",")]:
            rng = np.random.default_rng(d)
            base = make_spec("rappor", epsilon=2.0, domain_size=d)
            records = base.encode(rng.integers(0, d, size=10_000), rng)
            times: dict[str, list[float]] = {"before": [], "cold": [], "warm": [], "memory": []}

            def estimate_with(spec, records=records):  # type: ignore[no-untyped-def]
                acc = RapporAccumulator(spec)
                acc.update(records)
                return acc.estimate()

            for _ in range(args.repeats):
                spec = make_spec("rappor", epsilon=2.0, domain_size=d)

                # Each closure is timed at once, in its own iteration; the defaults bind the loop's values.
                def reference(spec: Any = spec, d: int = d, records: np.ndarray = records) -> None:
                    design = RapporDesign(spec, np.arange(d))
                    acc = RapporAccumulator(spec)
                    acc.update(records)
                    design.counts(acc.sums["ones"], acc.sums["cohort_counts"])
                    design.variance(np.full(d, 10.0))

                times["before"].append(_timed(reference))
                shutil.rmtree(os.path.join(root, "rappor"), ignore_errors=True)
                rd.clear_memory_cache()
                times["cold"].append(_timed(lambda d=d: estimate_with(make_spec("rappor", epsilon=2.0, domain_size=d))))
                rd.clear_memory_cache()
                times["warm"].append(_timed(lambda d=d: estimate_with(make_spec("rappor", epsilon=2.0, domain_size=d))))
                times["memory"].append(
                    _timed(lambda d=d: estimate_with(make_spec("rappor", epsilon=2.0, domain_size=d)))
                )
            size = os.path.getsize(rd.cache_path(base, np.arange(d)))
            cells = "  ".join(
                f"{k} {1e3 * statistics.median(v):8.1f} ms (min {1e3 * min(v):7.1f})" for k, v in times.items()
            )
            print(f"d={d:5d} m={base.num_cohorts} k={base.num_bits}  {cells}  file {size / 2**20:.1f} MiB")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
