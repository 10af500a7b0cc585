"""End-to-end latency, from a device's upload to the estimate that includes it (p50, p99), under load.

The pipeline runs as real processes (``ldp collector``, ``ldp shuffler``,
``ldp estimator``, ``ldp sink``; see ``tests/support/pipeline_procs.py``) on the
embedded log or on Kafka. An open-loop load generator uploads frames of
``--frame`` reports of one metric at a fixed rate from several HTTP clients
(frame ``i`` is due at ``t0 + i * frame / rate``, whatever the answers), and
a poller reads the estimator's ``GET /v1/estimates`` every few milliseconds.

Latency of a frame: from the moment its upload started to the first poll
whose counted total includes it. Within one metric-day every batch goes to
one partition and the shuffler releases (and the estimator counts) in
order, so the frame that brought the cumulative upload to ``U`` is counted
when the estimator's total first reaches ``U``. The shuffler's crowd
threshold equals the frame size, so each frame is released at the next
checkpoint (0.3 s interval): that interval bounds the latency from below.
A first run at a low rate warms the processes up and is not reported;
frames of each level's warm-up second are not measured either. The poll interval (5 ms)
is the resolution.

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_e2e.py                         # embedded log
    .venv/bin/python benchmarks/bench_e2e.py --kafka 127.0.0.1:9092  # the project's broker
    .venv/bin/python benchmarks/bench_e2e.py --rates 5000,50000 --seconds 10

Results print as Markdown and go to ``benchmarks/results/e2e-<transport>.json``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from client_sdk.upload.uploader import FRAME_CONTENT_TYPE  # noqa: E402
from ldp_core.days import utc_day  # noqa: E402
from ldp_core.metrics import parse_metrics  # noqa: E402
from ldp_core.wire.frames import ReportBatch, encode_frame  # noqa: E402
from tests.support.pipeline_procs import PipelineProcs  # noqa: E402

METRICS = {
    "format": "ldp-metrics/1",
    "metrics": {
        "tab": {
            "description": "benchmark metric",
            "owner": "bench@example.org",
            "expires": "2099-12-31",
            "mechanism": {"mechanism": "grr", "epsilon": 1.0},
            "domain": {"kind": "dictionary", "values": [f"v{i}" for i in range(16)]},
            "max_reports_per_day": 1,
        },
    },
}


def make_frames(count: int, frame: int, day: int, rng: np.random.Generator) -> list[bytes]:
    spec = parse_metrics(METRICS)["tab"].spec
    recs = spec.encode(rng.integers(0, spec.domain_size, count * frame), rng)
    return [
        encode_frame(ReportBatch("tab", spec, day, recs[i * frame : (i + 1) * frame].copy(), rng.bytes(16)))
        for i in range(count)
    ]


class Poller(threading.Thread):
    """Samples (time, counted reports) from the estimator every ``interval`` seconds."""

    def __init__(self, url: str, interval: float = 0.005) -> None:
        super().__init__(daemon=True)
        self.url, self.interval = url, interval
        self.times: list[float] = []
        self.counts: list[int] = []
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            while not self.stop.is_set():
                try:
                    r = http.get("/v1/estimates")
                    n = sum(e["n"] for e in r.json()["estimates"])
                except (httpx.HTTPError, ValueError, KeyError):
                    n = None
                if n is not None:
                    self.times.append(time.monotonic())
                    self.counts.append(n)
                time.sleep(self.interval)

    def reached(self, total: int) -> float | None:
        """The first sample time at which the count was at least ``total``."""
        i = bisect.bisect_left(self.counts, total)  # counts never decrease here (no rebalance in the run)
        return self.times[i] if i < len(self.times) else None


def run_rate(
    procs: PipelineProcs,
    rate: float,
    seconds: float,
    frame: int,
    clients: int,
    warmup: float,
    base: int,
    rng: np.random.Generator,
) -> dict[str, object]:
    """One load level; ``base`` is what the estimator already counted. Returns latency figures."""
    n_frames = max(1, int(rate * (seconds + warmup) / frame))
    frames = make_frames(n_frames, frame, utc_day(time.time()), rng)
    poller = Poller(procs.estimator_url)
    poller.start()
    lock = threading.Lock()
    next_i = [0]
    sent = [0.0] * n_frames
    accepted: list[tuple[float, int]] = []
    errors: list[str] = []
    t0 = time.monotonic() + 0.2

    def client() -> None:
        with httpx.Client(base_url=procs.collector_url, timeout=60) as http:
            while True:
                with lock:
                    i = next_i[0]
                    next_i[0] += 1
                if i >= n_frames:
                    return
                due = t0 + i * frame / rate
                delay = due - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                sent[i] = time.monotonic()
                while True:
                    r = http.post("/v1/reports", content=frames[i], headers={"Content-Type": FRAME_CONTENT_TYPE})
                    if r.status_code == 202:
                        break
                    if r.status_code != 503:
                        errors.append(f"{r.status_code} {r.text[:200]}")
                        return
                    time.sleep(0.05)
                with lock:
                    accepted.append((time.monotonic(), i))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"uploads failed: {errors[:3]}")
    t_end = time.monotonic()
    total = base + n_frames * frame
    deadline = time.monotonic() + 120
    while poller.reached(total) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the estimator never counted {total} reports (last {poller.counts[-1:]})")
        time.sleep(0.05)
    poller.stop.set()
    poller.join()
    accepted.sort()
    lat = []
    cum = base
    for _, i in accepted:
        cum += frame
        seen = poller.reached(cum)
        if sent[i] - t0 >= warmup and seen is not None:
            lat.append(max(0.0, seen - sent[i]))
    offered = n_frames * frame / (t_end - t0)
    arr = np.array(lat) * 1000.0
    return {
        "rate": rate,
        "achieved_rate": offered,
        "frames": n_frames,
        "measured_frames": len(lat),
        "p50_ms": float(np.percentile(arr, 50)),
        "p90_ms": float(np.percentile(arr, 90)),
        "p99_ms": float(np.percentile(arr, 99)),
        "max_ms": float(arr.max()),
        "poll_samples": len(poller.times),
        "total": total,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kafka", default=None, metavar="HOST:PORT", help="run on this broker (default: embedded log)")
    ap.add_argument(
        "--rates", default="5000,20000,50000,100000,200000", help="offered loads, reports/s (comma-separated)"
    )
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per load level")
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds of each level not measured")
    ap.add_argument("--frame", type=int, default=1000, help="reports per uploaded frame (= the crowd threshold)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent HTTP upload clients")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    transport = "kafka" if args.kafka else "sqlite"
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory(prefix="ldp-bench-e2e-") as tmp:
        work = Path(tmp)
        metrics_path = work / "metrics.json"
        metrics_path.write_text(json.dumps(METRICS))
        url = f"kafka://{args.kafka}" if args.kafka else f"sqlite:///{work / 'log.sqlite3'}"
        procs = PipelineProcs(work, url, metrics_path, min_batch=args.frame, partitions=4)
        procs.start()
        rows = []
        try:
            # cold start (numba kernels loading from cache, first consumer-group joins): not measured
            warm = run_rate(procs, 2000.0, 2.0, args.frame, 2, 0.0, 0, rng)
            base = int(warm["total"])  # type: ignore[arg-type]
            for rate in [float(r) for r in args.rates.split(",")]:
                row = run_rate(procs, rate, args.seconds, args.frame, args.clients, args.warmup, base, rng)
                base = int(row["total"])  # type: ignore[arg-type]
                rows.append(row)
                print(
                    f"  {transport} {rate:>8,.0f} rep/s offered ({row['achieved_rate']:,.0f} achieved): "
                    f"p50 {row['p50_ms']:.0f} ms, p99 {row['p99_ms']:.0f} ms",
                    flush=True,
                )
        finally:
            procs.stop()
    print()
    print("| transport | offered reports/s | achieved | frames measured | p50 ms | p90 ms | p99 ms | max ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {transport} | {r['rate']:,.0f} | {r['achieved_rate']:,.0f} | {r['measured_frames']} | "
            f"{r['p50_ms']:.0f} | {r['p90_ms']:.0f} | {r['p99_ms']:.0f} | {r['max_ms']:.0f} |"
        )
    out = ROOT / "benchmarks" / "results" / f"e2e-{transport}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "transport": transport,
                "frame": args.frame,
                "clients": args.clients,
                "seconds": args.seconds,
                "checkpoint_interval": 0.3,
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "load_avg_at_end": os.getloadavg(),
                },
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
