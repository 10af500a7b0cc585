"""``ldp privacy``: what ε a setting gives, what noise a target ε needs, over how many rounds.

Sub-commands (``--json`` prints one object; every figure says what it protects against):

* ``gaussian``: ε of T Poisson-sampled Gaussian steps (keys ``epsilon_pld``, ``epsilon_rdp``, ...).
* ``gaussian-noise``: the noise multiplier that meets a target ε.
* ``gaussian-steps``: how many steps fit a target ε.
* ``shuffle``: the central ε of a shuffled batch of ε₀-LDP reports (key ``epsilon``).
* ``shuffle-epsilon0``: the largest local ε₀ whose shuffled batch meets a target ε.
* ``local``: what K reports of an ε-LDP mechanism spend for one user.
* ``central``: the noise a central release of integer counts needs for a target ε
  (discrete Laplace or discrete Gaussian, :mod:`estimator.accounting.central`), and
  with ``--counts`` the release itself, drawn from the OS CSPRNG (keys ``scale`` or
  ``sigma``, ``variance``, ``std``, ``released``).
* ``ftrl``: ε of T rounds of DP-FTRL (tree-aggregated noise, each client at most once per tree,
  no sampling assumption; :mod:`estimator.fl.ftrl`; keys ``epsilon``, ``epsilon_rdp``, ``rounds``,
  ``trees``, ``restarts``, ...).
* ``budget``: whether a sequence of central releases fits an (ε, δ) budget under
  fully adaptive composition, with a privacy filter (:mod:`estimator.accounting.odometer`;
  keys ``filter``, ``plan``, ``refused``, ``spent``, ``remaining``; exit 1 if a release
  is refused).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import probability as _prob

__all__ = ["register"]

GAUSSIAN_PROTECTS = {
    "add_or_remove": "whether one person's data was used at all, against anyone who sees every noisy release "
    "(assumes each person's contribution is clipped to the bound the noise multiplier refers to, "
    "and that the Poisson sample stays secret)",
    "replace": "what one person's data is (replace-one neighbours), against anyone who sees every noisy release "
    "(assumes each person's contribution is clipped to the bound the noise multiplier refers to, "
    "and that the Poisson sample stays secret)",
}
LOCAL_PROTECTS = (
    "the user's true values, against everyone who sees the reports (collector, shuffler, analyst); "
    "not the fact that the user sent reports, nor their number"
)


#: Type of each sub-command option; every one of them is required.
_OPTION_TYPES: dict[str, Any] = {
    "--noise-multiplier": _positive,
    "--sample-rate": _prob,
    "--steps": _positive_int,
    "--target-epsilon": _positive,
    "--epsilon0": _positive,
    "--users": _positive_int,
    "--epsilon": _positive,
    "--reports": _positive_int,
    "--rounds": _positive_int,
}

FTRL_PROTECTS = (
    "{what}, against anyone who sees the released models, "
    "including whoever knows which clients took part in each round: DP-FTRL assumes no sampling "
    "(each client contributes at most once per tree, clipped to the bound the noise multiplier refers to); "
    "not against a server that adds the noise itself and sees the un-noised sums"
)


def _add_common(q: argparse.ArgumentParser, neighbors: bool) -> None:
    """``--delta`` and ``--json`` everywhere; ``--neighbors`` and ``--discretization`` for the PLD commands."""
    q.add_argument("--delta", type=_prob, required=True, help="target δ (below 1/population is customary)")
    if neighbors:
        q.add_argument(
            "--neighbors",
            choices=["add_or_remove", "replace"],
            default="add_or_remove",
            help="neighbouring datasets: add/remove one person (default) or replace one person's data",
        )
    q.add_argument("--json", action="store_true", help="print one JSON object")
    if neighbors:
        q.add_argument(
            "--discretization",
            type=_positive,
            default=1e-4,
            help="PLD grid step (default 1e-4): ε is an upper bound within about this of the exact value; "
            "1e-3 is about 10x faster",
        )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "privacy",
        help="privacy accounting: ε of a setting, noise for a target ε, shuffle amplification",
        description="Privacy accounting with dp_accounting (PLD, RDP) and the shuffle amplification bound "
        "of Feldman, McMillan and Talwar. Every figure is an upper bound on ε at the given δ; see docs/PRIVACY.md.",
    )
    ps = p.add_subparsers(dest="privacy_command", required=True)
    # name, help, options (flag or (flag, help)), whether it takes the PLD options, handler
    commands: list[tuple[str, str, list[str | tuple[str, str]], bool, Callable[[argparse.Namespace], int]]] = [
        (
            "gaussian",
            "ε of T Poisson-sampled Gaussian steps (DP-SGD, DP-FedAvg)",
            [
                ("--noise-multiplier", "σ / clipping bound"),
                ("--sample-rate", "Poisson sampling rate q (1 = everyone)"),
                "--steps",
            ],
            True,
            run_gaussian,
        ),
        (
            "gaussian-noise",
            "noise multiplier for a target ε",
            ["--target-epsilon", "--sample-rate", "--steps"],
            True,
            run_gaussian_noise,
        ),
        (
            "gaussian-steps",
            "how many Gaussian steps fit a target ε",
            ["--noise-multiplier", "--sample-rate", "--target-epsilon"],
            True,
            run_gaussian_steps,
        ),
        (
            "shuffle",
            "central ε of a shuffled batch of ε₀-LDP reports, per person",
            [("--epsilon0", "local ε of each report"), ("--users", "reports in the shuffled batch")],
            False,
            run_shuffle,
        ),
        (
            "shuffle-epsilon0",
            "largest local ε₀ whose shuffled batch meets a target ε",
            ["--target-epsilon", "--users"],
            False,
            run_shuffle_epsilon0,
        ),
        (
            "local",
            "what K reports of an ε-LDP mechanism spend for one user",
            [("--epsilon", "local ε per report"), ("--reports", "reports per user (of distinct, unmemoized values)")],
            False,
            run_local,
        ),
    ]
    for name, help_text, options, neighbors, func in commands:
        q = ps.add_parser(name, help=help_text)
        for option in options:
            flag, option_help = (option, None) if isinstance(option, str) else option
            q.add_argument(flag, type=_OPTION_TYPES[flag], required=True, help=option_help)
        _add_common(q, neighbors)
        q.set_defaults(func=func)
    shuffle = ps.choices["shuffle"]
    shuffle.add_argument(
        "--reports-per-user",
        type=_positive_int,
        default=1,
        metavar="R",
        help="most reports one person contributes to the batch (a metric's max_reports_per_day; "
        "default 1): the bound is per person, at ⌈users / R⌉ people of R·ε₀ each",
    )
    _register_central(ps)
    _register_budget(ps)
    _register_ftrl(ps)


def _emit(args: argparse.Namespace, obj: dict[str, Any], lines: list[str]) -> int:
    """Print ``obj`` as JSON with ``--json``, else ``lines`` and the ``protects`` line."""
    if args.json:
        print(json.dumps(obj))
    else:
        print("\n".join([*lines, f"  protects: {obj['protects']}"]))
    return 0


def _with_report(head: dict[str, Any], report: Any, protects: str) -> dict[str, Any]:
    """The JSON object of an accounted command: its inputs, the accountant's report, what it protects."""
    return {**head, **report.to_dict(), "protects": protects}


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def _gaussian_report(args: argparse.Namespace, noise_multiplier: float) -> Any:
    """The accountant's report for ``args.steps`` Gaussian steps at ``args.sample_rate``."""
    from estimator.accounting.accountant import account
    from ldp_core.privacy_events import sampled_gaussian_event

    event = sampled_gaussian_event(noise_multiplier, args.sample_rate, args.steps)
    return account(event, args.delta, args.neighbors, args.discretization)


