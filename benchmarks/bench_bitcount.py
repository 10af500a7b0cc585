"""Throughput of the packed-bit aggregation (OUE, CMS, RAPPOR servers).

For each mechanism, ``--n`` records with uniformly random report bytes (and
uniform rows / cohorts) are aggregated by ``accumulator_for(spec).update``
followed by ``estimate()``, with 1 and with 2 numba threads
(``numba.set_num_threads``): one untimed warm-up, then ``--repeats`` timed
runs. Printed: reports per second of wall time (median) and per second of
process CPU time (median; all threads counted, so other load on the shared
machine dilutes it less).

Also printed, in the same run: the read limit, the rate at which one numba thread reads the same
records (an OR over their 64-bit words, nothing else), the ceiling for any aggregation of them on
one core.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_bitcount.py --n 1000000 --d 1024 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
import numpy as np

from estimator.oracles import accumulator_for
from ldp_core.mechanisms import make_spec


def records_for(name: str, n: int, d: int, eps: float, rng: np.random.Generator) -> tuple[object, np.ndarray]:
    spec = make_spec(name, epsilon=eps, domain_size=d)
    rec = np.zeros(n, dtype=spec.record_dtype)
    rec["bits"] = rng.integers(0, 256, size=rec["bits"].shape, dtype=np.uint8)
    nbits = {"oue": d, "cms": getattr(spec, "width", 0), "rappor": getattr(spec, "num_bits", 0)}[name]
    if nbits % 8:
        rec["bits"][:, -1] &= np.uint8((1 << (nbits % 8)) - 1)
    for field, bound in spec.record_bounds().items():
        if field != "bits":
            rec[field] = rng.integers(0, bound, size=n)
    return spec, rec


@numba.njit(cache=True, nogil=True)
def _read_words(words: np.ndarray) -> np.uint64:
    acc = np.uint64(0)
    for i in range(words.shape[0]):
        for w in range(words.shape[1]):
            acc |= words[i, w]
    return acc


def read_limit(rec: np.ndarray, repeats: int) -> tuple[float, float]:
    """Reports per second of wall time and per CPU-second at which one thread reads the records'
    bits (medians of ``repeats``)."""
    bits = rec["bits"]
    nbytes = bits.shape[1] - bits.shape[1] % 8
    words = bits[:, :nbytes].view("<u8") if bits.strides[1] == 1 and nbytes else np.ascontiguousarray(bits)
    _read_words(words)
    walls, cpus = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        _read_words(words)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return rec.shape[0] / statistics.median(walls), rec.shape[0] / statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--epsilon", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mechanisms", default="oue,cms,rappor")
    ap.add_argument("--threads", default="1,2")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    print(f"numba threading layer: {numba.config.THREADING_LAYER}, n={args.n}, d={args.d}")
    for name in args.mechanisms.split(","):
        spec, rec = records_for(name, args.n, args.d, args.epsilon, rng)
        wall, cpu = read_limit(rec, args.repeats)
        print(
            f"{name:7s} read limit (1 thread, {rec.dtype.itemsize}-byte records): {wall / 1e6:7.2f}M reports/s "
            f"wall, {cpu / 1e6:7.2f}M per CPU-s"
        )
        for threads in (int(t) for t in args.threads.split(",")):
            numba.set_num_threads(threads)
            walls, cpus = [], []
            for r in range(args.repeats + 1):
                acc = accumulator_for(spec)
                t0, c0 = time.perf_counter(), time.process_time()
                acc.update(rec)
                acc.estimate()
                t1, c1 = time.perf_counter(), time.process_time()
                if r:
                    walls.append(t1 - t0)
                    cpus.append(c1 - c0)
            w, c = statistics.median(walls), statistics.median(cpus)
            print(
                f"{name:7s} threads={threads}: {args.n / w / 1e6:7.2f}M reports/s wall (median {w * 1e3:.1f} ms, "
                f"min {min(walls) * 1e3:.1f}), {args.n / c / 1e6:7.2f}M per CPU-s",
                flush=True,
            )


if __name__ == "__main__":
    main()
