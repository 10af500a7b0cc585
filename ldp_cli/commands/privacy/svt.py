"""``ldp privacy svt``: the ε of a sparse-vector selection (and, with ``--scores``, the selection itself)
beside the exponential mechanism's and the naive approach's; the figures come from
:func:`estimator.selection.mechanisms.svt_report`."""

from __future__ import annotations

import argparse

from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.budget import add_budget_flags, charge
from ldp_cli.commands.privacy.common import add_common, emit

__all__ = ["register_svt", "run_svt"]


def _scores(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be comma-separated integer scores, got {text}") from None


def register_svt(ps: argparse._SubParsersAction) -> None:
    q = ps.add_parser(
        "svt",
        help="ε of the sparse vector technique choosing among candidates (and the naive cost beside it)",
        description="The sparse vector technique (Lyu, Su, Li 2017, Alg. 1): threshold noise Lap(Δ/ε₁), query "
        "noise Lap(2cΔ/ε₂) (Lap(cΔ/ε₂) with --monotonic), halting after c above-threshold answers, for ε = ε₁ + ε₂ "
        "whatever the number of candidates. Beside it: the exponential mechanism's ε and the naive cost of "
        "releasing every candidate's score at the same query noise. With --scores, runs it (OS CSPRNG).",
    )
    q.add_argument("--epsilon", type=_positive, required=True, help="ε of the selection (ε₁ + ε₂)")
    q.add_argument(
        "--candidates", type=_positive_int, default=None, help="number of candidates (default: of --scores, else 10)"
    )
    q.add_argument(
        "--max-answers", type=_positive_int, default=1, help="c: halt after this many above-threshold answers"
    )
    q.add_argument("--sensitivity", type=_positive_int, default=1, help="Δ: how much one person moves each score")
    q.add_argument(
        "--monotonic",
        action="store_true",
        help="the scores move together (adding a person raises all or none, e.g. counts of correct rows)",
    )
    q.add_argument("--threshold", type=float, default=0.0, help="T: the threshold the scores are compared with")
    q.add_argument("--scores", type=_scores, default=None, help="integer scores a,b,c,...: run the selection on them")
    q.add_argument("--plot", default=None, help="write ε against the number of candidates (SVT, EM, naive) to this PNG")
    add_common(q, False)
    add_budget_flags(q)  # a run (--scores) is debited as kind "selection" before the noise is drawn
    q.set_defaults(func=run_svt)


def run_svt(args: argparse.Namespace) -> int:
    from estimator.accounting.central import SparseVector
    from estimator.selection.mechanisms import SelectionError, plot_selection_costs, svt_report, svt_select

    k = args.candidates or (len(args.scores) if args.scores else 10)
    if args.scores is not None and len(args.scores) != k:
        raise SelectionError(f"--candidates {k} but --scores has {len(args.scores)} values")
    obj = svt_report(args.epsilon, k, args.delta, args.max_answers, args.sensitivity, args.monotonic, args.threshold)
    n = obj["naive"]
    lines = [
        f"sparse vector technique over {k} candidates, c = {args.max_answers}, Δ = {args.sensitivity}"
        + (" (monotone scores)" if args.monotonic else "")
        + ":",
        f"  ε = {obj['epsilon']:g} = ε₁ {obj['epsilon_threshold']:.4f} (threshold noise {obj['threshold_noise']}, "
        f"scale {obj['threshold_scale']:.4f}) + ε₂ {obj['epsilon_queries']:.4f} (query noise {obj['query_noise']}, "
        f"scale {obj['query_scale']:.4f})",
        f"  exponential mechanism over the same candidates: ε = {obj['epsilon_exponential_mechanism']:g}",
        f"  naive (every score released at the query noise): ε = {n['epsilon_basic']:.4f} basic, "
        f"{n['epsilon_pld']:.4f} PLD at δ = {args.delta:g}",
    ]
    if args.scores is not None:
        svt = SparseVector(args.epsilon, args.threshold, args.max_answers, args.sensitivity, args.monotonic)
        refused = charge(args, "selection", svt.event, f"sparse vector over {k} candidates")
        if refused is not None:
            return refused
        sel = svt_select(lambda i: args.scores[i], k, svt)
        obj.update({"selected": list(sel.selected), "scored": sel.scored})
        lines.append(f"  selected (OS CSPRNG): {list(sel.selected) or 'none'} after scoring {sel.scored}")
    if args.plot:
        plot_selection_costs(obj, args.plot)
        obj["plot"] = args.plot
        lines.append(f"  plot: {args.plot}")
    return emit(args, obj, lines)
