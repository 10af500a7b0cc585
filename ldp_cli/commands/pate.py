"""``ldp pate``: PATE end to end on ``load_digits`` (:mod:`estimator.pate.experiment`).

Teachers trained on disjoint partitions of the sensitive digits label public inputs through GNMax, LNMax
and Confident-GNMax; the student is trained on the answered ones. Prints the teachers, the queries asked
and answered, the student's accuracy and ε (data-independent and data-dependent) for each setting (the
accuracy–ε table; ``--plot FILE`` draws it), the semi-private student against DP-SGD at the same ε, and
with ``--federated`` the teachers' votes summed through SecAgg. ``--json``: one object (``teachers``,
``queries``, ``answered``, ``student_accuracy``, ``epsilon``, ``epsilon_data_dependent``, ``tradeoff``,
``confident_vs_gnmax``, ``dpsgd_same_epsilon``, ``secagg``, ``budget``, ...). ``--budget-session FILE
--partner NAME``: every setting's planned queries debited (kind ``pate``) before the teachers train; exit 3
when the ledger refuses (:mod:`estimator.pate.budget`). Needs scikit-learn (the ``ml`` extra).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import probability as _prob
from ldp_cli.commands.argtypes import seed as _seed
from ldp_cli.commands.budget import add_budget_flags, report_refusal
from ldp_cli.commands.pate_modes import add_extra_flags, run_extra
from ldp_cli.progress import add_progress_flags, lines

__all__ = ["register", "run_pate_cmd"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "pate",
        help="PATE on load_digits: teachers, noisy labels, the student, accuracy against ε",
        description="PATE (Papernot et al. 2017, 2018) on scikit-learn's load_digits, offline: teachers on "
        "disjoint partitions of the sensitive part, GNMax / LNMax / Confident-GNMax labels for public inputs, "
        "the student trained on them; ε data-independent and data-dependent per setting; the semi-private "
        "student against DP-SGD at the same ε. See docs/PATE.md.",
    )
    p.add_argument(
        "--data",
        choices=["digits", "synthetic"],
        default="digits",
        help="digits: scikit-learn's load_digits (1,797 images; 25 teachers); synthetic: a generated 10-class "
        "task of 29,000 rows (make_classification) at the papers' scale, 250 teachers (default digits)",
    )
    p.add_argument("--teachers", type=_positive_int, default=None, help="number of teachers (default: the data's)")
    p.add_argument("--delta", type=_prob, default=1e-5, help="δ of every ε (default 1e-5)")
    p.add_argument(
        "--seed",
        type=_seed,
        default=None,
        help="seed of the split, teachers, noise and student, for a reproducible study (default: none; the noise "
        "from the OS CSPRNG). A seeded run's ε does not hold against anyone who knows the seed",
    )
    p.add_argument(
        "--setting",
        type=_positive_int,
        action="append",
        default=None,
        metavar="N",
        help="run only row N of the data's trade-off table (1-based, repeatable; docs/PATE.md): a release, or a "
        "debit to --budget-session, of that setting alone (default: every row)",
    )
    p.add_argument("--no-dpsgd", action="store_true", help="skip the DP-SGD comparison")
    p.add_argument(
        "--federated",
        nargs="?",
        const="inprocess",
        default=None,
        choices=["inprocess", "http"],
        help="sum the teachers' votes with SecAgg (teachers as devices); alone or 'inprocess': in this process, "
        "beside the study; 'http': a PATE task over the FL pipeline (collector, aggregation job and one device "
        "per teacher over HTTP on 127.0.0.1), its labels and student only (docs/PATE.md)",
    )
    add_extra_flags(p)
    p.add_argument("--plot", default=None, metavar="FILE", help="write student accuracy against ε to this PNG")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_budget_flags(p)  # the planned queries of every setting, debited as kind "pate" before teachers train
    add_progress_flags(p)
    p.set_defaults(func=run_pate_cmd)


def _f(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def _table(result: dict[str, Any]) -> list[str]:
    out = [
        f"{'setting':44s} {'asked':>5s} {'answered':>8s} {'labels ok':>9s} {'student':>7s} {'ε':>7s} {'ε data-dep':>10s}"
    ]
    for r in result["tradeoff"]:
        out.append(
            f"{r['setting']:44s} {r['queries']:5d} {r['answered']:8d} {_f(r['label_accuracy']):>9s} "
            f"{_f(r['student_accuracy']):>7s} {_f(r['epsilon'], '.2f'):>7s} {_f(r['epsilon_data_dependent'], '.2f'):>10s}"
        )
    return out


def _head(result: dict[str, Any]) -> list[str]:
    tail = (
        f"{result['public_examples']} public inputs, {result['test_examples']} test examples; δ = {result['delta']:g}"
    )
    b = result["budget"]
    if b is not None:
        cost = ", ".join(f"{u} {v:.6g}" for u, v in b["cost"].items())
        return [
            f"{result['data']}: {result['teachers']} teachers on {result['sensitive_examples']} sensitive examples; {tail}",
            f"debited to {b['partner']} in {b['session']} before the teachers trained (kind pate, the planned "
            f"queries of every setting): {cost}; withheld (not paid for): {', '.join(b['withheld'])}",
        ]
    return [
        f"{result['data']}: {result['teachers']} teachers on {result['sensitive_examples']} sensitive examples "
        f"(each {result['teacher_sizes']['min']}–{result['teacher_sizes']['max']} examples, mean test accuracy "
        f"{result['teacher_accuracy_mean']:.3f}; the noise-free ensemble {result['ensemble_accuracy']:.3f}); {tail}"
    ]


def _settings(args: argparse.Namespace) -> Any:
    """The rows ``--setting`` picks from the data's table, or None for every row."""
    if not args.setting:
        return None
    from estimator.pate.experiment import CONFIGS

    table = CONFIGS[args.data]
    bad = [n for n in args.setting if n > len(table)]
    if bad:
        raise ValueError(f"--setting {bad[0]}: the {args.data} table has rows 1 to {len(table)}")
    return tuple(table[n - 1] for n in dict.fromkeys(args.setting))


