"""Cross-origin access for web pages (CORS): the collector's and the issuer's answer to browsers.

A page on its own origin (``https://app.example``) that uploads to ``https://collector.example`` sends a
preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``/``-Headers``) before each
non-simple request; unless the answer allows its origin, method and headers, the browser withholds the
request and the page only sees ``TypeError: Failed to fetch``.

:class:`CorsMiddleware` answers for a fixed table of routes, and only for the origins the operator listed
(``--allow-origin``; ``*`` only when listed itself):

* a preflight of a listed route from a listed origin, for one of the route's methods and only headers the
  route accepts: 204 with ``Access-Control-Allow-Origin`` (that origin), ``-Allow-Methods``,
  ``-Allow-Headers``, ``-Max-Age``;
* any other preflight of a listed route: 403 ``{"error": "cors_refused", ...}`` without any
  ``Access-Control-Allow-*`` header (the browser then refuses the request);
* an actual request of a listed route from a listed origin: its answer gets ``Access-Control-Allow-Origin``
  and ``Access-Control-Expose-Headers`` (``Retry-After``, ``ETag``: what the SDK reads); from another
  origin it is served as before, without them, so the browser hides the answer from the page.

Every answer of a listed route carries ``Vary: Origin`` (caches must not hand one origin's answer to
another). No credentials are allowed: the SDK sends none (``credentials: "omit"``), tokens travel in
``Authorization`` headers that CORS allows as a request header only. With no origin listed the middleware
is not installed and nothing changes.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from pipeline.errors import ConfigError

__all__ = ["CorsMiddleware", "Route", "parse_origins", "COLLECTOR_ROUTES", "ISSUER_ROUTES"]

#: a route's methods and the request headers a browser may send on it (lower case)
Route = tuple[frozenset[str], frozenset[str]]

#: what the web SDK sends the collector: frames with their batch id (and a token once it has them)
COLLECTOR_ROUTES: dict[str, Route] = {
    "/v1/reports": (frozenset({"POST"}), frozenset({"content-type", "idempotency-key", "authorization"})),
    "/v1/metrics": (frozenset({"GET"}), frozenset({"accept", "if-none-match"})),
    "/v1/token-keys": (frozenset({"GET"}), frozenset({"accept"})),
}
#: what a device sends the issuer: the key fetch, and token requests signed as an enrolled device
ISSUER_ROUTES: dict[str, Route] = {
    "/v1/token-keys": (frozenset({"GET"}), frozenset({"accept"})),
    "/v1/token-requests": (
        frozenset({"POST"}),
        frozenset({"content-type", "x-ldp-device-credential", "x-ldp-device-signature"}),
    ),
}
_EXPOSE = b"Retry-After, ETag"
MAX_AGE = 600

ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def parse_origins(values: str | Iterable[str] | None, *, what: str = "allow_origins") -> tuple[str, ...]:
    """The origins of ``--allow-origin`` flags or a comma-separated variable, checked: each is ``*`` or
    ``scheme://host[:port]`` (no path, query or user); a trailing ``/`` is dropped, scheme and host are
    lower-cased (as browsers send them)."""
    if values is None:
        return ()
    items = values.split(",") if isinstance(values, str) else list(values)
    out: list[str] = []
    for raw in items:
        if not isinstance(raw, str):
            raise ConfigError(f"{what}: an origin must be a string, got {raw!r}")
        text = raw.strip()
        if not text:
            continue
        if text == "*":
            out.append(text)
            continue
        text = text.rstrip("/")
        parts = urlsplit(text)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query or parts.fragment:
            raise ConfigError(
                f"{what}: {raw!r} is not an origin: write scheme://host[:port] (e.g. https://app.example.com), "
                "or * for any page"
            )
        if parts.username is not None or parts.password is not None:
            raise ConfigError(f"{what}: {raw!r} is not an origin: it has a user part")
        try:
            port = parts.port
        except ValueError:
            raise ConfigError(f"{what}: {raw!r} has a bad port") from None
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        origin = f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")
        if origin not in out:
            out.append(origin)
    return tuple(out)


class CorsMiddleware:
    """ASGI middleware answering CORS for ``routes`` and the ``origins`` (see the module docstring)."""

    def __init__(self, app: ASGIApp, *, origins: Iterable[str], routes: Mapping[str, Route]) -> None:
        self.app = app
        self.origins = frozenset(origins)
        self.any = "*" in self.origins
        self.routes = dict(routes)

    def allowed(self, origin: str | None) -> bool:
        return origin is not None and (self.any or origin in self.origins)

    def answer_headers(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        """The headers added to the answer of an actual (not preflight) request of a listed route from
        ``origin`` (``None``: no ``Origin`` header); the native front's uploads get them too
        (:mod:`collector.http.front_bridge`)."""
        extra = [(b"vary", b"Origin")]
        if self.allowed(origin):
            extra += [
                (b"access-control-allow-origin", b"*" if self.any else str(origin).encode("latin-1")),
                (b"access-control-expose-headers", _EXPOSE),
            ]
        return extra

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        route = self.routes.get(scope.get("path", "")) if scope["type"] == "http" else None
        if route is None:
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get(b"origin")
        if scope["method"] == "OPTIONS" and origin is not None and b"access-control-request-method" in headers:
            await self._preflight(route, origin, headers, send)
            return
        extra = self.answer_headers(origin)

        async def send_with_cors(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, send_with_cors)

    async def _preflight(self, route: Route, origin: str, headers: dict[bytes, str], send: Any) -> None:
        methods, accepted = route
        method = headers[b"access-control-request-method"].strip().upper()
        wanted = {h.strip().lower() for h in headers.get(b"access-control-request-headers", "").split(",") if h.strip()}
        refusal = None
        if not self.allowed(origin):
            refusal = f"origin {origin!r} is not allowed here (the operator lists pages with --allow-origin)"
        elif method not in methods:
            refusal = f"method {method} is not served here (allowed: {', '.join(sorted(methods))})"
        elif not wanted <= accepted:
            refusal = f"request headers {', '.join(sorted(wanted - accepted))} are not accepted here"
        if refusal is not None:
            body = json.dumps({"error": "cors_refused", "message": refusal}).encode()
            out = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"vary", b"Origin"),
            ]
            await send({"type": "http.response.start", "status": 403, "headers": out})
            await send({"type": "http.response.body", "body": body})
            return
        out = [
            (b"vary", b"Origin"),
            (b"access-control-allow-origin", b"*" if self.any else origin.encode("latin-1")),
            (b"access-control-allow-methods", ", ".join(sorted(methods)).encode()),
            (b"access-control-allow-headers", ", ".join(sorted(accepted)).encode()),
            (b"access-control-max-age", str(MAX_AGE).encode()),
            (b"content-length", b"0"),
        ]
        await send({"type": "http.response.start", "status": 204, "headers": out})
        await send({"type": "http.response.body", "body": b""})
