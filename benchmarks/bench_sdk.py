"""Device SDK speed and memory: what ``record()`` costs the app, and what the SDK does behind it.

Measured, per mechanism (GRR, OLH, HCMS, RAPPOR):

* **record() on the app's thread**, p50 / p99 / p99.9 in microseconds, timed one call at a
  time with ``perf_counter_ns`` while the SDK's recorder thread runs concurrently (as it
  does in an app). Two paths: *accepted* (caps large enough that every call is queued
  for privatization) and *refused* (the metric already sent its r reports today: dropped
  on the hot path from an in-memory flag).
* **what record() would cost if done inline**: ``encode_one`` of one value and one
  fsynced SQLite transaction (spend + outbox insert), p50 each. This is the work the SDK
  moves off the app's thread.
* **recorder throughput**: reports privatized, charged to the ledger and made durable per
  second (batches of up to 2,048 per fsynced transaction).
* **memory**: in a fresh child process, resident set size and Python heap
  (``tracemalloc``) after import, after creating a client, and with a full outbox
  (10,000 reports) plus a full in-memory queue (10,000 pending records).
* **upload throughput**: reports per second moved from the outbox to the stdlib test
  receiver on 127.0.0.1 (which fsyncs each batch) in batches of 500, and to an
  in-memory transport (the SDK's own cost).

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_sdk.py            # about a minute
    .venv/bin/python benchmarks/bench_sdk.py --quick    # a few seconds, smaller N

Results print as Markdown and are written to ``benchmarks/results/sdk.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time
import tracemalloc

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from client_sdk.client import TelemetryClient  # noqa: E402
from client_sdk.config import ClientConfig  # noqa: E402
from client_sdk.ledger import BudgetLedger  # noqa: E402
from client_sdk.outbox import Outbox  # noqa: E402
from client_sdk.policy import LocalPolicy  # noqa: E402
from client_sdk.store import Store  # noqa: E402
from client_sdk.upload.uploader import HttpResponse  # noqa: E402
from ldp_core.metrics import parse_metrics  # noqa: E402
from ldp_core.randomness import secure_generator  # noqa: E402

MECHANISMS = {
    "grr": ({"mechanism": "grr", "epsilon": 1.0}, {"kind": "dictionary", "values": [f"v{i}" for i in range(64)]}),
    "olh": ({"mechanism": "olh", "epsilon": 1.0}, {"kind": "hashed", "size": 4096}),
    "hcms": ({"mechanism": "hcms", "epsilon": 2.0}, {"kind": "hashed", "size": 65536}),
    "rappor": ({"mechanism": "rappor", "epsilon": 2.0}, {"kind": "hashed", "size": 256}),
}
BIG = 1e6


def doc(names: list[str], r: int) -> dict:
    return {
        "format": "ldp-metrics/1",
        "metrics": {
            n: {
                "description": "benchmark",
                "owner": "bench@example.org",
                "expires": "2099-12-31",
                "mechanism": MECHANISMS[n][0],
                "domain": MECHANISMS[n][1],
                "max_reports_per_day": r,
            }
            for n in names
        },
    }


def value_for(name: str, i: int) -> str:
    return f"v{i % 64}" if name == "grr" else f"word-{i % 1000}"


def pct(samples_ns: list[int]) -> dict[str, float]:
    a = np.asarray(samples_ns, dtype=np.float64) / 1000.0
    return {
        "p50": float(np.percentile(a, 50)),
        "p99": float(np.percentile(a, 99)),
        "p999": float(np.percentile(a, 99.9)),
    }


def bench_record(name: str, n: int) -> dict:
    out: dict = {}
    policy = LocalPolicy(per_metric_daily=BIG, total_daily=BIG)
    with tempfile.TemporaryDirectory() as d:
        c = TelemetryClient(
            d,
            None,
            policy,
            doc([name], 10_000),
            config=ClientConfig(upload=False, max_queue=10 * n, max_outbox_reports=10 * n),
        )
        pc = time.perf_counter_ns
        vals = [value_for(name, i) for i in range(n)]
        for v in vals[:200]:  # warm-up (imports, first transaction)
            c.record(name, v)
        c.flush(60)
        accepted: list[int] = []
        t0 = time.perf_counter()
        for v in vals:
            t = pc()
            c.record(name, v)
            accepted.append(pc() - t)
        c.flush(600)
        elapsed = time.perf_counter() - t0
        out["accepted"] = pct(accepted)
        persisted = c.stats()["recorded"] - 200
        out["recorder_reports_per_s"] = persisted / elapsed
        # refused on the hot path: the report limit (10,000 today) is reached
        for v in vals[:12_000]:
            c.record(name, v)
        c.flush(600)
        refused: list[int] = []
        for v in vals:
            t = pc()
            c.record(name, v)
            refused.append(pc() - t)
        out["refused"] = pct(refused)
        c.close()

    # the same work done inline, for comparison
    m = parse_metrics(doc([name], 10_000))[name]
    rng = secure_generator()
    idx = m.domain.index_of(value_for(name, 1))
    enc: list[int] = []
    for _ in range(min(n, 5000)):
        t = pc()
        m.spec.encode_one(idx, rng)
        enc.append(pc() - t)
    out["encode_one_p50_us"] = pct(enc)["p50"]
    with tempfile.TemporaryDirectory() as d:
        store = Store(d)
        ledger = BudgetLedger(store, policy)
        ob = Outbox(store, max_reports=10 * n)
        rec = m.spec.encode_one(idx, rng)
        txn: list[int] = []
        for _ in range(min(n, 1000)):
            t = pc()
            with store.transaction() as conn:
                ledger.spend_in(conn, name, 1000, 20_000, None)
                ob.put_in(conn, name, m.spec, 20_000, rec, time.time())
            txn.append(pc() - t)
        store.close()
    out["fsynced_txn_p50_us"] = pct(txn)["p50"]
    return out


def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def memory_child(n: int) -> None:
    tracemalloc.start()
    import client_sdk.client  # noqa: F401  (already imported: measures the baseline)

    res = {"import": {"rss_kib": rss_kib(), "heap_kib": tracemalloc.get_traced_memory()[0] // 1024}}
    with tempfile.TemporaryDirectory() as d:
        c = TelemetryClient(
            d,
            None,
            LocalPolicy(per_metric_daily=BIG, total_daily=BIG),
            doc(["grr"], 10_000),
            config=ClientConfig(upload=False, max_queue=n, max_outbox_reports=n),
        )
        res["client"] = {"rss_kib": rss_kib(), "heap_kib": tracemalloc.get_traced_memory()[0] // 1024}
        for i in range(n):
            c.record("grr", f"v{i % 64}")
        c.flush(600)
        res["full_outbox"] = {
            "rss_kib": rss_kib(),
            "heap_kib": tracemalloc.get_traced_memory()[0] // 1024,
            "outbox_reports": c.pending_reports(),
        }
        # a full in-memory queue: the recorder blocked behind another writer's lock
        blocker = Store(d)
        conn = blocker.connection()
        conn.execute("BEGIN IMMEDIATE")
        c.record("grr", "v1")
        time.sleep(0.2)
        for i in range(n + 100):
            c.record("grr", f"v{i % 64}")
        res["full_outbox_and_queue"] = {
            "rss_kib": rss_kib(),
            "heap_kib": tracemalloc.get_traced_memory()[0] // 1024,
            "queue_full_tally": c.errors()["queue_full"],
        }
        conn.execute("ROLLBACK")
        blocker.close()
        c.close(upload=False)
    print(json.dumps(res))


def bench_upload(n: int, batch: int) -> dict:
    out: dict = {}
    policy = LocalPolicy(per_metric_daily=BIG, total_daily=BIG)

    def fill(d: str, url: str, transport=None) -> TelemetryClient:
        # the outbox is filled directly (the recorder is measured above), then a client uploads it
        m = parse_metrics(doc(["grr"], 10_000))["grr"]
        ob = Outbox(Store(d), max_reports=n)
        ob.put("grr", m.spec, 20_000, m.spec.encode(np.arange(n) % 64, secure_generator()), now=time.time())
        ob.store.close()
        return TelemetryClient(
            d,
            url,
            policy,
            doc(["grr"], 10_000),
            config=ClientConfig(transport=transport, batch_size=batch, batch_max_age=1e9, max_outbox_reports=n),
        )

    with tempfile.TemporaryDirectory() as d:
        c = fill(d, "http://127.0.0.1:9", transport=lambda req: HttpResponse(202, {}))
        t = time.perf_counter()
        assert c.flush(600)
        out["in_memory_reports_per_s"] = n / (time.perf_counter() - t)
        c.close()
    with tempfile.TemporaryDirectory() as d:
        recv = subprocess.Popen(
            [sys.executable, "-m", "tests.support.sdk_test_receiver", "--dir", os.path.join(d, "recv")],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
        )
        try:
            port = int(recv.stdout.readline().split()[1])  # type: ignore[union-attr]
            c = fill(os.path.join(d, "sdk"), f"http://127.0.0.1:{port}")
            t = time.perf_counter()
            assert c.flush(600)
            el = time.perf_counter() - t
            out["test_receiver_reports_per_s"] = n / el
            out["test_receiver_batches_per_s"] = (n / batch) / el
            c.close()
        finally:
            recv.terminate()
            recv.wait()
    out["reports"] = n
    out["batch_size"] = batch
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--memory-child", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.memory_child)
        return
    n = 2000 if args.quick else 20_000
    results: dict = {"python": platform.python_version(), "cpus": os.cpu_count(), "n": n, "record": {}}
    for name in MECHANISMS:
        results["record"][name] = bench_record(name, n)
        print(f"{name}: {json.dumps(results['record'][name])}", file=sys.stderr)
    mem = subprocess.run(
        [sys.executable, __file__, "--memory-child", "10000"], capture_output=True, text=True, check=True, cwd=ROOT
    )
    results["memory"] = json.loads(mem.stdout)
    results["upload"] = bench_upload(5000 if args.quick else 50_000, 500)

    print(
        "| mechanism | record() accepted p50 / p99 / p99.9 µs | refused p50 / p99 µs | encode_one p50 µs "
        "| fsynced txn p50 µs | recorder reports/s |"
    )
    print("|---|---|---|---|---|---|")
    for name, r in results["record"].items():
        a, f = r["accepted"], r["refused"]
        print(
            f"| {name} | {a['p50']:.1f} / {a['p99']:.1f} / {a['p999']:.1f} | {f['p50']:.1f} / {f['p99']:.1f} "
            f"| {r['encode_one_p50_us']:.1f} | {r['fsynced_txn_p50_us']:.0f} | {r['recorder_reports_per_s']:,.0f} |"
        )
    print()
    print("| state | RSS MiB | Python heap MiB |")
    print("|---|---|---|")
    for k, v in results["memory"].items():
        print(f"| {k} | {v['rss_kib'] / 1024:.1f} | {v['heap_kib'] / 1024:.2f} |")
    u = results["upload"]
    print()
    print(
        f"upload: {u['test_receiver_reports_per_s']:,.0f} reports/s ({u['test_receiver_batches_per_s']:.1f} "
        f"batches/s of {u['batch_size']}) to the test receiver; {u['in_memory_reports_per_s']:,.0f} reports/s "
        f"to an in-memory transport"
    )
    out = ROOT / "benchmarks" / "results" / "sdk.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
