"""The collector's batch-id store (or spent-token store): CPU per id of a group's lookup and record, against another tree's.

Each run records ``--ids`` random batch ids into a fresh store file, ``--group`` at a time, as the
collector's group commits do: ``lookup`` of the group's ids, then ``add`` of them with their content
digests and the accepted counts. It is timed with the process's CPU clock (``time.process_time``: the
work and the kernel time of its writes), over the **second half** of the ids, when the day's table holds
as many ids as a busy collector's would hold after a few minutes or hours. The store's peak memory
(``ru_maxrss``) and file size are noted.

With ``--before TREE`` (a ``git worktree`` of an earlier commit), the same runs load that tree's
``collector.dedup`` too, interleaved (after, before, after, ...), each run in a subprocess of its own;
the ratio of the medians goes to ``after_vs_before``. Results print as Markdown (``--json``: JSON) and go
to ``benchmarks/results/dedup_store.json`` (``--out`` elsewhere).

    python benchmarks/bench_dedup_store.py --before /path/to/worktree-of-previous-commit

With ``--store spent-tokens`` it times the spent-token store instead (``collector/spent_tokens.py``): ``--ids``
fresh 32-byte token digests spent ``--group`` at a time with ``spend_many``, as the collector spends the tokens
of one turn of its event loop; a tree whose store has no ``spend_many`` (before session 12) spends them one by
one, as its collector did, one transaction per upload. Results go to ``benchmarks/results/spent_tokens.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent

_WORKER = r"""
import json, os, resource, sys, tempfile, time
import numpy as np
from collector.dedup import BatchIdStore, content_digest
ids, group, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(seed)
raw = rng.bytes(16 * ids)
batch_ids = [raw[16 * i : 16 * i + 16] for i in range(ids)]
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "ids.sqlite3")
    store = BatchIdStore(path)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    lookup = record = 0.0
    half = (ids // group) // 2
    for k in range(ids // group):
        part = batch_ids[k * group : (k + 1) * group]
        digests = {i: content_digest(i) for i in part}
        t0 = time.process_time()
        known = store.lookup(part)
        t1 = time.process_time()
        store.add(digests, {"accepted": len(part)})
        t2 = time.process_time()
        assert not known
        if k >= half:
            lookup += t1 - t0
            record += t2 - t1
        if k % max(1, (ids // group) // 10) == 0:
            print(f"  {k * group:,} ids", file=sys.stderr, flush=True)
    counted = (ids // group - half) * group
    # a retry of every tenth id is found again, with its content
    again = batch_ids[:: max(1, ids // 1000)]
    found = store.lookup(again)
    assert len(found) == len(again), (len(found), len(again))
    store.close()
    size = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp))
print(json.dumps({
    "lookup_us_per_id": lookup / counted * 1e6,
    "record_us_per_id": record / counted * 1e6,
    "total_us_per_id": (lookup + record) / counted * 1e6,
    "rss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024,
    "file_mb": size / 2**20,
}))
"""


_SPENT_WORKER = r"""
import json, os, resource, sys, tempfile, time
import numpy as np
from collector.tokens import SpentTokens
ids, group, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = np.random.default_rng(seed)
raw = rng.bytes(32 * ids)
digests = [raw[32 * i : 32 * i + 32] for i in range(ids)]
batch = rng.bytes(16)
day = time.strftime("%Y-%m-%d", time.gmtime())
with tempfile.TemporaryDirectory() as tmp:
    store = SpentTokens(os.path.join(tmp, "spent.sqlite3"))
    grouped = hasattr(store, "spend_many")
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    spent = 0.0
    half = (ids // group) // 2
    for k in range(ids // group):
        part = [(d, batch, day) for d in digests[k * group : (k + 1) * group]]
        t0 = time.process_time()
        ok = store.spend_many(part) if grouped else [store.spend(*x) for x in part]
        t1 = time.process_time()
        assert all(ok)
        if k >= half:
            spent += t1 - t0
        if k % max(1, (ids // group) // 10) == 0:
            print(f"  {k * group:,} tokens", file=sys.stderr, flush=True)
    counted = (ids // group - half) * group
    again = [(d, rng.bytes(16), day) for d in digests[:: max(1, ids // 1000)]]  # double spends: all refused
    assert not any(store.spend_many(again) if grouped else [store.spend(*x) for x in again])
    store.close()
    size = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp))
print(json.dumps({
    "lookup_us_per_id": 0.0,
    "record_us_per_id": spent / counted * 1e6,
    "total_us_per_id": spent / counted * 1e6,
    "rss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024,
    "file_mb": size / 2**20,
    "grouped": float(grouped),
}))
"""
_WORKERS = {"batch-ids": (_WORKER, "collector/dedup.py"), "spent-tokens": (_SPENT_WORKER, "collector/tokens.py")}


def _run(tree: pathlib.Path, ids: int, group: int, seed: int, store: str = "batch-ids") -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _WORKERS[store][0], str(ids), str(group), str(seed)],
        cwd=tempfile.gettempdir(),
        env=dict(os.environ, PYTHONPATH=str(tree)),
        stdout=subprocess.PIPE,
        stderr=None,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ids", type=int, default=200_000, help="batch ids recorded per run (default 200,000)")
    p.add_argument("--group", type=int, default=64, help="ids per group commit (default 64)")
    p.add_argument("--runs", type=int, default=3, help="runs of each tree (default 3)")
    p.add_argument("--before", metavar="TREE", help="also run another source tree's store, interleaved")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    p.add_argument("--store", choices=sorted(_WORKERS), default="batch-ids", help="which store (default batch-ids)")
    p.add_argument("--out", type=pathlib.Path, help="default benchmarks/results/dedup_store.json or spent_tokens.json")
    args = p.parse_args(argv)
    results = ROOT / "benchmarks" / "results"
    out_path = args.out or results / ("dedup_store.json" if args.store == "batch-ids" else "spent_tokens.json")
    if args.ids < 2 * args.group or args.group < 1:
        p.error("--ids must be at least twice --group, and --group at least 1")
    trees = {"after": ROOT}
    if args.before:
        before = pathlib.Path(args.before).resolve()
        if not (before / _WORKERS[args.store][1]).is_file():
            p.error(f"--before {before}: no {_WORKERS[args.store][1]} there")
        trees["before"] = before
    load0 = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for r in range(args.runs):
        for name in trees if r % 2 == 0 else reversed(list(trees)):
            print(f"bench_dedup_store: run {r + 1}/{args.runs}, {name}", file=sys.stderr, flush=True)
            runs[name].append(_run(trees[name], args.ids, args.group, args.seed + r, args.store))
    result: dict[str, Any] = {
        "store": args.store,
        "ids": args.ids,
        "group": args.group,
        "runs": args.runs,
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "loadavg_before": load0,
        "loadavg_after": os.getloadavg(),
    }
    for name, rows in runs.items():
        result[name] = {k: round(statistics.median(x[k] for x in rows), 2) for k in rows[0]}
        result[name]["total_us_per_id_runs"] = [round(x["total_us_per_id"], 2) for x in rows]
    if "before" in result:
        result["after_vs_before"] = round(result["after"]["total_us_per_id"] / result["before"]["total_us_per_id"], 3)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"## {args.store} store: {args.ids:,} ids in groups of {args.group}, medians of {args.runs} runs "
        f"(load {load0[0]:.1f} before, {result['loadavg_after'][0]:.1f} after)\n"
    )
    print(
        "| tree | lookup µs/id | record µs/id | total µs/id | peak RSS growth MB | file MB |\n|---|---|---|---|---|---|"
    )
    for name in runs:
        x = result[name]
        print(
            f"| {name} | {x['lookup_us_per_id']:.1f} | {x['record_us_per_id']:.1f} | {x['total_us_per_id']:.1f} "
            f"| {x['rss_growth_mb']:.0f} | {x['file_mb']:.1f} |"
        )
    if "after_vs_before" in result:
        print(f"\nafter / before, CPU per id: {result['after_vs_before']:.2f}×")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
