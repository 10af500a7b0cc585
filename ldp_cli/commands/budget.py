"""``ldp budget``: a privacy budget shared among partners, in a session file (:mod:`estimator.accounting.ledger`).

* ``create FILE --subject S --epsilon E [--delta D] [--filter zcdp|basic]``: a new session over a data set or
  FL task with total (ε, δ).
* ``allocate FILE --partner P --share F``: give a partner a fraction of the budget (the shares add up to <= 1).
* ``approve FILE --kind K --by NAME [--partner P] [--note T]``: approve a kind of query (recorded).
* ``debit FILE --partner P --kind K (--release KIND:VALUE | --event JSON) [--label L]``: charge a query before
  it runs.
* ``report FILE [--plot PNG]``: who spent what (by partner and by kind), the approvals and the ledger.

Every sub-command prints one JSON object with ``--json``. A refused debit exits 3 (:data:`REFUSED_EXIT_CODE`)
with the reason (``unknown_partner``, ``unapproved``, ``exhausted``) and spends nothing; bad input exits 2.
Other commands debit a session before they run with ``--budget-session FILE --partner NAME``
(:func:`add_budget_flags`, :func:`charge`): ``ldp dpsgd`` and ``ldp privacy central``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int

__all__ = ["register", "add_budget_flags", "charge", "report_refusal"]


def _share(text: str) -> float:
    v = float(text)
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1], got {text}")
    return v


def _release(text: str) -> tuple[str, float]:
    kind, _, value = text.partition(":")
    try:
        v = float(value)
    except ValueError:
        v = float("nan")
    if kind not in ("laplace", "gaussian", "sparse-vector") or not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be laplace:EPS, gaussian:SIGMA or sparse-vector:EPS, got {text}")
    return kind, v


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "budget",
        help="a privacy budget shared among partners: sessions, shares, approvals, debits, report",
        description="A session file holds a total (ε, δ) over a data set or FL task, shares of it allocated to "
        "partners, the approved kinds of query and a ledger of every debit and refusal. Queries are debited "
        "before they run; a refused debit exits 3 and spends nothing. See docs/PRIVACY.md.",
    )
    ps = p.add_subparsers(dest="budget_command", required=True)
    q = ps.add_parser("create", help="a new session with a total (ε, δ)")
    q.add_argument("--subject", required=True, help="the data set or FL task the budget is over")
    q.add_argument("--epsilon", type=_positive, required=True)
    q.add_argument("--delta", type=float, default=None, help="δ of the budget (zcdp: required; basic: default 0)")
    q.add_argument("--filter", choices=["zcdp", "basic"], default="zcdp", help="privacy filter (default zcdp)")
    q.add_argument("--neighbors", choices=["add_or_remove", "replace"], default="add_or_remove")
    q.add_argument("--per-release-delta", type=float, default=None, help="basic filter: δ charged per Gaussian query")
    q.add_argument("--owner", default="", help="who created the session (recorded)")
    q = ps.add_parser("allocate", help="give a partner a share (fraction) of the budget")
    q.add_argument("--partner", required=True)
    q.add_argument("--share", type=_share, required=True)
    q.add_argument("--by", default="", help="who allocated it (recorded)")
    q = ps.add_parser("approve", help="approve a kind of query (for one partner or everyone)")
    q.add_argument("--kind", required=True, help="e.g. central, dpsgd, dpsgd-select, pate, synth")
    q.add_argument("--by", required=True, help="who approves (recorded in the ledger)")
    q.add_argument("--partner", default="*", help="the partner (default *: everyone)")
    q.add_argument("--note", default="")
    q = ps.add_parser("debit", help="charge a query to a partner before it runs")
    q.add_argument("--partner", required=True)
    q.add_argument("--kind", required=True)
    g = q.add_mutually_exclusive_group(required=True)
    g.add_argument("--release", type=_release, help="laplace:EPS, gaussian:SIGMA or sparse-vector:EPS")
    g.add_argument("--event", help="a privacy event as JSON (ldp_core.privacy_events)")
    q.add_argument("--sensitivity", type=_positive_int, default=1, help="of --release (default 1)")
    q.add_argument("--label", default="")
    q.add_argument(
        "--event-neighbors",
        choices=["add_or_remove", "replace"],
        default=None,
        help="the relation the event is stated under (default: the session's; replace in an add/remove session "
        "is refused, add/remove in a replace session is priced by group privacy)",
    )
    q.add_argument("--ref", default=None, help="debit at most once under this reference (e.g. fl-job:<task>)")
    q = ps.add_parser("report", help="who spent what")
    q.add_argument("--plot", default=None, help="write each partner's share and spend to this PNG")
    for q in ps.choices.values():
        q.add_argument("session", metavar="FILE", help="the session file (SQLite)")
        q.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_budget_cmd)


def add_budget_flags(p: argparse.ArgumentParser) -> None:
    """``--budget-session FILE --partner NAME``: debit the run to a shared budget before it starts."""
    g = p.add_argument_group("shared privacy budget (ldp budget)")
    g.add_argument("--budget-session", default=None, metavar="FILE", help="debit this run to the session first")
    g.add_argument("--partner", default=None, help="the partner the run is debited to (with --budget-session)")


def charge(args: argparse.Namespace, kind: str, event: Any, label: str = "") -> int | None:
    """Debit ``event`` before the run when ``--budget-session`` is given: None to go on, or the exit code
    (3) after printing why the ledger refused."""
    from estimator.accounting.ledger import LedgerRefusal, debit_before_run

    try:
        debit_before_run(args.budget_session, args.partner, kind, event, label)
    except LedgerRefusal as exc:
        return report_refusal(args, exc)
    return None


def report_refusal(args: argparse.Namespace, exc: Any) -> int:
    """Print why the ledger refused (stderr; with ``--json`` also ``{"refused": true, "reason", "error"}`` on
    stdout) and return the exit code 3."""
    from estimator.accounting.ledger import REFUSED_EXIT_CODE

    print(f"ldp {args.command}: refused by the budget session ({exc.reason}): {exc}", file=sys.stderr)
    if getattr(args, "json", False):
        print(json.dumps({"refused": True, "reason": exc.reason, "error": str(exc)}))
    return REFUSED_EXIT_CODE


def run_budget_cmd(args: argparse.Namespace) -> int:
    from estimator.accounting.ledger import BudgetLedger, LedgerRefusal

    c = args.budget_command
    if c == "create":
        delta = args.delta if args.delta is not None else (0.0 if args.filter == "basic" else None)
        if delta is None:
            raise ValueError("--delta is required for --filter zcdp")
        BudgetLedger.create(
            args.session,
            args.subject,
            args.epsilon,
            delta,
            args.filter,
            args.neighbors,
            args.per_release_delta,
            args.owner,
        ).close()
        obj: dict[str, Any] = {
            "session": args.session,
            "subject": args.subject,
            "epsilon": args.epsilon,
            "delta": delta,
        }
        return _emit(args, obj, f"session {args.session} over {args.subject!r}: ε = {args.epsilon:g}, δ = {delta:g}")
    with BudgetLedger(args.session) as ledger:
        if c == "allocate":
            obj = ledger.allocate(args.partner, args.share, args.by)
            return _emit(args, obj, f"{obj['partner']} holds {obj['share']:g} of the budget")
        if c == "approve":
            obj = ledger.approve(args.kind, args.by, args.partner, args.note)
            return _emit(args, obj, f"{obj['kind']} queries approved for {obj['partner']} by {obj['approved_by']}")
        if c == "debit":
            try:
                obj = ledger.debit(
                    args.partner, args.kind, _event(args), args.label, neighbors=args.event_neighbors, ref=args.ref
                )
            except LedgerRefusal as exc:
                return report_refusal(args, exc)
            costs = ", ".join(f"{u} {v:.6g}" for u, v in obj["cost"].items())
            again = " (already debited under this reference: nothing charged)" if obj["repeat"] else ""
            return _emit(args, obj, f"debited {costs} to {obj['partner']} ({obj['kind']}, {obj['neighbors']}){again}")
        r = ledger.report()
        if args.plot:
            from estimator.accounting.ledger import plot_report

            plot_report(r, args.plot)
            r["plot"] = args.plot
        return _emit(args, r, "\n".join(_report_lines(r)))


def _event(args: argparse.Namespace) -> Any:
    from estimator.accounting.queries import release_event
    from ldp_core.privacy_events import event_from_dict

    if args.release is not None:
        return release_event(args.release[0], args.release[1], args.sensitivity)
    try:
        return event_from_dict(json.loads(args.event))
    except json.JSONDecodeError as exc:
        raise ValueError(f"--event is not JSON: {exc}") from None


def _report_lines(r: dict[str, Any]) -> list[str]:
    st = r["status"]
    units = ", ".join(f"{u} {st['spent'][u]:.6g} of {st['budget'][u]:.6g}" for u in st["spent"])
    lines = [
        f"session {r['session']} over {r['subject']!r}: ε = {r['epsilon']:g}, δ = {r['delta']:g} ({r['filter']}); spent {units}"
    ]
    for name, p in r["partners"].items():
        spent = ", ".join(f"{u} {v:.6g}/{p['budget'][u]:.6g}" for u, v in p["spent"].items())
        lines.append(
            f"  {name:<16} share {p['share']:<6g} spent {spent}  ({p['debits']} debits, {p['refused']} refused)"
        )
    for kind, cost in r["by_kind"].items():
        lines.append(f"  kind {kind:<11} " + ", ".join(f"{u} {v:.6g}" for u, v in cost.items()))
    relations: dict[str, int] = {}
    for e in r["entries"]:
        if e["action"] == "debit":
            relations[e["neighbors"]] = relations.get(e["neighbors"], 0) + 1
    repeats = sum(1 for e in r["entries"] if e["action"] == "repeat")
    stated = ", ".join(f"{n} {k}" for k, n in sorted(relations.items()))
    lines.append(
        f"  debits stated under: {stated or 'none'} (session: {r['neighbors']}); {repeats} repeats not charged"
    )
    lines.append(f"  protects: {r['protects']}")
    return lines


def _emit(args: argparse.Namespace, obj: dict[str, Any], text: str) -> int:
    print(json.dumps(obj) if args.json else text)
    return 0