def run_gaussian(args: argparse.Namespace) -> int:
    report = _gaussian_report(args, args.noise_multiplier)
    head = {"noise_multiplier": args.noise_multiplier, "sample_rate": args.sample_rate, "steps": args.steps}
    obj = _with_report(head, report, GAUSSIAN_PROTECTS[args.neighbors])
    lines = [
        f"{args.steps} steps, noise multiplier {args.noise_multiplier:g}, Poisson rate {args.sample_rate:g}, "
        f"δ = {args.delta:g}, {args.neighbors} neighbours:",
        f"  ε (PLD, tight)   = {_fmt(report.epsilon_pld)}",
        f"  ε (RDP, looser)  = {_fmt(report.epsilon_rdp)}"
        + ("" if report.rdp_complete or report.epsilon_rdp is None else "   (incomplete: see note)"),
    ]
    if report.epsilon_exact is not None:
        lines.append(f"  ε (exact)        = {_fmt(report.epsilon_exact)}")
    lines += [f"  note: {n}" for n in report.notes]
    return _emit(args, obj, lines)


def run_gaussian_noise(args: argparse.Namespace) -> int:
    from estimator.accounting.accountant import gaussian_noise_for_epsilon

    z = gaussian_noise_for_epsilon(
        args.target_epsilon, args.delta, args.sample_rate, args.steps, args.neighbors, args.discretization
    )
    report = _gaussian_report(args, z)
    head = {
        "noise_multiplier": z,
        "target_epsilon": args.target_epsilon,
        "sample_rate": args.sample_rate,
        "steps": args.steps,
    }
    obj = _with_report(head, report, GAUSSIAN_PROTECTS[args.neighbors])
    lines = [
        f"noise multiplier {z:.4f} keeps {args.steps} steps at rate {args.sample_rate:g} within "
        f"ε = {args.target_epsilon:g}, δ = {args.delta:g} (PLD ε = {_fmt(report.epsilon_pld)}, RDP ε = {_fmt(report.epsilon_rdp)})",
    ]
    return _emit(args, obj, lines)


