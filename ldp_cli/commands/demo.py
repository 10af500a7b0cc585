"""``ldp demo``: the main job, the whole pipeline on one machine.

By default it runs the real pipeline with no broker: the FastAPI collector
on 127.0.0.1 (uvicorn), the shuffler, the streaming estimator (with its HTTP
API) and the Parquet sink, all on the embedded log, fed by a seeded
population of simulated devices that privatize their values with the SDK's
encoders and upload wire-format frames over HTTP (plus a few real
:class:`~client_sdk.client.TelemetryClient` devices going through ledger,
outbox and uploader). It prints, per metric, the estimates with their 95%
confidence intervals against the truth and the central ε the shuffle gives,
checks that every uploaded report was counted once and that the streaming
estimates equal the batch job's over the Parquet dataset, and writes a plot.
``--kafka HOST:PORT`` runs the same on a Kafka broker. ``--sealed`` seals every
metric's reports to an analyzer key; ``--tokens`` runs the token issuer beside a
collector that requires anonymous upload tokens: every device enrolls, fetches its
tokens and pays each upload with one, and one install floods a metric far beyond
its allowance (docs/TOKENS.md).

``--prio3`` runs the Prio3 metrics through two aggregators instead (docs/PRIO3.md).
``--offline`` runs the earlier in-memory simulation instead: one seeded Zipf
population through every frequency oracle (real encoders and estimators),
each oracle's accuracy against its theoretical variance, and a plot.

This module parses the options and hands them to :mod:`simulator.demo`, which runs the demo.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ldp_cli.commands.demo_prio3 import add_prio3_flags, refuse_prio3_flags, run_prio3
from ldp_cli.options import summary
from ldp_cli.progress import add_progress_flags, lines, progress_enabled
from simulator.demo.offline import DEFAULT_MECHANISMS
from simulator.demo.pipeline import DemoConfig, KeepRunning, serve_until_stopped
from simulator.population import parse_distribution

__all__ = ["register", "run", "run_offline", "run_pipeline"]

DEFAULT_METRICS = Path(__file__).resolve().parents[2] / "metrics" / "example.json"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole pipeline on simulated devices and compare the estimates with the "
        "truth (--offline: every oracle in memory)",
        description=summary(__doc__),
    )
    p.add_argument("--devices", type=int, default=None, help="simulated devices (default 20,000; 500 with --tokens)")
    p.add_argument(
        "--sdk-devices",
        type=int,
        default=4,
        help="of which this many run the real TelemetryClient end to end (default 4)",
    )
    p.add_argument("--metrics", type=Path, default=DEFAULT_METRICS, help="metrics file (default metrics/example.json)")
    p.add_argument(
        "--transport",
        "--kafka",
        dest="kafka",
        type=kafka_broker,
        default=None,
        metavar="kafka://HOST:PORT",
        help="run on this Kafka broker instead of the embedded log (topics and groups get a per-run suffix); "
        "--kafka HOST:PORT is the older spelling",
    )
    p.add_argument(
        "--min-batch", type=int, default=None, help="the shuffler's crowd threshold (default 1000; 250 with --tokens)"
    )
    p.add_argument(
        "--frame-reports",
        type=int,
        default=1000,
        help="reports per uploaded frame (default 1000; below --min-batch some may stay in the shuffler)",
    )
    p.add_argument(
        "--sealed",
        action="store_true",
        help="seal every metric's reports to a fresh analyzer key (docs/SEALED.md): the collector and the "
        "shuffler carry ciphertexts, the estimator and the sink open them",
    )
    p.add_argument(
        "--tokens",
        action="store_true",
        help="run the token issuer and a collector that requires tokens (docs/TOKENS.md): each device fetches "
        "its tokens and pays every upload with one (one upload per device and metric); one install floods a "
        "metric with crafted reports beyond its allowance",
    )
    p.add_argument(
        "--tokens-per-day",
        type=int,
        default=None,
        metavar="K",
        help="--tokens: the issuer's K tokens per device per UTC day (default: one per metric)",
    )
    p.add_argument(
        "--flood",
        type=int,
        default=300,
        metavar="N",
        help="--tokens: the flooding install's uploads (default 300; 0 for none)",
    )
    p.add_argument("--clients", type=int, default=4, help="concurrent HTTP upload clients (default 4)")
    p.add_argument("--top", type=int, default=8, help="rows printed per metric (default 8)")
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the run's log, state, dataset, keys and device stores in this folder (default: a temporary "
        "folder, removed when the demo ends)",
    )
    p.add_argument("--offline", action="store_true", help="the in-memory simulation of every oracle instead")
    p.add_argument("--mechanisms", default=",".join(DEFAULT_MECHANISMS), help="--offline: comma-separated list")
    p.add_argument("--epsilon", type=float, default=2.0, help="--offline: local ε of every oracle (default 2)")
    p.add_argument("--domain", type=int, default=128, help="--offline: domain size")
    p.add_argument("--users", type=int, default=200_000, help="--offline: simulated users")
    p.add_argument("--distribution", default="zipf:1.1", help="zipf:S or uniform (both modes)")
    p.add_argument("--seed", type=int, default=20261130)
    p.add_argument(
        "--out",
        type=Path,
        default=Path("out"),
        metavar="DIR",
        help="folder (not a file) for demo.png and demo.json (default out)",
    )
    p.add_argument("--no-plot", action="store_true")
    add_prio3_flags(p)  # --prio3 and its options (docs/PRIO3.md)
    add_progress_flags(p)  # a line per phase and the enrollment bar on stderr (a terminal only, unless --progress)
    p.add_argument(
        "--serve",
        action="store_true",
        help="after the run keep the pipeline and the dashboard running until interrupted (Ctrl-C or SIGTERM)",
    )
    p.add_argument(
        "--port",
        type=int,
        default=0,
        help="the estimator's port (its API and the dashboard at /; default: a free one)",
    )
    p.set_defaults(func=run)


def kafka_broker(text: str) -> str:
    """``--transport kafka://HOST:PORT`` or the older ``--kafka HOST:PORT``: the broker's ``HOST:PORT``."""
    broker = text[len("kafka://") :] if text.startswith("kafka://") else text
    if "://" in broker or not broker.rpartition(":")[2].isdigit():
        raise argparse.ArgumentTypeError(
            f"expected kafka://HOST:PORT (the demo runs on the embedded log unless given a broker), got {text!r}"
        )
    return broker


