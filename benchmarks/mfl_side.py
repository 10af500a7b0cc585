"""The multi-freq-ldpy half of ``bench_repeated.py``; runs inside ``.bench-mfl-venv``.

It imports nothing from this project. It reads a JSON job written by ``bench_repeated.py``::

    {"data": "/tmp/.../buckets.npy", "b": 32, "d": 4, "epsilon": 2.0, "repeats": 3, "seed": 1, "out": "..."}

where the data file holds each user's bucket index in ``[0, b)`` (so ``k = b``: the value is already
bucketized, as in our spec), privatizes every user with ``dBitFlipPM_Client`` (one user per call: the
package has no batch encoder), aggregates with ``dBitFlipPM_Aggregator_MI`` and writes the timings and the
estimated shares. The package draws from ``numpy.random``'s module state (inside numba), so each repeat
seeds it.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from numba import njit


@njit
def _seed(s: int) -> None:  # numba keeps its own numpy.random state: seed it inside a jitted function
    np.random.seed(s)


def main(path: str) -> None:
    from multi_freq_ldpy.long_freq_est.dBitFlipPM import dBitFlipPM_Aggregator_MI, dBitFlipPM_Client

    job = json.loads(open(path).read())
    data = np.load(job["data"])
    b, d, eps = int(job["b"]), int(job["d"]), float(job["epsilon"])
    runs = []
    for r in range(int(job["repeats"])):
        np.random.seed(job["seed"] + r)
        _seed(job["seed"] + r)
        dBitFlipPM_Client(int(data[0]), b, b, d, eps)  # compile outside the timing
        t0 = time.perf_counter()
        reports = [dBitFlipPM_Client(int(x), b, b, d, eps) for x in data]
        t1 = time.perf_counter()
        est = dBitFlipPM_Aggregator_MI(reports, b, d, eps)
        t2 = time.perf_counter()
        runs.append({"encode": t1 - t0, "aggregate": t2 - t1, "shares": [float(x) for x in est]})
        print(f"[multi-freq-ldpy] repeat {r}: encode {t1 - t0:.2f}s aggregate {t2 - t1:.2f}s", file=sys.stderr)
    open(job["out"], "w").write(json.dumps({"runs": runs}))


if __name__ == "__main__":
    main(sys.argv[1])
