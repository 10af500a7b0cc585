"""An "app" for the SDK crash tests: records the integers start..count-1 of metric
``seq`` and flushes. The tests kill it with SIGKILL at chosen moments and run it
again on the same storage directory.

``seq`` uses GRR with ε = 30 over {0..count-1}: a report differs from its value with
probability (d-1)/(e^30 + d - 1) < 3e-10 here, so the collector's records identify the
recorded values and a lost or duplicated report is visible. ``start`` is how many
reports the ledger already holds: values are persisted in order, so those are exactly
0..start-1.
"""

from __future__ import annotations

import argparse
import json
import time

from client_sdk.client import TelemetryClient
from client_sdk.config import ClientConfig
from client_sdk.policy import LocalPolicy
from client_sdk.upload.backoff import BackoffPolicy

__all__ = ["metrics_doc", "main"]


def metrics_doc(count: int) -> dict:
    return {
        "format": "ldp-metrics/1",
        "metrics": {
            "seq": {
                "description": "crash-test sequence",
                "owner": "sdk-tests@example.org",
                "expires": "2099-12-31",
                "mechanism": {"mechanism": "grr", "epsilon": 30.0},
                "domain": {"kind": "dictionary", "values": list(range(count))},
                "max_reports_per_day": count,
            }
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--batch-size", type=int, default=50)
    ap.add_argument("--slow", action="store_true", help="pause briefly every 4 records")
    args = ap.parse_args()
    cap = 30.0 * args.count
    client = TelemetryClient(
        args.dir,
        args.url,
        LocalPolicy(per_metric_daily=cap, total_daily=cap),
        metrics_doc(args.count),
        config=ClientConfig(
            batch_size=args.batch_size,
            batch_max_age=0.0,
            upload_timeout=10.0,
            backoff=BackoffPolicy(base=0.05, max_delay=0.5),
        ),
    )
    start = sum(d.metrics["seq"].reports for d in client.privacy_history() if "seq" in d.metrics)
    print(f"START {start}", flush=True)
    for i in range(start, args.count):
        client.record("seq", i)
        if args.slow and i % 4 == 0:
            time.sleep(0.002)
    ok = client.flush(120.0)
    print(
        "FLUSHED " + json.dumps({"ok": ok, "pending": client.pending_reports(), "errors": client.errors()}), flush=True
    )
    client.close()


if __name__ == "__main__":
    main()
