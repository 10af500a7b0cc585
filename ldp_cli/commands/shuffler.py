"""``ldp shuffler``: run the shuffler as a long-lived worker (see :mod:`collector.shuffler`).

The central (ε, δ) of each released batch comes from
:func:`estimator.accounting.shuffle.shuffler_guarantee`, wired in here
because the collector package must not import the estimator.

It starts whether or not the broker answers: the join is retried with
backoff (one log line when the broker is unreachable, one when connected;
see :mod:`pipeline.processor`), and ``ldp shuffler: running`` is printed
once it is connected. ``--status-file`` keeps a JSON file of its state and
counters for a healthcheck (:mod:`pipeline.status`). SIGTERM or Ctrl-C stops
it after a final checkpoint; the counters are printed as one JSON line on exit.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
from typing import Any

from ldp_cli.options import (
    add_group,
    add_idle_exit,
    add_log_level,
    add_member,
    add_metrics,
    add_session_timeout,
    add_status_file,
    add_transport,
    metrics_file,
    setup_logging,
    stop_event,
)

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    from collector.shuffler import ShufflerSettings  # light: numba loads only when a permutation is drawn

    d = ShufflerSettings()
    p = sub.add_parser(
        "shuffler",
        help="run the shuffler: batch, permute and release crowds of reports",
        description="Consume raw uploads, permute them per metric, spec and day with a CSPRNG, and "
        "release batches of at least --min-batch reports, exactly once.",
    )
    add_transport(p)
    add_metrics(p, "the metrics file (default $LDP_METRICS)")
    p.add_argument("--min-batch", type=int, default=d.min_batch, help=f"crowd threshold (default {d.min_batch})")
    p.add_argument(
        "--max-batch", type=int, default=d.max_batch, help=f"most reports per released batch (default {d.max_batch})"
    )
    p.add_argument(
        "--checkpoint-interval",
        type=float,
        default=d.checkpoint_interval,
        help=f"seconds between transactions (default {d.checkpoint_interval:g})",
    )
    add_group(p, d.group)
    add_member(
        p,
        None,
        "stable member name of this worker, also its Kafka group.instance.id (static membership) and transactional "
        "id: a restarted worker that keeps it gets its partitions back at once (default $LDP_SHUFFLER_MEMBER, else "
        "shuffler-HOST-PID: unique, but new at every start)",
    )
    p.add_argument("--partitions", type=int, default=d.partitions, help="partitions of topics it creates")
    p.add_argument("--dedup-window", type=int, default=d.dedup_window, help="upload batch ids remembered per partition")
    p.add_argument(
        "--max-day-age",
        type=int,
        default=None,
        help=f"the day window shared with the collector: a buffered group of day d is dropped (counted in "
        f"expired_groups, logged) once d < today - MAX_DAY_AGE - grace, today being the UTC day of this "
        f"machine's clock (default $LDP_SHUFFLER_MAX_DAY_AGE, else $LDP_MAX_DAY_AGE, else {d.max_day_age}: "
        f"the collector accepts [today - {d.max_day_age}, today + {d.max_days_ahead}])",
    )
    p.add_argument(
        "--max-days-ahead",
        type=int,
        default=None,
        help=f"the collector's newest accepted day, today + N (default $LDP_MAX_DAYS_AHEAD, else "
        f"{d.max_days_ahead}); later days are kept buffered, never dropped",
    )
    p.add_argument(
        "--expiry-grace-days",
        type=int,
        default=None,
        help=f"days a group is kept after the collector stopped accepting its day, for batches accepted just "
        f"before UTC midnight or read late (default {d.expiry_grace_days})",
    )
    p.add_argument(
        "--key-file",
        default=None,
        help=f"the shuffler's secret (seals checkpoints, keys the batch-id digests); created 0600 if missing; "
        f"every member of the group needs the same file (default $LDP_SHUFFLER_KEY_FILE, else {d.key_file})",
    )
    add_session_timeout(p, d.session_timeout)
    p.add_argument(
        "--shuffled-key",
        choices=("batch", "metric-day"),
        default=None,
        help="how released batches are keyed: batch spreads a plain metric-day over the shuffled topic's "
        "partitions, hence over the sink's and estimator's members (a sealed release is split by its records' "
        "encapsulated keys, so a replay meets its original's replay guard); "
        f"metric-day keeps one partition per metric-day (default $LDP_SHUFFLER_SHUFFLED_KEY, else {d.shuffled_key})",
    )
    p.add_argument(
        "--shuffled-spread",
        type=int,
        default=None,
        metavar="N",
        help="with --shuffled-key batch: 0 keys every released batch apart (a metric-day reaches every partition); "
        "N cycles a metric-day's batches over N evenly spaced partitions, enough for N members and fewer "
        "partitions per transaction; a sealed metric-day's records are routed over those N sub-keys (0: one per "
        f"partition) (default $LDP_SHUFFLER_SHUFFLED_SPREAD, else {d.shuffled_spread})",
    )
    p.add_argument("--raw-topic", default=d.raw_topic)
    p.add_argument("--shuffled-topic", default=d.shuffled_topic)
    p.add_argument("--state-topic", default=d.state_topic)
    p.add_argument("--delta", type=float, default=1e-6, help="delta of the reported central guarantee (default 1e-6)")
    p.add_argument("--no-guarantee", action="store_true", help="do not compute central guarantees")
    p.add_argument(
        "--device-epsilon-cap",
        action="append",
        metavar="[METRIC=]EPS",
        help="the devices' per-metric daily epsilon cap (the app's LocalPolicy per_metric_daily; METRIC=EPS for"
        " one metric's override; repeatable): the per-person central figure then assumes up to floor(cap/eps0)"
        " reports a device a day, which devices enforce whatever a metrics server says. Without it the figure"
        " assumes the metrics file's max_reports_per_day (docs/PRIVACY.md, section 2)",
    )
    add_idle_exit(p)
    p.add_argument("--stats-interval", type=float, default=60.0, help="log the counters every N seconds")
    add_status_file(p)
    add_log_level(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from collector.errors import ConfigError
    from collector.shuffler import DeviceCaps, Shuffler, ShufflerSettings
    from ldp_core.metrics import load_metrics
    from pipeline.processor import FATAL_ERRORS
    from pipeline.settings import default_member
    from pipeline.status import StatusFile
    from pipeline.transport import open_transport

    setup_logging(args.log_level)
    member_given = args.member is not None or bool(os.environ.get("LDP_SHUFFLER_MEMBER"))
    try:
        metrics_path = metrics_file(args.metrics)
        settings = ShufflerSettings.from_env(
            min_batch=args.min_batch,
            max_batch=args.max_batch,
            checkpoint_interval=args.checkpoint_interval,
            group=args.group,
            member=args.member if member_given else default_member("shuffler"),
            partitions=args.partitions,
            dedup_window=args.dedup_window,
            max_day_age=args.max_day_age,
            max_days_ahead=args.max_days_ahead,
            expiry_grace_days=args.expiry_grace_days,
            key_file=args.key_file,
            session_timeout=args.session_timeout,
            raw_topic=args.raw_topic,
            shuffled_topic=args.shuffled_topic,
            state_topic=args.state_topic,
            shuffled_key=args.shuffled_key,
            shuffled_spread=args.shuffled_spread,
        )
        metrics = load_metrics(metrics_path, reject_expired=False)
        caps = DeviceCaps.parse(args.device_epsilon_cap)
    except ConfigError as exc:
        print(f"ldp shuffler: error: {exc}", file=sys.stderr)
        return 2
    from estimator.accounting.shuffle import shuffler_guarantee

    guarantee = None if args.no_guarantee else shuffler_guarantee(args.delta)
    stop = stop_event()
    transport = open_transport(args.transport)
    shuffler = Shuffler(transport, metrics, settings, guarantee=guarantee, device_caps=caps)
    shuffler.static_member = member_given  # a stable name: Kafka's static membership (group.instance.id)
    if guarantee is not None and caps is None:
        print(
            "ldp shuffler: per-person central figures assume devices send at most the metrics file's"
            " max_reports_per_day; --device-epsilon-cap makes them hold whatever a metrics server tells devices",
            file=sys.stderr,
        )
    code = 0
    try:
        if args.status_file:
            StatusFile(args.status_file, "shuffler", shuffler, lambda: _counters(shuffler)).start(stop)
        if shuffler.connect(stop):
            print(f"ldp shuffler: running as {settings.group}/{settings.member} on {transport.url}", flush=True)
            reporter = threading.Thread(target=_report, args=(shuffler, stop, args.stats_interval), daemon=True)
            reporter.start()
            shuffler.supervise(lambda: shuffler.run(stop, idle_exit=args.idle_exit), stop)
    except FATAL_ERRORS as exc:  # ShufflerStateError (a ProcessorError), fencing, a configuration error
        print(f"ldp shuffler: error: {exc}", file=sys.stderr)
        code = 1
    finally:
        stop.set()
        shuffler.close()
        transport.close()
    print(json.dumps({"shuffler": shuffler.stats.to_dict(), "totals": shuffler.totals()}), flush=True)
    return code


def _counters(shuffler: Any) -> dict[str, Any]:
    """This process's counters and the durable totals of the partitions it owns (see ``Shuffler.totals``)."""
    return {"process": shuffler.stats.to_dict(), "totals": shuffler.totals()}


def _report(shuffler: Any, stop: threading.Event, every: float) -> None:
    log = logging.getLogger("ldp.shuffler")
    while not stop.wait(every):
        log.info("stats %s", json.dumps(_counters(shuffler)))
