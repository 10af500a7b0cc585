"""``ldp pate``'s other modes: ``--federated http`` (a PATE task over the FL pipeline, simulator/pate_fl.py)
and ``--sweep`` (accuracy–ε curves of GNMax and Confident-GNMax, estimator/pate/sweep.py). Parsing and
printing only; the command itself is :mod:`ldp_cli.commands.pate`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.progress import lines

__all__ = ["add_extra_flags", "run_extra"]


def add_extra_flags(p: argparse.ArgumentParser) -> None:
    h = p.add_argument_group("--federated http (a PATE task over the collector and the aggregation job)")
    h.add_argument("--queries", type=_positive_int, default=200, help="public queries the teachers label (default 200)")
    h.add_argument("--sigma", type=_positive, default=None, help="GNMax σ (σ₂ with --threshold; default teachers/6)")
    h.add_argument("--threshold", type=_positive, default=None, help="Confident-GNMax's threshold T (needs --sigma1)")
    h.add_argument("--sigma1", type=_positive, default=None, help="Confident-GNMax's check noise σ₁")
    h.add_argument(
        "--distributed-noise",
        action="store_true",
        help="GNMax's noise added by the teachers inside SecAgg (the server unmasks only noised histograms)",
    )
    h.add_argument("--timeout", type=_positive, default=300.0, help="give up after this many seconds (default 300)")


def _pate_config(args: argparse.Namespace, teachers: int) -> dict[str, Any]:
    sigma = args.sigma if args.sigma is not None else max(teachers / 6.0, 1.0)
    if (args.threshold is None) != (args.sigma1 is None):
        raise ValueError("--threshold and --sigma1 go together (Confident-GNMax)")
    out: dict[str, Any] = {"aggregator": "gnmax", "sigma": sigma}
    if args.threshold is not None:
        out.update(aggregator="confident_gnmax", threshold=args.threshold, sigma1=args.sigma1)
    if args.distributed_noise:
        out["noise"] = "distributed"
    return out


def _run_http(args: argparse.Namespace) -> int:
    from ldp_core.fl.errors import FLError
    from simulator.pate_fl import pate_http_study

    if args.budget_session or args.data != "digits" or args.setting:
        raise ValueError("--federated http runs on digits alone, without --setting or --budget-session")
    teachers = 25 if args.teachers is None else args.teachers
    try:
        result = pate_http_study(
            args.seed,
            teachers,
            args.queries,
            _pate_config(args, teachers),
            args.delta,
            args.timeout,
            progress=lines(args, "pate"),
        )
    except FLError as exc:
        raise SystemExit(f"ldp pate: {exc}") from None
    if args.json:
        print(json.dumps(result))
        return 0
    dd = result["epsilon_data_dependent_published"]
    print(
        f"PATE over HTTP: {result['teachers']} teacher devices, {result['survivors']} votes summed by SecAgg in the "
        f"job; {result['answered']} of {result['queries']} queries answered ({result['aggregator']}), labels "
        f"{result['label_accuracy']:.3f} correct; student {result['student_accuracy']:.3f}; ε {result['epsilon']:.2f}"
        + ("" if dd is None else f" (data-dependent, published: {dd:.2f})")
        + f" at δ = {result['delta']:g}; {result['seconds']:.1f} s"
    )
    if result["equal_to_in_process"] is not None:
        print(f"labels equal to the same release in one process: {result['equal_to_in_process']}")
    print(f"protects: {result['protects']}")
    return 0


def run_extra(args: argparse.Namespace) -> int | None:
    """Run ``--federated http`` or ``--sweep`` and return the exit status, or None for the ordinary study."""
    if args.federated == "http":
        return _run_http(args)
    return None
