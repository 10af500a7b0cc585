"""The collector: a FastAPI service that accepts privatized report batches and publishes them.

Endpoints
---------
``POST /v1/reports``
    One report batch, as a binary frame (``Content-Type:
    application/vnd.ldp.frame``, :data:`ldp_core.wire.frames.FRAME_CONTENT_TYPE`;
    ``application/octet-stream`` and the older ``application/x-ldp-frame``,
    which deployed devices may still send, are accepted too) or in the JSON
    form (``application/json``); see :mod:`ldp_core.wire.frames`. An optional
    ``Idempotency-Key`` header must equal the frame's batch id.
``GET /v1/metrics``
    The metrics document (:mod:`ldp_core.metrics`) the SDK reads, with an ``ETag``; with
    ``?layout=1`` each metric also carries its ``spec_id`` and ``record`` layout (:func:`metrics_layout`).
``GET /healthz``, ``GET /readyz``
    Liveness (the process and its publisher thread run) and readiness (the transport answers).
``GET /metrics``
    Prometheus counters and latency histograms.
``GET /docs``, ``GET /openapi.json``
    OpenAPI documentation (FastAPI's).

Answers to an upload
--------------------
=====  =======================================================================
202    published durably to ``ldp.reports.raw`` (``"accepted"``), or a batch id
       accepted before with the same records (``"duplicate"``; nothing is published again)
401    with ``--require-tokens`` only: no token, or a bad, expired (another day's) or unknown one
       (``token_*`` reasons, :mod:`collector.tokens`)
409    ``batch_id_conflict``: the batch id was accepted before with other records;
       nothing of this upload is stored (a new batch needs a fresh batch id); ``token_spent``
       (``--require-tokens``): the token paid for another batch before
400    the body is not a valid frame or JSON form (truncated, bad CRC, bad field,
       record outside the spec's bounds, ``Idempotency-Key`` differing from the batch id)
408    ``body_timeout``: the body did not arrive whole within ``body_timeout`` s
413    the body exceeds ``max_body_bytes`` (from ``Content-Length`` or while
       reading) or the batch holds more than ``max_records`` reports
415    another ``Content-Type``
422    a well-formed batch the collector will not take: unknown metric, spec
       other than the metric's, metric expired on the batch's day, day outside
       ``[today - max_day_age, today + max_days_ahead]``, no reports
503    overloaded (more than ``max_reading`` bodies being read, or ``max_in_flight``
       uploads in progress), the transport known to be down (answered at once,
       see :mod:`collector.ingest`) or not acknowledging; ``Retry-After`` says when to retry
=====  =======================================================================

A refusal sent before the whole body was read carries ``Connection: close``.
An upload is admitted (counted against ``max_in_flight``) only once its body
is read, and the body must arrive within ``body_timeout``; large JSON bodies
are decoded in a decode process, large frames on a thread, so that a few
sockets cannot stall the event loop (docs/COLLECTOR.md, "A few sockets
cannot stall it").

Every error body is ``{"error": <reason>, "message": <what is wrong and how to fix it>}``.

What leaves the collector
-------------------------
Only the batch itself: the records are decoded, checked against the
metric's spec, and **re-encoded** into a fresh frame (metric, spec id, day,
batch id, records), keyed ``"<metric>/<day>"``. No IP address, port, header,
user agent or arrival time is read into it; uvicorn's access log is off
(``ldp collector``), so client addresses are not logged either. The batch
id is the device's random idempotency key, not linked to the device.
(The transport itself stamps each record with its publish time; that stays
between the collector and the shuffler, which drops it.)

The answer 202 is sent only after the transport acknowledged the batch
(:mod:`collector.ingest`, group commit); the batch id is then recorded in a
durable store (:mod:`collector.dedup`), whose crash window the shuffler closes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.process
import contextlib
import functools
import hashlib
import inspect
import json
import logging
import multiprocessing
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from collector.dedup import BatchIdStore
from collector.errors import RejectedBatch, UnavailableError
from collector.fl.routes import add_fl_routes, start_fl_service
from collector.ingest import BATCHES_TOTAL, METRIC_REPORTS_TOTAL, REPORTS_TOTAL, GroupStats, Ingestor
from collector.prometheus import CONTENT_TYPE as PROMETHEUS_CONTENT_TYPE
from collector.prometheus import Registry
from collector.settings import CollectorSettings
from collector.tokens import SpentTokens, TokenRejected, TokenVerifier
from ldp_core.days import utc_day
from ldp_core.errors import FrameError, SpecMismatchError
from ldp_core.mechanisms.base import ReportSpec
from ldp_core.metrics import MetricSet, load_metrics, parse_metrics
from ldp_core.wire.frames import (
    FRAME_CONTENT_TYPE,
    MAX_RECORDS,
    ReportBatch,
    decode_frame,
    decode_json,
    encode_frame,
    read_header,
)
from ldp_core.wire.sealing import KEY_ID_SIZE
from pipeline.topics import metric_day_key
from pipeline.transport import Transport, open_transport

__all__ = [
    "create_app",
    "app_from_env",
    "CollectorApp",
    "FRAME_CONTENT_TYPES",
    "LEGACY_FRAME_CONTENT_TYPES",
    "JSON_CONTENT_TYPE",
    "CollectorMetrics",
]

log = logging.getLogger("ldp.collector")

#: Older names of the frame's media type, still accepted (not advertised) so that deployed devices keep working.
LEGACY_FRAME_CONTENT_TYPES = ("application/x-ldp-frame",)
#: Every media type accepted as a binary frame; the first is its name (what the SDK sends).
FRAME_CONTENT_TYPES = (FRAME_CONTENT_TYPE, "application/octet-stream", *LEGACY_FRAME_CONTENT_TYPES)
JSON_CONTENT_TYPE = "application/json"
_ROUTES = frozenset(
    {"/v1/reports", "/v1/metrics", "/healthz", "/readyz", "/ready", "/metrics", "/docs", "/openapi.json"}
)


class ErrorBody(BaseModel):
    """Every non-2xx answer."""

    error: str
    message: str


class AcceptedBody(BaseModel):
    """The 202 answer."""

    status: Literal["accepted", "duplicate"]
    batch_id: str
    reports: int


class CollectorMetrics:
    """The collector's Prometheus metric families."""

    def __init__(self) -> None:
        self.registry = r = Registry()
        self.batches = r.counter(BATCHES_TOTAL, "Uploaded batches by outcome and reason", ["outcome", "reason"])
        self.reports = r.counter(
            REPORTS_TOTAL,
            "Reports in uploaded batches by outcome and reason (batches that decoded)",
            ["outcome", "reason"],
        )
        self.metric_reports = r.counter(METRIC_REPORTS_TOTAL, "Reports published, per declared metric", ["metric"])
        self.latency = r.histogram(
            "ldp_collector_request_duration_seconds", "HTTP request latency", ["route", "method"]
        )
        self.in_flight = r.gauge("ldp_collector_uploads_in_flight", "Uploads being processed (body read)")
        self.reading = r.gauge("ldp_collector_uploads_reading", "Uploads whose body is being read")
        self.publish = r.histogram(
            "ldp_collector_publish_duration_seconds",
            "Duration of one group commit (duplicate check, durable publish, id record)",
        )
        self.group = r.histogram(
            "ldp_collector_publish_group_batches",
            "Batches per group commit",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
        )

    def persist(self, store: BatchIdStore) -> None:
        """Keep the upload counters in the batch-id store: they survive restarts, and the accepted ones are
        counted in the transaction that records the ids (:mod:`collector.dedup`, :mod:`collector.ingest`)."""
        for c in (self.batches, self.reports, self.metric_reports):
            c.persist(store)

    def reject(self, reason: str, reports: int | None, outcome: str = "rejected") -> None:
        self.batches.inc(outcome=outcome, reason=reason)
        if reports:
            self.reports.inc(reports, outcome=outcome, reason=reason)


