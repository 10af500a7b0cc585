"""The collector app behind the native front, for ``bench_front_bridge.py --http`` only (``ldp collector`` is
not wired to the front yet): uvicorn serves the app on an internal port, ``ldp_front.Front`` listens on the
public one and proxies to it, and :class:`collector.http.front_bridge.FrontBridge` serves the front's uploads
on uvicorn's loop. Prints ``listening on http://HOST:PORT`` once ready, as ``ldp collector`` does. Usage::

    .venv/bin/python benchmarks/front_collector.py TRANSPORT_URL METRICS RAW_TOPIC DEDUP_PATH
"""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn
import uvloop

try:
    import ldp_front
except ImportError as exc:  # never a silent fallback: this measures the front
    raise SystemExit("front_collector: ldp_front is not installed (native/front; scripts/bootstrap)") from exc

from collector.http.app import create_app
from collector.http.front_bridge import FrontBridge
from collector.http.protocol import server_options
from collector.settings import CollectorSettings


def _listen() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(2048)
    return s


async def _serve(settings: CollectorSettings) -> None:
    app = create_app(settings, metrics_route=False)
    upstream, public = _listen(), _listen()
    config = uvicorn.Config(
        app, access_log=False, server_header=False, log_level="warning", lifespan="on", **server_options(settings)
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[upstream]))
    while not server.started:
        await asyncio.sleep(0.01)
    front = ldp_front.Front(
        public.fileno(),
        f"127.0.0.1:{upstream.getsockname()[1]}",
        max_body_bytes=settings.max_body_bytes,
        body_timeout=settings.body_timeout,
        header_timeout=settings.header_timeout,
        max_connections=settings.max_connections,
        max_queued=4096,
        retry_after=settings.retry_after,
        threads=1,
    )
    FrontBridge.for_app(app).attach(front)
    print(f"listening on http://127.0.0.1:{public.getsockname()[1]}", flush=True)
    await task


def main() -> None:
    url, metrics, topic, dedup = sys.argv[1:5]
    settings = CollectorSettings(
        metrics_path=metrics, transport_url=url, raw_topic=topic, dedup_path=dedup, max_in_flight=4096
    )
    uvloop.run(_serve(settings))


if __name__ == "__main__":
    main()
