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

    s = p.add_argument_group("--sweep (accuracy–ε curves of GNMax and Confident-GNMax at matched accuracy)")
    s.add_argument(
        "--sweep",
        nargs="?",
        const="full",
        default=None,
        choices=["full", "small"],
        help="sweep GNMax σ × queries and Confident-GNMax (T, σ₁, σ₂) on a generated consensus task with an MLP "
        "student; compare the data-dependent ε at matched student accuracy (full: 200 teachers, the docs' "
        "figures, minutes; small: 40 teachers, the CI's)",
    )


def _run_sweep(args: argparse.Namespace) -> int:
    from estimator.pate.sweep import plot_sweep, run_sweep

    if args.budget_session or args.federated or args.setting:
        raise ValueError("--sweep runs alone: not with --federated, --setting or --budget-session")
    result = run_sweep(args.seed, args.sweep, args.delta, progress=lines(args, "pate"))
    if args.plot:
        plot_sweep(result, args.plot)
        result["plot"] = args.plot
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"sweep: {result['teachers']} teachers, {result['public_examples']} public inputs, vote accuracy "
        f"{result['vote_accuracy']:.3f}, {result['student']} (on every public input with true labels: "
        f"{result['all_public_student_accuracy']:.3f}); δ = {result['delta']:g}"
    )
    print(
        f"{'aggregator':10s} {'σ':>5s} {'T':>5s} {'σ1':>5s} {'asked':>5s} {'answered':>8s} {'student':>7s} {'ε':>7s} {'ε dd':>7s}"
    )
    for r in result["rows"]:
        acc = "-" if r["student_accuracy"] is None else f"{r['student_accuracy']:.3f}"
        print(
            f"{r['aggregator']:10s} {r['sigma']:5g} {r.get('threshold', '-'):>5} {r.get('sigma1', '-'):>5} "
            f"{r['queries']:5d} {r['answered']:8d} {acc:>7s} {r['epsilon']:7.2f} {r['epsilon_data_dependent']:7.2f}"
        )
    for c in result["matched_accuracy"]:
        print(
            f"student {c['student_accuracy']:.3f}: data-dependent ε GNMax {c['epsilon_gnmax']:.2f}, "
            f"Confident-GNMax {c['epsilon_confident']:.2f} ({100 * (c['reduction'] or 0):+.0f} % less)"
        )
    print(f"Confident-GNMax cheaper at every matched accuracy: {result['holds']}")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


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
    if args.sweep is not None:
        return _run_sweep(args)
    if args.federated == "http":
        return _run_http(args)
    return None