def run_pate_cmd(args: argparse.Namespace) -> int:
    extra = run_extra(args)  # --federated http, --sweep
    if extra is not None:
        return extra
    if args.federated and args.teachers is not None and args.teachers < 3:
        raise ValueError("--federated needs at least 3 teachers (secure aggregation)")
    from estimator.accounting.ledger import LedgerRefusal
    from estimator.pate.experiment import plot_tradeoff, run_pate

    say = lines(args, "pate")
    configs = _settings(args)
    try:
        result = run_pate(
            args.seed,
            args.teachers,
            args.delta,
            compare_dpsgd=not args.no_dpsgd,
            progress=say,
            federated=args.federated is not None,
            data_name=args.data,
            budget_session=args.budget_session,
            partner=args.partner,
            configs=configs,
        )
    except LedgerRefusal as exc:
        return report_refusal(args, exc)
    if args.plot:
        plot_tradeoff(result, args.plot)
        result["plot"] = args.plot
    if args.json:
        print(json.dumps(result))
        return 0
    text = [*_head(result), *_table(result)]
    if result["non_private_accuracy"] is not None:
        text.append(f"non-private model on the sensitive data: {result['non_private_accuracy']:.3f}")
    for other in ("gnmax", "lnmax"):
        for c in result[f"confident_vs_{other}"]:
            text.append(
                f"{c['confident']} vs {c[other]} (nearest student accuracy, {c['student_accuracy'][1]:.3f} vs "
                f"{c['student_accuracy'][0]:.3f}): answered {c['answered'][1]} vs {c['answered'][0]}, ε "
                f"{c['epsilon'][1]:.2f} vs {c['epsilon'][0]:.2f}, data-dependent {_f(c['epsilon_dd'][1], '.2f')} "
                f"vs {_f(c['epsilon_dd'][0], '.2f')}"
            )
    d = result.get("dpsgd_same_epsilon")
    if d:
        text.append(
            f"semi-private student {result['student_accuracy']:.3f} vs DP-SGD on the sensitive data at the same "
            f"ε = {d['epsilon']:.2f}: {d['accuracy']:.3f} (noise multiplier {d['noise_multiplier']:.3f})"
        )
    if result["secagg"]:
        s = result["secagg"]
        text.append(
            f"SecAgg: {s['teachers']} teachers' votes summed, equal to the plain sum: {s['equal_to_plain_sum']}"
        )
        dn = s["distributed_noise"]
        text.append(
            f"SecAgg with the GNMax noise added by the teachers (σ = {dn['sigma']:.3g}, {dn['queries']} queries): "
            f"labels {dn['label_accuracy']:.3f}, student {dn['student_accuracy']:.3f}, ε against everyone including "
            f"the server {dn['epsilon']:.2f} (central noise: {dn['epsilon_central_noise']:.2f})"
        )
    text.append(f"protects: {result['protects']}")
    if result["seed_warning"]:
        text.append(f"warning: {result['seed_warning']}")
    if args.plot:
        text.append(f"plot: {args.plot}")
    print("\n".join(text))
    return 0
