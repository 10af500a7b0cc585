"""``ldp collector --front native``: the device-facing socket served by the native upload front (issue 31).

Why. Any request served by a Python HTTP server costs about 35-46 µs of CPU before the collector does
anything (uvicorn's read-only endpoint, granian's RSGI and ASGI alike, docs/benchmarks/PIPELINE.md), which
alone puts the collector above 1.5× an endpoint that only reads the body. The native front
(``ldp_front``, native/front: tokio + hyper) parses HTTP/1.1 and reads the bodies of ``POST /v1/reports``
outside Python and hands them to the collector's event loop in batches (:mod:`collector.http.front_bridge`),
where they take the same steps as on the ASGI path. Every other request (the metrics document, token keys,
readiness, the FL routes, CORS preflights, a JSON upload, a body above ``max_body_bytes``...) is proxied to
the collector's ASGI app, which listens on a loopback port of its own: one implementation of every answer.

What differs from the Python front (docs/COLLECTOR.md, "The native front"): the front holds a body being read
in Rust, bounded by ``max_body_bytes``, ``body_timeout`` and, in all, ``max_reading × max_body_bytes`` bytes
(the Python front's bound) counted as they arrive (beyond: 503 ``overloaded`` and the connection closed), so a
slow body holds only what it sent and cannot take an honest upload's place; ``min_body_rate`` and the
eviction of slow readers are the Python front's rules (there a reading body costs the interpreter's time;
here a tokio task); bodies read and waiting for the loop are at most ``max_reading`` (beyond: 503
``overloaded``). One worker process (``--workers 1``): run several collectors behind one address to use more cores.

:class:`NativeFront` owns both halves for one collector process: :meth:`start` once the app has started
(its ingestor exists), :meth:`stop` before it shuts down (answers untaken uploads 503 ``shutting_down``,
lets taken ones finish, for up to ``grace`` seconds).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from collector.http.front_bridge import FrontBridge
from collector.http.upload import FRAME_CONTENT_TYPES
from collector.settings import CollectorSettings
from pipeline.errors import ConfigError

__all__ = ["FRONTS", "NativeFront", "load_front"]

log = logging.getLogger("ldp.collector")

#: ``--front``'s choices: uvicorn serves the device-facing socket, or the native front does
FRONTS = ("python", "native")

#: the front's counters exported as ``ldp_collector_front_events_total{event=...}`` (stats key: event)
_EVENTS = {
    "accepted": "accepted",
    "uploads_taken": "uploads",
    "prechecked": "prechecked",
    "proxied": "proxied",
    "header_timeouts": "header_timeouts",
    "evicted": "evicted",
    "client_gone": "client_gone",
    "proxy_errors": "proxy_errors",
    "proxy_timeouts": "proxy_timeouts",
}
#: what a proxied request may take beyond reading its body and publishing it before the front answers it 504
UPSTREAM_MARGIN = 10.0
#: the front's own refusals, counted in ``ldp_collector_batches_total`` like the Python front's
_REFUSALS = {"body_timeouts": ("rejected", "body_timeout"), "overloaded": ("unavailable", "overloaded")}


def load_front() -> Any:
    """The ``ldp_front`` module, or a clear :class:`ConfigError` saying how to build it."""
    try:
        import ldp_front
    except ImportError:
        raise ConfigError(
            "--front native needs the native upload front (the ldp_front module): build it with "
            "scripts/build-front (maturin from pip install -e '.[front]', and cargo), or use --front python"
        ) from None
    return ldp_front


class _FrontCollector(Collector):
    """The front's counters for ``/metrics``, read from ``Front.stats()`` when scraped."""

    def __init__(self, front: Any) -> None:
        self.front = front

    def collect(self) -> Iterator[Any]:
        stats = self.front.stats()
        events = CounterMetricFamily(
            "ldp_collector_front_events",
            "The native front's connection and request events (accepted connections, uploads handed to the "
            "app, proxied requests, head timeouts, evictions, answers no client was left for, proxy errors, proxied "
            "requests the app did not answer in time)",
            labels=["event"],
        )
        for key, event in _EVENTS.items():
            events.add_metric([event], float(stats.get(key, 0)))
        yield events
        yield GaugeMetricFamily(
            "ldp_collector_front_connections", "Connections open at the native front", value=stats["connections"]
        )
        yield GaugeMetricFamily(
            "ldp_collector_front_queued", "Upload bodies read by the native front, not yet taken", value=stats["queued"]
        )