def run_gaussian_steps(args: argparse.Namespace) -> int:
    from estimator.accounting.accountant import max_steps_for_epsilon

    t = max_steps_for_epsilon(
        args.noise_multiplier, args.sample_rate, args.target_epsilon, args.delta, args.neighbors, args.discretization
    )
    obj = {
        "steps": t,
        "noise_multiplier": args.noise_multiplier,
        "sample_rate": args.sample_rate,
        "target_epsilon": args.target_epsilon,
        "delta": args.delta,
        "neighbors": args.neighbors,
        "protects": GAUSSIAN_PROTECTS[args.neighbors],
    }
    lines = [
        f"at most {t} steps with noise multiplier {args.noise_multiplier:g} and rate {args.sample_rate:g} "
        f"stay within ε = {args.target_epsilon:g}, δ = {args.delta:g} (PLD accountant)",
    ]
    return _emit(args, obj, lines)


def run_shuffle(args: argparse.Namespace) -> int:
    from estimator.accounting.shuffle import shuffle_guarantee

    g = shuffle_guarantee(args.epsilon0, args.users, args.delta, args.reports_per_user)
    who = "" if g.reports_per_user == 1 else f" (at least {g.people} people of up to {g.reports_per_user} each)"
    lines = [
        f"{args.users} shuffled reports{who}, each {args.epsilon0:g}-LDP, δ = {args.delta:g}:",
        f"  ε (numerical bound)   = {g.epsilon:.4f}",
        f"  ε (closed-form bound) = {_fmt(g.epsilon_closed_form)}"
        + ("" if g.epsilon_closed_form is not None else "   (outside the closed form's range)"),
        f"  method: {g.method}",
    ]
    return _emit(args, g.to_dict(), lines)


def run_shuffle_epsilon0(args: argparse.Namespace) -> int:
    from estimator.accounting.shuffle import PROTECTS, local_epsilon_for_target, numerical_epsilon

    e0 = local_epsilon_for_target(args.target_epsilon, args.users, args.delta)
    eps = numerical_epsilon(e0, args.users, args.delta)
    obj = {
        "epsilon0": e0,
        "epsilon": eps,
        "target_epsilon": args.target_epsilon,
        "users": args.users,
        "delta": args.delta,
        "protects": PROTECTS,
    }
    lines = [
        f"local ε₀ up to {e0:.4f} keeps a shuffled batch of {args.users} reports within "
        f"ε = {args.target_epsilon:g}, δ = {args.delta:g} (bound: {eps:.4f})",
    ]
    return _emit(args, obj, lines)