def run(args: argparse.Namespace) -> int:
    if args.prio3:
        return run_prio3(args)
    refuse_prio3_flags(args)
    if args.offline:
        if args.serve:
            raise ValueError("--serve keeps the pipeline's dashboard running; --offline runs no pipeline")
        return run_offline(args)
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be from 0 to 65535, got {args.port}")
    with _terminate_unwinds():
        if not args.serve:
            return run_pipeline(args)
        kept = KeepRunning()
        try:
            code = run_pipeline(args, kept)
            if kept.pipe is not None:
                serve_until_stopped(kept.pipe)
        finally:
            if kept.pipe is not None:
                kept.stop()  # and the temporary work folder goes
                print("stopped.", flush=True)
        return code


@contextlib.contextmanager
def _terminate_unwinds() -> Iterator[None]:
    """While the demo runs, SIGTERM unwinds like Ctrl-C (exit 143): the pipeline is stopped and the temporary
    work folder, with its device credentials and keys, removed, instead of the process dying mid-run."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_pipeline(args: argparse.Namespace, keep: KeepRunning | None = None) -> int:
    """The pipeline run (:func:`simulator.demo.pipeline.run_pipeline`) with the options checked first;
    with ``keep`` the pipeline stays up afterwards (``--serve``)."""
    import logging

    from ldp_cli.options import setup_logging
    from simulator.demo.pipeline import run_pipeline as run_demo

    if args.devices is None:
        args.devices = 500 if args.tokens else 20_000
    if args.min_batch is None:
        args.min_batch = 250 if args.tokens else 1000
    if args.devices < 1 or args.sdk_devices < 0 or args.frame_reports < 1 or args.min_batch < 1:
        raise ValueError("--devices, --frame-reports and --min-batch must be positive, --sdk-devices >= 0")
    if not args.tokens and (args.tokens_per_day is not None or args.flood != 300):
        raise ValueError("--tokens-per-day and --flood go with --tokens")
    if args.flood < 0:
        raise ValueError("--flood must be >= 0")
    parse_distribution(args.distribution, 2)
    setup_logging(logging.WARNING, "%(name)s %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.ERROR)  # metadata warnings while topics are created
    cfg = DemoConfig(
        devices=args.devices,
        metrics=args.metrics,
        sdk_devices=args.sdk_devices,
        kafka=args.kafka,
        min_batch=args.min_batch,
        frame_reports=args.frame_reports,
        sealed=args.sealed,
        tokens=args.tokens,
        tokens_per_day=args.tokens_per_day,
        flood=args.flood,
        clients=args.clients,
        top=args.top,
        workdir=args.workdir,
        distribution=args.distribution,
        seed=args.seed,
        out=args.out,
        plot=not args.no_plot,
        port=args.port,
        serve=args.serve,
        progress=progress_enabled(args),
        on_phase=lines(args, "ldp demo"),
    )
    return run_demo(cfg, keep)


def run_offline(args: argparse.Namespace) -> int:
    """``--offline``: :func:`simulator.demo.offline.run_offline` over the comma-separated ``--mechanisms``."""
    from simulator.demo.offline import run_offline as run_oracles

    names = [m.strip() for m in args.mechanisms.split(",") if m.strip()]
    population = (args.epsilon, args.domain, args.users, args.distribution, args.seed, args.out)
    return run_oracles(names, *population, not args.no_plot, progress_enabled(args))
