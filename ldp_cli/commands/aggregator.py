"""``ldp aggregator``: run a Prio3 aggregator (the leader or the helper) as an HTTP service, set up a
deployment, or collect a batch (docs/PRIO3.md).

``--role helper`` serves the helper's routes; ``--role leader`` serves the leader's and reads the collector's
raw topic (``--transport``, the embedded log by default), queues the Prio3 reports and drives the helper at
``--helper-url``. Both listen on 127.0.0.1 unless ``--host`` says otherwise. ``--init DIR`` writes a new
deployment (both aggregators' key pairs, their shared VDAF verify key, and a metrics file with the demo's
Prio3 metrics naming both public keys). ``--collect METRIC`` is the collector's combine step: it asks both
aggregators for their aggregate share of one day and unshards them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ldp_cli.options import summary

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "aggregator",
        help="run a Prio3 aggregator (leader or helper) over HTTP, set one up, or collect a batch",
        description=summary(__doc__),
    )
    p.add_argument("--role", choices=("leader", "helper"), default=None, help="which aggregator to run")
    p.add_argument("--metrics", type=Path, default=None, help="the metrics file naming both aggregators' keys")
    p.add_argument("--key", type=Path, default=None, help="this aggregator's private key file (`ldp keys new`)")
    p.add_argument(
        "--verify-key", type=Path, default=None, help="the VDAF verify key file shared by the two aggregators"
    )
    p.add_argument("--state", type=Path, default=Path("ldp-data/prio3"), help="state folder (default ldp-data/prio3)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="port (default 0: a free one, printed at start-up)")
    p.add_argument("--helper-url", default=None, help="--role leader: the helper's base URL")
    p.add_argument(
        "--transport",
        default=None,
        help="--role leader: the log to read (default $LDP_TRANSPORT, else the embedded log)",
    )
    p.add_argument(
        "--raw-topic", default=None, help="--role leader: the collector's raw topic (default ldp.reports.raw)"
    )
    p.add_argument("--min-batch", type=int, default=100, help="fewest reports a released batch holds (default 100)")
    p.add_argument(
        "--central-epsilon",
        type=float,
        default=None,
        metavar="E",
        help="--role: add discrete Laplace noise (ε-DP per report, add/remove) to each share this aggregator releases",
    )
    p.add_argument(
        "--token-file",
        type=Path,
        default=None,
        help="a file holding the bearer token the leader, the helper and the collector share",
    )
    p.add_argument("--init", type=Path, default=None, metavar="DIR", help="write a new deployment into DIR and exit")
    p.add_argument("--collect", default=None, metavar="METRIC", help="the combine step: collect and unshard METRIC")
    p.add_argument("--day", type=int, default=None, help="--collect: the UTC day number (default today)")
    p.add_argument("--leader-url", default=None, help="--collect: the leader's base URL")
    p.add_argument("--json", action="store_true", help="print JSON (start-up line, deployment, or result)")
    p.set_defaults(func=run)


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file is None:
        return None
    token = args.token_file.read_text().strip()
    if not token:
        raise ValueError(f"--token-file {args.token_file} is empty")
    return token


def _init(args: argparse.Namespace) -> int:
    from simulator.prio3.stack import new_deployment

    dep = new_deployment(args.init)
    doc = {k: str(v) for k, v in vars(dep).items()}
    print(json.dumps(doc) if args.json else "\n".join(f"{k}: {v}" for k, v in doc.items()))
    return 0


def _collect(args: argparse.Namespace) -> int:
    import time

    from collector.aggregator.collect import collect
    from ldp_core.days import utc_day
    from ldp_core.metrics import load_metrics

    if args.metrics is None or args.leader_url is None or args.helper_url is None:
        raise ValueError("--collect needs --metrics, --leader-url and --helper-url")
    metrics = load_metrics(args.metrics, reject_expired=False)
    if args.collect not in metrics.prio3:
        raise ValueError(f"{args.collect!r} is not a prio3 metric of {args.metrics}")
    day = utc_day(time.time()) if args.day is None else args.day
    result = collect(metrics, args.collect, day, args.leader_url, args.helper_url, token=_token(args))
    print(
        json.dumps(result.to_json())
        if args.json
        else f"{result.metric} day {result.day}: {result.value} ({result.reports} reports"
        + (f"; noised by the aggregators, sd {result.noise['std']:.1f})" if result.noise else ")")
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    import socket

    import uvicorn

    from collector.aggregator.app import create_app, http_helper
    from collector.aggregator.feed import LeaderFeed
    from collector.aggregator.service import Aggregator
    from ldp_core.metrics import load_metrics
    from ldp_core.wire.sealing import load_key_file
    from pipeline.topics import RAW_TOPIC
    from pipeline.transport import open_transport
    from simulator.prio3.stack import read_verify_key

    if args.metrics is None or args.key is None or args.verify_key is None:
        raise ValueError("--role needs --metrics, --key and --verify-key (see --init)")
    if args.role == "leader" and not args.helper_url:
        raise ValueError("--role leader needs --helper-url")
    if not 0 <= args.port <= 65535 or args.min_batch < 1:
        raise ValueError("--port must be from 0 to 65535 and --min-batch positive")
    token = _token(args)
    metrics = load_metrics(args.metrics, reject_expired=False)
    helper = http_helper(args.helper_url, token=token) if args.role == "leader" else None
    agg = Aggregator(
        args.role,
        metrics,
        load_key_file(args.key),
        read_verify_key(args.verify_key),
        args.state / args.role,
        min_batch=args.min_batch,
        helper=helper,
        central_epsilon=args.central_epsilon,
    )
    feed = None
    if args.role == "leader":
        feed = LeaderFeed(agg, open_transport(args.transport), args.raw_topic or RAW_TOPIC).start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    url = f"http://{args.host}:{sock.getsockname()[1]}"
    info = {
        "role": args.role,
        "url": url,
        "key_id": agg.key.key_id,
        "metrics": sorted(agg.specs),
        "pid": os.getpid(),
        "central_epsilon": args.central_epsilon,
    }
    print(json.dumps(info) if args.json else f"ldp aggregator ({args.role}) listening on {url}", flush=True)
    server = uvicorn.Server(
        uvicorn.Config(create_app(agg, token=token), log_level="warning", access_log=False, log_config=None)
    )
    try:
        server.run(sockets=[sock])
    finally:
        if feed is not None:
            feed.stop()
        agg.close()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        if args.init is not None:
            return _init(args)
        if args.collect is not None:
            return _collect(args)
        if args.role is None:
            raise ValueError("say --role leader or --role helper (or --init DIR, or --collect METRIC)")
        return _serve(args)
    except (ValueError, OSError) as exc:
        print(f"ldp aggregator: error: {exc}", file=sys.stderr)
        return 2
