"""``ldp estimator``: the streaming estimator as a long-lived service (see :mod:`estimator.streaming`).

It consumes the shuffled topic in a consumer group, snapshots its state and
offsets to ``--state DIR``, and serves ``GET /v1/estimates/{metric}`` on
``--host:--port``. Give each instance its own ``--state`` folder; instances
of one ``--group`` split the partitions, and ``--peer URL`` (repeatable)
lets one instance answer ``?merged=true`` with the merged state of all.
A transport failure (broker restart, locked log) drops the uncommitted
tails and rejoins after a pause; SIGTERM or Ctrl-C checkpoints and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
import threading
import time

from pipeline.topics import DEFAULT_PARTITIONS, SHUFFLED_TOPIC

__all__ = ["register", "DEFAULT_PORT"]

DEFAULT_PORT = 8090


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("estimator", help="run the streaming estimator and serve live estimates over HTTP",
                       description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--transport", default=None, help="sqlite:///path or kafka://host:port (default $LDP_TRANSPORT)")
    p.add_argument("--state", required=True, help="folder of this instance's snapshot (estimator.sqlite3)")
    p.add_argument("--metrics", action="append", default=None,
                   help="metrics file(s) declaring the specs (repeatable; default $LDP_METRICS or metrics/example.json)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--topic", default=SHUFFLED_TOPIC, help=f"shuffled topic (default {SHUFFLED_TOPIC})")
    p.add_argument("--group", default="ldp-estimator", help="consumer group (default ldp-estimator)")
    p.add_argument("--member", default=None, help="member name (default: kept in the state folder)")
    p.add_argument("--partitions", type=int, default=DEFAULT_PARTITIONS, help="partitions if the topic is created")
    p.add_argument("--checkpoint-seconds", type=float, default=1.0, help="seconds between snapshots (default 1)")
    p.add_argument("--session-timeout", type=float, default=10.0, help="group session timeout, seconds")
    p.add_argument("--peer", action="append", default=[], help="base URL of another instance (repeatable)")
    p.add_argument("--no-http", action="store_true", help="consume only; serve nothing")
    p.add_argument("--idle-exit", type=float, default=None, help="exit after this many seconds without input")
    p.add_argument("--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=run)


def consume_forever(engine: object, stop: threading.Event, *, idle_exit: float | None = None,
                    backoff: float = 1.0) -> None:
    """Run ``engine`` (a :class:`~pipeline.processor.StreamProcessor`) until ``stop``; rejoin after ``backoff`` on a
    transient failure, stop on a fatal one (:data:`~pipeline.processor.FATAL_ERRORS`)."""
    from pipeline.processor import FATAL_ERRORS

    log = logging.getLogger("ldp.consumer")
    while not stop.is_set():
        try:
            engine.run(stop=stop, idle_timeout=idle_exit)  # type: ignore[attr-defined]
            if idle_exit is not None:
                stop.set()
        except FATAL_ERRORS:  # ProcessorError (state and log disagree) or FencedError: stop
            raise
        except Exception as exc:  # a broker restart, a locked log: rejoin and go on
            log.warning("%s failed (%r); rejoining in %.1f s", type(engine).__name__, exc, backoff)
            try:
                engine.rejoin(f"transport failure {exc!r}")  # type: ignore[attr-defined]
            except Exception as again:  # noqa: BLE001 - closing a consumer of a dead broker may fail too
                log.warning("leaving the group failed too (%r)", again)
            stop.wait(backoff)


def run(args: argparse.Namespace) -> int:
    from pipeline.catalog import SpecCatalog
    from pipeline.transport import open_transport
    from estimator.streaming import StreamingEstimator, create_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    catalog = SpecCatalog.from_files(args.metrics)
    transport = open_transport(args.transport)
    engine = StreamingEstimator(transport, args.state, catalog, topic=args.topic, group=args.group,
                                member=args.member, checkpoint_seconds=args.checkpoint_seconds,
                                session_timeout=args.session_timeout, partitions=args.partitions)
    stop = threading.Event()
    failure: list[BaseException] = []

    def work() -> None:
        try:
            consume_forever(engine, stop, idle_exit=args.idle_exit)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failure.append(exc)
            stop.set()

    worker = threading.Thread(target=work, name="estimator-consumer", daemon=True)
    worker.start()
    code = 0
    import signal

    # Ours before uvicorn's: it restores them and re-raises the signal after its shutdown, which then
    # lands here instead of killing the process before the final checkpoint.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        if args.no_http:
            print(f"ldp estimator: consuming {args.topic} as {args.group}/{engine.member} on {transport.url}",
                  flush=True)
            while not stop.wait(0.5):
                pass
        else:
            import uvicorn

            app = create_app(engine, peers=args.peer)
            sock = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((args.host, args.port))
            host, port = sock.getsockname()[:2]
            print(f"ldp estimator: listening on http://{host}:{port} (consuming {args.topic} as "
                  f"{args.group}/{engine.member} on {transport.url})", flush=True)
            server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, access_log=False, server_header=False,
                                                   log_level=args.log_level, lifespan="off"))

            def watch() -> None:
                while not stop.wait(0.5):
                    pass
                server.should_exit = True

            threading.Thread(target=watch, daemon=True).start()
            server.run(sockets=[sock])
    finally:
        stop.set()
        worker.join(timeout=60)
        t0 = time.monotonic()
        try:
            engine.close()
        finally:
            transport.close()
        logging.getLogger("ldp.estimator").info("closed in %.2f s", time.monotonic() - t0)
    if failure:
        print(f"ldp estimator: error: {failure[0]}", file=sys.stderr)
        code = 1
    print(json.dumps({"estimator": engine.stats.to_json_obj()}), flush=True)
    return code
