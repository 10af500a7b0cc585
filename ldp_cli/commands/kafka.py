"""``ldp kafka up|status|down``: the project's own single-node Kafka broker.

See :mod:`ldp_cli.broker` for what each step does.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from ldp_cli.broker import DEFAULT_KAFKA_VERSION, BrokerConfig, down, status, up
from ldp_cli.errors import BrokerError

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "kafka",
        help="run the project's own single-node Apache Kafka broker (downloaded from Maven Central)",
        description="Provision Apache Kafka from Maven Central and run one KRaft broker+controller on 127.0.0.1. "
        "Jars, config, data, pid and log live in --home (default $LDP_KAFKA_HOME or .kafka/ at the repository root).",
    )
    ksub = p.add_subparsers(dest="kafka_command", required=True)

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--home", default=None, help="folder of jars, config, data, pid and log")

    q = ksub.add_parser("up", help="download (once), format (once) and start the broker; wait until it answers")
    common(q)
    q.add_argument("--port", type=int, default=None, help="broker port (default 9092, or the last one used)")
    q.add_argument("--controller-port", type=int, default=None, help="KRaft controller port (default 9093)")
    q.add_argument("--heap", default=None, help="JVM heap, e.g. 512m (default)")
    q.add_argument(
        "--kafka-version", default=None, help=f"Kafka version on Maven Central (default {DEFAULT_KAFKA_VERSION})"
    )
    q.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for the broker to answer (default 120)"
    )
    q.set_defaults(func=run_up)

    q = ksub.add_parser("status", help="whether the broker runs and answers; exit 0 if so, 1 if not")
    common(q)
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(func=run_status)

    q = ksub.add_parser("down", help="stop the broker (SIGTERM, then SIGKILL after --grace seconds)")
    common(q)
    q.add_argument("--grace", type=float, default=30.0, help="seconds between SIGTERM and SIGKILL (default 30)")
    q.add_argument(
        "--purge", action="store_true", help="also delete the broker's data (topics, offsets); keeps the jars"
    )
    q.set_defaults(func=run_down)


def _quiet_client_logs() -> None:
    # kafka-python warns on every refused connection while the broker starts
    logging.getLogger("kafka").addHandler(logging.NullHandler())
    logging.getLogger("kafka").propagate = False


def _err(args: argparse.Namespace, exc: Exception) -> int:
    print(f"ldp kafka {args.kafka_command}: error: {exc}", file=sys.stderr)
    return 1


def run_up(args: argparse.Namespace) -> int:
    _quiet_client_logs()
    t0 = time.monotonic()
    try:
        cfg = BrokerConfig.from_home(
            args.home,
            port=args.port,
            controller_port=args.controller_port,
            heap=args.heap,
            kafka_version=args.kafka_version,
        )
        st = up(cfg, timeout=args.timeout, log=lambda m: print(f"ldp kafka: {m}", file=sys.stderr))
    except BrokerError as exc:
        return _err(args, exc)
    print(
        f"Kafka {st.kafka_version} answers on {st.bootstrap} (pid {st.pid}, cluster {st.cluster_id}); "
        f"ready in {time.monotonic() - t0:.1f} s"
    )
    return 0


def run_status(args: argparse.Namespace) -> int:
    _quiet_client_logs()
    try:
        st = status(BrokerConfig.from_home(args.home))
    except BrokerError as exc:
        return _err(args, exc)
    if args.json:
        print(json.dumps(st.to_json_obj()))
    else:
        print(st.detail)
        print(
            f"  bootstrap {st.bootstrap}  pid {st.pid}  kafka {st.kafka_version}  cluster {st.cluster_id}  home {st.home}"
        )
    return 0 if st.running else 1


def run_down(args: argparse.Namespace) -> int:
    try:
        print(down(BrokerConfig.from_home(args.home), grace=args.grace, purge=args.purge))
    except BrokerError as exc:
        return _err(args, exc)
    return 0
