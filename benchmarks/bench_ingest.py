"""Ingest and shuffle throughput: one collector worker into the transport, and the shuffler.

* **ingest**: ``ldp collector`` (one uvicorn worker, a separate process) on
  127.0.0.1; an asyncio load generator in this process keeps ``--connections``
  keep-alive connections busy with binary frames of ``--reports`` OLH reports
  (each a fresh batch id, so every one is published). Counted: 202-accepted
  reports per second over ``--seconds``, request latency p50/p99, and the
  collector's CPU seconds (from ``/proc``) per million reports.
* **shuffle**: ``--batches`` raw frames of ``--reports`` reports over eight
  metric-days are published first; then one in-process :class:`~collector.shuffler.processor.Shuffler`
  (already joined to its group, kernel warmed up) is timed from its first poll
  until every input report is committed (released or buffered), with
  ``--min-batch`` as crowd threshold and the default checkpoint interval.

Each figure is the median of ``--runs`` runs, each on fresh topics. Usage::

    .venv/bin/ldp kafka up
    .venv/bin/python benchmarks/bench_ingest.py                       # Kafka at $LDP_KAFKA_BOOTSTRAP or 127.0.0.1:9092
    .venv/bin/python benchmarks/bench_ingest.py --transport sqlite    # the embedded log
    .venv/bin/python benchmarks/bench_ingest.py --quick

Results print as Markdown and go to ``benchmarks/results/ingest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import zlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collector.shuffler import Shuffler, ShufflerSettings  # noqa: E402
from collector.shuffler.permute import warm_up  # noqa: E402
from ldp_core.days import utc_day  # noqa: E402
from ldp_core.metrics import load_metrics  # noqa: E402
from ldp_core.wire.frames import ReportBatch, encode_frame  # noqa: E402
from pipeline.topics import metric_day_key  # noqa: E402
from pipeline.transport import open_transport  # noqa: E402

METRICS = ROOT / "metrics" / "example.json"


def _cpu_seconds(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _template(n: int) -> bytes:
    spec = load_metrics(METRICS, reject_expired=False)["emoji_used"].spec
    rng = np.random.default_rng(0)
    records = spec.encode(rng.integers(0, spec.domain_size, n), rng)
    return encode_frame(ReportBatch("emoji_used", spec, utc_day(time.time()), records))


class Collector:
    """``ldp collector`` in a subprocess; with ``peer`` (``read`` or ``parse``), ``benchmarks/ingest_peer.py``
    instead: the same HTTP stack whose endpoint only reads the body (and parses the frame), publishing nothing."""

    def __init__(self, url: str, topic: str, tmp: pathlib.Path, peer: str | None = None, front: str = "python") -> None:
        args = [
            sys.executable,
            "-m",
            "ldp_cli.main",
            "collector",
            "--transport",
            url,
            "--metrics",
            str(METRICS),
            "--port",
            "0",
            "--raw-topic",
            topic,
            "--dedup",
            str(tmp / f"ids-{topic}.sqlite3"),
            "--max-in-flight",
            "4096",
            "--front",
            front,
        ]
        if peer is not None:
            args = [sys.executable, str(ROOT / "benchmarks" / "ingest_peer.py"), peer]
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp,
            env=dict(os.environ, PYTHONPATH=os.environ.get("LDP_BENCH_COLLECTOR_TREE") or str(ROOT)),
        )
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if "listening on" not in line:
            raise RuntimeError(f"collector did not start: {line!r} {self.proc.communicate()[1]}")
        self.host, port = line.split("http://")[1].split()[0].rsplit(":", 1)
        self.port = int(port)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.communicate(timeout=60)


async def _connection(
    host: str, port: int, template: bytes, deadline: float, warm_until: float, latencies: list[float], counts: list[int]
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    head = (
        f"POST /v1/reports HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/vnd.ldp.frame\r\n"
        f"Content-Length: {len(template)}\r\n\r\n"
    ).encode()
    frame = bytearray(template)
    while True:
        now = time.perf_counter()
        if now >= deadline:
            break
        frame[28:44] = os.urandom(16)
        frame[-4:] = zlib.crc32(memoryview(frame)[:-4]).to_bytes(4, "little")
        writer.write(head + frame)
        t0 = time.perf_counter()
        status_line = await reader.readuntil(b"\r\n")
        headers = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in headers.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await reader.readexactly(length)
        t1 = time.perf_counter()
        if t0 >= warm_until:
            latencies.append(t1 - t0)
            counts[0 if status_line.split(b" ")[1] == b"202" else 1] += 1
    writer.close()


async def _load(
    host: str, port: int, template: bytes, seconds: float, connections: int, warmup: float
) -> tuple[list[float], list[int]]:
    latencies: list[float] = []
    counts = [0, 0]
    start = time.perf_counter()
    await asyncio.gather(
        *(
            _connection(host, port, template, start + warmup + seconds, start + warmup, latencies, counts)
            for _ in range(connections)
        )
    )
    return latencies, counts


def _broker_pid() -> int | None:
    path = pathlib.Path(os.environ.get("LDP_KAFKA_HOME", ROOT / ".kafka")) / "kafka.pid"
    try:
        pid = int(path.read_text().strip())
        _cpu_seconds(pid)
        return pid
    except (OSError, ValueError):
        return None


def _drop_topics(url: str, topics: list[str]) -> None:
    """Delete a run's topics from the broker: each ingest run writes gigabytes, which filled the disk of a
    machine that ran the benchmark a few dozen times."""
    if not url.startswith("kafka://"):
        return
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=url.removeprefix("kafka://").split("?")[0])
    try:
        admin.delete_topics(topics)
    except Exception as exc:  # noqa: BLE001 - a figure measured is worth more than a topic left behind
        print(f"could not delete {topics}: {exc!r}", file=sys.stderr)
    finally:
        admin.close()


def bench_ingest(
    url: str,
    tmp: pathlib.Path,
    reports: int,
    seconds: float,
    connections: int,
    peer: str | None = None,
    front: str = "python",
) -> dict[str, float]:
    topic = f"bench.raw-{uuid.uuid4().hex[:8]}"
    collector = Collector(url, topic, tmp, peer, front)
    broker = _broker_pid() if url.startswith("kafka://") and peer is None else None
    try:
        template = _template(reports)
        warmup = 1.0
        pids = {"collector": collector.proc.pid, "client": os.getpid(), **({"broker": broker} if broker else {})}
        cpu0 = {k: _cpu_seconds(p) for k, p in pids.items()}
        latencies, counts = asyncio.run(_load(collector.host, collector.port, template, seconds, connections, warmup))
        cpu = {k: _cpu_seconds(p) - cpu0[k] for k, p in pids.items()}
    finally:
        collector.stop()
        if peer is None:  # (a peer publishes nothing)
            _drop_topics(url, [topic])
    lat = np.array(latencies) * 1000
    # CPU over warm-up plus measurement, per report answered in either
    answered = max(1, counts[0] + counts[1]) * reports * (seconds + warmup) / seconds
    out = {
        "reports_per_s": counts[0] * reports / seconds,
        "requests_per_s": counts[0] / seconds,
        "rejected": counts[1],
        "latency_p50_ms": float(np.percentile(lat, 50)) if lat.size else float("nan"),
        "latency_p99_ms": float(np.percentile(lat, 99)) if lat.size else float("nan"),
    }
    for k, v in cpu.items():
        out[f"{k}_cpu_s_per_m_reports"] = v / answered * 1e6
    return out


def bench_shuffle(url: str, batches: int, reports: int, min_batch: int) -> dict[str, float]:
    tag = uuid.uuid4().hex[:8]
    settings = ShufflerSettings(
        raw_topic=f"bench.raw-{tag}",
        shuffled_topic=f"bench.shuffled-{tag}",
        state_topic=f"bench.state-{tag}",
        group=f"bench-{tag}",
        min_batch=min_batch,
        partitions=8,
        key_file=os.path.join(tempfile.gettempdir(), f"ldp-bench-shuffler-{tag}.key"),
    )
    metrics = load_metrics(METRICS, reject_expired=False)
    spec = metrics["emoji_used"].spec
    rng = np.random.default_rng(1)
    template = spec.encode(rng.integers(0, spec.domain_size, reports), rng)
    day0 = utc_day(time.time())
    with open_transport(url) as tr:
        shuffler = Shuffler(tr, metrics, settings)
        shuffler.open()
        while not shuffler._require_consumer().assignment():
            shuffler.step(timeout=0.2)
        items = []
        for i in range(batches):
            batch = ReportBatch("emoji_used", spec, day0 - (i % 8), template)
            items.append((metric_day_key(batch.metric, batch.day), encode_frame(batch)))
        # warm-up: one batch per partition, processed and committed before the clock starts, so the first
        # fetch positions (offset look-ups, with their retry back-off on fresh topics) are not timed
        warm = [
            (metric_day_key("emoji_used", day0 - i), encode_frame(ReportBatch("emoji_used", spec, day0 - i, template)))
            for i in range(8)
        ]
        tr.publish_many(settings.raw_topic, warm)
        while shuffler.stats.input_reports < len(warm) * reports:
            shuffler.step()
            shuffler.checkpoint(force=True)
        base = shuffler.stats.input_reports
        for k in range(0, len(items), 200):
            tr.publish_many(settings.raw_topic, items[k : k + 200])
        total = batches * reports
        c0 = time.process_time()
        t0 = time.perf_counter()
        while shuffler.stats.input_reports - base < total:
            shuffler.step()
            if (
                shuffler._progress
                and shuffler.stats.input_reports
                - base
                + sum(p.delta["input_reports"] for p in shuffler._parts.values())
                >= total
            ):
                shuffler.checkpoint(force=True)
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        stats = shuffler.stats.to_dict()
        shuffler.close()
    _drop_topics(url, [settings.raw_topic, settings.shuffled_topic, settings.state_topic])
    return {
        "reports_per_s": total / elapsed,
        "seconds": elapsed,
        "cpu_s_per_m_reports": cpu / total * 1e6,
        "released_reports": stats["released_reports"],
        "released_batches": stats["released_batches"],
        "checkpoints": stats["checkpoints"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--transport",
        default="kafka",
        help="'kafka' ($LDP_KAFKA_BOOTSTRAP, default 127.0.0.1:9092), 'sqlite', or a transport URL",
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0, help="load duration of one ingest run")
    ap.add_argument("--connections", type=int, default=256)
    ap.add_argument("--reports", type=int, default=1000, help="reports per uploaded batch")
    ap.add_argument("--batches", type=int, default=2000, help="raw batches per shuffle run")
    ap.add_argument("--min-batch", type=int, default=10_000, help="crowd threshold of the shuffle runs")
    ap.add_argument("--quick", action="store_true", help="one short run of each")
    ap.add_argument("--skip-ingest", action="store_true")
    ap.add_argument("--skip-shuffle", action="store_true")
    ap.add_argument(
        "--before",
        metavar="TREE",
        default=None,
        help="also load, interleaved in the same runs, the collector of another source tree (e.g. a `git worktree` "
        "of the previous commit): its figures go to 'ingest_before' and the ratio to 'collector_cpu_after_vs_before'; "
        "with --native, its collector behind the native front too: 'ingest_native_before' and "
        "'collector_native_cpu_after_vs_before'",
    )
    ap.add_argument(
        "--peers",
        action="store_true",
        help="also load, in the same runs (interleaved), an endpoint that only reads the body and one that also "
        "parses the frame (benchmarks/ingest_peer.py), and give the collector's CPU per report as a multiple of theirs; "
        "with the native front installed (ldp_front, scripts/build-front), also 'front-read': the front reads the "
        "uploads and Python answers each batch 202 at once",
    )
    ap.add_argument(
        "--native",
        action="store_true",
        help="also load, interleaved in the same runs, the collector with --front native (the native upload front, "
        "scripts/build-front): its figures go to 'ingest_native', its CPU per report against the Python front's and "
        "each peer's to 'native_cpu_vs_python' and 'collector_native_cpu_vs_<peer>'",
    )
    args = ap.parse_args()
    if args.quick:
        args.runs, args.seconds, args.batches = 1, 2.0, 500
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="bench-ingest-"))
    kafka = os.environ.get("LDP_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    url = {"kafka": f"kafka://{kafka}", "sqlite": f"sqlite:///{tmp}/log.sqlite3"}.get(args.transport, args.transport)
    warm_up()
    load0 = os.getloadavg()
    results: dict[str, object] = {
        "transport": url.split("://")[0],
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu_model": next(
            (ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), ""
        ),
        "loadavg_before": load0,
    }
    if not args.skip_ingest:
        peers: tuple[str, ...] = ("read", "parse") if args.peers else ()
        if args.peers and importlib.util.find_spec("ldp_front") is not None:
            peers += ("front-read",)
        elif args.peers:
            print("bench_ingest: ldp_front is not installed (scripts/build-front): no front-read peer", file=sys.stderr)
        runs, peer_runs = [], {p: [] for p in peers}  # type: ignore[var-annotated]
        before_runs, native_runs, native_before_runs = [], [], []
        for _ in range(args.runs):
            if args.before:
                os.environ["LDP_BENCH_COLLECTOR_TREE"] = args.before
                try:
                    before_runs.append(bench_ingest(url, tmp, args.reports, args.seconds, args.connections))
                    if args.native:
                        native_before_runs.append(
                            bench_ingest(url, tmp, args.reports, args.seconds, args.connections, front="native")
                        )
                finally:
                    del os.environ["LDP_BENCH_COLLECTOR_TREE"]
            runs.append(bench_ingest(url, tmp, args.reports, args.seconds, args.connections))
            if args.native:
                native_runs.append(bench_ingest(url, tmp, args.reports, args.seconds, args.connections, front="native"))
            for p in peers:
                peer_runs[p].append(bench_ingest(url, tmp, args.reports, args.seconds, args.connections, p))
        results["ingest_runs"] = runs
        results["ingest"] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        cpu = results["ingest"]["collector_cpu_s_per_m_reports"]  # type: ignore[index]
        if before_runs:
            results["ingest_before_runs"] = before_runs
            results["ingest_before"] = {k: statistics.median(r[k] for r in before_runs) for k in before_runs[0]}
            results["collector_cpu_after_vs_before"] = cpu / results["ingest_before"]["collector_cpu_s_per_m_reports"]
        if native_runs:
            results["ingest_native_runs"] = native_runs
            results["ingest_native"] = {k: statistics.median(r[k] for r in native_runs) for k in native_runs[0]}
            results["native_cpu_vs_python"] = results["ingest_native"]["collector_cpu_s_per_m_reports"] / cpu  # type: ignore[index]
        if native_before_runs:
            results["ingest_native_before_runs"] = native_before_runs
            results["ingest_native_before"] = {
                k: statistics.median(r[k] for r in native_before_runs) for k in native_before_runs[0]
            }
            results["collector_native_cpu_after_vs_before"] = (
                results["ingest_native"]["collector_cpu_s_per_m_reports"]  # type: ignore[index]
                / results["ingest_native_before"]["collector_cpu_s_per_m_reports"]  # type: ignore[index]
            )
        for p, pruns in peer_runs.items():
            med = {k: statistics.median(r[k] for r in pruns) for k in pruns[0]}
            results[f"peer_{p}_runs"] = pruns
            results[f"peer_{p}"] = med
            results[f"collector_cpu_vs_{p}"] = cpu / med["collector_cpu_s_per_m_reports"]
            if native_runs:
                results[f"collector_native_cpu_vs_{p}"] = (
                    results["ingest_native"]["collector_cpu_s_per_m_reports"]  # type: ignore[index]
                    / med["collector_cpu_s_per_m_reports"]
                )
        if "front-read" in peer_runs and "read" in peer_runs:
            results["front_read_cpu_vs_read"] = (
                results["peer_front-read"]["collector_cpu_s_per_m_reports"]  # type: ignore[index]
                / results["peer_read"]["collector_cpu_s_per_m_reports"]  # type: ignore[index]
            )
    if not args.skip_shuffle:
        runs = [bench_shuffle(url, args.batches, args.reports, args.min_batch) for _ in range(args.runs)]
        results["shuffle_runs"] = runs
        results["shuffle"] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    results["loadavg_after"] = os.getloadavg()
    out = ROOT / "benchmarks" / "results" / f"ingest-{results['transport']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(
        f"## Ingest and shuffle ({results['transport']}; medians of {args.runs} runs; load average "
        f"{load0[0]:.1f} before, {results['loadavg_after'][0]:.1f} after)\n"
    )  # type: ignore[index]
    print("| stage | reports/s | detail |\n|---|---|---|")
    if "ingest" in results:
        i = results["ingest"]
        print(
            f"| collector → {results['transport']} ({args.reports}-report frames, {args.connections} connections) "
            f"| {i['reports_per_s']:,.0f} | {i['requests_per_s']:,.0f} req/s; p50 {i['latency_p50_ms']:.1f} ms, "
            f"p99 {i['latency_p99_ms']:.1f} ms; CPU s per million reports: collector "
            f"{i['collector_cpu_s_per_m_reports']:.2f}, load generator {i['client_cpu_s_per_m_reports']:.2f}"
            + (f", broker {i['broker_cpu_s_per_m_reports']:.2f}" if "broker_cpu_s_per_m_reports" in i else "")
            + " |"
        )
        if "ingest_before" in results:
            b = results["ingest_before"]
            print(
                f"| the same, collector of {args.before} | {b['reports_per_s']:,.0f} | CPU s per million reports: "
                f"collector {b['collector_cpu_s_per_m_reports']:.3f} (after/before "
                f"{results['collector_cpu_after_vs_before']:.2f}) |"
            )
        if "ingest_native" in results:
            n = results["ingest_native"]
            print(
                f"| the same, `--front native` | {n['reports_per_s']:,.0f} | p50 {n['latency_p50_ms']:.1f} ms, "
                f"p99 {n['latency_p99_ms']:.1f} ms; CPU s per million reports: collector "
                f"{n['collector_cpu_s_per_m_reports']:.3f} ({results['native_cpu_vs_python']:.2f}× the Python front's)"
                + "".join(
                    f"; {results[f'collector_native_cpu_vs_{p}']:.2f}× the {p} peer's"
                    for p in ("read", "parse", "front-read")
                    if f"collector_native_cpu_vs_{p}" in results
                )
                + " |"
            )
        if "ingest_native_before" in results:
            b = results["ingest_native_before"]
            print(
                f"| the same, `--front native`, collector of {args.before} | {b['reports_per_s']:,.0f} | CPU s per "
                f"million reports: collector {b['collector_cpu_s_per_m_reports']:.3f} (after/before "
                f"{results['collector_native_cpu_after_vs_before']:.2f}) |"
            )
        for p in ("read", "parse", "front-read"):
            if f"peer_{p}" in results:
                q = results[f"peer_{p}"]
                what = {
                    "read": "an endpoint that only reads the body",
                    "parse": "an endpoint that only reads the body and parses the frame",
                    "front-read": "the native front (ldp_front) reads it, Python answers each batch 202",
                }[p]
                print(
                    f"| peer: {what} | {q['reports_per_s']:,.0f} | CPU s per million reports: "
                    f"{q['collector_cpu_s_per_m_reports']:.3f}; the collector uses "
                    f"{results[f'collector_cpu_vs_{p}']:.2f}× its CPU per report"
                    + (f" (front-read / read: {results['front_read_cpu_vs_read']:.2f})" if p == "front-read" else "")
                    + " |"
                )
    if "shuffle" in results:
        s = results["shuffle"]
        print(
            f"| shuffler on {results['transport']} ({args.batches} × {args.reports} reports, min batch "
            f"{args.min_batch}) | {s['reports_per_s']:,.0f} | {s['seconds']:.2f} s; {s['released_batches']:.0f} "
            f"batches released in {s['checkpoints']:.0f} transactions; shuffler process CPU "
            f"{s['cpu_s_per_m_reports']:.2f} s per million reports |"
        )
    print(f"\n(raw figures: {out.relative_to(ROOT)})")


if __name__ == "__main__":
    main()