def _error(status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> Response:
    body = json.dumps({"error": reason, "message": message}).encode()
    return Response(body, status_code=status, media_type="application/json", headers=headers)


_Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]


def _error_parts(status: int, reason: str, message: str, retry_after: int | None = None) -> _Answer:
    extra = [] if retry_after is None else [(b"retry-after", str(retry_after).encode())]
    return status, json.dumps({"error": reason, "message": message}).encode(), extra


def _resolve(declared: MetricSet, metric: str, spec_id: str) -> ReportSpec:
    """The spec a batch of ``metric`` made under ``spec_id`` is decoded with; 422 if there is none."""
    m = declared.get(metric)
    if m is None:
        raise RejectedBatch(
            422,
            "unknown_metric",
            f"metric {metric!r} is not declared in the collector's "
            "metrics file; GET /v1/metrics lists the declared metrics",
        )
    if m.spec.spec_id != spec_id:
        raise RejectedBatch(
            422,
            "spec_mismatch",
            f"metric {metric!r} is collected under spec {m.spec.spec_id} ({m.spec.name}, "
            f"epsilon={m.spec.epsilon:g}), but the batch was made under spec {spec_id}; "
            "refresh the metric definitions from GET /v1/metrics",
        )
    return m.wire_spec  # a sealed metric's: opaque records, plain frames of it refused


