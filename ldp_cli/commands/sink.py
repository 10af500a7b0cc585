"""``ldp sink``: the Parquet sink as a long-lived worker (see :mod:`collector.sinks.parquet`).

Consumes the shuffled topic in a consumer group and writes
``DATASET/metric=<m>/day=<N>/part-*.parquet``; files become visible
atomically and offsets are committed only once they are durable. It
starts whether or not the broker answers (the join is retried with backoff,
:mod:`pipeline.processor`); a transport failure drops the buffers and
rejoins after a backoff step; ``--status-file`` keeps a JSON file of its
state and counters (:mod:`pipeline.status`); SIGTERM or Ctrl-C flushes and
exits; the counters are printed as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys

from ldp_cli.options import (
    ShuffledInput,
    add_idle_exit,
    add_log_level,
    add_metrics,
    add_shuffled_consumer,
    add_status_file,
    add_transport,
    consume_forever,
    stop_event,
    summary,
)

__all__ = ["register", "DEFAULT_GROUP"]

#: equals :data:`collector.sinks.parquet.DEFAULT_GROUP` (not imported here: ``ldp --help`` stays light)
DEFAULT_GROUP = "ldp-parquet-sink"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sink",
        help="write the shuffled reports to a Parquet dataset partitioned by metric and day",
        description=summary(__doc__),
    )
    add_transport(p)
    p.add_argument("--dataset", required=True, help="root folder of the Parquet dataset")
    add_metrics(p, "metrics file(s) declaring the specs (repeatable; default $LDP_METRICS; required)", repeatable=True)
    add_shuffled_consumer(
        p, DEFAULT_GROUP, "member name, also its Kafka group.instance.id (static membership; default: random, unique)"
    )
    p.add_argument("--flush-reports", type=int, default=1_000_000, help="flush once this many reports are buffered")
    p.add_argument("--flush-seconds", type=float, default=5.0, help="flush once the oldest buffered batch is this old")
    add_idle_exit(p)
    add_status_file(p)
    add_log_level(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from collector.sinks.parquet import ParquetSink
    from pipeline.processor import FATAL_ERRORS
    from pipeline.status import StatusFile

    inp = ShuffledInput(args)
    transport = inp.transport
    sink = ParquetSink(
        transport,
        args.dataset,
        inp.catalog,
        flush_reports=args.flush_reports,
        flush_seconds=args.flush_seconds,
        **inp.consumer_options(args),
    )
    sink.static_member = args.member is not None  # a stable name: Kafka's static membership
    stop = stop_event()
    print(
        f"ldp sink: writing {sink.root} from {args.topic} as {args.group}/{sink.member} on {transport.url}", flush=True
    )
    code = 0
    try:
        if args.status_file:
            StatusFile(args.status_file, "sink", sink, sink.stats.to_json_obj).start(stop)
        consume_forever(sink, stop, idle_exit=args.idle_exit)
    except FATAL_ERRORS as exc:  # a dataset inconsistency (SinkError) or fencing
        print(f"ldp sink: error: {exc}", file=sys.stderr)
        code = 1
    finally:
        stop.set()
        sink.close()
        transport.close()
    print(json.dumps({"sink": sink.stats.to_json_obj()}), flush=True)
    return code