class NativeFront:
    """The native front on ``sock`` (the device-facing listener) and its bridge to ``app`` (a
    :class:`~collector.http.app.CollectorApp`), proxying the rest to :attr:`inner`, the app's own loopback
    listener, which uvicorn serves."""

    def __init__(self, settings: CollectorSettings, sock: socket.socket) -> None:
        self.module = load_front()
        self.settings = settings
        self.sock = sock
        #: the app's own listener (uvicorn serves it): what the front proxies to
        self.inner = socket.create_server(("127.0.0.1", 0), backlog=2048)
        host, port = self.inner.getsockname()[:2]
        self.upstream = f"{host}:{port}"
        self.front: Any = None
        self.bridge: FrontBridge | None = None
        self._counted = dict.fromkeys(_REFUSALS, 0)
        self._stopped = False

    def start(self, app: Any, loop: asyncio.AbstractEventLoop) -> None:
        s = self.settings
        self.front = self.module.Front(
            self.sock.fileno(),
            self.upstream,
            upload_path="/v1/reports",
            content_types=list(FRAME_CONTENT_TYPES),
            max_body_bytes=s.max_body_bytes,
            body_timeout=s.body_timeout,
            header_timeout=s.header_timeout,
            max_connections=s.max_connections,
            max_queued=s.max_reading,
            max_reading_bytes=s.max_reading * s.max_body_bytes,
            # a proxied upload (a body the front did not take) is answered within body_timeout + publish_timeout
            upstream_timeout=s.body_timeout + s.publish_timeout + UPSTREAM_MARGIN,
            retry_after=s.retry_after,
            threads=1,
        )
        self.bridge = FrontBridge.for_app(app)
        self.bridge.attach(self.front, loop)
        app.metrics.registry.register(_FrontCollector(self.front))
        app.state.runtime.setdefault("on_render", []).append(self.count_refusals)
        log.info("native front on %s:%d, the rest proxied to %s", *self.sock.getsockname()[:2], self.upstream)

    def count_refusals(self) -> None:
        """Add the front's own refusals since the last call to the app's upload counters (at each scrape)."""
        if self.front is None or self.bridge is None:
            return
        stats, metrics = self.front.stats(), self.bridge.upload.metrics
        for key, (outcome, reason) in _REFUSALS.items():
            new = int(stats.get(key, 0)) - self._counted[key]
            if new > 0:
                metrics.batches.labels(outcome=outcome, reason=reason).inc(new)
                self._counted[key] += new

    async def stop(self, grace: float) -> None:
        """Stop accepting; untaken uploads are answered 503, taken ones still get their answers (the loop keeps
        running while the front waits up to ``grace`` s for its connections to finish). Idempotent."""
        if self.front is None or self._stopped:
            return
        self._stopped = True
        await asyncio.get_running_loop().run_in_executor(None, self.front.close, grace)
        if self.bridge is not None:
            self.bridge.detach()
        self.count_refusals()


def make_server(config: Any, native: NativeFront | None) -> Any:
    """The uvicorn server of ``config``; with ``native``, one that stops the front before its own shutdown
    (so that every upload the front took is answered while the app's ingestor still runs)."""
    import uvicorn

    if native is None:
        return uvicorn.Server(config)
    front = native

    class FrontedServer(uvicorn.Server):
        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            s = front.settings
            await front.stop(s.body_timeout + s.publish_timeout + 1.0)
            await super().shutdown(sockets=sockets)

    return FrontedServer(config)


async def serve(
    server: Any, sock: socket.socket, msock: socket.socket | None, app: Any, native: NativeFront | None
) -> None:
    """Run the collector: uvicorn on ``sock`` (the device-facing socket, or with ``native`` the app's loopback
    one, the front then serving the device-facing one once the app has started), the operational metrics on
    ``msock`` (if any)."""
    from collector.http.monitoring import start_metrics_listener
    from collector.http.workers import renderer

    render_now = renderer(app.metrics, app.state.runtime)
    listener = None if msock is None else await start_metrics_listener(msock, render_now)
    try:
        if native is None:
            await server.serve(sockets=[sock])
            return
        running = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not running.done():  # the app's start-up (its ingestor) comes first
            await asyncio.sleep(0.005)
        if server.started:
            native.start(app, asyncio.get_running_loop())
        await running
    finally:
        if native is not None:
            await native.stop(0.0)
        if listener is not None:
            listener.close()
