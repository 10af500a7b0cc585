"""What the collector answers besides a 202: the ``{"error", "message"}`` body of every refusal, and the
handler that gives the framework's own 404 and 405 that body too."""

from __future__ import annotations

import json
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

__all__ = ["Answer", "AcceptedBody", "ErrorBody", "add_error_handler", "error_parts", "error_response"]

#: an upload's answer: status, JSON body and extra headers (lower-case names), as the ASGI server takes them
Answer = tuple[int, bytes, list[tuple[bytes, bytes]]]


class ErrorBody(BaseModel):
    """Every non-2xx answer."""

    error: str
    message: str


class AcceptedBody(BaseModel):
    """The 202 answer."""

    status: Literal["accepted", "duplicate"]
    batch_id: str
    reports: int


def error_response(status: int, reason: str, message: str, headers: dict[str, str] | None = None) -> Response:
    """A refusal as a framework response."""
    body = json.dumps({"error": reason, "message": message}).encode()
    return Response(body, status_code=status, media_type="application/json", headers=headers)


def error_parts(status: int, reason: str, message: str, retry_after: int | None = None) -> Answer:
    """A refusal as an :data:`Answer`, with ``Retry-After`` when ``retry_after`` is given."""
    extra = [] if retry_after is None else [(b"retry-after", str(retry_after).encode())]
    return status, json.dumps({"error": reason, "message": message}).encode(), extra


_REASONS = {404: "not_found", 405: "method_not_allowed"}


def add_error_handler(app: FastAPI) -> None:
    """Give the framework's own errors (404, 405, ...) the documented ``{"error", "message"}`` body."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        path = request.url.path[:100]
        hints = {
            404: f"no route {path!r}; GET /docs lists the routes",
            405: f"{request.method} is not allowed on {path!r}; GET /docs lists the routes",
        }
        return error_response(
            exc.status_code,
            _REASONS.get(exc.status_code, "http_error"),
            hints.get(exc.status_code, str(exc.detail)[:200]),
            headers=dict(exc.headers or {}),
        )
