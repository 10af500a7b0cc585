"""Heavy hitters side by side: this project's PEM and SFP beside pure-ldp's PEM, SFP and TreeHist.

One run, the same populations: for each seed a Zipf(1.1) population of
``--users`` six-letter words over 10^5 distinct words
(``simulator.heavy_hitters.synthetic_population``, as
``bench_heavy_hitters.sh``) is written as ``value<TAB>count``; ours runs
through ``ldp simulate --input`` and pure-ldp's classes run in
``.bench-venv`` (``benchmarks/hh_pureldp_side.py``, explicit settings listed
there) over the same file. Recorded per run: recall and precision at K,
server seconds (ours: decode; pure-ldp: aggregate + find_heavy_hitters).

Usage: .venv/bin/python benchmarks/bench_hh_side.py [--users N] [--seeds 1 2 3] [--epsilons 1 2 4] [--out FILE.jsonl]
       [--plot P.png] [--ours "pem pem-az sfp"] [--pureldp "pem sfp treehist"] [--ldp CMD] [--label NAME]
       [--mem-cap-gb 10] [--chunk 50000]
(`--ldp`/`--label`: run an older checkout as "ours before"; docs/benchmarks/ESTIMATION.md has the commands)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.heavy_hitters import synthetic_population  # noqa: E402
from simulator.population import parse_distribution  # noqa: E402

EPSILONS = (1.0, 2.0, 4.0)


def _ours(mech: str, eps: float, path: Path, top: int, seed: int, ldp: list[str]) -> dict:
    # "pem-az": our PEM told the alphabet a..z, as pure-ldp's classes are (hh_pureldp_side.py)
    base, _, az = mech.partition("-")
    cmd = [*ldp, "simulate", "--mechanism", base, "--epsilon", str(eps)]
    cmd += ["--alphabet", "abcdefghijklmnopqrstuvwxyz"] if az == "az" else []
    cmd += ["--input", str(path), "--top", str(top), "--seed", str(seed), "--json"]
    o = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    sec = o["seconds"]
    return {
        "mechanism": f"ours {mech}",
        "epsilon": eps,
        "users": o["users"],
        "seed": seed,
        "recall": o["recall"],
        "precision": o["precision"],
        "found": len(o["found"]),
        "seconds": {"encode": sec["encode"], "server": sec["decode"]},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--top", type=int, default=32)
    ap.add_argument(
        "--out", help="default benchmarks/results/heavy_hitters_side_s<seeds>.jsonl (as docs/benchmarks/ESTIMATION.md)"
    )
    ap.add_argument("--plot", default=str(ROOT / "docs/img/heavy_hitters_side.png"))
    ap.add_argument("--pureldp", default="pem sfp treehist")
    ap.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    ap.add_argument(
        "--ldp",
        default=str(ROOT / ".venv/bin/ldp"),
        help="the command that runs ours (e.g. an older checkout's `python -m ldp_cli.main`, for a before/after)",
    )
    ap.add_argument(
        "--ours", default="pem pem-az sfp", help="our mechanisms to run (pem-az: PEM told the alphabet a..z)"
    )
    ap.add_argument(
        "--mem-cap-gb",
        type=float,
        default=10.0,
        help="address-space cap of pure-ldp's process (prlimit --as; 0: none), so it fails instead of the machine",
    )
    ap.add_argument("--chunk", type=int, default=50_000, help="users pure-ldp privatises, then aggregates, at a time")
    ap.add_argument("--label", default="ours", help="the name of our rows (e.g. 'ours before')")
    ap.add_argument("--from", dest="from_", nargs="+", help="only tabulate and plot these result files (one per seed)")
    a = ap.parse_args()
    if a.out is None:
        a.out = str(ROOT / f"benchmarks/results/heavy_hitters_side_s{'_'.join(map(str, a.seeds))}.jsonl")
    if a.from_:
        rows = [json.loads(line) for f in a.from_ for line in Path(f).read_text().splitlines()]
        a.seeds = sorted({r["seed"] for r in rows})
        a.users = rows[0]["users"]
        a.epsilons = sorted({r["epsilon"] for r in rows})
        return _report(rows, a)
    py = (
        ""
        if not a.pureldp.split()
        else subprocess.run(
            ["bash", str(ROOT / "benchmarks/baseline_env.sh"), "pureldp"], check=True, capture_output=True, text=True
        ).stdout.strip()
    )
    print(f"load {Path('/proc/loadavg').read_text().strip()}", file=sys.stderr)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in a.seeds:
            rng = np.random.default_rng(seed)
            pop = synthetic_population(a.users, parse_distribution("zipf:1.1", 100_000), 6, rng)
            path = Path(tmp) / f"pop{seed}.tsv"
            path.write_text("".join(f"{v}\t{c}\n" for v, c in zip(pop.values, pop.counts.tolist())))
            for mech in a.ours.split():
                for eps in a.epsilons:
                    rows.append(_ours(mech, eps, path, a.top, seed, a.ldp.split()))
                    rows[-1]["mechanism"] = f"{a.label} {mech}"
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            if not a.pureldp.split():
                continue
            job = {
                "input": str(path),
                "epsilons": list(a.epsilons),
                "top": a.top,
                "seed": seed,
                "out": str(Path(tmp) / f"pure{seed}.json"),
                "mechanisms": a.pureldp.split(),
                "cms": {"k": 16, "m": 1024},
                "chunk": a.chunk,
            }
            (Path(tmp) / "job.json").write_text(json.dumps(job))
            cap = ["prlimit", f"--as={int(a.mem_cap_gb * 2**30)}"] if a.mem_cap_gb else []
            subprocess.run(
                [*cap, py, str(ROOT / "benchmarks/hh_pureldp_side.py"), str(Path(tmp) / "job.json")], check=True
            )
            rows.extend(json.loads(Path(job["out"]).read_text())["runs"])
    load = Path("/proc/loadavg").read_text().strip()
    with open(a.out, "w") as fh:
        for r in rows:
            fh.write(json.dumps({**r, "load": load}) + "\n")
    return _report(rows, a)


def _report(rows: list[dict], a: argparse.Namespace) -> int:
    names = list(dict.fromkeys(r["mechanism"] for r in rows))
    print("| implementation | ε | recall@K | precision@K | server s |\n|---|---|---|---|---|")
    med: dict[str, list[float]] = {}
    for name in names:
        for eps in a.epsilons:
            rs = [r for r in rows if r["mechanism"] == name and r["epsilon"] == eps]
            if not rs:
                continue
            rec = statistics.median(r["recall"] for r in rs)
            pre = statistics.median(r["precision"] for r in rs)
            sec = statistics.median(r["seconds"]["server"] for r in rs)
            med.setdefault(name, []).append(rec)
            print(f"| {name} | {eps:g} | {rec:.3f} | {pre:.3f} | {sec:.2f} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in names:
        ax.plot(a.epsilons[: len(med[name])], med[name], marker="o", label=name)
    ax.set_xlabel("local ε")
    ax.set_ylabel(f"recall@{a.top} (median over seeds {a.seeds})")
    ax.set_title(f"Heavy hitters, n = {a.users:,} Zipf(1.1) six-letter words")
    ax.set_ylim(0, 1.02)
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.plot, dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
