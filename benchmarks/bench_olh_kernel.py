"""Throughput of the OLH support-count kernel and of the OLH batch encoder.

The kernel (:func:`estimator.kernels.olh.olh_support_counts`) evaluates
``reduce_range(xxh32_u32(x, seed_i), g) == y_i`` for every report i and every
domain item x: n·d hash evaluations. For 1 and 2 numba threads
(``numba.set_num_threads``) it is warmed up once, then timed ``--repeats``
times; the figure printed is n·d / median wall time, then n·d per second
of process CPU time (per-core rate; other load on the machine does not
dilute it, though it still shares caches). The numba threading layer in use
is printed too. The encoder line is reports per second of
``OLHSpec.encode`` (median of the same number of repeats).

The last line times the first OLH kernel calls (serial and parallel paths)
in two fresh interpreters that share one empty numba cache directory: the
first compiles, the second must only load the cache (``cache=True``). Each
child first calls a trivial cached kernel, so numba's own start-up (target
initialization, a second or two on a loaded machine) is shown apart.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_olh_kernel.py --n 1000000 --d 1024 --repeats 5

The machine is shared, so wall-clock medians move with its load; compare
figures taken together.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

from estimator.kernels.olh import olh_support_counts
from ldp_core.mechanisms.olh import OLHSpec

ROOT = Path(__file__).resolve().parents[1]

FIRST_CALL = """
import time
import numpy as np
from estimator.kernels.counting import histogram
t0 = time.perf_counter()
histogram(np.zeros(8, dtype=np.uint8), np.zeros(4, dtype=np.int64))
t1 = time.perf_counter()
from estimator.kernels.olh import olh_support_counts
olh_support_counts(np.arange(5000, dtype=np.uint32), np.zeros(5000, dtype=np.uint8), 4, 64)
olh_support_counts(np.arange(1 << 16, dtype=np.uint32), np.zeros(1 << 16, dtype=np.uint8), 4, 1024)
t2 = time.perf_counter()
print(f"{t1 - t0:.3f} {t2 - t1:.3f}")
"""


def time_kernel(spec: OLHSpec, records: np.ndarray, repeats: int) -> tuple[list[float], list[float]]:
    """Wall and process CPU seconds of each timed run (after one warm-up run)."""
    olh_support_counts(records["seed"], records["y"], spec.hash_range, spec.domain_size)
    wall, cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        olh_support_counts(records["seed"], records["y"], spec.hash_range, spec.domain_size)
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def first_call_seconds(cache_dir: str) -> tuple[float, float]:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    out = subprocess.run(
        [sys.executable, "-c", FIRST_CALL], env=env, cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    return float(out[0]), float(out[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="reports (default 10^6)")
    ap.add_argument("--d", type=int, default=1024, help="domain size (default 1024)")
    ap.add_argument("--epsilon", type=float, default=2.0, help="ε (default 2; g = round(e^ε) + 1)")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per setting (default 5, at least 3)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-first-call", action="store_true", help="do not time fresh interpreters")
    args = ap.parse_args(argv)
    repeats = max(3, args.repeats)

    spec = OLHSpec(epsilon=args.epsilon, domain_size=args.d)
    rng = np.random.default_rng(args.seed)
    values = rng.integers(0, args.d, size=args.n)
    spec.encode(values[:1000], rng)
    enc_times, enc_cpu = [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        records = spec.encode(values, rng)
        enc_times.append(time.perf_counter() - t0)
        enc_cpu.append(time.process_time() - c0)
    print(f"OLH ε={spec.epsilon:g} g={spec.g} n={args.n} d={args.d}")
    print(
        f"encoder: {args.n / statistics.median(enc_times) / 1e6:8.1f} M reports/s (median of {repeats}; "
        f"per core of CPU time {args.n / statistics.median(enc_cpu) / 1e6:.1f} M/s)"
    )

    hashes = args.n * args.d
    before = numba.get_num_threads()
    try:
        for threads in (1, 2):
            if threads > numba.config.NUMBA_NUM_THREADS:
                print(f"kernel, {threads} threads: unavailable (NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS})")
                continue
            numba.set_num_threads(threads)
            wall, cpu = time_kernel(spec, records, repeats)
            med = statistics.median(wall)
            print(
                f"kernel, {threads} thread{'s' if threads > 1 else ' '}: "
                f"{hashes / med / 1e6:8.0f} M hash evaluations/s "
                f"(median of {repeats}: {med:.3f} s; best {hashes / min(wall) / 1e6:.0f} M/s; "
                f"per core of CPU time {hashes / statistics.median(cpu) / 1e6:.0f} M/s)"
            )
    finally:
        numba.set_num_threads(before)
    print(f"numba threading layer: {numba.threading_layer()}")

    if not args.skip_first_call:
        with tempfile.TemporaryDirectory() as cache_dir:
            cold = first_call_seconds(cache_dir)
            warm = first_call_seconds(cache_dir)
        print(
            f"fresh interpreter, first OLH kernel calls: empty cache {cold[1]:.2f} s, filled cache {warm[1]:.2f} s "
            f"(numba start-up before them: {cold[0]:.2f} s, {warm[0]:.2f} s)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
