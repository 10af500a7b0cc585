"""``ldp fl device``: N devices of a task, from one data file, against the collector over HTTP.

The device side of the quickstart (docs/fl/README.md): the fleet logic is in :mod:`simulator.fl_fleet`; this
module holds the options and the wiring.
"""

from __future__ import annotations

import argparse
import json

from ldp_cli.commands.argtypes import positive, positive_int, seed
from ldp_cli.progress import add_progress_flags, lines

__all__ = ["register_device", "run_device_cmd"]


def register_device(fsub: argparse._SubParsersAction) -> None:
    d = fsub.add_parser(
        "device",
        help="run N devices of a task from one data file against the collector (over HTTP)",
        description="Runs the first N client ids of the task file as devices in this process (simulator/fl_fleet.py): "
        "each holds its share of the data file, is enrolled with the authority's key (or a bundle from ldp fl "
        "enroll), and takes part in rounds through the collector's FL routes until the job ends the task. Prints "
        "a summary (--json: one object).",
    )
    d.add_argument("--task", required=True, help="the task file the job runs (its name, clients and model)")
    d.add_argument(
        "--collector",
        default="http://127.0.0.1:8080",
        help="the collector's URL (https, or http on loopback; default http://127.0.0.1:8080)",
    )
    d.add_argument("--devices", type=positive_int, default=None, help="how many devices (default: every client)")
    who = d.add_mutually_exclusive_group(required=True)
    who.add_argument("--authority", help="the authority key file: mint each device's credential in memory")
    who.add_argument("--identities", metavar="DIR", help="a folder of device bundles from ldp fl enroll --out")
    d.add_argument(
        "--data",
        default=None,
        help="an .npz with x, y and optionally client (the device index of each row); with --make-data, written here",
    )
    d.add_argument(
        "--make-data",
        action="store_true",
        help="make seeded synthetic data that fits the task's model (a linear rule per class, shifted per device)",
    )
    d.add_argument("--rows", type=positive_int, default=60, help="with --make-data: rows per device (default 60)")
    d.add_argument("--seed", type=seed, default=0, help="with --make-data: the data's seed (default 0)")
    d.add_argument(
        "--queries",
        default=None,
        metavar="FILE",
        help="a PATE task's public queries (.npy, or .npz with the array x): the devices are teachers that upload "
        "only their masked votes on these (their SHA-256 must be the signed task's pate.queries_sha256)",
    )
    d.add_argument("--timeout", type=positive, default=300.0, help="give up after this many seconds (default 300)")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    add_progress_flags(d)
    d.set_defaults(func=run_device_cmd)


def run_device_cmd(args: argparse.Namespace) -> int:
    import time

    import numpy as np

    from client_sdk.fl.device import FLDevice
    from client_sdk.urls import ClientConfigError
    from estimator.fl.task import FLTaskSpec
    from ldp_core.fl.errors import FLError
    from simulator import fl_fleet

    try:
        spec = FLTaskSpec.from_file(args.task)
        n = len(spec.clients) if args.devices is None else args.devices
        if n > len(spec.clients):
            raise FLError(f"--devices {n}: the task has only {len(spec.clients)} clients")
        ids = list(spec.clients[:n])
        if args.make_data:
            data = fl_fleet.make_task_data(spec.model, n, args.rows, np.random.default_rng(args.seed))
            if args.data:
                fl_fleet.save_data(args.data, data)
        elif args.data:
            data = fl_fleet.load_data(args.data)
        else:
            raise FLError("give --data FILE.npz, or --make-data to make one")
        parts = fl_fleet.split_data(data, n)
        if args.authority:
            idents = fl_fleet.mint_identities(args.authority, ids)
        else:
            idents = fl_fleet.load_identities(args.identities, ids)
        queries = None if args.queries is None else fl_fleet.load_queries(args.queries)
        devices = [
            FLDevice(args.collector, spec.task, c, X, y, identity=ident, pate_queries=queries)
            for c, (X, y), ident in zip(ids, parts, idents)
        ]
    except (FLError, ClientConfigError) as exc:
        raise SystemExit(f"ldp fl device: {exc}") from None
    show = lines(args, "ldp fl device")
    show(f"{n} devices of task {spec.task} against {args.collector}")
    fleet = fl_fleet.Fleet(devices)
    start = time.monotonic()
    finished = fleet.run(
        args.timeout,
        on_round=lambda r, k, _t: show(f"round {r + 1}/{spec.rounds}: {k} of {n} devices uploaded"),
    )
    report = fleet.report(parts, finished, time.monotonic() - start)
    if queries is not None:  # PATE teachers: no model is released (the labels are in the job's status)
        report["train_accuracy"] = None
    for d in devices:
        d.close()
    if args.json:
        print(json.dumps(report))
    else:
        acc = report["train_accuracy"]
        print(
            f"ldp fl device: task {spec.task} {'done' if finished else 'NOT done (timed out)'}: {n} devices, "
            f"{report['uploads']} uploads, {report['seconds']:.1f} s"
            + ("" if acc is None else f"; the released model's accuracy on the devices' data {acc:.3f}")
        )
    return 0 if finished else 1
