"""``ldp synth``: differentially private synthetic data (:mod:`estimator.synth`, docs/SYNTH.md).

``--method mst|aim|dpgan`` reads a table (``--input FILE.csv``, every column categorical, or the project's
seeded population of ``--rows`` devices) and writes ``--rows`` synthetic records (``--out FILE.csv`` or
``.parquet``) at central (``--epsilon``, ``--delta``); ``exact-marginals``, ``gan-nodp`` and ``copy`` are the
non-private baselines. ``--method ldp-marginals`` is synthetic telemetry: every row is a device that reports
one assigned 2-way marginal at local ε = ``--epsilon`` through the real SDK, collector and shuffler (a local
stack on the embedded log), and the table is built from the estimates. ``--method all`` compares every
generator's fidelity and memorisation on the population (``--plot FILE.png``). ``--json`` prints one object:
``method``, ``epsilon``, ``delta``, ``rho`` (zCDP, marginal methods), ``rows``, ``out`` and per method its
details; with ``all``, ``generators`` (one row of figures each) and ``reference``. ``--budget-session FILE
--partner NAME``: the run debited (kind ``synth``, :mod:`estimator.synth.budget`) before the table is
synthesised, ``budget`` in the JSON; exit 3 when the ledger refuses.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ldp_cli.commands.argtypes import open_unit as _open_unit
from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import seed as _seed
from ldp_cli.commands.budget import add_budget_flags, report_refusal
from ldp_cli.progress import add_progress_flags

__all__ = ["register", "run_synth_cmd"]

METHODS = ("mst", "aim", "dpgan", "ldp-marginals", "exact-marginals", "gan-nodp", "copy", "all")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "synth",
        help="differentially private synthetic data: MST, AIM, DP-GAN, and synthetic telemetry from LDP marginals",
        description="Synthetic records from a model of noisy statistics. mst/aim: marginals measured with "
        "Gaussian noise, a graphical model fitted by mbi (zCDP, printed as (ε, δ) per record); dpgan: DP-SGD on "
        "the discriminator only (ε per record by the DP-SGD accountant); ldp-marginals: each device reports one "
        "random 2-way marginal under local ε through the SDK, collector and shuffler. See docs/SYNTH.md.",
    )
    p.add_argument("--method", required=True, choices=METHODS)
    p.add_argument(
        "--epsilon",
        type=_positive,
        default=1.0,
        help="ε (central for mst/aim/dpgan; per device report for ldp-marginals; default 1)",
    )
    p.add_argument("--delta", type=_open_unit, default=1e-6, help="δ of the central (ε, δ) (default 1e-6)")
    p.add_argument(
        "--rows",
        type=_positive_int,
        default=None,
        help="synthetic records (default: as many as the input); with no --input also the population's size (default 3000)",
    )
    p.add_argument(
        "--input", default=None, help="a CSV table (every column categorical; default: the project's seeded population)"
    )
    p.add_argument("--out", default=None, help="write the synthetic table to this .csv or .parquet file")
    p.add_argument(
        "--degree", type=_positive_int, default=3, help="AIM's workload: every DEGREE-way marginal (default 3)"
    )
    p.add_argument("--steps", type=_positive_int, default=1500, help="DP-GAN training steps (default 1500)")
    p.add_argument(
        "--mechanism", choices=["oue", "olh"], default="oue", help="ldp-marginals' frequency oracle (default oue)"
    )
    p.add_argument(
        "--sdk-devices", type=int, default=20, help="ldp-marginals: devices that are real SDK clients (default 20)"
    )
    p.add_argument(
        "--ldp-epsilon", type=_positive, default=None, help="all: the local ε of ldp-marginals (default --epsilon)"
    )
    p.add_argument(
        "--seed", type=_seed, default=None, help="seed of the population and of every random step (default: OS entropy)"
    )
    p.add_argument("--plot", default=None, help="all: write the comparison to this PNG")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_budget_flags(p)  # mst/aim/dpgan/ldp-marginals: debited as kind "synth" before the table is read
    add_progress_flags(p)
    p.set_defaults(func=run_synth_cmd)


def _table(args: argparse.Namespace) -> Any:
    from estimator.synth.data import population

    if args.input is None:
        return population(args.rows or 3000, args.seed if args.seed is not None else 0)
    from estimator.synth.io import read_csv

    return read_csv(args.input)


def run_synth_cmd(args: argparse.Namespace) -> int:
    from estimator.accounting.ledger import LedgerRefusal

    try:
        return _run(args)
    except LedgerRefusal as exc:
        return report_refusal(args, exc)


def _run(args: argparse.Namespace) -> int:
    import numpy as np

    from ldp_cli.progress import lines

    say = lines(args, "synth")
    if args.method == "all":
        if args.budget_session:
            raise ValueError("--method all compares several runs, private and not: it cannot be debited to a session")
        from estimator.synth.evaluate import plot
        from simulator.synth_study import compare

        result: dict[str, Any] = compare(
            args.rows or 3000,
            args.epsilon,
            args.delta,
            args.seed if args.seed is not None else 0,
            aim_degree=args.degree,
            gan_steps=args.steps,
            ldp_epsilon=args.ldp_epsilon,
            progress=say,
        )
        if args.plot:
            plot(result["generators"], result["reference"], args.plot)
            result["plot"] = args.plot
        return _print(args, result)
    table = _table(args)
    from ldp_core.randomness import secure_generator

    # without --seed the noise, selections and samples come from the OS CSPRNG
    rng = secure_generator() if args.seed is None else np.random.default_rng(args.seed)
    if args.method == "ldp-marginals":
        from estimator.synth.budget import debit_synth
        from simulator.synth_study import telemetry_table

        debit = debit_synth(args.budget_session, args.partner, args.method, args.epsilon, args.delta, table.rows)

        syn, info = telemetry_table(
            table,
            args.epsilon,
            rng,
            rows=args.rows,
            mechanism=args.mechanism,
            sdk_clients=args.sdk_devices,
            progress=say,
        )
        info["budget"] = debit
    else:
        from estimator.synth.runner import generate

        syn, info = generate(
            args.method,
            table,
            args.epsilon,
            args.delta,
            rng,
            rows=args.rows,
            progress=say,
            aim_degree=args.degree,
            gan_steps=args.steps,
            budget_session=args.budget_session,
            partner=args.partner,
        )
    if args.out:
        from estimator.synth.io import write_table

        write_table(syn, args.out)
    info["out"] = args.out
    info["seeded"] = args.seed is not None
    info["randomness"] = "seeded" if args.seed is not None else "os_csprng"
    info["seed_warning"] = (
        "a seeded run's ε does not hold against anyone who knows the seed" if args.seed is not None else None
    )
    return _print(args, info)


def _print(args: argparse.Namespace, result: dict[str, Any]) -> int:
    if args.json:
        print(json.dumps(result))
        return 0
    if "generators" in result:
        print(
            f"{'generator':16} {'privacy':8} {'ε':>6} {'TV1':>6} {'TV2':>6} {'TV3':>6} {'acc':>6} {'copies':>7} {'planted':>7}"
        )
        for r in result["generators"]:
            eps = "-" if r["epsilon"] is None else f"{r['epsilon']:.2f}"
            print(
                f"{r['generator']:16} {r['privacy']:8} {eps:>6} {r['tv_1way']:6.3f} {r['tv_2way']:6.3f} {r['tv_3way']:6.3f} "
                f"{r['accuracy_synthetic_to_real']:6.3f} {r['exact_copy_share']:7.3f} {r['planted_found']:>4}/{r['planted']}"
            )
        ref = result["reference"]
        print(
            f"real vs real: TV2 {ref['tv_2way']:.3f}, accuracy {ref['accuracy_real_to_real']:.3f}, "
            f"unseen records' copy share {ref['holdout_exact_copy_share']:.3f}"
        )
        return 0
    for k, v in result.items():
        if k not in ("consistency", "seed_warning"):
            print(f"{k}: {v}")
    if result.get("seed_warning"):
        print(f"warning: {result['seed_warning']}.")
    return 0
