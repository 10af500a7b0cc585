"""The Python CPU per upload of the native front's bridge vs the ASGI path's handler, without HTTP.

What the native front (native/front, issue 31) leaves to Python is :class:`collector.http.front_bridge.FrontBridge`:
take a batch of uploads, run each through ``UploadHandler.start``, publish, answer in one ``answer_many``. This
measures that, against the ASGI path as uvicorn drives it after parsing HTTP: ``CollectorApp(scope, receive,
send)``, one task per upload (the ASGI messages included, uvicorn's own parsing and writing not).

Both modes run one collector app each (the embedded sqlite log transport, or Kafka with ``--transport kafka``;
the default settings otherwise) on one event
loop (uvloop unless ``--loop asyncio``), in rounds that alternate between them: ``--uploads`` binary frames of
``--reports`` OLH reports (each a fresh batch id, so every one is published) in waves of ``--wave``
concurrent uploads. For the bridge, a wave is queued at once on the tests' in-process front (a deque and an
eventfd, tests/support/loopback_front.py; the Rust front's queue costs Python only the tuples ``take_nowait``
builds). The bridge's uploads carry the fields of the Rust front's frame pre-check (native/front/src/frames.rs,
computed before the rounds with ``ldp_front``: the front does it on its own threads as it reads a body); a third
mode, ``bridge_unchecked``, offers the same uploads without them (decoded in full, as with ``--no-precheck``,
which also runs without ``ldp_front``). Counted per upload:
the event loop thread's CPU time (``time.thread_time``; what the front's Python half costs) and the whole
process's (``time.process_time``; the publisher threads' group commits into the log and the batch-id store
included), and the time the garbage collector ran meanwhile (``gc.callbacks``). Figures are medians over ``--rounds`` rounds. Usage::

    .venv/bin/python benchmarks/bench_front_bridge.py
    .venv/bin/python benchmarks/bench_front_bridge.py --quick --json
    .venv/bin/python benchmarks/bench_front_bridge.py --transport kafka   # Kafka at $LDP_KAFKA_BOOTSTRAP

With ``--http`` it compares whole collectors over HTTP instead: ``ldp collector`` against ``ldp collector
--front native`` (which needs ``ldp_front``), under ``bench_ingest.py``'s
load generator; counted is the collector process's CPU per answered upload (the front's threads included).

Results print as Markdown (or JSON with ``--json``) and go to ``benchmarks/results/front_bridge[-http][-kafka].json``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import gc
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from collector.http.app import CollectorApp, create_app  # noqa: E402
from collector.http.front_bridge import FrontBridge  # noqa: E402
from collector.settings import CollectorSettings  # noqa: E402
from ldp_core.days import utc_day  # noqa: E402
from ldp_core.metrics import load_metrics  # noqa: E402
from ldp_core.wire.frames import FRAME_CONTENT_TYPE, ReportBatch, encode_frame  # noqa: E402
from tests.support.loopback_front import LoopbackFront, native_checker  # noqa: E402

METRICS = ROOT / "metrics" / "example.json"
METRIC = "emoji_used"


class _Front(LoopbackFront):
    """The tests' stand-in for the Rust front, queueing a whole wave with one eventfd write and counting the
    answers instead of keeping them (the least Python cost a front can add)."""

    def __init__(self, precheck: Any = None) -> None:
        super().__init__(precheck)
        self.checked: dict[int, Any] = {}  # id(body) -> the pre-check's fields, computed before the rounds
        self.use_checked = True
        self.answered = 0
        self.calls = 0
        self.statuses: collections.Counter[int] = collections.Counter()
        self.target = 0
        self.done: asyncio.Event | None = None

    def offer(self, bodies: list[bytes], first: int) -> None:
        checked = self.checked if self.use_checked else {}
        self._queue.extend(
            (first + i, b, FRAME_CONTENT_TYPE, None, None, None, checked.get(id(b))) for i, b in enumerate(bodies)
        )
        os.eventfd_write(self.notify_fd(), 1)

    def answer_many(self, answers: list[tuple[int, int, bytes, list[tuple[bytes, bytes]]]]) -> int:
        self.calls += 1
        for a in answers:
            self.statuses[a[1]] += 1
        self.answered += len(answers)
        if self.answered >= self.target and self.done is not None:
            self.done.set()
        return len(answers)


def _frames(n: int, reports: int, seed: int) -> list[bytes]:
    """``n`` frames of the same ``reports`` OLH reports, each with a fresh batch id."""
    import numpy as np

    spec = load_metrics(METRICS, reject_expired=False)[METRIC].spec
    rng = np.random.default_rng(seed)
    records = spec.encode(rng.integers(0, spec.domain_size, reports), rng)
    day = utc_day(time.time())
    return [encode_frame(ReportBatch(METRIC, spec, day, records, batch_id=rng.bytes(16))) for _ in range(n)]


async def _asgi_round(app: CollectorApp, bodies: list[bytes], wave: int) -> collections.Counter[int]:
    statuses: collections.Counter[int] = collections.Counter()

    async def one(body: bytes) -> None:
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/reports",
            "headers": [(b"content-type", FRAME_CONTENT_TYPE.encode()), (b"content-length", str(len(body)).encode())],
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                statuses[message["status"]] += 1

        await app(scope, receive, send)

    for k in range(0, len(bodies), wave):
        await asyncio.gather(*(one(b) for b in bodies[k : k + wave]))
    return statuses


async def _bridge_round(front: _Front, bodies: list[bytes], wave: int, checked: bool) -> collections.Counter[int]:
    front.statuses = collections.Counter()
    front.use_checked = checked
    for k in range(0, len(bodies), wave):
        part = bodies[k : k + wave]
        front.answered, front.target, front.done = 0, len(part), asyncio.Event()
        front.offer(part, k)
        await front.done.wait()
    return front.statuses


class _GcClock:
    """The wall time the cyclic garbage collector ran (on any thread), from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.total = 0.0
        self._t0 = 0.0
        gc.callbacks.append(self._cb)

    def _cb(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.total += time.perf_counter() - self._t0


async def _measure(
    round_: Callable[[list[bytes]], Any], bodies: list[bytes], gc_clock: _GcClock
) -> tuple[float, float, float]:
    t_loop, t_proc, t_gc = time.thread_time(), time.process_time(), gc_clock.total
    statuses = await round_(bodies)
    loop_cpu, proc_cpu = time.thread_time() - t_loop, time.process_time() - t_proc
    if statuses != {202: len(bodies)}:
        raise SystemExit(f"unexpected answers: {dict(statuses)}")
    n = len(bodies)
    return loop_cpu / n * 1e6, proc_cpu / n * 1e6, (gc_clock.total - t_gc) / n * 1e6


async def _bench(args: argparse.Namespace, tmp: pathlib.Path) -> dict[str, Any]:
    per_round = args.uploads
    frames = _frames(per_round * (args.rounds + 1) * 3, args.reports, args.seed)
    apps = {}
    run = uuid.uuid4().hex[:8]
    for mode in ("asgi", "bridge"):
        url = f"sqlite:///{tmp}/{mode}.log.sqlite3" if args.transport == "sqlite" else f"kafka://{args.bootstrap}"
        settings = CollectorSettings(
            metrics_path=str(METRICS),
            transport_url=url,
            dedup_path=str(tmp / f"{mode}.ids.sqlite3"),
            raw_partitions=1,
            raw_topic=f"ldp.bench.bridge-{run}-{mode}",
        )
        apps[mode] = create_app(settings, metrics_route=False)
    checker = native_checker() if args.precheck else contextlib.nullcontext()
    front = _Front(checker.__enter__())
    bridge = FrontBridge.for_app(apps["bridge"])
    async with (
        apps["asgi"].fastapi.router.lifespan_context(apps["asgi"].fastapi),
        apps["bridge"].fastapi.router.lifespan_context(apps["bridge"].fastapi),
    ):
        bridge.attach(front)  # registers the metrics with the pre-check
        if front.precheck is not None:  # the Rust front computes these on its own threads as it reads bodies
            front.checked = {id(f): front.precheck.check_frame(f) for f in frames}
            if None in front.checked.values():
                raise SystemExit("the pre-check refused a frame of the benchmark")
        gc_clock = _GcClock()
        rounds: dict[str, Callable[[list[bytes]], Any]] = {
            "asgi": lambda b: _asgi_round(apps["asgi"], b, args.wave),
            "bridge": lambda b: _bridge_round(front, b, args.wave, True),
            "bridge_unchecked": lambda b: _bridge_round(front, b, args.wave, False),
        }
        modes = ["asgi", "bridge"] + (["bridge_unchecked"] if front.precheck is not None else [])
        results: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
        it = iter(frames)
        for r in range(args.rounds + 1):  # the first round of each warms up (not counted)
            for mode in modes if r % 2 == 0 else modes[::-1]:
                if args.only not in (None, mode):
                    continue
                bodies = [next(it) for _ in range(per_round)]
                got = await _measure(rounds[mode], bodies, gc_clock)
                if r:
                    results[mode].append(got)
        bridge.detach()
        taken = bridge.stats["taken"]
    front.close()
    checker.__exit__(None, None, None)
    out: dict[str, Any] = {
        "uploads_per_round": per_round,
        "rounds": args.rounds,
        "reports_per_upload": args.reports,
        "wave": args.wave,
        "loop": args.loop,
        "transport": args.transport,
        "frame_bytes": len(frames[0]),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
    }
    for mode, rows in results.items():
        if not rows:
            continue
        out[mode] = {
            "loop_thread_us_per_upload": round(statistics.median(r[0] for r in rows), 1),
            "process_us_per_upload": round(statistics.median(r[1] for r in rows), 1),
            "gc_us_per_upload": round(statistics.median(r[2] for r in rows), 1),
            "loop_thread_us_rounds": [round(r[0], 1) for r in rows],
        }
    if results.get("bridge"):
        out["bridge"]["answers_per_answer_many"] = round(taken / front.calls, 1)
    if args.only is None:
        out["loop_thread_ratio_bridge_to_asgi"] = round(
            out["bridge"]["loop_thread_us_per_upload"] / out["asgi"]["loop_thread_us_per_upload"], 3
        )
        if "bridge_unchecked" in out:
            out["loop_thread_ratio_precheck"] = round(
                out["bridge"]["loop_thread_us_per_upload"] / out["bridge_unchecked"]["loop_thread_us_per_upload"], 3
            )
    return out


def _http(args: argparse.Namespace) -> dict[str, Any]:
    """Over HTTP: ``ldp collector`` against the collector behind the native front, in alternating runs of
    ``--seconds`` under ``--connections`` keep-alive connections (bench_ingest.py's load generator); the
    collector process's CPU (from ``/proc``, the front's threads included) per answered upload."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_ingest as bi

    rows: dict[str, list[dict[str, float]]] = {"asgi": [], "front": []}
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        url = f"kafka://{args.bootstrap}" if args.transport == "kafka" else f"sqlite:///{tmp}/log.sqlite3"
        template = bi._template(args.reports)
        for r in range(args.rounds):
            for kind in ("asgi", "front") if r % 2 == 0 else ("front", "asgi"):
                topic = f"bench.raw-{uuid.uuid4().hex[:8]}"
                server = bi.Collector(url, topic, tmp, front="python" if kind == "asgi" else "native")
                try:
                    cpu0 = bi._cpu_seconds(server.proc.pid)
                    latencies, counts = asyncio.run(
                        bi._load(server.host, server.port, template, args.seconds, args.connections, 1.0)
                    )
                    cpu = bi._cpu_seconds(server.proc.pid) - cpu0
                finally:
                    server.stop()
                answered = max(1, counts[0] + counts[1]) * (args.seconds + 1.0) / args.seconds
                rows[kind].append(
                    {
                        "collector_us_per_upload": cpu / answered * 1e6,
                        "reports_per_s": counts[0] * args.reports / args.seconds,
                        "latency_p50_ms": statistics.median(latencies) * 1000 if latencies else float("nan"),
                        "rejected": counts[1],
                    }
                )
    out: dict[str, Any] = {
        "mode": "http",
        "transport": args.transport,
        "reports_per_upload": args.reports,
        "connections": args.connections,
        "seconds": args.seconds,
        "runs": args.rounds,
    }
    for kind, runs in rows.items():
        out[kind] = {k: round(statistics.median(x[k] for x in runs), 1) for k in runs[0]}
        out[kind]["collector_us_per_upload_runs"] = [round(x["collector_us_per_upload"], 1) for x in runs]
    out["front_to_asgi"] = round(out["front"]["collector_us_per_upload"] / out["asgi"]["collector_us_per_upload"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--uploads", type=int, default=2000, help="uploads per round and mode (default 2000)")
    p.add_argument("--rounds", type=int, help="counted rounds per mode (default 7; with --http runs of each, 3)")
    p.add_argument("--reports", type=int, default=1000, help="reports per upload (default 1000)")
    p.add_argument("--wave", type=int, default=64, help="concurrent uploads (default 64)")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    p.add_argument("--transport", choices=("sqlite", "kafka"), default="sqlite")
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("LDP_KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        help="Kafka's address with --transport kafka (default $LDP_KAFKA_BOOTSTRAP or 127.0.0.1:9092)",
    )
    p.add_argument("--seed", type=int, default=9)
    p.add_argument("--only", choices=("asgi", "bridge", "bridge_unchecked"), help="run one path only (for a profiler)")
    p.add_argument(
        "--no-precheck",
        dest="precheck",
        action="store_false",
        help="no frame pre-check (without ldp_front): the bridge decodes every frame in full",
    )
    p.add_argument(
        "--http",
        action="store_true",
        help="over HTTP instead: `ldp collector` vs the collector behind the native front (needs ldp_front); "
        "--rounds runs of each",
    )
    p.add_argument("--seconds", type=float, default=5.0, help="with --http: load duration of a run (default 5)")
    p.add_argument("--connections", type=int, default=256, help="with --http: connections (default 256)")
    p.add_argument("--quick", action="store_true", help="500 uploads x 3 rounds")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--out", help="results file (default benchmarks/results/front_bridge[-kafka].json)")
    args = p.parse_args(argv)
    if args.out is None:
        name = "front_bridge" + ("-http" if args.http else "") + ("-kafka" if args.transport == "kafka" else "")
        name += ".json"
        args.out = str(ROOT / "benchmarks" / "results" / name)
    if args.rounds is None:
        args.rounds = 3 if args.http else 7
    if args.quick:
        args.uploads, args.rounds, args.seconds = 500, (1 if args.http else 3), 2.0
    if args.http:
        result = _http(args)
        pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        if args.json:
            print(json.dumps(result, indent=2))
            return 0
        print(f"over HTTP, {args.transport}, {args.reports} reports per upload, {args.connections} connections")
        print("| collector | CPU us per upload | reports/s | p50 ms |")
        print("|---|---|---|---|")
        for kind in ("asgi", "front"):
            r = result[kind]
            print(f"| {kind} | {r['collector_us_per_upload']} | {r['reports_per_s']:,.0f} | {r['latency_p50_ms']} |")
        print(f"front / asgi: {result['front_to_asgi']}")
        return 0
    if args.loop == "uvloop":
        import uvloop

        runner: Callable[[Any], Any] = uvloop.run
    else:
        runner = asyncio.run
    with tempfile.TemporaryDirectory() as tmp:
        result = runner(_bench(args, pathlib.Path(tmp)))
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(
        f"{args.uploads} uploads x {args.rounds} rounds, {args.reports} reports each, waves of {args.wave}, "
        f"{args.loop}, {args.transport}"
    )
    print("| path | loop thread us/upload | process us/upload | of which garbage collection |")
    print("|---|---|---|---|")
    for mode in ("asgi", "bridge", "bridge_unchecked"):
        if mode not in result:
            continue
        r = result[mode]
        print(f"| {mode} | {r['loop_thread_us_per_upload']} | {r['process_us_per_upload']} | {r['gc_us_per_upload']} |")
    if "bridge" in result:
        print(f"answers per answer_many call: {result['bridge']['answers_per_answer_many']}")
    if "loop_thread_ratio_bridge_to_asgi" in result:
        print(f"bridge / asgi (loop thread): {result['loop_thread_ratio_bridge_to_asgi']}")
    if "loop_thread_ratio_precheck" in result:
        print(f"bridge / bridge_unchecked (loop thread): {result['loop_thread_ratio_precheck']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
