"""Start-up time of the ``ldp`` command against ``python -c 'import numpy'`` (issue 31, "Speed").

Each case is run ``--runs`` times as a fresh process, the cases interleaved run by run so that the
load of the shared machine falls on all of them alike; printed: the median wall time of each and its
ratio to the median of ``import numpy`` measured in the same run (the goal is at most 3x), and the
1-minute load average before and after. numba's on-disk cache is warmed first (one untimed run of
each case), as a second run of a job would find it.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_startup.py --runs 15
    .venv/bin/python benchmarks/bench_startup.py --runs 15 --json
    # the same cases on another checkout (e.g. a git worktree of the previous commit), run as
    # `python -m ldp_cli.main` from that directory, beside this one's
    .venv/bin/python benchmarks/bench_startup.py --runs 15 --before ../old-tree
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

LDP = [str(Path(sys.executable).with_name("ldp"))] if Path(sys.executable).with_name("ldp").exists() else None

CASES: dict[str, list[str]] = {
    "import numpy": [sys.executable, "-c", "import numpy"],
    "ldp --help": [*(LDP or [sys.executable, "-m", "ldp_cli.main"]), "--help"],
    "ldp simulate olh n=1000": [
        *(LDP or [sys.executable, "-m", "ldp_cli.main"]),
        *"simulate --mechanism olh --epsilon 2 --domain 1024 --users 1000 --json --seed 1".split(),
    ],
    "ldp simulate oue n=1000": [
        *(LDP or [sys.executable, "-m", "ldp_cli.main"]),
        *"simulate --mechanism oue --epsilon 2 --domain 1024 --users 1000 --json --seed 1".split(),
    ],
}


def _once(cmd: list[str], cwd: str | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    ap.add_argument("--before", default=None, metavar="DIR", help="also run the ldp cases from this checkout")
    args = ap.parse_args()
    cases = {name: (cmd, None) for name, cmd in CASES.items()}
    if args.before:
        for name, cmd in CASES.items():
            if name.startswith("ldp "):
                rest = cmd[len(LDP) :] if LDP and cmd[: len(LDP)] == LDP else cmd[3:]
                cases[f"before: {name}"] = ([sys.executable, "-m", "ldp_cli.main", *rest], args.before)
    load_before = os.getloadavg()[0]
    for cmd, cwd in cases.values():  # warm numba's cache and the file cache
        _once(cmd, cwd)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, (cmd, cwd) in cases.items():
            times[name].append(_once(cmd, cwd))
    base = statistics.median(times["import numpy"])
    out = {
        "runs": args.runs,
        "cpus": os.cpu_count(),
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cases": {
            name: {
                "median_s": round(statistics.median(ts), 4),
                "min_s": round(min(ts), 4),
                "ratio_to_numpy": round(statistics.median(ts) / base, 2),
            }
            for name, ts in times.items()
        },
    }
    if args.json:
        print(json.dumps(out))
        return
    print(f"{args.runs} runs each, {out['cpus']} CPUs, load average {out['load_1min'][0]} -> {out['load_1min'][1]}")
    for name, row in out["cases"].items():
        print(
            f"{name:36s} median {row['median_s'] * 1e3:7.1f} ms  min {row['min_s'] * 1e3:7.1f} ms  "
            f"{row['ratio_to_numpy']:5.2f}x import numpy"
        )


if __name__ == "__main__":
    main()
