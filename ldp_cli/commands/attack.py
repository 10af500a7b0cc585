"""``ldp attack {mia,lira,inversion,dlg,groups}``: attacks on the models the jobs train (docs/ATTACKS.md).

Each runs a seeded study on generated data (:mod:`estimator.attacks.runs`) and prints a table, or with
``--json`` one object (``rows``: one per setting, ``study``: the settings, ``seconds``); ``--plot FILE``
draws it. Progress lines (one per trained model or setting) go to stderr, unless ``--json`` or
``--no-progress`` (``--progress`` forces them).

* ``mia``: the shadow-model attack (Shokri et al.) and the loss threshold; ``lira``: LiRA, online and
  offline (Carlini et al.). Each row: ``printed_epsilon`` (the accountant's, null without DP) beside
  ``epsilon_lower_bound`` (what the attack proves, at ``--confidence``), and per attack its AUC, TPR at
  FPR 1% and 0.1% and the rates behind the bound.
  ``--target pate|synth``: the same game against a PATE student or an MLP trained on DP synthetic data
  (:mod:`estimator.attacks.targets`): ``target``, and rows with ``setting`` instead of ``noise_multiplier``.
* ``inversion``: model inversion; per σ the cosine of the reconstructed class representative to its
  training class mean.
* ``dlg``: gradient inversion of an MLP's shared gradient with no defence, clipping, noise and SecAgg.
* ``groups``: DP-SGD's accuracy on the majority classes and on a minority class, with and without DP.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ldp_cli.commands.argtypes import open_unit as _open_unit
from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import probability as _prob
from ldp_cli.commands.argtypes import seed as _seed
from ldp_cli.commands.attack_targets import target_flags as _target_flags
from ldp_cli.commands.attack_targets import target_study as _target_study
from ldp_cli.progress import add_progress_flags, progress_enabled

__all__ = ["register"]

HELP = "attacks on trained models: membership inference (shadow, LiRA) with ε lower bounds, inversion, DLG, groups"


def _sigma_list(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not out or any(not (0 <= z < float("inf")) for z in out):
        raise argparse.ArgumentTypeError(f"noise multipliers must be finite numbers >= 0 (0: no DP), got {text!r}")
    return out


def _int_list(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or any(k < 2 for k in out):
        raise argparse.ArgumentTypeError(f"client counts must be integers >= 2, got {text!r}")
    return out


_VERBS = {
    "mia": "membership inference with shadow models (Shokri et al. 2017) and the loss threshold",
    "lira": "membership inference by the likelihood-ratio attack (LiRA, Carlini et al. 2022), online and offline",
    "inversion": "model inversion (Fredrikson et al. 2015) of a softmax classifier, with and without DP-SGD",
    "dlg": "gradient inversion (DLG, Zhu et al. 2019) of an MLP's shared gradient: none, clipping, noise, SecAgg",
    "groups": "DP-SGD's accuracy on majority classes and a minority class, with and without DP",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attack", help=HELP, description=HELP + ". See docs/ATTACKS.md.")
    ps = p.add_subparsers(dest="attack_command", required=True)
    for name, help_line in _VERBS.items():
        q = ps.add_parser(name, help=help_line, description=help_line + ". Generated data, seeded (--seed).")
        if name != "dlg":
            default = {"inversion": "0,0.5,1,2,4", "groups": "1,4,16"}.get(name, "0,1,2")
            q.add_argument(
                "--noise-multipliers",
                type=_sigma_list,
                default=_sigma_list(default),
                help=f"DP-SGD noise multipliers σ, comma-separated (0: no clipping and no noise; default {default})",
            )
            q.add_argument("--steps", type=_positive_int, default=None, help="DP-SGD steps (default: the study's)")
            q.add_argument("--clip", type=_positive, default=None, help="clipping norm C (default: the study's)")
            q.add_argument("--sample-rate", type=_prob, default=None, help="Poisson rate q (default: the study's)")
            q.add_argument("--delta", type=_open_unit, default=1e-5, help="δ of the printed ε (default 1e-5)")
        if name in ("mia", "lira"):
            q.add_argument("--shadows", type=_positive_int, default=16, help="shadow models (default 16)")
            q.add_argument("--pool", type=_positive_int, default=None, help="rows in the attacked pool (default 400)")
            q.add_argument("--hidden", type=int, default=0, help="attack an MLP of this width (default 0: softmax)")
            q.add_argument("--confidence", type=_open_unit, default=0.95, help="of the ε lower bound (default 0.95)")
            _target_flags(q)
        if name == "dlg":
            q.add_argument(
                "--noise-multipliers", type=_sigma_list, default=(0.001, 0.01, 0.1, 1.0), help="σ of the noise cases"
            )
            q.add_argument(
                "--clients", type=_int_list, default=(2, 4, 16), help="SecAgg client counts (default 2,4,16)"
            )
            q.add_argument("--trials", type=_positive_int, default=3, help="targets per case (default 3)")
            q.add_argument("--no-dlg", action="store_true", help="the analytic recovery only (skip the optimisation)")
            q.add_argument(
                "--model",
                choices=["mlp", "cnn"],
                default="mlp",
                help="the numpy MLP (default) or the small CNN (PyTorch, the torch extra)",
            )
            q.add_argument("--activation", choices=["tanh", "relu"], default="tanh", help="the MLP's (default tanh)")
        q.add_argument(
            "--seed", type=_seed, default=0, help="seed of the data, the training and the attack (default 0)"
        )
        q.add_argument("--plot", default=None, help="write the study's figure to this PNG")
        q.add_argument("--json", action="store_true", help="print one JSON object")
        add_progress_flags(q)
        q.set_defaults(func=run_attack_cmd)


def _overrides(args: argparse.Namespace, **names: str) -> dict[str, Any]:
    return {field: getattr(args, arg) for field, arg in names.items() if getattr(args, arg, None) is not None}


def _study(args: argparse.Namespace) -> tuple[Any, Any]:
    from estimator.attacks import runs

    kind = args.attack_command
    common = _overrides(args, steps="steps", clip="clip", sample_rate="sample_rate", delta="delta", seed="seed")
    if kind in ("mia", "lira") and args.target != "dpsgd":
        return _target_study(args, _overrides(args, delta="delta", seed="seed"))
    if kind in ("mia", "lira"):
        scores = ("shadow", "loss") if kind == "mia" else ("lira_online", "lira_offline")
        study = runs.MembershipStudy(
            noise_multipliers=args.noise_multipliers,
            shadows=args.shadows,
            pool=args.pool or 400,
            hidden=max(args.hidden, 0),
            confidence=args.confidence,
            **common,
        )
        return study, lambda note: runs.run_membership(study, scores, note)
    if kind == "inversion":
        inv = runs.InversionStudy(noise_multipliers=args.noise_multipliers, **common)
        return inv, lambda note: runs.run_inversion(inv, note)
    if kind == "groups":
        grp = runs.GroupStudy(noise_multipliers=args.noise_multipliers, **common)
        return grp, lambda note: runs.run_groups(grp, note)
    dlg = runs.DLGStudy(
        model=args.model,
        activation=args.activation,
        noise_multipliers=args.noise_multipliers,
        secagg_clients=args.clients,
        trials=args.trials,
        run_dlg=not args.no_dlg,
        seed=args.seed,
    )
    return dlg, lambda note: runs.run_dlg(dlg, note)


def _fmt(v: float | None, nd: int = 3) -> str:
    return "∞ (no DP)" if v is None else f"{v:.{nd}g}"


def _print_table(kind: str, result: dict[str, Any]) -> None:
    rows = result["rows"]
    if "target" in result:  # pate or synth: one row per setting, every score
        print(f"{'setting':44} {'printed ε':>10} {'ε lower bound':>14}  AUC (loss, shadow, LiRA offline, online)")
        for r in rows:
            aucs = ", ".join(f"{a['auc']:.3f}" for a in r["attacks"].values())
            print(f"{r['setting']:44} {_fmt(r['printed_epsilon']):>10} {r['epsilon_lower_bound']:>14.3f}  {aucs}")
        s = result["study"]
        print(
            f"ε lower bound at confidence {s['confidence']}, δ = {s['delta']:g}; {s['shadows']} shadows, pool {s['pool']}"
        )
    elif kind in ("mia", "lira"):
        names = result["scores"]
        print(f"{'σ':>5} {'printed ε':>10} {'ε lower bound':>14}  " + "  ".join(f"{n + ' AUC':>18}" for n in names))
        for r in rows:
            aucs = "  ".join(f"{r['attacks'][n]['auc']:>18.3f}" for n in names)
            print(
                f"{r['noise_multiplier']:>5g} {_fmt(r['printed_epsilon']):>10} {r['epsilon_lower_bound']:>14.3f}  {aucs}"
            )
        s = result["study"]
        print(
            f"ε lower bound at confidence {s['confidence']}, δ = {s['delta']:g}; {s['shadows']} shadows, pool {s['pool']}"
        )
    elif kind == "inversion":
        print(f"{'σ':>5} {'printed ε':>10} {'cosine to class mean':>21} {'identified':>11} {'train acc':>10}")
        for r in rows:
            print(
                f"{r['noise_multiplier']:>5g} {_fmt(r['printed_epsilon']):>10} {r['mean_cosine_to_class_mean']:>21.3f} "
                f"{r['identified_fraction']:>11.2f} {r['train_accuracy']:>10.3f}"
            )
    elif kind == "dlg":
        print(f"{result['model']}; {result['error']}")
        print(
            f"{'defence':>8} {'σ':>6} {'ε (1 round)':>12} {'clients':>8} {'analytic':>10} {'DLG':>10} {'label':>6} {'exposed':>8}"
        )
        for r in rows:
            dl = "-" if r["dlg_error"] is None else f"{r['dlg_error']:.3g}"
            an = "-" if r["analytic_error"] is None else f"{r['analytic_error']:.3g}"
            eps = "-" if r["epsilon_one_round"] is None else f"{r['epsilon_one_round']:.3g}"
            exp = "-" if r["clients_exposed"] is None else f"{r['clients_exposed']:.2f}"
            print(
                f"{r['defence']:>8} {r['noise_multiplier']:>6g} {eps:>12} {r['clients']:>8} {an:>10} "
                f"{dl:>10} {r['label_recovered']:>6.2f} {exp:>8}"
            )
    else:
        print(
            f"{'σ':>5} {'ε':>7}  majority: {'no DP':>6} {'clip':>6} {'DP':>6}  minority: {'no DP':>6} {'clip':>6} {'DP':>6}"
        )
        for r in rows:
            cells = [r[run][g] for g in ("majority", "minority") for run in ("no_dp", "clip_only", "dp")]
            print(
                f"{r['noise_multiplier']:>5g} {r['epsilon']:>7.3g}  {'':>9} {cells[0]:>6.3f} {cells[1]:>6.3f} {cells[2]:>6.3f}"
                f"  {'':>9} {cells[3]:>6.3f} {cells[4]:>6.3f} {cells[5]:>6.3f}"
            )
        print("clip: DP-SGD's clipping and sampling without its noise")
    print(f"{result['seconds']:.1f} s")


def run_attack_cmd(args: argparse.Namespace) -> int:
    kind = args.attack_command
    show = progress_enabled(args)

    def note(message: str) -> None:
        if show:
            print(f"attack {kind}: {message}", file=sys.stderr, flush=True)

    _, run = _study(args)
    result = run(note)
    if args.plot:
        from estimator.attacks.plots import plot_attack

        plot_attack(kind, result, args.plot)
        result["plot"] = args.plot
    if args.json:
        print(json.dumps(result))
    else:
        _print_table(kind, result)
        if args.plot:
            print(f"plot: {args.plot}")
    return 0
