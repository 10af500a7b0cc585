"""The scenarios on the drift partition (:mod:`simulator.scenarios.fl.drift`): ``ldp study drift``,
``compress``, ``personalize`` and ``local-dpsgd`` (also under ``ldp fl``), their options and wiring."""

from __future__ import annotations

import argparse

from ldp_cli.commands.argtypes import bits_list, noise_multiplier_list, nonnegative, nonnegative_int, seed_list
from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import probability as _prob
from ldp_cli.commands.argtypes import seed as _seed
from ldp_cli.commands.study.common import add_no_progress, add_plot_and_json, finish, prog, round_bar

__all__ = [
    "register_drift",
    "register_compress",
    "register_personalize",
    "register_local_dpsgd",
    "run_drift_cmd",
    "run_compress_cmd",
    "run_personalize_cmd",
    "run_local_dpsgd_cmd",
]


def register_drift(ssub: argparse._SubParsersAction) -> None:
    d = ssub.add_parser(
        "drift",
        help="non-IID drift: FedAvg vs FedProx vs SCAFFOLD on a label-skewed partition",
        description="Seeded synthetic classes split by Dirichlet(0.1) label skew with per-client feature "
        "shift; FedAvg, FedProx and SCAFFOLD (and FedAvg on an IID split) on the same client schedule; "
        "test accuracy per round (see simulator/scenarios/fl/drift.py).",
    )
    d.add_argument("--rounds", type=_positive_int, default=100)
    d.add_argument("--seed", type=_seed, default=0)
    add_plot_and_json(d, "write accuracy per round per strategy to this PNG")
    d.add_argument(
        "--dp",
        action="store_true",
        help="also DP-FedAvg and DP-FTRL at equal ε (key dp; see simulator.scenarios.fl.drift.run_drift_dp)",
    )
    d.add_argument(
        "--client-clip-norm",
        "--clip-norm",
        dest="clip_norm",
        type=_positive,
        default=2.0,
        help="with --dp: DP-FedAvg's clip norm C of a client's update (default 2)",
    )
    d.add_argument(
        "--client-noise-multiplier",
        "--noise-multiplier",
        dest="noise_multiplier",
        type=_positive,
        default=3.0,
        help="with --dp: DP-FedAvg's noise multiplier z (default 3)",
    )
    d.add_argument(
        "--ddg",
        action="store_true",
        help="with --dp: also the distributed discrete Gaussian at DP-FedAvg's known-sample ε, per bit width "
        "(key ddg; see simulator.scenarios.fl.drift.compare_drift_ddg_to_central; one training run per width)",
    )
    d.add_argument(
        "--ddg-bits",
        type=bits_list,
        default=(8, 10, 12, 16),
        help="with --ddg: comma-separated bits per coordinate (default 8,10,12,16)",
    )
    add_no_progress(d)
    d.set_defaults(func=run_drift_cmd)


def run_drift_cmd(args: argparse.Namespace) -> int:
    from simulator.scenarios.fl.drift import DriftConfig, DriftDPConfig, plot_drift, report_lines, run_drift_study

    if args.ddg and not args.dp:
        raise SystemExit(f"{prog(args)}: --ddg needs --dp (it is matched to DP-FedAvg's ε)")
    dp = DriftDPConfig(args.clip_norm, args.noise_multiplier) if args.dp else None
    cfg = DriftConfig(rounds=args.rounds, seed=args.seed)
    with round_bar(args) as bar:  # every run's rounds: the plain strategies, --dp's and --ddg's
        result = run_drift_study(cfg, dp, args.ddg_bits if args.ddg else None, on_round=lambda _record: bar.update())
    return finish(args, result, plot_drift, report_lines)


def register_compress(ssub: argparse._SubParsersAction) -> None:
    d = ssub.add_parser(
        "compress",
        help="compressed uplink updates against the float32 update on the drift partition at equal ε",
        description="DP-FedAvg on the drift scenario's skewed partition with each uplink encoding (float32, "
        "b-bit quantization with unbiased or conditional rounding, rotation then quantization, count sketch, top-k "
        "with error feedback), the noise "
        "scaled to each encoding's sensitivity so that ε is equal (see simulator/scenarios/fl/compress.py).",
    )
    d.add_argument("--rounds", type=_positive_int, default=100, help="rounds (default 100)")
    d.add_argument("--seeds", type=seed_list, default=(0,), help="comma-separated seeds (default 0)")
    d.add_argument(
        "--client-clip-norm",
        "--clip-norm",
        dest="clip_norm",
        type=_positive,
        default=2.0,
        help="DP-FedAvg's clip norm C of a client's update (default 2)",
    )
    d.add_argument(
        "--client-noise-multiplier",
        "--noise-multiplier",
        dest="noise_multiplier",
        type=_positive,
        default=3.0,
        help="DP-FedAvg's noise multiplier z, relative to each encoding's sensitivity (default 3)",
    )
    add_plot_and_json(d, "write accuracy against uplink bytes (and per round) to this PNG")
    add_no_progress(d)
    d.set_defaults(func=run_compress_cmd)


def run_compress_cmd(args: argparse.Namespace) -> int:
    from simulator.scenarios.fl.compress import DEFAULT_SCHEMES, plot_compress, report_lines, run_compress
    from simulator.scenarios.fl.drift import DriftConfig, DriftDPConfig

    dp = DriftDPConfig(clip_norm=args.clip_norm, noise_multiplier=args.noise_multiplier)
    with round_bar(args, total=len(DEFAULT_SCHEMES) * len(args.seeds) * args.rounds) as bar:
        result = run_compress(DriftConfig(rounds=args.rounds), dp, seeds=args.seeds, on_round=lambda *_: bar.update())
    return finish(args, result, plot_compress, report_lines)