def _decode(body: bytes, kind: str, declared: MetricSet, max_records: int) -> ReportBatch:
    """Decode one body (``kind`` ``"frame"`` or ``"json"``) against the declared metrics; :class:`RejectedBatch` if it does not."""
    resolve = functools.partial(_resolve, declared)
    if not body:
        raise RejectedBatch(400, "malformed", "the body is empty; send one report batch")
    try:
        if kind == "frame":
            header = read_header(body)
            if header.n_records > max_records:
                raise RejectedBatch(
                    413,
                    "too_many_records",
                    f"the batch holds {header.n_records} reports; "
                    f"this collector takes at most {max_records} per batch: split it",
                )
            return decode_frame(body, resolve)
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise RejectedBatch(400, "malformed", f"the JSON body does not parse: {str(exc)[:200]}") from None
        if isinstance(obj, dict) and isinstance(obj.get("records"), list) and len(obj["records"]) > max_records:
            raise RejectedBatch(
                413,
                "too_many_records",
                f"the batch holds {len(obj['records'])} reports; "
                f"this collector takes at most {max_records} per batch: split it",
            )
        return decode_json(obj, resolve)
    except RejectedBatch:
        raise
    except SpecMismatchError as exc:
        raise RejectedBatch(422, "spec_mismatch", str(exc)) from None
    except FrameError as exc:
        raise RejectedBatch(400, "malformed", str(exc)) from None
    except (ValueError, TypeError, KeyError, IndexError, OverflowError, RecursionError) as exc:
        log.warning("undecodable upload: %s", type(exc).__name__)
        raise RejectedBatch(400, "malformed", f"the batch does not decode ({type(exc).__name__})") from None


#: the decode process's metrics and record limit (set by :func:`_decode_worker_init`)
_WORKER: dict[str, Any] = {}


def _decode_worker_init(metrics_json: str, max_records: int) -> None:
    _WORKER["metrics"] = parse_metrics(metrics_json, reject_expired=False)
    _WORKER["max_records"] = max_records


def _json_to_frame(body: bytes) -> bytes | tuple[int, str, str]:
    """In a decode process: a JSON form's batch as a binary frame, or the refusal ``(status, reason, message)``."""
    try:
        return encode_frame(_decode(body, "json", _WORKER["metrics"], _WORKER["max_records"]))
    except RejectedBatch as exc:
        return exc.status, exc.reason, exc.message


def record_layout(spec: ReportSpec) -> dict[str, Any]:
    """How one record of ``spec`` is laid out: in a frame (packed little-endian fields, numpy type strings) and
    in the JSON form (a list of the fields' values in order: an integer, or a hex string for a byte array)."""
    dtype = spec.record_dtype
    types: Mapping[str, tuple[Any, ...]] = dtype.fields or {}  # a record dtype is structured
    fields: list[dict[str, Any]] = []
    for name in dtype.names or ():
        ftype = types[name][0]
        if ftype.subdtype is not None:
            base, shape = ftype.subdtype
            fields.append(
                {
                    "name": name,
                    "dtype": base.str,
                    "shape": list(shape),
                    "json": {"type": "string", "format": f"hex, {ftype.itemsize} bytes"},
                }
            )
        else:
            info = np.iinfo(ftype)
            fields.append(
                {
                    "name": name,
                    "dtype": ftype.str,
                    "json": {"type": "integer", "minimum": int(info.min), "maximum": int(info.max)},
                }
            )
    return {"itemsize": dtype.itemsize, "fields": fields, "json_record": [f["name"] for f in fields]}


def metrics_layout(declared: MetricSet) -> dict[str, Any]:
    """The metrics document with, per metric, its ``spec_id``, the ``accepted_spec_ids`` and its ``record``
    layout (:func:`record_layout`) added (``GET /v1/metrics?layout=1``)."""
    doc = declared.to_dict()
    for name, entry in doc["metrics"].items():
        spec = declared[name].spec
        entry["spec_id"] = spec.spec_id
        entry["accepted_spec_ids"] = [spec.spec_id]
        entry["record"] = record_layout(spec)
    return doc


class CollectorApp:
    """The collector's ASGI application: ``POST /v1/reports`` is served here directly, everything else by
    the FastAPI app (``.fastapi``), whose route for uploads documents the same handler in the OpenAPI
    schema. Serving uploads outside the framework's middleware and routing stack saves about a third of
    the CPU per upload. Other attributes (``state``, ``router``, ``openapi()``...) are the FastAPI app's."""

    def __init__(self, fastapi_app: FastAPI, upload: Callable[..., Any], metrics: CollectorMetrics) -> None:
        self.fastapi = fastapi_app
        self.upload = upload
        self.metrics = metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fastapi, name)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
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

        async def chunks() -> AsyncIterator[bytes]:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ClientDisconnect()
                yield message.get("body", b"")
                if not message.get("more_body", False):
                    return

        try:
            status, body, extra = await self.upload(ctype or "", length, key, chunks(), auth)
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
            self.metrics.latency.observe(time.perf_counter() - t0, route="/v1/reports", method="POST")


