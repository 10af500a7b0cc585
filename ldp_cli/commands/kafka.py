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

    def brokers(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--brokers",
            type=int,
            default=1,
            help="KRaft nodes (default 1). N > 1: a cluster on loopback in HOME/cluster/node1..N, broker ports "
            "PORT..PORT+N-1, controller ports from --controller-port (default PORT+N), replication factor "
            "min(3, N) and min.insync.replicas one less for every topic (ldp_cli/broker_cluster.py)",
        )

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
    brokers(q)
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
    brokers(q)
    q.add_argument("--port", type=int, default=None, help="with --brokers N: node 1's broker port, as given to up")
    q.add_argument("--controller-port", type=int, default=None, help="with --brokers N: as given to up")
    q.set_defaults(func=run_down)


def _quiet_client_logs() -> None:
    # kafka-python warns on every refused connection while the broker starts
    logging.getLogger("kafka").addHandler(logging.NullHandler())
    logging.getLogger("kafka").propagate = False


def _err(args: argparse.Namespace, exc: Exception) -> int:
    print(f"ldp kafka {args.kafka_command}: error: {exc}", file=sys.stderr)
    return 1


def _cluster(args: argparse.Namespace) -> list[BrokerConfig]:
    """The nodes of ``--brokers N`` (N > 1): node 1 on ``--port`` (default 9092), controllers from
    ``--controller-port`` (default port + N), jars of the single broker's home."""
    import dataclasses

    from ldp_cli.broker_cluster import cluster_configs

    base = BrokerConfig.from_home(
        args.home, heap=getattr(args, "heap", None), kafka_version=getattr(args, "kafka_version", None)
    )
    port = args.port if args.port is not None else 9092
    cport = args.controller_port if args.controller_port is not None else port + args.brokers
    try:
        base = dataclasses.replace(base, port=port, controller_port=cport, lib_dir=base.libs)
        return cluster_configs(base.home / "cluster", base, args.brokers)
    except ValueError as exc:
        raise BrokerError(str(exc)) from None


def run_cluster_up(args: argparse.Namespace) -> int:
    from ldp_cli.broker_cluster import cluster_bootstrap, cluster_up

    t0 = time.monotonic()
    try:
        cfgs = _cluster(args)
        cluster_up(cfgs, timeout=args.timeout, log=lambda m: print(f"ldp kafka: {m}", file=sys.stderr))
    except BrokerError as exc:
        return _err(args, exc)
    print(
        f"Kafka cluster of {len(cfgs)} nodes answers on {cluster_bootstrap(cfgs)} (replication factor "
        f"{cfgs[0].replication}, min.insync.replicas {cfgs[0].min_isr}); ready in {time.monotonic() - t0:.1f} s"
    )
    return 0


def run_up(args: argparse.Namespace) -> int:
    _quiet_client_logs()
    if args.brokers > 1:
        return run_cluster_up(args)
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
    if args.brokers > 1:
        from ldp_cli.broker_cluster import cluster_down

        try:
            for line in cluster_down(_cluster(args), grace=args.grace, purge=args.purge):
                print(line)
        except BrokerError as exc:
            return _err(args, exc)
        return 0
    try:
        print(down(BrokerConfig.from_home(args.home), grace=args.grace, purge=args.purge))
    except BrokerError as exc:
        return _err(args, exc)
    return 0
