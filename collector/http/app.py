"""The collector: a FastAPI service that accepts privatized report batches and publishes them.

This module wires the service together (:func:`create_app`); each concern lives in its own module of
:mod:`collector.http`.

Endpoints
---------
``POST /v1/reports``
    One report batch, as a binary frame or in the JSON form; its answers, and what of it leaves the
    collector: :mod:`collector.http.upload`.
``GET /v1/metrics``
    The metrics document (:mod:`ldp_core.metrics`) the SDK reads, with an ``ETag``; with ``?layout=1``
    each metric also carries its ``spec_id`` and ``record`` layout (:mod:`collector.http.metrics_doc`).
``GET /healthz``, ``GET /readyz``
    Liveness (the process and its publisher thread run) and readiness (the transport answers):
    :mod:`collector.http.health`.
``GET /metrics``
    Prometheus counters and latency histograms (:mod:`collector.http.monitoring`), only with
    ``metrics_route`` (``ldp collector --public-metrics``); by default ``ldp collector`` serves them on a
    listener of its own (``--metrics-host``, ``--metrics-port``) and this app answers 404.
``/v1/fl/...``
    With ``fl_enabled``, the federated-learning routes (:mod:`collector.fl.routes`).
``OPTIONS`` (CORS preflights) of the two routes above
    With ``allow_origins``, answered for those web pages' origins only (:mod:`collector.cors`).
``GET /docs``, ``GET /openapi.json``
    OpenAPI documentation (FastAPI's).

Every error body is ``{"error": <reason>, "message": <what is wrong and how to fix it>}``
(:mod:`collector.http.answers`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response
from starlette.requests import ClientDisconnect

from collector.cors import COLLECTOR_ROUTES, CorsMiddleware
from collector.dedup import BatchIdStore
from collector.fl.routes import add_fl_routes, start_fl_service
from collector.http.admission import Admission
from collector.http.answers import add_error_handler
from collector.http.bodies import BodyReaders
from collector.http.decode import json_decode_pool
from collector.http.health import Readiness, add_health_routes
from collector.http.metrics_doc import MetricsDocument, add_metrics_route
from collector.http.monitoring import MULTIPROC_ENV, CollectorMetrics, Timing, add_prometheus_route
from collector.http.upload import UploadHandler, add_upload_route
from collector.http.workers import renderer
from collector.ingest import Ingestor
from collector.settings import CollectorSettings
from collector.tokens import SpentTokens, TokenVerifier
from ldp_core.days import utc_day
from ldp_core.metrics import MetricSet, load_metrics
from ldp_core.wire.frames import MAX_RECORDS
from pipeline.transport import Transport, open_transport

__all__ = ["create_app", "app_from_env", "CollectorApp"]

log = logging.getLogger("ldp.collector")


class _BodyChunks:
    """The request body's chunks from ASGI ``receive``, as an async iterator; :class:`ClientDisconnect` if the
    client leaves first. A class rather than an async generator: asyncio registers every async generator's
    first iteration in a ``WeakSet`` of the loop (for shutdown), which cost 5 % of the loop's time under load."""

    __slots__ = ("_receive", "_done")

    def __init__(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        self._receive = receive
        self._done = False

    def __aiter__(self) -> _BodyChunks:
        return self

    async def __anext__(self) -> bytes:
        if self._done:
            raise StopAsyncIteration
        message = await self._receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        self._done = not message.get("more_body", False)
        body: bytes = message.get("body", b"")
        return body


class CollectorApp:
    """The collector's ASGI application: ``POST /v1/reports`` is served here directly, everything else by
    the FastAPI app (``.fastapi``), whose route for uploads documents the same handler in the OpenAPI
    schema. Serving uploads outside the framework's middleware and routing stack saves about a third of
    the CPU per upload. Other attributes (``state``, ``router``, ``openapi()``...) are the FastAPI app's."""

    def __init__(self, fastapi_app: FastAPI, upload: UploadHandler, metrics: CollectorMetrics) -> None:
        self.fastapi = fastapi_app
        self.upload = upload
        self.metrics = metrics
        self.entry: Any = self.serve
        if fastapi_app.state.settings.allow_origins:
            self.entry = CorsMiddleware(
                self.serve, origins=fastapi_app.state.settings.allow_origins, routes=COLLECTOR_ROUTES
            )

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fastapi, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await self.entry(scope, receive, send)

    async def serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/reports" or scope["method"] != "POST":
            await self.fastapi(scope, receive, send)
            return
        t0 = time.perf_counter()
        ctype = length = key = auth = None
        for name, value in scope["headers"]:
            if name == b"content-type":
                ctype = value.decode("latin-1")
            elif name == b"content-length":
                length = value.decode("latin-1")
            elif name == b"idempotency-key":
                key = value.decode("latin-1")
            elif name == b"authorization":
                auth = value.decode("latin-1")

        try:
            status, body, extra = await self.upload(ctype or "", length, key, _BodyChunks(receive), auth)
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        *extra,
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
        finally:
            self.metrics.observe_upload(time.perf_counter() - t0)


def _lifespan(
    settings: CollectorSettings,
    runtime: dict[str, Any],
    prom: CollectorMetrics,
    new_json_decoder: Callable[[], Any],
    *,
    transport: Transport | None,
    dedup: BatchIdStore | None,
    spent_tokens: SpentTokens | None,
    clock: Callable[[], float],
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """What the app starts and stops: the transport and dedup store (unless given), the ingestor and its
    publisher threads, the JSON decode processes and, with ``fl_enabled``, the FL service. ``runtime``
    holds them while the app runs."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own_transport = transport is None
        tr: Transport = open_transport(settings.transport_url) if transport is None else transport
        store = dedup if dedup is not None else BatchIdStore(settings.dedup_path, ttl=settings.dedup_ttl, clock=clock)
        prom.persist(store)
        ingestor = Ingestor(
            tr,
            settings.raw_topic,
            store,
            partitions=settings.raw_partitions,
            max_group=settings.max_group,
            retry_after=settings.retry_after,
            threads=settings.publishers,
            on_group=prom.observe_group,
            probe_after=settings.probe_after,
            probe_interval=settings.probe_interval,
        )
        ingestor.start()
        runtime.update(
            transport=tr,
            ingestor=ingestor,
            readiness=Readiness(tr, settings.raw_topic),
            json_decoder=new_json_decoder(),
        )
        if settings.fl_enabled:
            runtime["fl"] = start_fl_service(
                tr, settings.fl_rounds_topic, settings.fl_updates_topic, settings.retry_after
            )
        publisher = asyncio.create_task(_publish_for_workers(store, prom, runtime)) if _multiprocess() else None
        try:
            yield
        finally:
            if publisher is not None:
                publisher.cancel()
            if runtime.get("fl") is not None:
                runtime.pop("fl").stop()
            runtime["json_decoder"].shutdown(wait=True, cancel_futures=True)
            ingestor.stop(timeout=settings.publish_timeout)
            if dedup is None:
                store.close()
            if spent_tokens is not None:
                spent_tokens.close()
            if own_transport:
                tr.close()

    return lifespan


def add_token_keys_route(app: FastAPI, verifier: TokenVerifier) -> None:
    """``GET /v1/token-keys`` (with ``--require-tokens``): the issuer keys this collector accepts, one per day,
    in the issuer's document shape; a device checks the issuer's key against it before asking for tokens
    (docs/TOKENS.md, "Key consistency")."""

    @app.get("/v1/token-keys", summary="The token keys this collector accepts (one per day)")
    async def token_keys() -> Response:
        body = json.dumps(verifier.key_document()).encode()
        return Response(body, media_type="application/json", headers={"Cache-Control": "no-store"})


def _multiprocess() -> bool:
    return bool(os.environ.get(MULTIPROC_ENV))


async def _publish_for_workers(store: BatchIdStore, prom: CollectorMetrics, runtime: dict[str, Any]) -> None:
    """With ``--workers`` (prometheus-client's multiprocess mode), once a second: the reading and in-flight gauges into this
    worker's shared value, its pending upload counts into the shared store (the parent renders both)."""
    while True:
        await asyncio.sleep(1.0)
        prom.reading.set(runtime["reading"])
        prom.in_flight.set(runtime["in_flight"])
        try:
            await asyncio.to_thread(store.flush_counts)
        except Exception:  # a busy or failing store: the next second tries again
            log.warning("could not write the upload counters to the batch-id store", exc_info=True)


def create_app(
    settings: CollectorSettings,
    *,
    transport: Transport | None = None,
    metrics: MetricSet | None = None,
    dedup: BatchIdStore | None = None,
    clock: Callable[[], float] = time.time,
    metrics_route: bool = True,
) -> CollectorApp:
    """The collector's ASGI app (a :class:`CollectorApp` around a FastAPI app).

    ``metrics_route`` serves Prometheus ``GET /metrics`` on this app. ``ldp collector`` and
    :func:`app_from_env` pass ``settings.public_metrics`` (default off: they serve the metrics on a
    listener of their own, :func:`collector.http.monitoring.start_metrics_listener`); embedding code
    and tests that call this function get the route unless they say otherwise.

    ``transport``, ``metrics`` and ``dedup`` default to what ``settings``
    names (the transport URL, the metrics file, the dedup store path); pass
    them to share or fake them in tests. Whatever the app opens itself it
    closes on shutdown. ``clock`` gives the current POSIX time (day checks).
    """
    declared = metrics if metrics is not None else load_metrics(settings.metrics_path, reject_expired=False)
    expired = declared.expired(utc_day(clock()))
    if expired:
        log.warning("metrics past their expiry are refused: %s", ", ".join(sorted(expired)))
    document = MetricsDocument(declared)
    prom = CollectorMetrics()
    token_verifier: TokenVerifier | None = None
    spent_tokens: SpentTokens | None = None
    if settings.require_tokens:  # a missing key folder is an error at start-up
        token_verifier = TokenVerifier(
            settings.token_keys,
            issuer_name=settings.token_issuer,
            origin=settings.token_origin,
            clock=clock,
            on_refused_day=lambda _day, _n: prom.token_key_days_refused.inc(),
        )
        spent_tokens = SpentTokens(settings.spent_path)
    max_records = min(settings.max_records, MAX_RECORDS)
    readers = BodyReaders(
        max_reading=settings.max_reading,
        body_timeout=settings.body_timeout,
        min_body_rate=settings.min_body_rate,
        body_grace=settings.body_grace,
    )
    runtime: dict[str, Any] = {"in_flight": 0, "reading": 0, "readers": readers}
    new_json_decoder = functools.partial(json_decode_pool, settings.decode_workers, document.body.decode(), max_records)
    upload = UploadHandler(
        settings,
        declared,
        prom,
        runtime,
        admission=Admission(settings, declared, clock, tokens=token_verifier is not None),
        max_records=max_records,
        new_json_decoder=new_json_decoder,
        tokens=token_verifier,
        spent=spent_tokens,
    )

    extra: dict[str, Any] = {}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        # FastAPI's native OpenTelemetry spans would carry client addresses to any configured exporter
        # (and cost a provider lookup per request); the collector exports its own metrics at /metrics
        extra["telemetry"] = {"tracing": False, "metrics": False, "logs": False}
    app = FastAPI(
        title="LDP telemetry collector",
        version="1",
        summary="Accepts locally privatized report batches and publishes them for shuffling.",
        lifespan=_lifespan(
            settings,
            runtime,
            prom,
            new_json_decoder,
            transport=transport,
            dedup=dedup,
            spent_tokens=spent_tokens,
            clock=clock,
        ),
        **extra,
    )
    add_error_handler(app)
    app.state.settings = settings
    app.state.metrics = declared
    app.state.prometheus = prom
    app.state.runtime = runtime

    add_upload_route(app, upload)
    add_metrics_route(app, document)
    add_health_routes(app, runtime)
    if token_verifier is not None:
        add_token_keys_route(app, token_verifier)
    if metrics_route:
        add_prometheus_route(app, renderer(prom, runtime))
    if settings.fl_enabled:
        add_fl_routes(
            app,
            runtime,
            prom.registry,
            max_body_bytes=settings.max_body_bytes,
            publish_timeout=settings.publish_timeout,
        )
    app.add_middleware(Timing, metrics=prom)
    return CollectorApp(app, upload, prom)


def app_from_env() -> CollectorApp:
    """The app configured from the environment (``uvicorn --factory collector.http.app:app_from_env``).

    ``$LDP_COLLECTOR_SETTINGS`` (the JSON of a :class:`CollectorSettings`,
    as ``ldp collector --workers N`` passes it) wins; otherwise the
    ``LDP_COLLECTOR_*`` variables, ``$LDP_TRANSPORT`` and ``$LDP_METRICS``.
    """
    import os

    blob = os.environ.get("LDP_COLLECTOR_SETTINGS")
    settings = CollectorSettings.from_json(blob) if blob else CollectorSettings.from_env()
    return create_app(settings, metrics_route=settings.public_metrics)
