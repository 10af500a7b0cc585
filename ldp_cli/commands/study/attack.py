"""``ldp study attack`` (also ``ldp fl attack``): membership inference and gradient inversion
(:mod:`simulator.scenarios.fl.attacks`) or, with ``--poisoning``, model poisoning against robust aggregators
(:mod:`simulator.scenarios.fl.poisoning`): options and wiring."""

from __future__ import annotations

import argparse

from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import seed as _seed
from ldp_cli.commands.study.common import add_no_progress, add_plot_and_json, finish, prog, round_bar

__all__ = ["register_attack", "run_attack_cmd"]


def register_attack(ssub: argparse._SubParsersAction) -> None:
    a = ssub.add_parser(
        "attack",
        help="membership inference and gradient inversion, with and without DP and SecAgg",
        description="Loss-threshold membership inference on a federatedly trained, overfitting model "
        "(plain FedAvg and DP-FedAvg at several noise multipliers, with the advantage's confidence "
        "interval and the client-level DP bounds) and the analytic gradient inversion of one client's "
        "update in the clear, clipped, under central DP and under secure aggregation "
        "(see simulator/scenarios/fl/attacks.py).",
    )
    a.add_argument("--seed", type=_seed, default=0)
    a.add_argument(
        "--rounds", type=_positive_int, default=40, help="training rounds of the membership game (default 40)"
    )
    a.add_argument("--trials", type=_positive_int, default=50, help="target clients per inversion setting (default 50)")
    add_plot_and_json(a, "write the advantages and inversion success rates to this PNG")
    a.add_argument(
        "--poisoning",
        action="store_true",
        help="instead: label flipping, a scaled backdoor and sign flipping by 10-30%% malicious clients against "
        "mean, median, trimmed mean, Krum and FLTrust (simulator/scenarios/fl/poisoning.py); --rounds applies",
    )
    a.add_argument(
        "--dp-fltrust",
        action="store_true",
        help="with --poisoning: add DP-FLTrust (root update clipped to C = 0.1, noise multiplier 1, the sum over "
        "the expected cohort) as a sixth aggregator, with its client-level epsilon",
    )
    add_no_progress(a)
    a.set_defaults(func=run_attack_cmd)


def run_attack_cmd(args: argparse.Namespace) -> int:
    if args.poisoning:
        from simulator.scenarios.fl import poisoning

        aggs = (*poisoning.AGGREGATORS, poisoning.DP_AGGREGATOR) if args.dp_fltrust else poisoning.AGGREGATORS
        cfg = poisoning.PoisoningConfig(rounds=args.rounds, seed=args.seed)
        runs = (1 + len(poisoning.ATTACKS) * len(cfg.fractions)) * len(aggs)
        with round_bar(args, total=runs * cfg.rounds) as bar:
            result = poisoning.run_fl_poisoning(cfg, aggregators=aggs, on_round=lambda *_: bar.update())
        return finish(args, result, poisoning.plot_fl_poisoning, poisoning.report_lines)
    if args.dp_fltrust:
        raise SystemExit(f"{prog(args)}: --dp-fltrust adds a row to the poisoning scenario; it needs --poisoning")
    from simulator.scenarios.fl.attacks import (
        InversionConfig,
        MembershipConfig,
        plot_attacks,
        report_lines,
        run_attacks,
    )

    membership = MembershipConfig(rounds=args.rounds, seed=args.seed)
    # the bar counts the membership game's training rounds; the inversion's trials follow in well under a second
    with round_bar(args, total=(1 + len(membership.noise_multipliers)) * args.rounds) as bar:
        result = run_attacks(membership, InversionConfig(trials=args.trials, seed=args.seed), lambda *_: bar.update())
    return finish(args, result, plot_attacks, report_lines)
