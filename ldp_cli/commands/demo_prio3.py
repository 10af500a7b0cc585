"""``ldp demo --prio3``: the demo's Prio3 metrics through the collector and both aggregators (docs/PRIO3.md).

The options it adds to ``ldp demo`` and the text it prints; the run is :mod:`simulator.prio3.demo`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ldp_cli.progress import lines

__all__ = ["add_prio3_flags", "refuse_prio3_flags", "run_prio3"]


def add_prio3_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prio3",
        action="store_true",
        help="the Prio3 metrics through the collector, the leader and the helper aggregators (HTTP on 127.0.0.1), "
        "each exact aggregate beside the truth (exit 1 unless equal) and beside local DP on the same data",
    )
    p.add_argument(
        "--central-epsilon",
        type=float,
        default=None,
        metavar="E",
        help="--prio3: each aggregator adds discrete Laplace noise at this ε (add/remove one device) to its share",
    )
    p.add_argument("--ldp-epsilon", type=float, default=1.0, help="--prio3: local ε of the LDP side (default 1)")
    p.add_argument(
        "--prio3-ports",
        default="0,0,0",
        metavar="C,H,L",
        help="--prio3: ports of the collector, the helper and the leader (default 0,0,0: free ones)",
    )
    p.add_argument("--json", action="store_true", help="--prio3: print the result document as JSON")


def refuse_prio3_flags(args: argparse.Namespace) -> None:
    """A --prio3 option given without --prio3 is a usage error, not silently ignored."""
    given = [
        flag
        for flag, on in (
            ("--json", args.json),
            ("--central-epsilon", args.central_epsilon is not None),
            ("--ldp-epsilon", args.ldp_epsilon != 1.0),
            ("--prio3-ports", args.prio3_ports != "0,0,0"),
        )
        if on
    ]
    if given:
        raise ValueError(f"{', '.join(given)} go(es) with --prio3 (the pipeline demo writes its results to --out)")


def _ports(text: str) -> tuple[int, int, int]:
    try:
        c, h, lead = (int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--prio3-ports takes three ports C,H,L, got {text!r}") from None
    if not all(0 <= x <= 65535 for x in (c, h, lead)):
        raise ValueError(f"--prio3-ports: ports are from 0 to 65535, got {text!r}")
    return c, h, lead


def _fmt(v: Any) -> str:
    if isinstance(v, list):
        return "[" + " ".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v) + "]"
    return f"{v:g}" if isinstance(v, float) else str(v)


def print_text(doc: dict[str, Any]) -> None:
    print(f"Prio3: {doc['devices']} devices, {doc['replayed_reports']} reports replayed (dropped by the leader)")
    for r in doc["metrics"]:
        mark = "==" if r["equal"] else "!= (WRONG)"
        print(f"\n{r['metric']} ({r['type']}, {r['reports']} reports)")
        print(f"  truth            {_fmt(r['truth'])}")
        print(f"  prio3 (exact)    {_fmt(r['prio3'])}   {mark} truth")
        if "central" in r:
            c = r["central"]
            print(
                f"  prio3 + central  {_fmt(c['value'])}   (discrete Laplace by both aggregators, ε={c['epsilon']:g}, sd {c['std']:.1f})"
            )
        ldp = r["ldp"]
        print(
            f"  local DP         {_fmt(ldp['estimate'])}   ({ldp['mechanism']}, ε={ldp['epsilon']:g}, sd {_fmt(ldp['std'])})"
        )
        print(
            f"  bytes/report     prio3 {r['bytes_per_report']}, ldp {ldp['bytes_per_report']};  device CPU/report "
            f"prio3 {r['device_cpu_us']:.0f} µs, ldp {ldp['device_cpu_us']:.1f} µs"
        )
    lead, helper = doc["leader"]["cpu_per_report_us"], doc["helper"]["cpu_per_report_us"]
    ldp_srv = sum(r["ldp"]["server_cpu_us"] for r in doc["metrics"]) / len(doc["metrics"])
    print(
        f"\nserver CPU per report: leader {lead:.0f} µs, helper {helper:.0f} µs (Prio3); "
        f"estimator {ldp_srv:.1f} µs (local DP, mean over the metrics)"
    )
    print("all Prio3 aggregates equal the truth" if doc["all_equal"] else "A PRIO3 AGGREGATE DIFFERS FROM THE TRUTH")


def run_prio3(args: argparse.Namespace) -> int:
    from simulator.prio3.demo import Prio3DemoConfig, run_prio3_demo

    if args.central_epsilon is not None and not args.central_epsilon > 0:
        raise ValueError("--central-epsilon must be > 0")
    cfg = Prio3DemoConfig(
        devices=1000 if args.devices is None else args.devices,
        sdk_devices=args.sdk_devices,
        seed=args.seed,
        frame_reports=min(args.frame_reports, 1000),
        ldp_epsilon=args.ldp_epsilon,
        central_epsilon=args.central_epsilon,
        ports=_ports(args.prio3_ports),
        workdir=args.workdir,
        out=args.out,
        plot=not args.no_plot,
        on_phase=lines(args, "ldp demo --prio3"),
    )
    code, doc = run_prio3_demo(cfg)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print_text(doc)
        print(f"\nwrote {args.out / 'prio3.json'}" + ("" if args.no_plot else f" and {args.out / 'prio3.png'}"))
    return code
