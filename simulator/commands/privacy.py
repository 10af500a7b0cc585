"""``ldp privacy``: what ε a setting gives, what noise a target ε needs, over how many rounds.

Sub-commands (``--json`` prints one object; every figure says what it protects against):

* ``gaussian``: ε of T Poisson-sampled Gaussian steps (keys ``epsilon_pld``, ``epsilon_rdp``, ...).
* ``gaussian-noise``: the noise multiplier that meets a target ε.
* ``gaussian-steps``: how many steps fit a target ε.
* ``shuffle``: the central ε of a shuffled batch of ε₀-LDP reports (key ``epsilon``).
* ``shuffle-epsilon0``: the largest local ε₀ whose shuffled batch meets a target ε.
* ``local``: what K reports of an ε-LDP mechanism spend for one user.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

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


def _positive_int(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return v


def _prob(text: str) -> float:
    v = float(text)
    if not 0.0 < v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return v


def _positive(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "privacy",
        help="privacy accounting: ε of a setting, noise for a target ε, shuffle amplification",
        description="Privacy accounting with dp_accounting (PLD, RDP) and the shuffle amplification bound "
        "of Feldman, McMillan and Talwar. Every figure is an upper bound on ε at the given δ; see docs/PRIVACY.md.",
    )
    ps = p.add_subparsers(dest="privacy_command", required=True)

    def common(q: argparse.ArgumentParser, neighbors: bool = True) -> None:
        q.add_argument("--delta", type=_prob, required=True, help="target δ (below 1/population is customary)")
        if neighbors:
            q.add_argument(
                "--neighbors", choices=["add_or_remove", "replace"], default="add_or_remove",
                help="neighbouring datasets: add/remove one person (default) or replace one person's data",
            )
        q.add_argument("--json", action="store_true", help="print one JSON object")
        if neighbors:
            q.add_argument(
                "--discretization", type=_positive, default=1e-4,
                help="PLD grid step (default 1e-4): ε is an upper bound within about this of the exact value; "
                "1e-3 is about 10x faster",
            )

    g = ps.add_parser("gaussian", help="ε of T Poisson-sampled Gaussian steps (DP-SGD, DP-FedAvg)")
    g.add_argument("--noise-multiplier", type=_positive, required=True, help="σ / clipping bound")
    g.add_argument("--sample-rate", type=_prob, required=True, help="Poisson sampling rate q (1 = everyone)")
    g.add_argument("--steps", type=_positive_int, required=True)
    common(g)
    g.set_defaults(func=run_gaussian)

    gn = ps.add_parser("gaussian-noise", help="noise multiplier for a target ε")
    gn.add_argument("--target-epsilon", type=_positive, required=True)
    gn.add_argument("--sample-rate", type=_prob, required=True)
    gn.add_argument("--steps", type=_positive_int, required=True)
    common(gn)
    gn.set_defaults(func=run_gaussian_noise)

    gt = ps.add_parser("gaussian-steps", help="how many Gaussian steps fit a target ε")
    gt.add_argument("--noise-multiplier", type=_positive, required=True)
    gt.add_argument("--sample-rate", type=_prob, required=True)
    gt.add_argument("--target-epsilon", type=_positive, required=True)
    common(gt)
    gt.set_defaults(func=run_gaussian_steps)

    s = ps.add_parser("shuffle", help="central ε of a shuffled batch of ε₀-LDP reports")
    s.add_argument("--epsilon0", type=_positive, required=True, help="local ε of each report")
    s.add_argument("--users", type=_positive_int, required=True, help="reports in the shuffled batch")
    common(s, neighbors=False)
    s.set_defaults(func=run_shuffle)

    se = ps.add_parser("shuffle-epsilon0", help="largest local ε₀ whose shuffled batch meets a target ε")
    se.add_argument("--target-epsilon", type=_positive, required=True)
    se.add_argument("--users", type=_positive_int, required=True)
    common(se, neighbors=False)
    se.set_defaults(func=run_shuffle_epsilon0)

    lo = ps.add_parser("local", help="what K reports of an ε-LDP mechanism spend for one user")
    lo.add_argument("--epsilon", type=_positive, required=True, help="local ε per report")
    lo.add_argument("--reports", type=_positive_int, required=True, help="reports per user (of distinct, unmemoized values)")
    common(lo, neighbors=False)
    lo.set_defaults(func=run_local)


def _emit(args: argparse.Namespace, obj: dict[str, Any], lines: list[str]) -> int:
    if args.json:
        print(json.dumps(obj))
    else:
        print("\n".join(lines))
    return 0


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def run_gaussian(args: argparse.Namespace) -> int:
    from client_sdk.privacy_events import GaussianEvent, PoissonSampledEvent, SelfComposedEvent
    from estimator.accounting.accountant import account

    step = GaussianEvent(args.noise_multiplier)
    if args.sample_rate < 1.0:
        step = PoissonSampledEvent(args.sample_rate, step)
    report = account(SelfComposedEvent(step, args.steps), args.delta, args.neighbors, args.discretization)
    obj = {
        "noise_multiplier": args.noise_multiplier,
        "sample_rate": args.sample_rate,
        "steps": args.steps,
        **report.to_dict(),
        "protects": GAUSSIAN_PROTECTS[args.neighbors],
    }
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
    lines.append(f"  protects: {obj['protects']}")
    return _emit(args, obj, lines)


def run_gaussian_noise(args: argparse.Namespace) -> int:
    from estimator.accounting.accountant import account, gaussian_noise_for_epsilon, sampled_gaussian_event

    z = gaussian_noise_for_epsilon(
        args.target_epsilon, args.delta, args.sample_rate, args.steps, args.neighbors, args.discretization
    )
    report = account(sampled_gaussian_event(z, args.sample_rate, args.steps), args.delta, args.neighbors, args.discretization)
    obj = {
        "noise_multiplier": z,
        "target_epsilon": args.target_epsilon,
        "sample_rate": args.sample_rate,
        "steps": args.steps,
        **report.to_dict(),
        "protects": GAUSSIAN_PROTECTS[args.neighbors],
    }
    lines = [
        f"noise multiplier {z:.4f} keeps {args.steps} steps at rate {args.sample_rate:g} within "
        f"ε = {args.target_epsilon:g}, δ = {args.delta:g} (PLD ε = {_fmt(report.epsilon_pld)}, RDP ε = {_fmt(report.epsilon_rdp)})",
        f"  protects: {obj['protects']}",
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
        f"  protects: {obj['protects']}",
    ]
    return _emit(args, obj, lines)


def run_shuffle(args: argparse.Namespace) -> int:
    from estimator.accounting.shuffle import shuffle_guarantee

    g = shuffle_guarantee(args.epsilon0, args.users, args.delta)
    obj = g.to_dict()
    lines = [
        f"{args.users} shuffled reports, each {args.epsilon0:g}-LDP, δ = {args.delta:g}:",
        f"  ε (numerical bound)   = {g.epsilon:.4f}",
        f"  ε (closed-form bound) = {_fmt(g.epsilon_closed_form)}"
        + ("" if g.epsilon_closed_form is not None else "   (outside the closed form's range)"),
        f"  method: {g.method}",
        f"  protects: {g.protects}",
    ]
    return _emit(args, obj, lines)


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
        f"  protects: {PROTECTS}",
    ]
    return _emit(args, obj, lines)


def run_local(args: argparse.Namespace) -> int:
    from client_sdk.privacy_events import LocalReportEvent, SelfComposedEvent
    from estimator.accounting.accountant import account

    report = account(SelfComposedEvent(LocalReportEvent(args.epsilon), args.reports), args.delta, "replace")
    obj = {
        "epsilon_per_report": args.epsilon,
        "reports": args.reports,
        **report.to_dict(),
        "protects": LOCAL_PROTECTS,
    }
    lines = [
        f"{args.reports} reports at local ε = {args.epsilon:g} per user:",
        f"  ε (basic composition, δ = 0) = {_fmt(report.epsilon_basic)}",
        f"  ε (PLD, δ = {args.delta:g})       = {_fmt(report.epsilon_pld)}",
        f"  protects: {LOCAL_PROTECTS}",
    ]
    return _emit(args, obj, lines)
