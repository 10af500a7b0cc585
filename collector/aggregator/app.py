"""The aggregator's HTTP service (FastAPI): what the leader and the helper answer.

``POST /v1/prio3/aggregate`` (helper): one aggregation job from the leader (:meth:`Aggregator.aggregate_job`).
``POST /v1/prio3/collect`` (both): ``{"metric", "day"}`` -> this aggregator's aggregate share of that batch,
released once, with its report count and checksum. ``GET /v1/prio3/status``: counts and CPU per report.
``GET /healthz``. With a ``token``, the two POST routes need ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from collector.aggregator.service import Aggregator, CollectRefused

__all__ = ["create_app", "http_helper"]


def _refusal(status: int, reason: str, message: str) -> Any:
    return JSONResponse({"error": reason, "message": message}, status_code=status)


def create_app(agg: Aggregator, *, token: str | None = None) -> FastAPI:
    app = FastAPI(title=f"ldp prio3 {agg.role}", docs_url=None, redoc_url=None, openapi_url=None)
    lock = asyncio.Lock()  # one job at a time: the aggregator's SQLite state is shared

    def allowed(request: Request) -> bool:
        if token is None:
            return True
        got = request.headers.get("authorization", "")
        return hmac.compare_digest(got.encode(), f"Bearer {token}".encode())

    async def body_of(request: Request) -> dict[str, Any] | None:
        try:
            body = await request.json()
        except ValueError:
            return None
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("metric"), str)
            or not isinstance(body.get("day"), int)
        ):
            return None
        return body

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "role": agg.role}

    @app.get("/v1/prio3/status")
    async def status() -> dict[str, Any]:
        return agg.status()

    @app.post("/v1/prio3/aggregate", response_model=None)
    async def aggregate(request: Request) -> Any:
        if not allowed(request):
            return _refusal(401, "unauthorized", "a bearer token is required")
        if agg.role != "helper":
            return _refusal(404, "not_helper", "this aggregator is the leader")
        body = await body_of(request)
        if body is None or not isinstance(body.get("reports"), list):
            return _refusal(400, "bad_request", 'expected {"metric", "day", "reports": [...]}')
        async with lock:
            try:
                return await asyncio.to_thread(agg.aggregate_job, body["metric"], body["day"], body["reports"])
            except CollectRefused as exc:
                return _refusal(exc.status, exc.reason, str(exc))

    @app.post("/v1/prio3/collect", response_model=None)
    async def collect(request: Request) -> Any:
        if not allowed(request):
            return _refusal(401, "unauthorized", "a bearer token is required")
        body = await body_of(request)
        if body is None:
            return _refusal(400, "bad_request", 'expected {"metric", "day"}')
        async with lock:
            try:
                share = await asyncio.to_thread(agg.aggregate_share, body["metric"], body["day"])
            except CollectRefused as exc:
                return _refusal(exc.status, exc.reason, str(exc))
        return share.to_json()

    return app


def http_helper(base_url: str, *, token: str | None = None, timeout: float = 60.0) -> Any:
    """The leader's call to the helper over HTTP (a :data:`~collector.aggregator.service.HelperCall`)."""
    import httpx

    client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout)
    headers = {"authorization": f"Bearer {token}"} if token else {}

    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = client.post(path, json=body, headers=headers)
        resp.raise_for_status()
        out: dict[str, Any] = resp.json()
        return out

    return call
