"""``ldp privacy central``, ``budget`` and ``ftrl``: the noise of a central release of counts (and the
release), a sequence of releases charged to a privacy filter, and the ε of DP-FTRL; options and output.
The figures come from :mod:`estimator.accounting.queries` and :func:`estimator.fl.ftrl.ftrl_summary`."""

from __future__ import annotations

import argparse

from estimator.accounting.queries import RELEASE_KINDS
from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import probability as _prob
from ldp_cli.commands.budget import add_budget_flags, report_refusal
from ldp_cli.commands.privacy.common import add_common, emit, fmt

__all__ = ["register_central_commands", "run_central", "run_budget", "run_ftrl"]


def register_central_commands(ps: argparse._SubParsersAction) -> None:
    """``central``, ``budget`` and ``ftrl`` under ``ldp privacy``'s sub-parsers ``ps``."""
    _register_central(ps)
    _register_budget(ps)
    _register_ftrl(ps)


def _counts(text: str) -> list[int]:
    """``--counts``: comma-separated integers."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integers, got {text}") from None


def _release(text: str) -> tuple[str, float, int]:
    """``--release KIND:VALUE[xN]``: (kind, value, repetitions)."""
    kind, _, rest = text.partition(":")
    value, _, times = rest.partition("x")
    try:
        v, n = float(value), int(times) if times else 1
    except ValueError:
        v, n = float("nan"), 0
    if kind not in RELEASE_KINDS or not v > 0 or v == float("inf") or n < 1:
        raise argparse.ArgumentTypeError(
            f"must be KIND:VALUE or KIND:VALUExN with KIND one of {', '.join(RELEASE_KINDS)}, VALUE > 0 and N >= 1, "
            f"got {text}"
        )
    return kind, v, n


def _add_neighbors(q: argparse.ArgumentParser) -> None:
    q.add_argument(
        "--neighbors",
        choices=["add_or_remove", "replace"],
        default="add_or_remove",
        help="neighbouring datasets: add/remove one person (default) or replace one person's data",
    )


def _register_central(ps: argparse._SubParsersAction) -> None:
    q = ps.add_parser(
        "central",
        help="noise for a central release of integer counts at a target ε (and the release)",
        description="Calibrate the discrete Laplace (ε-DP) or discrete Gaussian ((ε, δ)-DP) noise of a "
        "central release of integer counts; with --counts, release them with noise drawn from the OS "
        "CSPRNG. The released figures are printed, never the exact counts.",
    )
    q.add_argument("--mechanism", choices=["laplace", "gaussian"], required=True)
    q.add_argument(
        "--target-epsilon", "--epsilon", dest="epsilon", type=_positive, required=True, help="target ε of the release"
    )
    q.add_argument("--delta", type=_prob, default=None, help="target δ (gaussian only; required there)")
    q.add_argument(
        "--sensitivity",
        type=_positive_int,
        default=1,
        help="how much one person moves the counts (L1 for laplace, L2 for gaussian; default 1)",
    )
    _add_neighbors(q)
    q.add_argument("--counts", type=_counts, default=None, help="comma-separated integer counts to release")
    q.add_argument("--json", action="store_true", help="print one JSON object")
    add_budget_flags(q)  # a release (--counts) is debited to the session before the noise is drawn
    q.set_defaults(func=run_central)


def _register_budget(ps: argparse._SubParsersAction) -> None:
    kinds = "; ".join(f"{k}: {v}" for k, v in RELEASE_KINDS.items())
    q = ps.add_parser(
        "budget",
        help="whether a sequence of central releases fits an (ε, δ) budget (privacy filter)",
        description="Charge releases, in order, to a privacy filter with a budget fixed in advance: a "
        "release that would cross it is refused and spends nothing, later ones are still tried. The "
        "whole interaction is then (ε, δ)-DP however adaptively the releases were chosen. Exit 1 if "
        "any release is refused.",
    )
    q.add_argument("--epsilon", type=_positive, required=True, help="ε of the budget")
    q.add_argument(
        "--delta", type=float, default=None, help="δ of the budget (zcdp: required, in (0, 1); basic: default 0)"
    )
    q.add_argument(
        "--filter",
        choices=["zcdp", "basic"],
        default="zcdp",
        help="zcdp (default; Σρ within the budget, tight for many releases) or basic (Σε, Σδ)",
    )
    q.add_argument(
        "--release",
        type=_release,
        action="append",
        required=True,
        metavar="KIND:VALUE[xN]",
        help=f"a release, N times (repeatable, in order); {kinds}",
    )
    q.add_argument(
        "--sensitivity",
        type=_positive_int,
        default=1,
        help="how much one person moves each released vector (default 1)",
    )
    q.add_argument(
        "--per-release-delta",
        type=_prob,
        default=None,
        help="basic filter: δ charged to each gaussian release (its PLD ε at this δ)",
    )
    _add_neighbors(q)
    q.add_argument("--json", action="store_true", help="print one JSON object")
    q.set_defaults(func=run_budget)


def run_central(args: argparse.Namespace) -> int:
    from estimator.accounting.ledger import LedgerRefusal, debit_before_run
    from estimator.accounting.queries import central_release

    if args.mechanism == "gaussian" and args.delta is None:
        raise ValueError("--delta is required for --mechanism gaussian")
    label = f"central {args.mechanism} release of {len(args.counts or [])} counts"
    try:
        obj = central_release(
            args.mechanism,
            args.epsilon,
            args.delta,
            args.sensitivity,
            args.neighbors,
            args.counts,
            before_release=lambda ev: debit_before_run(args.budget_session, args.partner, "central", ev, label),
        )
    except LedgerRefusal as exc:
        return report_refusal(args, exc)
    if args.mechanism == "laplace":
        what = f"discrete Laplace noise of scale {obj['scale']:.6g}"
        bound = f"ε = {fmt(obj['epsilon_achieved'])} (pure)"
    else:
        what = f"discrete Gaussian noise of σ = {obj['sigma']:.6g}"
        bound = f"ε = {fmt(obj['epsilon_achieved'])} at δ = {args.delta:g} (PLD)"
    lines = [
        f"a central release of counts (sensitivity {args.sensitivity}, {args.neighbors} neighbours) within "
        f"ε = {args.epsilon:g}" + ("" if args.delta is None else f", δ = {args.delta:g}") + f": {what}",
        f"  {bound}; noise variance {obj['variance']:.6g} (std {obj['std']:.4g}) per count",
    ]
    if "released" in obj:
        lines.append(f"  released: {', '.join(str(v) for v in obj['released'])}")
    return emit(args, obj, lines)


def run_budget(args: argparse.Namespace) -> int:
    from estimator.accounting.queries import budget_plan

    if args.filter == "zcdp" and args.delta is None:
        raise ValueError("--delta is required for --filter zcdp")
    obj = budget_plan(
        args.epsilon,
        args.delta,
        args.filter,
        args.release,
        args.sensitivity,
        args.neighbors,
        per_release_delta=args.per_release_delta,
    )
    plan, refused = obj["plan"], obj["refused"]
    unit_text = ", ".join(f"{u} {obj['spent'][u]:.6g} of {obj['budget'][u]:.6g}" for u in obj["spent"])
    lines = [
        f"{obj['filter']} with budget ε = {args.epsilon:g}, δ = {obj['guarantee']['delta']:g} ({args.neighbors} "
        f"neighbours): {len(plan) - refused} of {len(plan)} releases admitted; spent {unit_text}"
    ]
    for r in plan:
        costs = ", ".join(f"{u} {c:.6g}" for u, c in r["cost"].items())
        lines.append(f"  {r['release']:<24} {'admitted' if r['admitted'] else 'REFUSED':<9} costs {costs}")
    emit(args, obj, lines)
    return 1 if refused else 0


def _register_ftrl(ps: argparse._SubParsersAction) -> None:
    q = ps.add_parser(
        "ftrl",
        help="ε of T rounds of DP-FTRL (tree-aggregated noise, no sampling assumption)",
        description="Client-level ε of DP-FTRL (Kairouz et al. ICML 2021): each tree of s rounds is a Gaussian "
        "mechanism of sensitivity C·√⌈log2(s+1)⌉ when a client contributes at most once per tree; the trees "
        "compose. epsilon is the exact Gaussian-DP figure, epsilon_rdp dp_accounting's RDP bound for the "
        "same trees (SingleEpochTreeAggregationDpEvent).",
    )
    q.add_argument("--noise-multiplier", type=_positive, required=True, help="per-node noise σ / clip norm C")
    q.add_argument("--rounds", type=_positive_int, required=True, help="rounds T")
    q.add_argument(
        "--restart-every",
        type=_positive_int,
        default=None,
        metavar="R",
        help="start a fresh tree every R rounds (default: one tree for all T rounds)",
    )
    add_common(q, False)
    q.add_argument(
        "--neighbors",
        choices=["add_or_remove", "replace"],
        default="add_or_remove",
        help="neighbouring datasets: add/remove one client (default) or replace one client's data",
    )
    q.set_defaults(func=run_ftrl)


def run_ftrl(args: argparse.Namespace) -> int:
    from estimator.fl.ftrl import ftrl_summary

    obj = ftrl_summary(args.noise_multiplier, args.rounds, args.delta, args.restart_every, args.neighbors)
    lines = [
        f"DP-FTRL, {args.rounds} rounds in {obj['trees']} tree(s), noise multiplier {args.noise_multiplier:g}, "
        f"δ = {args.delta:g}, {args.neighbors} neighbours:",
        f"  ε (exact GDP)    = {fmt(obj['epsilon'])}",
        f"  ε (RDP, looser)  = {fmt(obj['epsilon_rdp'])}",
    ]
    return emit(args, obj, lines)
