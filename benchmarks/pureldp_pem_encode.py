"""pure-ldp's PEM encoder alone: client reports per CPU-second; runs inside ``.bench-venv``.

    bash benchmarks/baseline_env.sh pureldp
    .bench-venv/bin/python benchmarks/pureldp_pem_encode.py [--users 20000] [--json]

The settings of ``hh_pureldp_side.py`` (PEM, start 2, fragment 1, six letters, Apple CMS 16 x 1024) on
random six-letter words; per ε, the encode's CPU seconds (``time.process_time``: other tenants of a shared
machine do not count) and wall seconds, the rate per CPU-second and the CPU seconds per 10^5 reports,
with the machine (CPUs, CPU model, load average) recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hh_pureldp_side  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=20_000)
    ap.add_argument("--epsilons", default="2,4,8")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print one JSON document instead of lines")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    random.seed(args.seed)
    np.random.seed(args.seed)
    users = ["".join(random.choice(string.ascii_lowercase) for _ in range(6)) for _ in range(args.users)]
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "")
    out = {"machine": {"cpus": os.cpu_count(), "cpu_model": model, "load_before": os.getloadavg()[0]}, "runs": []}
    for eps in (float(e) for e in args.epsilons.split(",")):
        client, _server = hh_pureldp_side._build("pem", eps, {"k": 16, "m": 1024})
        c0, t0 = time.process_time(), time.perf_counter()
        for u in users:
            client.privatise(u)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        run = {
            "epsilon": eps,
            "users": len(users),
            "cpu_s": round(cpu, 3),
            "wall_s": round(wall, 3),
            "per_cpu_s": round(len(users) / cpu),
            "cpu_s_per_1e5": round(1e5 * cpu / len(users), 2),
        }
        out["runs"].append(run)
        if not args.json:
            print(
                f"ε {eps:g}: {len(users):,} encodes in {cpu:.2f} CPU-s ({wall:.2f} s wall): "
                f"{run['per_cpu_s']:,}/CPU-s, {run['cpu_s_per_1e5']} CPU-s per 10^5"
            )
    out["machine"]["load_after"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
