"""The peers ``bench_ingest.py --peers`` measures the collector against: the same HTTP stack, less work.

``python benchmarks/ingest_peer.py read|parse|front-read``: one uvicorn worker with the collector's own server
options (httptools, uvloop, its protocol class, access log off) on 127.0.0.1, serving an ASGI app whose
``POST`` reads the whole body and answers 202 with a JSON body of the collector's shape (``read``), or also
decodes and checks the binary frame against the metrics file's spec (``parse``: :func:`decode_frame`, CRC,
fields, record bounds). ``front-read``: the native upload front (``ldp_front``, native/front; one tokio
worker thread) reads the uploads, and Python, on an event loop watching the front's eventfd, takes each
waiting batch (up to 512) and answers them all 202 at once with the same JSON body: the floor a collector
behind the front could reach. Nothing is published. Prints ``listening on http://HOST:PORT`` like the
collector.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def make_app(mode: str) -> Any:
    from ldp_core.metrics import load_metrics
    from ldp_core.wire.frames import decode_frame, read_header

    specs = {name: m.spec for name, m in load_metrics(ROOT / "metrics" / "example.json", reject_expired=False).items()}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        parts = []
        while True:
            message = await receive()
            parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(parts)
        n = 0
        if mode == "parse":
            batch = decode_frame(body, specs[read_header(body).metric])
            n = len(batch)
        answer = b'{"status":"accepted","batch_id":"%s","reports":%d}' % (body[28:44].hex().encode(), n)
        await send(
            {
                "type": "http.response.start",
                "status": 202,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    return app


def serve_front(sock: Any) -> None:
    """``front-read``: ldp_front parses HTTP and reads bodies; Python only answers whole batches."""
    import asyncio

    import ldp_front

    front = ldp_front.Front(
        sock.fileno(),
        None,
        upload_path="/v1/reports",
        content_types=["application/vnd.ldp.frame", "application/octet-stream"],
        max_body_bytes=8 << 20,
        body_timeout=10.0,
        header_timeout=30.0,
        max_connections=10_000,
        max_queued=4096,
        retry_after=1,
        threads=1,
    )
    headers: list[tuple[bytes, bytes]] = []

    def on_ready() -> None:
        batch = front.take_nowait(512)
        front.answer_many(
            [
                (t, 202, b'{"status":"accepted","batch_id":"%s","reports":0}' % body[28:44].hex().encode(), headers)
                for t, body, *_ in batch
            ]
        )

    async def run() -> None:
        asyncio.get_running_loop().add_reader(front.notify_fd(), on_ready)
        await asyncio.Event().wait()

    try:
        import uvloop

        uvloop.run(run())
    except ImportError:
        asyncio.run(run())


def main() -> None:
    import uvicorn

    from collector.http.protocol import server_options
    from collector.settings import CollectorSettings
    from ldp_cli.options import bind_socket

    mode = sys.argv[1] if len(sys.argv) > 1 else "read"
    if mode not in ("read", "parse", "front-read"):
        raise SystemExit("usage: ingest_peer.py read|parse|front-read")
    settings = CollectorSettings.from_env(metrics_path=str(ROOT / "metrics" / "example.json"))
    sock = bind_socket("127.0.0.1", 0, backlog=2048)
    host, port = sock.getsockname()[:2]
    if mode == "front-read":
        print(f"ingest peer ({mode}): listening on http://{host}:{port}", flush=True)
        serve_front(sock)
        return
    config = uvicorn.Config(
        make_app(mode),
        access_log=False,
        server_header=False,
        log_level="warning",
        lifespan="off",
        **server_options(settings),
    )
    print(f"ingest peer ({mode}): listening on http://{host}:{port}", flush=True)
    from uvicorn._compat import asyncio_run

    server = uvicorn.Server(config)
    asyncio_run(server.serve(sockets=[sock]), loop_factory=config.get_loop_factory())


if __name__ == "__main__":
    main()