_JSON_FORM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["version", "metric", "spec_id", "day", "batch_id", "records"],
    "properties": {
        "version": {"type": "integer", "enum": [1]},
        "metric": {"type": "string", "pattern": "^[A-Za-z0-9_.:\\-]{1,255}$"},
        "spec_id": {"type": "string", "pattern": "^[0-9a-f]{16}$"},
        "day": {"type": "integer", "minimum": 0, "description": "days since 1970-01-01 (UTC)"},
        "batch_id": {"type": "string", "pattern": "^[0-9a-fA-F]{32}$"},
        "records": {
            "type": "array",
            "items": {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "string"}]}},
        },
    },
}

_REPORTS_OPENAPI: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            **{
                ct: {"schema": {"type": "string", "format": "binary"}}
                for ct in FRAME_CONTENT_TYPES
                if ct not in LEGACY_FRAME_CONTENT_TYPES
            },
            JSON_CONTENT_TYPE: {"schema": _JSON_FORM_SCHEMA},
        },
    },
    "parameters": [
        {
            "name": "Idempotency-Key",
            "in": "header",
            "required": False,
            "schema": {"type": "string"},
            "description": "the batch id in hex (optional)",
        }
    ],
}

_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "malformed body"},
    413: {"model": ErrorBody, "description": "body or batch too large"},
    409: {"model": ErrorBody, "description": "batch id accepted before with other records"},
    415: {"model": ErrorBody, "description": "unsupported Content-Type"},
    422: {"model": ErrorBody, "description": "unknown metric, spec mismatch, expired metric or day out of range"},
    503: {"model": ErrorBody, "description": "overloaded or transport unavailable; see Retry-After"},
}


class _Timing:
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
            path = scope.get("path", "")
            method = scope.get("method", "")
            self.metrics.latency.observe(
                time.perf_counter() - t0,
                route=path if path in _ROUTES else "other",
                method=method if method in ("GET", "POST", "HEAD") else "other",
            )


class _Readiness:
    """Whether the transport answers, probed at most every ``ttl`` seconds in a worker thread."""

    def __init__(self, transport: Transport, topic: str, ttl: float = 2.0) -> None:
        self.transport = transport
        self.topic = topic
        self.ttl = ttl
        self._at = -1e18
        self._result: tuple[bool, str] = (False, "not probed yet")
        self._lock = threading.Lock()

    def _probe(self) -> tuple[bool, str]:
        ok, detail = self.transport.health(self.topic, timeout=2.0)
        return ok, detail

    def check(self) -> tuple[bool, str]:
        with self._lock:
            if time.monotonic() - self._at < self.ttl:
                return self._result
            self._result = self._probe()
            self._at = time.monotonic()
            return self._result


