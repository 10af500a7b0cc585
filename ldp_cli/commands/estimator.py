"""``ldp estimator``: the streaming estimator as a long-lived service (see :mod:`estimator.service`).

It consumes the shuffled topic in a consumer group, snapshots its state and
offsets to ``--state DIR``, and serves ``GET /v1/estimates/{metric}`` on
``--host:--port``. Give each instance its own ``--state`` folder; instances
of one ``--group`` split the partitions, and with ``--peer URL`` (repeatable)
every read answers for the whole group (``?merged=false``: this member only;
a peer that does not answer makes the answer ``partial``).
It starts (and serves its restored state) whether or not the broker
answers: the join is retried with backoff (:mod:`pipeline.processor`), and
``GET /readyz`` answers 503 until it is joined. A
transport failure (broker restart, locked log) drops the uncommitted tails
and rejoins after a backoff step; ``--status-file`` keeps a JSON file of
its state and counters (:mod:`pipeline.status`); SIGTERM or Ctrl-C
checkpoints and exits.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
import time

from ldp_cli.options import (
    ShuffledInput,
    add_idle_exit,
    add_log_level,
    add_metrics,
    add_shuffled_consumer,
    add_status_file,
    add_transport,
    bind_socket,
    consume_forever,
    stop_event,
    summary,
)

__all__ = ["register", "DEFAULT_PORT", "DEFAULT_GROUP"]

DEFAULT_PORT = 8090
DEFAULT_GROUP = "ldp-estimator"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimator",
        help="service: run the streaming estimator and serve live estimates over HTTP",
        description=summary(__doc__),
    )
    add_transport(p)
    p.add_argument("--state", required=True, help="folder of this instance's snapshot (estimator.sqlite3)")
    add_metrics(p, "metrics file(s) declaring the specs (repeatable; default $LDP_METRICS; required)", repeatable=True)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)")
    add_shuffled_consumer(
        p,
        DEFAULT_GROUP,
        "member name, also its Kafka group.instance.id (static membership; default: kept in the state folder)",
    )
    p.add_argument("--checkpoint-seconds", type=float, default=1.0, help="seconds between snapshots (default 1)")
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        help="base URL of another member of the group (repeatable): reads then answer for the whole group",
    )
    p.add_argument("--no-http", action="store_true", help="consume only; serve nothing")
    p.add_argument(
        "--replay-set",
        help="SQLite file of the sealed records already counted (replay guard); members of a group on one host "
        "share one to drop replays across rebalances (default: sealed-seen.sqlite3 in --state)",
    )
    p.add_argument(
        "--dataset",
        help="the Parquet sink's folder: heavy-hitter metrics' values are discovered from its part files and "
        "shown on the dashboard (GET /v1/heavy-hitters/{metric}; docs/DASHBOARD.md)",
    )
    add_idle_exit(p)
    add_status_file(p)
    add_log_level(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from estimator.service import StreamingEstimator, create_app
    from pipeline.status import StatusFile

    inp = ShuffledInput(args)
    transport, catalog = inp.transport, inp.catalog
    engine = StreamingEstimator(
        transport,
        args.state,
        catalog,
        checkpoint_seconds=args.checkpoint_seconds,
        replay_set=args.replay_set,
        **inp.consumer_options(args),
    )
    engine.static_member = args.member is not None  # a stable name: Kafka's static membership
    stop = threading.Event()  # set by the signals below, a consumer failure, or the end of the HTTP server
    failure: list[BaseException] = []

    def work() -> None:
        try:
            consume_forever(engine, stop, idle_exit=args.idle_exit)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failure.append(exc)
            stop.set()

    if args.status_file:
        StatusFile(args.status_file, "estimator", engine, engine.stats.to_json_obj).start(stop)
    worker = threading.Thread(target=work, name="estimator-consumer", daemon=True)
    worker.start()
    code = 0
    # Ours before uvicorn's: it restores them and re-raises the signal after its shutdown, which then
    # lands here instead of killing the process before the final checkpoint.
    stop_event(stop)
    try:
        if args.no_http:
            print(
                f"ldp estimator: consuming {args.topic} as {args.group}/{engine.member} on {transport.url}", flush=True
            )
            while not stop.wait(0.5):
                pass
        else:
            import uvicorn

            app = create_app(engine, peers=args.peer, dataset=args.dataset)
            sock = bind_socket(args.host, args.port)
            host, port = sock.getsockname()[:2]
            print(
                f"ldp estimator: listening on http://{host}:{port} (consuming {args.topic} as "
                f"{args.group}/{engine.member} on {transport.url}); dashboard http://{host}:{port}/",
                flush=True,
            )
            server = uvicorn.Server(
                uvicorn.Config(
                    app,
                    host=host,
                    port=port,
                    access_log=False,
                    server_header=False,
                    log_level=args.log_level,
                    lifespan="off",
                )
            )

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