def register_personalize(ssub: argparse._SubParsersAction) -> None:
    d = ssub.add_parser(
        "personalize",
        help="personalization: Ditto, Per-FedAvg, MOON vs FedAvg and SCAFFOLD, per-client accuracy",
        description="The drift scenario's label-skewed partition with an MLP; FedAvg, SCAFFOLD, Ditto, "
        "Per-FedAvg (first-order) and MOON on the same client schedule, and FedAvg fine-tuned by the same "
        "few local steps as Per-FedAvg; each client is scored on its own held-out data: median, 10th "
        "percentile and worst-decile mean of per-client accuracy (see simulator/scenarios/fl/personalize.py).",
    )
    d.add_argument("--rounds", type=_positive_int, default=60, help="rounds (default 60)")
    d.add_argument("--seed", type=_seed, default=0)
    d.add_argument("--lam", type=nonnegative, default=0.1, help="Ditto's λ toward the global model (default 0.1)")
    d.add_argument(
        "--inner-lr", type=_positive, default=0.05, help="Per-FedAvg's inner step α, also at evaluation (default 0.05)"
    )
    d.add_argument(
        "--eval-steps",
        type=nonnegative_int,
        default=10,
        help="Per-FedAvg's (and fedavg_finetune's) SGD steps on the client's data before scoring (default 10)",
    )
    d.add_argument("--moon-mu", type=nonnegative, default=1.0, help="MOON's contrastive weight μ (default 1)")
    d.add_argument("--moon-tau", type=_positive, default=0.5, help="MOON's temperature τ (default 0.5)")
    add_plot_and_json(d, "write the per-client accuracy distributions (CDFs) to this PNG")
    add_no_progress(d)
    d.set_defaults(func=run_personalize_cmd)


def run_personalize_cmd(args: argparse.Namespace) -> int:
    import dataclasses

    from ldp_core.fl.personalization import DittoSpec, MoonSpec, PerFedAvgSpec
    from simulator.scenarios.fl.personalize import PersonalizeConfig, plot_personalize, report_lines, run_personalize

    base = PersonalizeConfig()
    cfg = PersonalizeConfig(
        drift=dataclasses.replace(base.drift, rounds=args.rounds, seed=args.seed),
        ditto=DittoSpec(args.lam),
        perfedavg=PerFedAvgSpec(args.inner_lr, args.eval_steps),
        moon=MoonSpec(args.moon_mu, args.moon_tau),
    )
    with round_bar(args) as bar:
        result = run_personalize(cfg, on_round=lambda _record: bar.update())
    return finish(args, result, plot_personalize, report_lines)


def register_local_dpsgd(ssub: argparse._SubParsersAction) -> None:
    d = ssub.add_parser(
        "local-dpsgd",
        help="DP-SGD on the devices under DP-FedAvg: accuracy against sample-level ε (drift partition)",
        description="The drift scenario's label-skewed partition with DP-FedAvg on (client-level DP) and the "
        "devices' local training replaced by DP-SGD (task option local_dp_sgd), one run per local noise "
        "multiplier plus plain local SGD; prints test accuracy, the sample-level ε of a device in every round "
        "and of this run's busiest device, and the client-level ε (see simulator/scenarios/fl/local_dpsgd.py).",
    )
    d.add_argument("--rounds", type=_positive_int, default=100, help="rounds (default 100)")
    d.add_argument("--seed", type=_seed, default=0)
    d.add_argument(
        "--noise-multipliers",
        type=noise_multiplier_list,
        default=(0.8, 1.5, 3.0),
        help="comma-separated local DP-SGD noise multipliers σ, one run each (default 0.8,1.5,3)",
    )
    d.add_argument("--clip", type=_positive, default=1.0, help="per-example clip norm c (default 1)")
    d.add_argument("--sample-rate", type=_prob, default=0.1, help="Poisson rate q of the local batches (default 0.1)")
    d.add_argument("--epochs", type=_positive_int, default=2, help="local epochs of round(1/q) steps (default 2)")
    d.add_argument("--client-clip-norm", type=_positive, default=2.0, help="DP-FedAvg's clip norm C (default 2)")
    d.add_argument(
        "--client-noise-multiplier", type=_positive, default=3.0, help="DP-FedAvg's noise multiplier z (default 3)"
    )
    d.add_argument("--delta", type=_prob, default=1e-5, help="δ of both ε (default 1e-5)")
    add_plot_and_json(d, "write accuracy against sample-level ε to this PNG")
    add_no_progress(d)
    d.set_defaults(func=run_local_dpsgd_cmd)


def run_local_dpsgd_cmd(args: argparse.Namespace) -> int:
    from ldp_core.fl.errors import FLError
    from simulator.scenarios.fl.drift import DriftConfig
    from simulator.scenarios.fl.local_dpsgd import LocalDPSGDConfig, plot_local_dpsgd, report_lines, run_local_dpsgd

    try:
        dp = LocalDPSGDConfig(
            noise_multipliers=args.noise_multipliers,
            clip=args.clip,
            sample_rate=args.sample_rate,
            epochs=args.epochs,
            client_clip_norm=args.client_clip_norm,
            client_noise_multiplier=args.client_noise_multiplier,
            delta=args.delta,
        )
    except FLError as exc:
        raise SystemExit(f"{prog(args)}: {exc}") from None
    with round_bar(args, total=(2 + len(dp.noise_multipliers)) * args.rounds) as bar:
        result = run_local_dpsgd(DriftConfig(rounds=args.rounds, seed=args.seed), dp, lambda *_: bar.update())
    return finish(args, result, plot_local_dpsgd, report_lines)
