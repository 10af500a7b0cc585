"""Transport throughput with one report batch per record.

Publishes ``--batches`` wire frames of ``--reports`` GRR reports (d = 1024,
2-byte records) to a fresh 4-partition topic, then reads them back with one
consumer. Timed:

* **publish, one call per batch**: ``publish()`` returns once the record is
  durable, so this is one acknowledgement round trip (Kafka, acks=all) or
  one fsync'd SQLite commit (embedded, synchronous=FULL) per batch;
* **publish_many**: ``--group`` batches per call, acknowledged together;
* **consume**: poll until every record arrived, then one commit.

Usage::

    .venv/bin/ldp kafka up
    .venv/bin/python benchmarks/bench_transport.py                    # both transports
    .venv/bin/python benchmarks/bench_transport.py --only sqlite --batches 500

Prints reports per second and MB per second; results go to
``benchmarks/results/transport.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time
import uuid

import numpy as np

from ldp_core.mechanisms import make_spec
from ldp_core.wire.frames import ReportBatch, encode_frame
from pipeline.transport import Transport, open_transport


def frames(n: int, reports: int) -> list[bytes]:
    spec = make_spec("grr", epsilon=2.0, domain_size=1024)
    rng = np.random.default_rng(7)
    recs = spec.encode(rng.integers(0, 1024, reports), rng)
    return [encode_frame(ReportBatch("bench.metric", spec, 20_000 + i % 7, recs)) for i in range(n)]


def run(t: Transport, data: list[bytes], reports: int, group: int) -> dict[str, float]:
    out: dict[str, float] = {}
    mb = sum(map(len, data)) / 1e6
    keys = [f"metric-day-{i % 16}".encode() for i in range(len(data))]

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    t.create_topic(topic, 4)
    t0 = time.perf_counter()
    for k, v in zip(keys, data):
        t.publish(topic, k, v)
    dt = time.perf_counter() - t0
    out["publish_one_reports_per_s"] = len(data) * reports / dt
    out["publish_one_batches_per_s"] = len(data) / dt

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    t.create_topic(topic, 4)
    t0 = time.perf_counter()
    for i in range(0, len(data), group):
        t.publish_many(topic, list(zip(keys[i : i + group], data[i : i + group])))
    dt = time.perf_counter() - t0
    out["publish_many_reports_per_s"] = len(data) * reports / dt
    out["publish_many_mb_per_s"] = mb / dt

    with t.consume(topic, f"bench-{uuid.uuid4().hex[:8]}") as c:
        c.poll(max_records=1, timeout=10.0)  # join the group; not timed
        c.commit({})
        t0 = time.perf_counter()
        got = 1
        while got < len(data):
            got += len(c.poll(max_records=1000, timeout=5.0))
        c.commit()
        dt = time.perf_counter() - t0
    out["consume_reports_per_s"] = (len(data) - 1) * reports / dt
    out["consume_mb_per_s"] = mb * (len(data) - 1) / len(data) / dt
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=1000)
    ap.add_argument("--reports", type=int, default=4096)
    ap.add_argument("--group", type=int, default=64, help="batches per publish_many call")
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--only", choices=["kafka", "sqlite"], default=None)
    args = ap.parse_args()
    data = frames(args.batches, args.reports)
    results = {"batches": args.batches, "reports_per_batch": args.reports, "frame_bytes": len(data[0]), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        urls = {
            "sqlite (FULL)": f"sqlite:///{tmp}/full.sqlite3",
            "sqlite (NORMAL)": f"sqlite:///{tmp}/normal.sqlite3?synchronous=NORMAL",
            "kafka": f"kafka://{args.bootstrap}",
        }
        for name, url in urls.items():
            if args.only and not name.startswith(args.only):
                continue
            with open_transport(url) as t:
                results["runs"][name] = run(t, data, args.reports, args.group)
    print(f"{args.batches} batches of {args.reports} reports ({len(data[0])} bytes each), 4 partitions\n")
    print(
        "| transport | publish (1/call) reports/s | batches/s | publish_many reports/s | MB/s "
        "| consume reports/s | MB/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, r in results["runs"].items():
        print(
            f"| {name} | {r['publish_one_reports_per_s']:,.0f} | {r['publish_one_batches_per_s']:,.0f} | "
            f"{r['publish_many_reports_per_s']:,.0f} | {r['publish_many_mb_per_s']:.0f} | "
            f"{r['consume_reports_per_s']:,.0f} | {r['consume_mb_per_s']:.0f} |"
        )
    out = pathlib.Path(__file__).parent / "results" / "transport.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