def run_local(args: argparse.Namespace) -> int:
    from estimator.accounting.accountant import account
    from ldp_core.privacy_events import LocalReportEvent, SelfComposedEvent

    report = account(SelfComposedEvent(LocalReportEvent(args.epsilon), args.reports), args.delta, "replace")
    obj = _with_report({"epsilon_per_report": args.epsilon, "reports": args.reports}, report, LOCAL_PROTECTS)
    lines = [
        f"{args.reports} reports at local ε = {args.epsilon:g} per user:",
        f"  ε (basic composition, δ = 0) = {_fmt(report.epsilon_basic)}",
        f"  ε (PLD, δ = {args.delta:g})       = {_fmt(report.epsilon_pld)}",
    ]
    return _emit(args, obj, lines)


# -- central releases and budgets (estimator.accounting.central, .odometer) ----------------
CENTRAL_PROTECTS = (
    "the people behind the counts, against everyone who sees the released counts (assumes each person moves "
    "the counts by at most the sensitivity: L1 for laplace, L2 for gaussian); not against whoever computes "
    "the exact counts, nor a second release of the same counts that is not charged"
)
BUDGET_PROTECTS = (
    "the people behind the data, against everyone who sees every release charged to the filter, however "
    "each release was chosen after the previous ones; not releases that bypass the filter"
)
#: the release kinds ``ldp privacy budget --release`` takes and what their number is
RELEASE_KINDS = {
    "laplace": "ε of a discrete Laplace release of counts (LaplaceCounts)",
    "gaussian": "σ of a discrete Gaussian release of counts (GaussianCounts)",
    "sparse-vector": "ε of a sparse-vector selection of counts above a threshold (SparseVector)",
}


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
    q.add_argument("--epsilon", type=_positive, required=True, help="target ε of the release")
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
    import math

    from estimator.accounting.accountant import basic_epsilon, epsilon_pld, sensitivity_factor
    from estimator.accounting.central import GaussianCounts, LaplaceCounts

    head: dict[str, Any] = {
        "mechanism": args.mechanism,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "sensitivity": args.sensitivity,
        "neighbors": args.neighbors,
    }
    mech: LaplaceCounts | GaussianCounts
    if args.mechanism == "laplace":
        # ε-DP under add/remove; replace-one neighbours differ by two contributions
        mech = LaplaceCounts(args.epsilon / sensitivity_factor(args.neighbors), args.sensitivity)
        achieved = basic_epsilon(mech.event, args.neighbors)
        obj = {**head, "scale": float(mech.scale), "epsilon_achieved": achieved}
        what = f"discrete Laplace noise of scale {float(mech.scale):.6g}"
        bound = f"ε = {_fmt(achieved)} (pure)"
    else:
        if args.delta is None:
            raise ValueError("--delta is required for --mechanism gaussian")
        mech = GaussianCounts.for_epsilon(args.epsilon, args.delta, args.sensitivity, args.neighbors)
        achieved = epsilon_pld(mech.event, args.delta, args.neighbors)
        obj = {**head, "sigma": mech.sigma, "epsilon_achieved": achieved}
        what = f"discrete Gaussian noise of σ = {mech.sigma:.6g}"
        bound = f"ε = {_fmt(achieved)} at δ = {args.delta:g} (PLD)"
    obj.update(variance=mech.variance, std=math.sqrt(mech.variance))
    lines = [
        f"a central release of counts (sensitivity {args.sensitivity}, {args.neighbors} neighbours) within "
        f"ε = {args.epsilon:g}" + ("" if args.delta is None else f", δ = {args.delta:g}") + f": {what}",
        f"  {bound}; noise variance {mech.variance:.6g} (std {math.sqrt(mech.variance):.4g}) per count",
    ]
    if args.counts is not None:
        released = mech.release(args.counts)  # no generator: the OS CSPRNG (secure_generator)
        obj["released"] = [int(v) for v in released]
        lines.append(f"  released: {', '.join(str(v) for v in obj['released'])}")
    obj["protects"] = CENTRAL_PROTECTS
    return _emit(args, obj, lines)


