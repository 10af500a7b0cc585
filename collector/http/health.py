"""``GET /healthz`` (liveness: the process and its publisher thread run) and ``GET /readyz`` (readiness:
the transport answers)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response

from collector.http.answers import error_response
from collector.ingest import Ingestor
from pipeline.transport import Transport

__all__ = ["Readiness", "add_health_routes"]


class Readiness:
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


def add_health_routes(app: FastAPI, runtime: dict[str, Any]) -> None:
    """The two probes; ``runtime`` holds the ``ingestor`` and the ``readiness`` while the app runs."""

    @app.get("/healthz", summary="Liveness: the process and its publisher thread run")
    async def healthz() -> Response:
        ingestor: Ingestor | None = runtime.get("ingestor")
        if ingestor is None or not ingestor.alive:
            return error_response(503, "not_running", "the publisher thread is not running")
        return Response(b'{"status":"ok"}', media_type="application/json")

    @app.get("/readyz", summary="Readiness: the transport answers")
    async def readyz() -> Response:
        readiness: Readiness | None = runtime.get("readiness")
        if readiness is None:
            return error_response(503, "starting", "the collector is starting")
        ok, detail = await asyncio.to_thread(readiness.check)
        ingestor: Ingestor = runtime["ingestor"]
        body = {
            "ready": ok,
            "transport": detail,
            "last_publish_error": ingestor.last_error,
            "transport_down": ingestor.down,
            "queued": ingestor.queued(),
        }
        return Response(json.dumps(body).encode(), status_code=200 if ok else 503, media_type="application/json")
