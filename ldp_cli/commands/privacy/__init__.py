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
* ``svt``: ε of the sparse vector technique choosing among candidates, its noise scales, the
  exponential mechanism's ε and the naive cost beside it (:mod:`estimator.selection.mechanisms`;
  keys ``epsilon``, ``epsilon_threshold``, ``epsilon_queries``, ``threshold_scale``, ``query_scale``,
  ``naive``, ``protects``; with ``--scores`` also ``selected``).
* ``pate``: ε of PATE's GNMax and Confident-GNMax (:mod:`estimator.pate`; keys ``epsilon``, with a
  threshold ``epsilon_confident``, with ``--votes`` ``answered``, ``epsilon_data_dependent``, ...).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import probability as _prob
from ldp_cli.commands.privacy.central import register_central_commands
from ldp_cli.commands.privacy.common import add_common, emit, fmt
from ldp_cli.commands.privacy.pate import register_pate_command
from ldp_cli.commands.privacy.svt import register_svt

__all__ = ["register"]

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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "privacy",
        help="privacy accounting: ε of a setting, noise for a target ε, shuffle amplification",
        description="Privacy accounting with dp_accounting (PLD, RDP) and the shuffle amplification bound "
        "of Feldman, McMillan and Talwar. Every figure is an upper bound on ε at the given δ; see docs/PRIVACY.md.",
    )
    ps = p.add_subparsers(dest="privacy_command", required=True)
    # name, help, options (flag or (flag, help)), whether it takes the PLD options, handler
    # (a flag may be a tuple: the documented name first, then the older spellings kept as aliases)
    commands: list[
        tuple[str, str, list[str | tuple[str | tuple[str, ...], str]], bool, Callable[[argparse.Namespace], int]]
    ] = [
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
            [(("--epsilon", "--epsilon0"), "local ε₀ of each report"), ("--users", "reports in the shuffled batch")],
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
            flags = (flag,) if isinstance(flag, str) else flag
            dest = flags[-1].lstrip("-").replace("-", "_")  # the oldest spelling's: the handlers read it
            shown = flags[0].lstrip("-").replace("-", "_").upper()
            q.add_argument(
                *flags, dest=dest, metavar=shown, type=_OPTION_TYPES[flags[-1]], required=True, help=option_help
            )
        add_common(q, neighbors)
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
    register_central_commands(ps)
    register_svt(ps)
    register_pate_command(ps)


def run_gaussian(args: argparse.Namespace) -> int:
    from estimator.accounting.queries import gaussian_epsilon

    obj = gaussian_epsilon(
        args.noise_multiplier, args.sample_rate, args.steps, args.delta, args.neighbors, args.discretization
    )
    lines = [
        f"{args.steps} steps, noise multiplier {args.noise_multiplier:g}, Poisson rate {args.sample_rate:g}, "
        f"δ = {args.delta:g}, {args.neighbors} neighbours:",
        f"  ε (PLD, tight)   = {fmt(obj['epsilon_pld'])}",
        f"  ε (RDP, looser)  = {fmt(obj['epsilon_rdp'])}"
        + ("" if obj["rdp_complete"] or obj["epsilon_rdp"] is None else "   (incomplete: see note)"),
    ]
    if obj["epsilon_exact"] is not None:
        lines.append(f"  ε (exact)        = {fmt(obj['epsilon_exact'])}")
    lines += [f"  note: {n}" for n in obj["notes"]]
    return emit(args, obj, lines)


def run_gaussian_noise(args: argparse.Namespace) -> int:
    from estimator.accounting.queries import gaussian_noise

    obj = gaussian_noise(
        args.target_epsilon, args.sample_rate, args.steps, args.delta, args.neighbors, args.discretization
    )
    lines = [
        f"noise multiplier {obj['noise_multiplier']:.4f} keeps {args.steps} steps at rate {args.sample_rate:g} within "
        f"ε = {args.target_epsilon:g}, δ = {args.delta:g} (PLD ε = {fmt(obj['epsilon_pld'])}, RDP ε = {fmt(obj['epsilon_rdp'])})",
    ]
    return emit(args, obj, lines)


def run_gaussian_steps(args: argparse.Namespace) -> int:
    from estimator.accounting.queries import gaussian_steps

    obj = gaussian_steps(
        args.noise_multiplier, args.sample_rate, args.target_epsilon, args.delta, args.neighbors, args.discretization
    )
    lines = [
        f"at most {obj['steps']} steps with noise multiplier {args.noise_multiplier:g} and rate {args.sample_rate:g} "
        f"stay within ε = {args.target_epsilon:g}, δ = {args.delta:g} (PLD accountant)",
    ]
    return emit(args, obj, lines)


def run_shuffle(args: argparse.Namespace) -> int:
    from estimator.accounting.shuffle import shuffle_guarantee

    g = shuffle_guarantee(args.epsilon0, args.users, args.delta, args.reports_per_user)
    who = "" if g.reports_per_user == 1 else f" (at least {g.people} people of up to {g.reports_per_user} each)"
    lines = [
        f"{args.users} shuffled reports{who}, each {args.epsilon0:g}-LDP, δ = {args.delta:g}:",
        f"  ε (numerical bound)   = {g.epsilon:.4f}",
        f"  ε (closed-form bound) = {fmt(g.epsilon_closed_form)}"
        + ("" if g.epsilon_closed_form is not None else "   (outside the closed form's range)"),
        f"  method: {g.method}",
    ]
    return emit(args, g.to_dict(), lines)


def run_shuffle_epsilon0(args: argparse.Namespace) -> int:
    from estimator.accounting.queries import shuffle_local_epsilon

    obj = shuffle_local_epsilon(args.target_epsilon, args.users, args.delta)
    lines = [
        f"local ε₀ up to {obj['epsilon0']:.4f} keeps a shuffled batch of {args.users} reports within "
        f"ε = {args.target_epsilon:g}, δ = {args.delta:g} (bound: {obj['epsilon']:.4f})",
    ]
    return emit(args, obj, lines)


def run_local(args: argparse.Namespace) -> int:
    from estimator.accounting.queries import local_reports

    obj = local_reports(args.epsilon, args.reports, args.delta)
    lines = [
        f"{args.reports} reports at local ε = {args.epsilon:g} per user:",
        f"  ε (basic composition, δ = 0) = {fmt(obj['epsilon_basic'])}",
        f"  ε (PLD, δ = {args.delta:g})       = {fmt(obj['epsilon_pld'])}",
    ]
    return emit(args, obj, lines)