def _release_event(kind: str, value: float, sensitivity: int) -> Any:
    from estimator.accounting.central import GaussianCounts, LaplaceCounts, SparseVector

    if kind == "laplace":
        return LaplaceCounts(value, sensitivity).event
    if kind == "gaussian":
        return GaussianCounts(value, sensitivity).event
    return SparseVector(value, 0.0, sensitivity=sensitivity).event


def run_budget(args: argparse.Namespace) -> int:
    from estimator.accounting.odometer import BasicFilter, PrivacyFilter, ZCDPFilter

    flt: PrivacyFilter
    if args.filter == "zcdp":
        if args.delta is None:
            raise ValueError("--delta is required for --filter zcdp")
        flt = ZCDPFilter(args.epsilon, args.delta, args.neighbors)
    else:
        flt = BasicFilter(
            args.epsilon,
            0.0 if args.delta is None else args.delta,
            args.neighbors,
            per_release_delta=args.per_release_delta,
        )
    plan: list[dict[str, Any]] = []
    for kind, value, times in args.release:
        event = _release_event(kind, value, args.sensitivity)
        label = f"{kind}:{value:g}"
        for _ in range(times):
            cost = dict(zip(flt.units, flt.cost(event)))
            plan.append({"release": label, "admitted": flt.try_spend(event, label), "cost": cost})
    refused = sum(not r["admitted"] for r in plan)
    status = flt.status()
    obj = {**status, "plan": plan, "refused": refused, "protects": BUDGET_PROTECTS}
    unit_text = ", ".join(f"{u} {status['spent'][u]:.6g} of {status['budget'][u]:.6g}" for u in flt.units)
    lines = [
        f"{status['filter']} with budget ε = {args.epsilon:g}, δ = {flt.delta:g} ({args.neighbors} neighbours): "
        f"{len(plan) - refused} of {len(plan)} releases admitted; spent {unit_text}"
    ]
    for r in plan:
        costs = ", ".join(f"{u} {c:.6g}" for u, c in r["cost"].items())
        lines.append(f"  {r['release']:<24} {'admitted' if r['admitted'] else 'REFUSED':<9} costs {costs}")
    _emit(args, obj, lines)
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
    _add_common(q, False)
    q.add_argument(
        "--neighbors",
        choices=["add_or_remove", "replace"],
        default="add_or_remove",
        help="neighbouring datasets: add/remove one client (default) or replace one client's data",
    )
    q.set_defaults(func=run_ftrl)


def run_ftrl(args: argparse.Namespace) -> int:
    from estimator.fl.ftrl import ftrl_epsilon, ftrl_epsilon_rdp, tree_depth, tree_sizes

    z, rounds, every = args.noise_multiplier, args.rounds, args.restart_every
    sizes = tree_sizes(rounds, every)
    eps = ftrl_epsilon(z, rounds, args.delta, every, args.neighbors)
    eps_rdp = ftrl_epsilon_rdp(z, rounds, args.delta, every, args.neighbors)
    obj = {
        "epsilon": eps,
        "epsilon_rdp": eps_rdp,
        "delta": args.delta,
        "noise_multiplier": z,
        "rounds": rounds,
        "restart_every": every,
        "trees": len(sizes),
        "restarts": len(sizes) - 1,
        "nodes_per_client": sum(tree_depth(s) for s in sizes),
        "neighbors": args.neighbors,
        "accountant": "exact Gaussian DP of the composed trees (Dong, Roth, Su 2019); "
        "epsilon_rdp: dp_accounting RDP, SingleEpochTreeAggregationDpEvent",
        "protects": FTRL_PROTECTS.format(
            what="whether one client's data was used at all"
            if args.neighbors == "add_or_remove"
            else "what one client's data is (replace-one neighbours)"
        ),
    }
    lines = [
        f"DP-FTRL, {rounds} rounds in {len(sizes)} tree(s), noise multiplier {z:g}, δ = {args.delta:g}, "
        f"{args.neighbors} neighbours:",
        f"  ε (exact GDP)    = {_fmt(eps)}",
        f"  ε (RDP, looser)  = {_fmt(eps_rdp)}",
    ]
    return _emit(args, obj, lines)
