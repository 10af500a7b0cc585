"""Operational metrics of a collector run as several worker processes (``ldp collector --workers N``).

Each uvicorn worker is a process with its own counters, gauges and histograms; a scrape of one of them
would show one worker's share. So ``ldp collector --workers N`` uses prometheus-client's **multiprocess
mode**: before the workers start it points ``$PROMETHEUS_MULTIPROC_DIR`` at a fresh folder, every worker's
library values then live in memory-mapped files there, and the metrics listener, served by the parent
process (:func:`metrics_for_workers`), renders them summed over the workers with the library's
``MultiProcessCollector`` (histograms and counters summed; the two gauges ``livesum``: over live workers).
The upload counters (``ldp_collector_batches_total``, ``..._reports_total``, ``..._metric_reports_total``)
are not library values but counts in the batch-id store that the workers share (:mod:`collector.dedup`):
the parent reads them from that file, and each worker writes what it counted at least once a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, multiprocess
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from collector.http.monitoring import MULTIPROC_ENV, CollectorMetrics, start_metrics_listener
from ldp_core.processes import pid_alive
from pipeline.prometheus import render

__all__ = ["WholeCollector", "metrics_for_workers", "renderer"]


class _Families(Collector):
    """Families another object collects (the stored upload counters), added to a registry."""

    def __init__(self, families: Iterable[Collector]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        for family in self.families:
            yield from family.collect()


class WholeCollector:
    """Every worker's metrics from the multiprocess folder ``path``, with the stored upload counters of
    ``store`` (a :class:`CollectorMetrics` persisted in the shared batch-id store)."""

    def __init__(self, path: str, *, store: CollectorMetrics) -> None:
        self.path = path
        self.registry = CollectorRegistry(auto_describe=True)
        multiprocess.MultiProcessCollector(self.registry, path=path)  # type: ignore[no-untyped-call]
        self.registry.register(_Families([store.batches, store.reports, store.metric_reports]))

    def render(self) -> bytes:
        """The text format; live gauges of workers that died are dropped first (a restarted worker's)."""
        for f in Path(self.path).glob("gauge_live*_*.db"):
            pid = f.stem.rsplit("_", 1)[-1]
            if pid.isdigit() and not pid_alive(int(pid)):
                multiprocess.mark_process_dead(int(pid), self.path)  # type: ignore[no-untyped-call]
        return render(self.registry)


def renderer(metrics: CollectorMetrics, runtime: dict[str, Any]) -> Callable[[], bytes]:
    """What ``GET /metrics`` answers: this process's families, or, in prometheus-client's multiprocess mode
    (``$PROMETHEUS_MULTIPROC_DIR``, set by ``ldp collector --workers N``), every worker's
    (:class:`WholeCollector`). ``runtime["reading"]`` is the number of bodies being read, ``runtime["in_flight"]`` of uploads in progress
    (both gauges are set from them when rendered, not on every upload); ``runtime["on_render"]``, if any, lists
    callables run first (the native front's refusals are counted then, :mod:`collector.http.frontend`)."""
    if os.environ.get(MULTIPROC_ENV):
        whole = WholeCollector(os.environ[MULTIPROC_ENV], store=metrics)

        def render_all() -> bytes:
            for hook in runtime.get("on_render", ()):
                hook()
            metrics.reading.set(runtime["reading"])
            metrics.in_flight.set(runtime["in_flight"])
            return whole.render()

        return render_all

    def render_own() -> bytes:
        for hook in runtime.get("on_render", ()):
            hook()
        metrics.reading.set(runtime["reading"])
        metrics.in_flight.set(runtime["in_flight"])
        return render(metrics.registry)

    return render_own


def _serve_in_thread(sock: socket.socket, render_now: Callable[[], bytes]) -> Callable[[], None]:
    """Serve ``GET /metrics`` on ``sock`` from an event loop on a daemon thread; returns its stop."""
    loop = asyncio.new_event_loop()
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(start_metrics_listener(sock, render_now))
        started.set()
        try:
            loop.run_forever()
        finally:
            server.close()
            loop.run_until_complete(server.wait_closed())
            loop.close()

    thread = threading.Thread(target=run, name="ldp-collector-metrics", daemon=True)
    thread.start()
    started.wait(30)

    def stop() -> None:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    return stop


@contextlib.contextmanager
def metrics_for_workers(settings: Any, sock: socket.socket | None) -> Iterator[str]:
    """For ``ldp collector --workers N``: sets ``$PROMETHEUS_MULTIPROC_DIR`` (a fresh folder, removed on exit,
    unless the variable names a folder already) before the workers start, and serves the whole collector's
    metrics on ``sock`` (unless None: ``--public-metrics``, where each worker's ``/metrics`` renders the
    same whole). Yields the folder."""
    from collector.dedup import BatchIdStore

    given = os.environ.get(MULTIPROC_ENV)
    own = not (given and Path(given).is_dir())
    path = tempfile.mkdtemp(prefix="ldp-collector-metrics-") if own else str(given)
    os.environ[MULTIPROC_ENV] = path
    store = stop = None
    try:
        if sock is not None:
            store = BatchIdStore(settings.dedup_path, ttl=settings.dedup_ttl)
            counted = CollectorMetrics()
            counted.persist(store)
            stop = _serve_in_thread(sock, WholeCollector(path, store=counted).render)
        yield path
    finally:
        if stop is not None:
            stop()
        if store is not None:
            store.close()
        if own:
            shutil.rmtree(path, ignore_errors=True)
            os.environ.pop(MULTIPROC_ENV, None)
