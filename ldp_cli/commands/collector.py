"""``ldp collector``: run the HTTP collector (FastAPI on uvicorn).

Flags win over ``LDP_COLLECTOR_*`` environment variables (``$LDP_TRANSPORT``
and ``$LDP_METRICS`` too), which win over defaults; see
:class:`collector.settings.CollectorSettings`. uvicorn's access log is off:
it would record client addresses. SIGTERM or Ctrl-C stops it gracefully
(queued batches are published first).
"""

from __future__ import annotations

import argparse
import os
import sys

from collector.errors import ConfigError
from ldp_cli.options import add_log_level, add_metrics, add_transport, bind_socket, on_stop_signals, summary

__all__ = ["register"]

#: flags that are :class:`collector.settings.CollectorSettings` fields of the same ``dest``
_FLAGS: list[tuple[str, str, type, str]] = [
    ("--dedup", "dedup_path", str, "SQLite file of recently accepted batch ids (keyed digests, UTC days only)"),
    ("--token-keys", "token_keys", str, "the issuer's public day-key folder (with --require-tokens)"),
    ("--token-issuer", "token_issuer", str, "the issuer's name in the token challenge (default ldp-issuer)"),
    ("--token-origin", "token_origin", str, "this collector's name in the token challenge (default ldp-collector)"),
    (
        "--spent-tokens",
        "spent_path",
        str,
        "SQLite file of redeemed tokens, shared by the workers and by every collector of this token origin "
        "(one host: docs/COLLECTOR.md, Several collectors)",
    ),
    ("--raw-topic", "raw_topic", str, "topic accepted batches go to (default ldp.reports.raw)"),
    ("--raw-partitions", "raw_partitions", int, "partitions of the raw topic when the collector creates it"),
    ("--max-body-bytes", "max_body_bytes", int, "largest accepted request body in bytes (413 above; default 4194304)"),
    ("--max-records", "max_records", int, "most reports per batch (413 above; default 65536)"),
    (
        "--max-in-flight",
        "max_in_flight",
        int,
        "uploads processed at once, counted once their body is read (503 with Retry-After above; default 256)",
    ),
    (
        "--max-reading",
        "max_reading",
        int,
        "request bodies read at once (503 with Retry-After and Connection: close above; default 1024)",
    ),
    (
        "--body-timeout",
        "body_timeout",
        float,
        "seconds a request body may take to arrive after its headers (408 and close after; default 15)",
    ),
    ("--min-body-rate", "min_body_rate", float, "bytes/s a body must average after --body-grace (default 1024)"),
    ("--body-grace", "body_grace", float, "seconds before --min-body-rate applies (default 2)"),
    ("--header-timeout", "header_timeout", float, "seconds to send request line+headers, idle too (default 5)"),
    ("--max-connections", "max_connections", int, "beyond, the oldest head-less one is closed (default 8192)"),
    (
        "--offload-json-bytes",
        "offload_json_bytes",
        int,
        "JSON bodies above this many bytes are decoded in a decode process, off the event loop (default 2048)",
    ),
    (
        "--offload-frame-bytes",
        "offload_frame_bytes",
        int,
        "binary frames above this many bytes are decoded on a thread, off the event loop (default 1048576)",
    ),
    ("--decode-workers", "decode_workers", int, "processes that decode large JSON bodies (default 1)"),
    (
        "--probe-after",
        "probe_after",
        float,
        "seconds a publish may run before the transport is probed; while a probe fails uploads get 503 at once "
        "(default 1)",
    ),
    (
        "--probe-interval",
        "probe_interval",
        float,
        "seconds between probes of a transport that is down, and at least between two probes (default 1)",
    ),
    ("--retry-after", "retry_after", int, "seconds clients are asked to wait on 503"),
    (
        "--max-days-ahead",
        "max_days_ahead",
        int,
        "how many UTC days ahead of the collector a batch's day may be (default $LDP_MAX_DAYS_AHEAD, shared with "
        "the shuffler, else 1)",
    ),
    (
        "--max-day-age",
        "max_day_age",
        int,
        "how many UTC days old a batch's day may be (default $LDP_MAX_DAY_AGE, shared with the shuffler, else 31)",
    ),
    ("--dedup-ttl", "dedup_ttl", float, "seconds a batch id is remembered, rounded up to UTC days (default 259200)"),
    ("--fl-rounds-topic", "fl_rounds_topic", str, "with --fl: topic the aggregation jobs publish rounds to"),
    ("--fl-updates-topic", "fl_updates_topic", str, "with --fl: topic device FL uploads go to"),
]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "collector",
        help="run the HTTP collector that accepts report batches",
        description=summary(__doc__),
    )
    add_transport(
        p,
        dest="transport_url",
        help="sqlite:///path/log.sqlite3 or kafka://host:port (default "
        "$LDP_TRANSPORT, else the embedded log ldp-data/transport.sqlite3)",
    )
    add_metrics(
        p,
        "the metrics file (JSON) served to SDKs and used to check uploads (default $LDP_METRICS)",
        dest="metrics_path",
    )
    for flag, dest, typ, text in _FLAGS:
        p.add_argument(flag, dest=dest, type=typ, default=None, help=text)
    p.add_argument(
        "--fl",
        dest="fl_enabled",
        action="store_const",
        const=True,
        default=None,
        help="serve the federated-learning routes /v1/fl/... (default $LDP_COLLECTOR_FL_ENABLED, else off)",
    )
    p.add_argument(
        "--require-tokens",
        dest="require_tokens",
        action="store_const",
        const=True,
        default=None,
        help="refuse uploads without a valid, unspent anonymous token (docs/TOKENS.md; needs --token-keys)",
    )
    p.add_argument(
        "--allow-origin",
        dest="allow_origins",
        action="append",
        default=None,
        metavar="ORIGIN",
        help="a web page origin (https://app.example) whose browsers may upload and fetch the metrics (CORS); "
        "repeatable; * allows any page (default $LDP_COLLECTOR_ALLOW_ORIGINS, comma-separated, else none)",
    )
    p.add_argument(
        "--metrics-host",
        dest="metrics_host",
        help="address of the operational-metrics listener (Prometheus /metrics; default "
        "$LDP_COLLECTOR_METRICS_HOST, else 127.0.0.1)",
    )
    p.add_argument(
        "--metrics-port",
        dest="metrics_port",
        type=int,
        help="port of the operational-metrics listener (default $LDP_COLLECTOR_METRICS_PORT, else 0: a free one, "
        "printed at start-up); the device-facing port answers 404 at /metrics",
    )
    p.add_argument(
        "--public-metrics",
        dest="public_metrics",
        action="store_const",
        const=True,
        default=None,
        help="serve /metrics on the device-facing port instead, without a credential (default "
        "$LDP_COLLECTOR_PUBLIC_METRICS, else off)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0 picks a free one)")
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (default 1)")
    p.add_argument(
        "--front",
        choices=("python", "native"),
        default=None,
        help="what serves the device-facing port: python (uvicorn) or native (the native upload front, one worker; "
        "docs/COLLECTOR.md) (default $LDP_COLLECTOR_FRONT, else python)",
    )
    add_log_level(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from collector.http.app import create_app
    from collector.http.protocol import server_options
    from collector.settings import CollectorSettings
    from ldp_core.processes import freeze_built_heap

    overrides = {dest: getattr(args, dest) for _, dest, _, _ in _FLAGS}
    overrides.update(transport_url=args.transport_url, metrics_path=args.metrics_path, fl_enabled=args.fl_enabled)
    overrides.update(require_tokens=args.require_tokens, allow_origins=args.allow_origins)
    overrides.update(public_metrics=args.public_metrics, front=args.front)
    overrides.update(metrics_host=args.metrics_host, metrics_port=args.metrics_port)
    try:
        settings = CollectorSettings.from_env(**overrides)
        if settings.front == "native" and args.workers > 1:
            raise ConfigError("--front native serves one worker: run several collectors (docs/COLLECTOR.md)")
        app = create_app(settings, metrics_route=settings.public_metrics)  # checks the metrics file first
    except ConfigError as exc:
        print(f"ldp collector: error: {exc}", file=sys.stderr)
        return 2
    common = dict(
        host=args.host,
        port=args.port,
        access_log=False,
        server_header=False,
        log_level=args.log_level,
        proxy_headers=False,
        lifespan="on",
        **server_options(settings),
    )
    msock = None if settings.public_metrics else bind_socket(settings.metrics_host, settings.metrics_port, backlog=128)
    maddr = ":".join(map(str, msock.getsockname()[:2])) if msock is not None else ""
    mline = f"ldp collector: operational metrics on http://{maddr}/metrics" if maddr else ""
    if args.workers > 1:  # the parent serves every worker's metrics (collector/http/workers.py)
        from collector.http.workers import metrics_for_workers

        os.environ["LDP_COLLECTOR_SETTINGS"] = settings.to_json()
        with metrics_for_workers(settings, msock):
            print(mline, end="\n" if mline else "", flush=True)
            uvicorn.run("collector.http.app:app_from_env", factory=True, workers=args.workers, **common)
        return 0
    sock = bind_socket(args.host, args.port, backlog=2048)  # connections wait in the backlog until uvicorn accepts them
    host, port = sock.getsockname()[:2]
    from collector.http.frontend import NativeFront, make_server, serve

    native = None
    if settings.front == "native":  # the front takes the device-facing socket, uvicorn a loopback one for the rest
        try:
            native = NativeFront(settings, sock)
        except ConfigError as exc:
            print(f"ldp collector: error: {exc}", file=sys.stderr)
            return 2
        sock = native.inner
    print(f"ldp collector: listening on http://{host}:{port} (transport {settings.transport_url})", flush=True)
    print(mline, end="\n" if mline else "", flush=True)
    server = make_server(uvicorn.Config(app, **common), native)
    freeze_built_heap()
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal with the handlers it found
    # installed; these make that a normal exit
    on_stop_signals(_exit_normally)
    try:
        from uvicorn._compat import asyncio_run  # uvicorn's loop choice (uvloop if installed)
    except ImportError:  # an older uvicorn: the default loop
        import asyncio

        asyncio.run(serve(server, sock, msock, app, native))
    else:
        asyncio_run(serve(server, sock, msock, app, native), loop_factory=server.config.get_loop_factory())
    return 0


def _exit_normally(signum: int, frame: object) -> None:
    raise SystemExit(0)
