"""The collector's operational metrics: its Prometheus families (:class:`CollectorMetrics`), the middleware
that times every request, and ``GET /metrics``: on a listener of its own (:func:`start_metrics_listener`,
the default of ``ldp collector``), or on the device-facing app only when asked (:func:`add_prometheus_route`).

The metrics tell an operator's business (per-round accepted FL updates: the realized sample size; upload
counts and rejections), so they are kept off the port devices reach."""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import Counter, Gauge, Histogram

from collector.dedup import BatchIdStore
from collector.ingest import BATCHES_TOTAL, METRIC_REPORTS_TOTAL, REPORTS_TOTAL, GroupStats
from pipeline.prometheus import CONTENT_TYPE, LATENCY_BUCKETS, StoredCounter, new_registry

__all__ = ["MULTIPROC_ENV", "CollectorMetrics", "Timing", "add_prometheus_route", "start_metrics_listener"]

#: prometheus-client's multiprocess mode: the folder where every worker's values are (read at import)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

#: the routes whose latency is told apart (any other path is counted as ``other``: no client-chosen labels)
ROUTES = frozenset(
    {"/v1/reports", "/v1/metrics", "/v1/token-keys", "/healthz", "/readyz", "/metrics", "/docs", "/openapi.json"}
)


class CollectorMetrics:
    """The collector's Prometheus metric families, in a registry of the app's own (``registry``; the FL
    routes add theirs to it). The upload counters are :class:`~pipeline.prometheus.StoredCounter` s
    (:meth:`persist`); the gauges and histograms are the process's own."""

    def __init__(self) -> None:
        self.registry = r = new_registry()
        self.batches = StoredCounter(
            BATCHES_TOTAL, "Uploaded batches by outcome and reason", ["outcome", "reason"], registry=r
        )
        self.reports = StoredCounter(
            REPORTS_TOTAL,
            "Reports in uploaded batches by outcome and reason (batches that decoded)",
            ["outcome", "reason"],
            registry=r,
        )
        self.metric_reports = StoredCounter(
            METRIC_REPORTS_TOTAL, "Reports published, per declared metric", ["metric"], registry=r
        )
        self.latency = Histogram(
            "ldp_collector_request_duration_seconds",
            "HTTP request latency",
            ["route", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._upload_latency = self.latency.labels(route="/v1/reports", method="POST")  # looked up once
        # livesum: with --workers (prometheus-client's multiprocess mode) the sum over the live workers
        self.in_flight = Gauge(
            "ldp_collector_uploads_in_flight",
            "Uploads being processed (body read)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.reading = Gauge(
            "ldp_collector_uploads_reading",
            "Uploads whose body is being read",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.publish = Histogram(
            "ldp_collector_publish_duration_seconds",
            "Duration of one group commit (duplicate check, durable publish, id record)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.group = Histogram(
            "ldp_collector_publish_group_batches",
            "Batches per group commit",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=r,
        )

        self.token_key_days_refused = Counter(
            "ldp_collector_token_key_days_refused",
            "Token key days refused whole: the issuer's public folder held several keys for one day",
            registry=r,
        )

    def persist(self, store: BatchIdStore) -> None:
        """Keep the upload counters in the batch-id store: they survive restarts, and the accepted ones are
        counted in the transaction that records the ids (:mod:`collector.dedup`, :mod:`collector.ingest`)."""
        for c in (self.batches, self.reports, self.metric_reports):
            c.persist(store)

    def reject(self, reason: str, reports: int | None, outcome: str = "rejected") -> None:
        """Count a refused upload (and its ``reports``, when it decoded)."""
        self.batches.labels(outcome=outcome, reason=reason).inc()
        if reports:
            self.reports.labels(outcome=outcome, reason=reason).inc(reports)

    def observe_group(self, stats: GroupStats) -> None:
        """Count one group commit of the ingestor."""
        self.publish.observe(stats.seconds)
        self.group.observe(stats.published + stats.duplicates + stats.failed)

    def observe_upload(self, seconds: float) -> None:
        """Count one ``POST /v1/reports``'s latency."""
        self._upload_latency.observe(seconds)

    def observe_uploads(self, seconds: Sequence[float]) -> None:
        """Count the latencies of many uploads at once (the native front's answers of one loop iteration): what
        :meth:`observe_upload` of each counts, with one increment per bucket they fall in instead of two
        locked increments per upload (prometheus-client has no batch observe; this uses its histogram child's
        bounds, buckets and sum, ``tests/collector/test_monitoring.py`` holds it to ``observe``)."""
        child = self._upload_latency
        bounds = child._upper_bounds
        per_bucket = collections.Counter(bisect.bisect_left(bounds, s) for s in seconds)
        buckets = child._buckets
        for i, n in per_bucket.items():
            buckets[i].inc(n)
        child._sum.inc(sum(seconds))

    def observe_request(self, seconds: float, path: str, method: str) -> None:
        """Count one request's latency under its route (``other`` for any path the collector does not serve)."""
        self.latency.labels(
            route=path if path in ROUTES else "other",
            method=method if method in ("GET", "POST", "HEAD") else "other",
        ).observe(seconds)


class Timing:
    """ASGI middleware: request latency per route into a histogram (the route, never the client)."""

    def __init__(self, app: Any, metrics: CollectorMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            self.metrics.observe_request(time.perf_counter() - t0, scope.get("path", ""), scope.get("method", ""))


def add_prometheus_route(app: FastAPI, render_now: Callable[[], bytes]) -> None:
    """Serve ``render_now()`` (:func:`collector.http.workers.renderer`) at ``GET /metrics`` of the
    device-facing app."""

    @app.get("/metrics", summary="Prometheus metrics", responses={200: {"content": {"text/plain": {}}}})
    async def prometheus_metrics() -> Response:
        return Response(render_now(), media_type=CONTENT_TYPE)


_HEAD_LIMIT = 8192
_READ_TIMEOUT = 5.0


def _answer(status: str, body: bytes, content_type: str = "text/plain; charset=utf-8") -> bytes:
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


async def start_metrics_listener(sock: socket.socket, render_now: Callable[[], bytes]) -> asyncio.Server:
    """Serve ``GET /metrics`` (``render_now()``, e.g. :func:`renderer`; nothing else: 404, 405) on the bound
    ``sock``, in the running event loop.

    A minimal HTTP/1.1 responder, one request per connection: the request head must arrive within 5 s and
    8 KiB. Rendering happens on the loop, as the app's own route does (the counters' store is not shared
    with another thread)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT)
            parts = head.split(b"\r\n", 1)[0].split(b" ")
            method, target = (parts[0], parts[1]) if len(parts) == 3 else (b"", b"")
            path = target.split(b"?", 1)[0]
            if not method:
                out = _answer("400 Bad Request", b"bad request\n")
            elif path != b"/metrics":
                out = _answer("404 Not Found", b"not found\n")
            elif method not in (b"GET", b"HEAD"):
                out = _answer("405 Method Not Allowed", b"method not allowed\n")
            else:
                out = _answer("200 OK", render_now(), CONTENT_TYPE)
                if method == b"HEAD":
                    out = out[: out.index(b"\r\n\r\n") + 4]
            writer.write(out)
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    return await asyncio.start_server(handle, sock=sock, limit=_HEAD_LIMIT)