def create_app(
    settings: CollectorSettings,
    *,
    transport: Transport | None = None,
    metrics: MetricSet | None = None,
    dedup: BatchIdStore | None = None,
    clock: Callable[[], float] = time.time,
) -> CollectorApp:
    """The collector's ASGI app (a :class:`CollectorApp` around a FastAPI app).

    ``transport``, ``metrics`` and ``dedup`` default to what ``settings``
    names (the transport URL, the metrics file, the dedup store path); pass
    them to share or fake them in tests. Whatever the app opens itself it
    closes on shutdown. ``clock`` gives the current POSIX time (day checks).
    """
    declared = metrics if metrics is not None else load_metrics(settings.metrics_path, reject_expired=False)
    today = utc_day(clock())
    expired = declared.expired(today)
    if expired:
        log.warning("metrics past their expiry are refused: %s", ", ".join(sorted(expired)))
    metrics_body = declared.to_json().encode()
    metrics_etag = '"' + hashlib.sha256(metrics_body).hexdigest()[:32] + '"'
    # SDKs from before numeric and sealed metrics refuse a document with fields they do not know ("kind",
    # range domains, "sealed", "analyzer_keys"), so by default GET /v1/metrics serves them the plain
    # frequency metrics only; ?kinds=all (what the SDK asks for now) serves every metric
    frequency_only = MetricSet({n: m for n, m in declared.items() if m.kind == "frequency" and not m.sealed})
    compat_body = frequency_only.to_json().encode()
    compat_etag = '"' + hashlib.sha256(compat_body).hexdigest()[:32] + '"'
    layout_body = json.dumps(metrics_layout(declared), indent=2, ensure_ascii=False).encode()
    layout_etag = '"' + hashlib.sha256(layout_body).hexdigest()[:32] + '"'
    prom = CollectorMetrics()
    token_verifier: TokenVerifier | None = None
    spent_tokens: SpentTokens | None = None
    if settings.require_tokens:  # a missing key folder is an error at start-up
        token_verifier = TokenVerifier(
            settings.token_keys, issuer_name=settings.token_issuer, origin=settings.token_origin, clock=clock
        )
        spent_tokens = SpentTokens(settings.spent_path)
    max_records = min(settings.max_records, MAX_RECORDS)
    decode = functools.partial(_decode, declared=declared, max_records=max_records)
    state: dict[str, Any] = {"in_flight": 0, "reading": 0}

    def on_group(stats: GroupStats) -> None:
        prom.publish.observe(stats.seconds)
        prom.group.observe(stats.published + stats.duplicates + stats.failed)

    def new_json_decoder() -> concurrent.futures.ProcessPoolExecutor:
        # spawned, not forked: this process runs threads (publishers, uvicorn's); started on the first large JSON
        return concurrent.futures.ProcessPoolExecutor(
            settings.decode_workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_decode_worker_init,
            initargs=(metrics_body.decode(), max_records),
        )

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
            on_group=on_group,
            probe_after=settings.probe_after,
            probe_interval=settings.probe_interval,
        )
        ingestor.start()
        state.update(
            transport=tr,
            ingestor=ingestor,
            readiness=_Readiness(tr, settings.raw_topic),
            json_decoder=new_json_decoder(),
        )
        if settings.fl_enabled:
            state["fl"] = start_fl_service(
                tr, settings.fl_rounds_topic, settings.fl_updates_topic, settings.retry_after
            )
        try:
            yield
        finally:
            if state.get("fl") is not None:
                state.pop("fl").stop()
            state["json_decoder"].shutdown(wait=True, cancel_futures=True)
            ingestor.stop(timeout=settings.publish_timeout)
            if dedup is None:
                store.close()
            if spent_tokens is not None:
                spent_tokens.close()
            if own_transport:
                tr.close()

    extra: dict[str, Any] = {}
    if "telemetry" in inspect.signature(FastAPI.__init__).parameters:
        # FastAPI's native OpenTelemetry spans would carry client addresses to any configured exporter
        # (and cost a provider lookup per request); the collector exports its own metrics at /metrics
        extra["telemetry"] = {"tracing": False, "metrics": False, "logs": False}
    app = FastAPI(
        title="LDP telemetry collector",
        version="1",
        summary="Accepts locally privatized report batches and publishes them for shuffling.",
        lifespan=lifespan,
        **extra,
    )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # every non-2xx answer has the documented {"error", "message"} body, the framework's 404/405 included
        reasons = {404: "not_found", 405: "method_not_allowed"}
        hints = {
            404: f"no route {request.url.path[:100]!r}; GET /docs lists the routes",
            405: f"{request.method} is not allowed on {request.url.path[:100]!r}; GET /docs lists the routes",
        }
        return _error(
            exc.status_code,
            reasons.get(exc.status_code, "http_error"),
            hints.get(exc.status_code, str(exc.detail)[:200]),
            headers=dict(exc.headers or {}),
        )

    app.state.settings = settings
    app.state.metrics = declared
    app.state.prometheus = prom
    app.state.runtime = state

    sealing_ids = {k.key_id for k in declared.analyzer_keys}

    def check_length(length: str | None) -> None:
        if length is not None:
            if not length.strip().isdigit():
                raise RejectedBatch(400, "malformed", f"Content-Length {length[:40]!r} is not a number")
            if int(length) > settings.max_body_bytes:
                raise RejectedBatch(
                    413,
                    "too_large",
                    f"the body has {int(length)} bytes; this collector takes at "
                    f"most {settings.max_body_bytes}: split the batch",
                )

    async def read_body(chunks: AsyncIterator[bytes]) -> bytes:
        buf = bytearray()
        async for chunk in chunks:
            buf += chunk
            if len(buf) > settings.max_body_bytes:
                raise RejectedBatch(
                    413, "too_large", f"the body exceeds {settings.max_body_bytes} bytes; split the batch"
                )
        return bytes(buf)

    def check_sealed(batch: ReportBatch, metric_sealed: bool) -> None:
        """What can be checked of sealed records without the analyzer's key (which the collector never has):
        the metric is a sealed one, and every record names a key of the metrics file."""
        if not metric_sealed:
            raise RejectedBatch(
                422,
                "not_sealed_metric",
                f"metric {batch.metric!r} is not sealed: send its records plain (GET /v1/metrics)",
            )
        kids = np.ascontiguousarray(batch.records).view(np.uint8).reshape(len(batch), -1)[:, :KEY_ID_SIZE]
        seen = {bytes(r).hex() for r in np.unique(kids, axis=0)}
        unknown = sorted(seen - sealing_ids)
        if unknown:
            raise RejectedBatch(
                422,
                "unknown_analyzer_key",
                f"records are sealed to analyzer key(s) {unknown[:4]}; this collector accepts "
                f"{sorted(sealing_ids)}: refresh the metric definitions from GET /v1/metrics",
            )

    def admit(batch: ReportBatch, key: str | None) -> None:
        if key is not None and key.strip().lower() != batch.batch_id.hex():
            raise RejectedBatch(
                400,
                "idempotency_key_mismatch",
                f"Idempotency-Key {key[:64]!r} differs from the frame's batch id {batch.batch_id.hex()}",
            )
        if len(batch) == 0:
            raise RejectedBatch(422, "empty", "the batch holds no reports")
        now = utc_day(clock())
        oldest, newest = settings.day_window.bounds(now)  # the window the shuffler keeps too (ldp_core.days)
        if batch.day > newest:
            raise RejectedBatch(
                422,
                "bad_day",
                f"day {batch.day} is {batch.day - now} days ahead of the collector's "
                f"UTC day {now}; at most {settings.max_days_ahead} ahead is accepted (check the clock)",
            )
        if batch.day < oldest:
            raise RejectedBatch(
                422,
                "bad_day",
                f"day {batch.day} is {now - batch.day} days old; batches older than "
                f"{settings.max_day_age} days are not accepted",
            )
        m = declared[batch.metric]  # after the day checks: a day far out of range is bad_day, not expired_metric
        if token_verifier is not None and len(batch) > m.max_reports_per_day:
            # one token pays for one device's reports of one metric-day: what bounds a device's influence
            raise RejectedBatch(
                422,
                "too_many_reports",
                f"with tokens a batch carries at most the metric's max_reports_per_day ({m.max_reports_per_day}) "
                f"reports, got {len(batch)}",
            )
        if batch.sealed:
            check_sealed(batch, m.sealed)
        if m.is_expired(batch.day):
            raise RejectedBatch(
                422,
                "expired_metric",
                f"metric {batch.metric!r} expired on {m.expires.isoformat()}; "
                f"reports for day {batch.day} are no longer collected",
            )

    async def read_body_within(chunks: AsyncIterator[bytes], timeout: float) -> bytes:
        """:func:`read_body`, or :class:`TimeoutError` after ``timeout`` s. (A bare timer handle: asyncio.timeout
        costs about five times as much, on every upload.)"""
        task = asyncio.current_task()
        assert task is not None
        expired = False

        def expire() -> None:
            nonlocal expired
            expired = True
            task.cancel()

        handle = asyncio.get_running_loop().call_later(timeout, expire)
        try:
            return await read_body(chunks)
        except asyncio.CancelledError:
            if expired and task.uncancel() == 0:
                raise TimeoutError from None
            raise  # cancelled by someone else (the server shutting down)
        finally:
            handle.cancel()

    def prepare(body: bytes, kind: str, key: str | None) -> tuple[ReportBatch, bytes | RejectedBatch]:
        """Decode, check and re-encode one body (on the event loop, or on a decode thread for large ones):
        the batch and its new frame, or the batch and why it is refused (its reports are counted)."""
        batch = decode(body, kind)
        try:
            admit(batch, key)
        except RejectedBatch as exc:
            return batch, exc
        return batch, encode_frame(batch)

    def refuse_early(status: int, reason: str, message: str, retry_after: int | None = None) -> _Answer:
        """A refusal sent before the whole body was read: the rest of it would be taken for the next request
        on a keep-alive connection, so the connection is closed after the answer."""
        status, err, extra = _error_parts(status, reason, message, retry_after)
        extra.append((b"connection", b"close"))
        return status, err, extra

    async def upload(
        ctype: str,
        length: str | None,
        idempotency_key: str | None,
        chunks: AsyncIterator[bytes],
        authorization: str | None = None,
    ) -> _Answer:
        """One upload: ``(status, JSON body, extra headers)``.

        The body is read (within ``body_timeout``) before the upload is admitted: a socket that sends a
        partial body holds no ``max_in_flight`` slot, only one of the ``max_reading`` ones, and for at most
        ``body_timeout``. Large bodies are decoded on the decode threads (``offload_*_bytes``)."""
        ctype = ctype.split(";")[0].strip().lower()
        if ctype in FRAME_CONTENT_TYPES:
            kind, offload = "frame", settings.offload_frame_bytes
        elif ctype == JSON_CONTENT_TYPE:
            kind, offload = "json", settings.offload_json_bytes
        else:
            prom.reject("unsupported_media_type", None)
            return refuse_early(
                415,
                "unsupported_media_type",
                f"Content-Type {ctype[:80] or '(none)'!r} is not accepted; send a binary frame as "
                f"{FRAME_CONTENT_TYPES[0]} or the JSON form as {JSON_CONTENT_TYPE}",
            )
        spend: tuple[bytes, str] | None = None
        if token_verifier is not None:  # --require-tokens: a valid token of today, before the body is read
            try:
                spend = token_verifier.verify(authorization)
            except TokenRejected as exc:
                prom.reject(exc.reason, None)
                return refuse_early(exc.status, exc.reason, exc.message)
        if state["reading"] >= settings.max_reading:
            prom.reject("overloaded", None, outcome="unavailable")
            return refuse_early(
                503,
                "overloaded",
                f"more than {settings.max_reading} request bodies are being read; retry later",
                settings.retry_after,
            )
        state["reading"] += 1  # the gauge is set from this when /metrics is read (not on every upload)
        try:
            check_length(length)
            body = await read_body_within(chunks, settings.body_timeout)
        except RejectedBatch as exc:
            prom.reject(exc.reason, None)
            return refuse_early(exc.status, exc.reason, exc.message)
        except TimeoutError:
            prom.reject("body_timeout", None)
            return refuse_early(
                408,
                "body_timeout",
                f"the body did not arrive within {settings.body_timeout:g} s of the request's headers; "
                "send the whole body at once",
            )
        except ClientDisconnect:
            prom.reject("client_disconnected", None)
            return _error_parts(400, "client_disconnected", "the client closed the connection before the body ended")
        finally:
            state["reading"] -= 1
        # admission, once the body is here
        if state["in_flight"] >= settings.max_in_flight:
            prom.reject("overloaded", None, outcome="unavailable")
            return _error_parts(
                503,
                "overloaded",
                f"more than {settings.max_in_flight} uploads are in progress; retry later",
                settings.retry_after,
            )
        ingestor: Ingestor = state["ingestor"]
        down = ingestor.down
        if down is not None:
            prom.reject("transport_unavailable", None, outcome="unavailable")
            return _error_parts(
                503,
                "transport_unavailable",
                f"the transport is unavailable ({down}); retry later",
                settings.retry_after,
            )
        state["in_flight"] += 1
        prom.in_flight.inc()
        batch: ReportBatch | None = None
        try:
            if len(body) > offload:
                # JSON rows are decoded in Python, so in a decode process (a thread would hold this process's
                # interpreter lock, and every other upload would wait for it); large frames decode in numpy,
                # on a thread
                loop = asyncio.get_running_loop()
                if kind == "json":
                    try:
                        frame = await loop.run_in_executor(state["json_decoder"], _json_to_frame, body)
                    except concurrent.futures.process.BrokenProcessPool:
                        # the decode process died (killed, out of memory): a new pool for the next upload
                        log.error("the JSON decode process died; starting a new one")
                        state["json_decoder"].shutdown(wait=False)
                        state["json_decoder"] = new_json_decoder()
                        raise UnavailableError(
                            "internal", "the collector's decode process failed; retry later", settings.retry_after
                        ) from None
                    if isinstance(frame, tuple):
                        raise RejectedBatch(*frame)
                    decoded, value = prepare(frame, "frame", idempotency_key)
                else:
                    decoded, value = await loop.run_in_executor(None, prepare, body, kind, idempotency_key)
            else:
                decoded, value = prepare(body, kind, idempotency_key)
            batch = decoded
            if isinstance(value, RejectedBatch):
                raise value
            if (
                spend is not None
                and spent_tokens is not None
                and not spent_tokens.spend(spend[0], decoded.batch_id, spend[1])
            ):
                raise RejectedBatch(409, "token_spent", "this token was redeemed before (for another batch)")
            fut = ingestor.submit(
                decoded.batch_id,
                metric_day_key(decoded.metric, decoded.day),
                value,
                len(decoded),
                metric=decoded.metric,
            )
            try:
                # cancelling ``fut`` on a timeout is harmless: the ingestor hands out a future of the caller's own
                outcome = await asyncio.wait_for(asyncio.wrap_future(fut), settings.publish_timeout)
            except TimeoutError:
                raise UnavailableError(
                    "timeout",
                    f"the transport did not acknowledge the batch within {settings.publish_timeout:g} s; retry later",
                    settings.retry_after,
                ) from None
        except RejectedBatch as exc:
            prom.reject(exc.reason, len(batch) if batch is not None else None)
            return _error_parts(exc.status, exc.reason, exc.message)
        except UnavailableError as exc:
            prom.reject(exc.reason, len(batch) if batch is not None else None, outcome="unavailable")
            return _error_parts(503, exc.reason, exc.message, exc.retry_after)
        finally:
            state["in_flight"] -= 1
            prom.in_flight.inc(-1)
        assert batch is not None  # decoded before the publish it was answered for
        if outcome != "accepted":  # accepted ones were counted with their ids, in the store's transaction
            prom.batches.inc(outcome=outcome, reason="ok")
            prom.reports.inc(len(batch), outcome=outcome, reason="ok")
        return (
            202,
            b'{"status":"%s","batch_id":"%s","reports":%d}'
            % (outcome.encode(), batch.batch_id.hex().encode(), len(batch)),
            [],
        )

    @app.post(
        "/v1/reports",
        status_code=202,
        response_model=AcceptedBody,
        responses=_ERROR_RESPONSES,
        openapi_extra=_REPORTS_OPENAPI,
        summary="Upload one report batch",
    )
    async def post_reports(request: Request) -> Response:
        # CollectorApp serves uploads before they reach FastAPI; this route documents the same handler
        status, body, extra = await upload(
            request.headers.get("content-type", ""),
            request.headers.get("content-length"),
            request.headers.get("idempotency-key"),
            request.stream(),
            request.headers.get("authorization"),
        )
        return Response(
            body, status_code=status, media_type="application/json", headers={k.decode(): v.decode() for k, v in extra}
        )

    @app.get(
        "/v1/metrics",
        summary="The declared metrics (the document the SDK reads)",
        responses={200: {"content": {"application/json": {}}}, 304: {"description": "not modified"}},
        openapi_extra={
            "parameters": [
                {
                    "name": "layout",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string", "enum": ["0", "1", "true", "false"]},
                    "description": "1: add each metric's spec_id, accepted_spec_ids and record layout",
                },
                {
                    "name": "kinds",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string", "enum": ["all", "frequency"]},
                    "description": "all: every metric, numeric ones included (what the SDK asks for); "
                    "frequency (the default, for SDKs from before numeric metrics): frequency metrics only",
                },
            ]
        },
    )
    async def get_metrics(request: Request) -> Response:
        """The metrics document the SDK reads. With ``?layout=1`` each metric also carries its ``spec_id``
        (and the ids still accepted) and its ``record`` layout: the fields' numpy types and the JSON form's
        record shape, for clients written without the SDK. (Not by default: the SDK's parser refuses
        unknown fields, deployed SDKs included.)"""
        layout = request.query_params.get("layout", "").lower() in ("1", "true", "yes")
        every = request.query_params.get("kinds", "frequency").lower() == "all"
        if layout:
            body, etag = layout_body, layout_etag
        else:
            body, etag = (metrics_body, metrics_etag) if every else (compat_body, compat_etag)
        headers = {"ETag": etag, "Cache-Control": "public, max-age=300"}
        if request.headers.get("if-none-match") == etag:
            return Response(status_code=304, headers=headers)
        return Response(body, media_type="application/json", headers=headers)

    @app.get("/healthz", summary="Liveness: the process and its publisher thread run")
    async def healthz() -> Response:
        ingestor: Ingestor | None = state.get("ingestor")
        if ingestor is None or not ingestor.alive:
            return _error(503, "not_running", "the publisher thread is not running")
        return Response(b'{"status":"ok"}', media_type="application/json")

    @app.get("/readyz", summary="Readiness: the transport answers")
    @app.get("/ready", include_in_schema=False)
    async def readyz() -> Response:
        readiness: _Readiness | None = state.get("readiness")
        if readiness is None:
            return _error(503, "starting", "the collector is starting")
        ok, detail = await asyncio.to_thread(readiness.check)
        ingestor: Ingestor = state["ingestor"]
        body = {
            "ready": ok,
            "transport": detail,
            "last_publish_error": ingestor.last_error,
            "transport_down": ingestor.down,
            "queued": ingestor.queued(),
        }
        return Response(json.dumps(body).encode(), status_code=200 if ok else 503, media_type="application/json")

    @app.get("/metrics", summary="Prometheus metrics", responses={200: {"content": {"text/plain": {}}}})
    async def prometheus_metrics() -> Response:
        prom.reading.set(state["reading"])
        return Response(prom.registry.render(), media_type=PROMETHEUS_CONTENT_TYPE)

    if settings.fl_enabled:
        add_fl_routes(
            app, state, prom.registry, max_body_bytes=settings.max_body_bytes, publish_timeout=settings.publish_timeout
        )
    app.add_middleware(_Timing, metrics=prom)
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
    return create_app(settings)
