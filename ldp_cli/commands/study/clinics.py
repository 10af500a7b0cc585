"""``ldp study clinics`` (also ``ldp fl clinics``): the clinics scenario's options and wiring
(:mod:`simulator.scenarios.fl.clinics`)."""

from __future__ import annotations

import argparse
import json

from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import probability as _prob
from ldp_cli.commands.argtypes import seed as _seed
from ldp_cli.commands.dpsgd_select import float_list
from ldp_cli.commands.study.common import add_no_progress, finish, prog, round_bar

__all__ = ["register_clinics", "run_clinics_cmd"]


def register_clinics(ssub: argparse._SubParsersAction) -> None:
    c = ssub.add_parser(
        "clinics",
        help="20 clinics, logistic regression, DP-FedAvg at σ = 0 / 0.5 / 2.0",
        description="20 synthetic clinics with shifted features; FedAvg and DP-FedAvg (clip 0.5) "
        "with Poisson sampling of clinics; prints accuracy and the client-level ε of each setting.",
    )
    c.add_argument("--rounds", type=_positive_int, default=None, help="rounds (default 100)")
    c.add_argument(
        "--sample-rate", type=_prob, default=None, help="Poisson rate q (default 0.5: 10 of 20 clinics expected)"
    )
    c.add_argument("--seed", type=_seed, default=None, help="seed (default 0)")
    c.add_argument("--plot", default=None, help="write accuracy per round per setting to this PNG")
    c.add_argument("--no-noise-search", action="store_true", help="skip the noise needed for ε = 1, 3, 8")
    c.add_argument(
        "--example",
        action="store_true",
        help="the user's own example exactly (default_rng(9), 10 of 20 clinics without replacement; "
        "fixed: takes none of --rounds, --sample-rate, --seed, --plot, --no-noise-search); "
        "--json prints {rows: [{setting, accuracy, weight_error, epsilon, ...}]}",
    )
    g = c.add_argument_group(
        "private choice of the noise multiplier",
        "train DP-FedAvg at every candidate σ, score each on the clinics' own validation rows (capped per "
        "clinic), choose with the sparse vector technique or the exponential mechanism; the printed ε composes "
        "every candidate and the choice (docs/DPSGD.md)",
    )
    g.add_argument("--select", choices=["svt", "em"], default=None, help="choose σ privately")
    g.add_argument(
        "--candidate-noise-multipliers", type=float_list, default=(2.0, 1.0, 0.5), help="σ values (default 2,1,0.5)"
    )
    g.add_argument("--select-epsilon", type=_positive, default=1.0, help="ε of the choice (default 1)")
    g.add_argument("--select-threshold", type=_prob, default=None, help="svt: fraction of the top score to reach")
    g.add_argument("--validation-cap", type=_positive_int, default=20, help="rows counted per clinic (Δ; default 20)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    add_no_progress(c)
    c.set_defaults(func=run_clinics_cmd)


def run_clinics_cmd(args: argparse.Namespace) -> int:
    from simulator.scenarios.fl import clinics

    if args.example:
        fixed = {"--rounds": args.rounds, "--sample-rate": args.sample_rate, "--seed": args.seed, "--plot": args.plot}
        given = [k for k, v in fixed.items() if v is not None] + (["--no-noise-search"] if args.no_noise_search else [])
        if given:
            raise SystemExit(f"{prog(args)} --example: the example is fixed; drop {', '.join(given)}")
        result = clinics.run_example()
        print(json.dumps(result) if args.json else "\n".join(clinics.example_report_lines(result)))
        return 0
    cfg = clinics.ClinicsConfig(
        rounds=100 if args.rounds is None else args.rounds,
        sample_rate=0.5 if args.sample_rate is None else args.sample_rate,
        seed=0 if args.seed is None else args.seed,
    )
    if args.select:
        return _run_select(args, cfg)
    with round_bar(args) as bar:
        result = clinics.run_clinics(
            cfg, noise_for_targets=not args.no_noise_search, on_round=lambda _record: bar.update()
        )
    return finish(args, result, clinics.plot_accuracy, lambda r: clinics.report_lines(r, cfg))


def _run_select(args: argparse.Namespace, cfg: object) -> int:
    from simulator.scenarios.fl.clinics_select import select_clinics_noise

    r = select_clinics_noise(
        cfg,  # type: ignore[arg-type]
        tuple(args.candidate_noise_multipliers),
        args.select,
        args.select_epsilon,
        args.select_threshold,
        args.validation_cap,
    )
    if args.json:
        print(json.dumps(r))
    else:
        chosen = "none above the threshold" if r["chosen"] is None else f"σ = {r['chosen_noise_multiplier']:g}"
        print(
            f"clinics, private choice of σ ({r['method']}, ε_select = {r['epsilon_select']:g}) among "
            f"{r['candidates']}: {chosen}, {r['candidates_trained']} trained\n"
            f"  ε = {r['epsilon']:.4g} at δ = {r['delta']:g} in total (every candidate "
            f"{r['epsilon_training_all_candidates']:.4g}, composed with the choice)"
            + (
                ""
                if r["chosen"] is None
                else f"; the chosen run alone {r['epsilon_chosen_run']:.4g}, test accuracy {r['test_accuracy']:.4f}"
            )
            + f"\nε protects {r['protects']}."
        )
    return 0 if r["chosen"] is not None else 1
