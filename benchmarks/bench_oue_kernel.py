"""OUE aggregation kernel: this checkout's against another checkout's, interleaved in one process.

Loads ``estimator/kernels/sketch.py`` of ``--before DIR`` (e.g. a git worktree of an earlier
commit) beside this checkout's, and times ``cms_add`` of both on the same ``--n`` random OUE reports
(d = ``--d`` bits) on one numba thread, the two alternating run by run (``--repeats`` each, after a
warm-up), together with the read limit (one thread OR-ing the same words, nothing else). Printed:
medians of reports per second of wall time and per CPU-second of the process, and the 1-minute load
average before and after. The counts of both are checked equal.

Usage (from the repository root)::

    git worktree add /tmp/old <commit>
    .venv/bin/python benchmarks/bench_oue_kernel.py --before /tmp/old --n 1000000 --repeats 15
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import numba
import numpy as np

from estimator.kernels import sketch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_bitcount import _read_words  # noqa: E402


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("before_sketch", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, metavar="DIR")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    numba.set_num_threads(1)
    before = _load(Path(args.before) / "estimator" / "kernels" / "sketch.py")
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 256, size=(args.n, args.d // 8), dtype=np.uint8)
    rows = np.zeros(args.n, dtype=np.uint8)
    words = bits.view("<u8")

    def run_after() -> np.ndarray:
        out = np.zeros((1, args.d), dtype=np.int64)
        sketch.cms_add(rows, bits, out, np.zeros(1, dtype=np.int64))
        return out

    def run_before() -> np.ndarray:
        out = np.zeros((1, args.d), dtype=np.int64)
        before.cms_add(rows, bits, out, np.zeros(1, dtype=np.int64))
        return out

    def run_read() -> np.uint64:
        return _read_words(words)

    cases = {"read limit": run_read, "before": run_before, "after": run_after}
    assert np.array_equal(run_before(), run_after())
    load0 = os.getloadavg()[0]
    walls: dict[str, list[float]] = {k: [] for k in cases}
    cpus: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(args.repeats):
        for name, fn in cases.items():
            t0, c0 = time.perf_counter(), time.process_time()
            fn()
            walls[name].append(time.perf_counter() - t0)
            cpus[name].append(time.process_time() - c0)
    print(
        f"n={args.n} d={args.d}, 1 numba thread, {args.repeats} runs each, load {load0:.1f} -> {os.getloadavg()[0]:.1f}"
    )
    for name in cases:
        w, c = statistics.median(walls[name]), statistics.median(cpus[name])
        print(f"{name:10s} {args.n / w / 1e6:7.1f}M reports/s wall   {args.n / c / 1e6:7.1f}M per CPU-s")


if __name__ == "__main__":
    main()
