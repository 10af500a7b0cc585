"""The PSI service (``ldp psi serve``) and its client (``ldp psi client``): one round trip over HTTP.

``GET /v1/psi`` says the server's mode and limits; ``POST /v1/psi`` takes the client's request (the
protobuf of its blinded items, ``application/octet-stream``) and returns the server's setup and
response (two length-prefixed protobufs). Bad requests get 400 with ``{"error": ...}``; a request
for the other mode 409; one over the body limit 413.
"""

from __future__ import annotations

import time
from typing import Any

from estimator.psi.protocol import ClientResult, Mode, PsiClient, PsiError, PsiServer

__all__ = ["create_app", "run_client"]

BYTES_PER_ITEM = 40  # a compressed P-256 point (33 bytes) and its protobuf framing, with margin


def create_app(server: PsiServer) -> Any:
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    limit = server.max_client_items * BYTES_PER_ITEM + 1024

    async def info(request: Request) -> Response:
        return JSONResponse(server.info())

    async def answer(request: Request) -> Response:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            return JSONResponse({"error": f"request larger than {limit} bytes"}, status_code=413)
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                return JSONResponse({"error": f"request larger than {limit} bytes"}, status_code=413)
        try:
            out = await run_in_threadpool(server.answer, bytes(body))  # seconds of EC work: off the event loop
        except PsiError as e:
            status = 409 if "mode" in str(e) else 400
            return JSONResponse({"error": str(e)}, status_code=status)
        return Response(out, media_type="application/octet-stream")

    return Starlette(routes=[Route("/v1/psi", info, methods=["GET"]), Route("/v1/psi", answer, methods=["POST"])])


def run_client(url: str, items: list[str], mode: Mode = "intersection", timeout: float = 600.0) -> dict[str, Any]:
    """Ask the server at ``url``; the result with bytes each way and wall time."""
    import httpx

    t0 = time.perf_counter()
    client = PsiClient(items, mode)
    body = client.request()
    t_req = time.perf_counter() - t0
    base = url.rstrip("/")
    try:
        with httpx.Client(timeout=timeout) as http:
            info = http.get(f"{base}/v1/psi")
            if info.status_code != 200:
                raise PsiError(f"{base}/v1/psi answered {info.status_code}")
            if info.json().get("mode") != mode:
                raise PsiError(f"the server runs in {info.json().get('mode')} mode, not {mode}")
            resp = http.post(f"{base}/v1/psi", content=body, headers={"content-type": "application/octet-stream"})
    except httpx.HTTPError as e:
        raise PsiError(f"could not reach the PSI server at {base}: {e}") from None
    if resp.status_code != 200:
        try:
            detail = resp.json().get("error", resp.text)
        except ValueError:
            detail = resp.text
        raise PsiError(f"the PSI server answered {resp.status_code}: {detail}")
    t1 = time.perf_counter()
    result: ClientResult = client.finish(len(body), resp.content)
    t_fin = time.perf_counter() - t1
    return {
        "mode": result.mode,
        "client_items": result.client_items,
        "intersection_size": result.intersection_size,
        "intersection": result.intersection,
        "server_fpr": info.json().get("fpr"),
        "plaintext_bytes": sum(len(x.encode()) + 1 for x in client.items),
        "request_bytes": result.request_bytes,
        "answer_bytes": result.answer_bytes,
        "seconds": time.perf_counter() - t0,
        "client_request_s": t_req,
        "client_finish_s": t_fin,
    }
