"""``ldp fl``: federated-learning scenarios.

* ``job``: the aggregation job of one task over the pipeline (:mod:`estimator.fl.job`);
  prints ``ldp fl job: running`` once it serves a round and its JSON status when it stops.
* ``clinics``: 20 synthetic clinics, logistic regression, FedAvg without DP and
  with clipping 0.5 and noise multipliers 0 / 0.5 / 2.0; test accuracy, the
  client-level ε each setting gives and the noise needed for ε = 1, 3, 8
  (``--json``: one object, see :func:`simulator.scenarios.fl.clinics.run_clinics`).
* ``drift``: FedAvg, FedProx and SCAFFOLD on a label-skewed, feature-shifted
  partition, test accuracy per round (:func:`simulator.scenarios.fl.drift.run_drift`).
* ``personalize``: Ditto, Per-FedAvg and MOON against FedAvg and SCAFFOLD on the drift
  partition, each client scored on its own test data: median and worst decile
  (:func:`simulator.scenarios.fl.personalize.run_personalize`).
* ``local-dpsgd``: the drift partition under DP-FedAvg with DP-SGD on the devices, one run per
  local noise multiplier: test accuracy against the devices' sample-level ε
  (:func:`simulator.scenarios.fl.local_dpsgd.run_local_dpsgd`).
* ``attack``: membership inference by loss threshold with and without client-level
  DP (advantage, interval, DP bounds) and gradient inversion of one client's update
  in the clear, under central DP and under secure aggregation
  (:func:`simulator.scenarios.fl.attacks.run_attacks`).
* ``compress``: compressed uplink updates (quantization, rotation, count sketch, top-k with error
  feedback) against the float32 update on the drift partition at equal ε: uplink bytes per device,
  final accuracy, ε (:func:`simulator.scenarios.fl.compress.run_compress`).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from ldp_cli.commands.argtypes import positive as _positive
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import probability as _prob
from ldp_cli.commands.argtypes import seed as _seed
from ldp_cli.options import add_group, add_member, add_session_timeout, add_transport, stop_event

__all__ = ["register"]


def _plot_and_json(
    args: argparse.Namespace, result: dict[str, Any], plot: Callable[[dict[str, Any], str], None]
) -> bool:
    """Write ``--plot`` (and name it in the result); with ``--json`` print the result and return True."""
    if args.plot:
        plot(result, args.plot)
        result["plot"] = args.plot
    if args.json:
        print(json.dumps(result))
    return bool(args.json)


def _add_plot_and_json(p: argparse.ArgumentParser, plot_help: str) -> None:
    """The scenarios' ``--plot PNG`` and ``--json`` flags (read by :func:`_plot_and_json`)."""
    p.add_argument("--plot", default=None, help=plot_help)
    p.add_argument("--json", action="store_true", help="print one JSON object")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fl",
        help="federated-learning scenarios with client-level DP",
        description="Federated-learning scenarios that reproduce published set-ups on seeded synthetic data.",
    )
    fsub = p.add_subparsers(dest="scenario", required=True)
    c = fsub.add_parser(
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
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=run_clinics_cmd)
    j = fsub.add_parser(
        "job",
        help="run a federated task's aggregation job over the pipeline",
        description="The aggregation job (estimator/fl/job.py): publishes rounds to the rounds topic, "
        "consumes device uploads from the updates topic (through `ldp collector --fl`), aggregates "
        "with client-level DP, robust aggregators or optional secure aggregation, "
        "and resumes exactly where it stopped after a crash.",
    )
    j.add_argument("--task", required=True, help="the task file (JSON of estimator.fl.job.FLTaskSpec)")
    add_transport(j)
    add_group(j, None, shown="ldp-fl-<task>")
    add_member(j, "fl-job-0", "member name; keep it across restarts")
    j.add_argument("--rounds-topic", default=None)
    j.add_argument("--updates-topic", default=None)
    j.add_argument("--state-topic", default=None)
    j.add_argument("--status-file", default=None, help="write the JSON status here (atomically, as it changes)")
    j.add_argument(
        "--checkpoint-interval",
        type=float,
        default=1.0,
        help="seconds between mid-phase checkpoints while uploads arrive (default 1)",
    )
    add_session_timeout(j, help=None)
    j.add_argument(
        "--max-record-bytes",
        type=_positive_int,
        default=900_000,
        help="largest record the job writes; checkpoints and round states are split into chunks "
        "of at most this size (default 900000, under Kafka's common 1 MB message.max.bytes)",
    )
    j.add_argument("--keep-running", action="store_true", help="do not exit after the last round")
    j.set_defaults(func=run_job_cmd)
    e = fsub.add_parser(
        "enroll",
        help="create the enrollment authority key, or mint device credentials with it",
        description="Device enrollment (ldp_core/tokens/enrollment.py): --init-authority writes a new Ed25519 "
        "authority key file (mode 0600); with --device-id, mints a signing key and an authority-signed "
        "credential per device into --out (one bundle per device, mode 0600). For tests, the demo and "
        "operators without an attestation service; in production the device makes its own key and only "
        "its public key is certified (EnrollmentAuthority.certify).",
    )
    e.add_argument("--authority", required=True, help="the authority key file")
    e.add_argument("--init-authority", action="store_true", help="create the authority key file (refuses to overwrite)")
    e.add_argument("--device-id", action="append", default=[], help="a device id to enroll (repeatable)")
    e.add_argument("--out", default=None, help="folder for the device bundles (<device-id>.json)")
    e.add_argument("--lifetime-days", type=_positive_int, default=365, help="credential lifetime (default 365)")
    e.set_defaults(func=run_enroll_cmd)
    g = fsub.add_parser(
        "sign-task",
        help="put the authority's key and signature into a task file",
        description="Sets enrollment_key and task_signature (the authority's signature of the task's "
        "security configuration: name, secagg, secagg_threshold, enrollment key) in the task file; "
        "devices refuse SecAgg rounds whose configuration is not signed.",
    )
    g.add_argument("--authority", required=True, help="the authority key file")
    g.add_argument("--task", required=True, help="the task file (rewritten in place unless --out)")
    g.add_argument("--out", default=None)
    g.set_defaults(func=run_sign_task_cmd)
    _register_drift(fsub)
    _register_compress(fsub)
    _register_personalize(fsub)
    _register_attack(fsub)
    _register_local_dpsgd(fsub)


def _fmt_eps(e: float | None) -> str:
    return "—" if e is None else f"{e:.4g}"


def run_clinics_example_cmd(args: argparse.Namespace) -> int:
    from simulator.scenarios.fl.clinics import run_example

    fixed = {"--rounds": args.rounds, "--sample-rate": args.sample_rate, "--seed": args.seed, "--plot": args.plot}
    given = [k for k, v in fixed.items() if v is not None] + (["--no-noise-search"] if args.no_noise_search else [])
    if given:
        raise SystemExit(f"ldp fl clinics --example: the example is fixed; drop {', '.join(given)}")
    result = run_example()
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"the user's example: default_rng(9), {result['clinics']} clinics, {result['rounds']} rounds, "
        f"{result['sampling']['count']} of {result['clinics']} per round without replacement, "
        f"δ = {result['delta']:g}, neighbours: {result['neighbors']}"
    )
    print(
        f"{'setting':<14} {'accuracy':>9} {'weight err':>11} {'ε observers':>12} {'ε knows sample':>15} "
        f"{'ε this sample':>14} {'ε server operator':>18}"
    )
    for r in result["rows"]:
        operator = r.get("epsilon_server_operator")
        op = "none" if operator is None and r["epsilon"] is not None else _fmt_eps(operator)
        print(
            f"{r['setting']:<14} {r['accuracy']:>9.3f} {r['weight_error']:>11.3f} {_fmt_eps(r['epsilon']):>12} "
            f"{_fmt_eps(r['epsilon_known_sample']):>15} {_fmt_eps(r['epsilon_known_sample_realized']):>14} "
            f"{op:>18}"
        )
    print(
        "ε observers: against anyone who sees the models but not the sample (the smaller of dp_accounting's "
        "RDP bound for sampling without replacement and the unamplified exact bound"
        + (
            "; here RDP's bound is the larger, so amplification is not credited"
            if all(r["epsilon"] is None or r["epsilon"] >= r["epsilon_known_sample"] for r in result["rows"])
            else ""
        )
        + "). ε knows sample: against anyone who knows the sample and sees only the models (no "
        "amplification, a clinic may be in every round). ε this sample: the same for this run's sample (its "
        "most-sampled clinic's rounds). The server operator: none, the noise is central (added after the "
        "server averaged the clipped updates), except for distributed DG, whose devices add discrete Gaussian "
        "shares before secure aggregation (Kairouz, Liu, Steinke 2021; its bits per coordinate in the JSON): "
        "one figure for every adversary, no amplification credited. No noise: ε is infinite (— in the table, "
        "null in JSON)."
    )
    ftrl = next((r for r in result["rows"] if r["setting"] == "DP-FTRL"), None)
    if ftrl is not None:
        print(
            f"DP-FTRL: tree-aggregated noise (z = {ftrl['noise_multiplier']:.3g} per node, a tree every "
            f"{ftrl['restart_every']} rounds, each clinic once per tree), no sampling assumed: its ε is the same "
            "for observers and for whoever knows the sample, matched to σ 2.0's ε knows sample."
        )
    return 0


def run_clinics_cmd(args: argparse.Namespace) -> int:
    from simulator.scenarios.fl.clinics import ClinicsConfig, plot_accuracy, run_clinics

    if args.example:
        return run_clinics_example_cmd(args)
    cfg = ClinicsConfig(
        rounds=100 if args.rounds is None else args.rounds,
        sample_rate=0.5 if args.sample_rate is None else args.sample_rate,
        seed=0 if args.seed is None else args.seed,
    )
    result = run_clinics(cfg, noise_for_targets=not args.no_noise_search)
    if _plot_and_json(args, result, plot_accuracy):
        return 0
    print(
        f"clinics: {result['clinics']} clinics, {result['rounds']} rounds, Poisson q = {cfg.sample_rate} "
        f"(mean {cfg.sample_rate * cfg.clinics:g} per round), δ = {cfg.delta:g}; {result['data']}"
    )
    print(
        f"{'setting':<22} {'clip':>6} {'σ':>6} {'accuracy':>9} {'client-level ε':>15} {'ε knows sample':>15} "
        f"{'ε server operator':>18}"
    )

    def eps_s(e: Any) -> str:
        return "—" if e is None else e if isinstance(e, str) else f"{e:.4g}"

    for s in result["settings"]:
        clip = "—" if s["clip_norm"] is None else f"{s['clip_norm']:g}"
        sig = "—" if s["noise_multiplier"] is None else f"{s['noise_multiplier']:g}"
        operator = "—" if s["epsilon_by_adversary"] is None else "none"
        print(
            f"{s['name']:<22} {clip:>6} {sig:>6} {s['test_accuracy']:>9.4f} {eps_s(s['epsilon_observers']):>15} "
            f"{eps_s(s['epsilon_known_sample']):>15} {operator:>18}"
        )
    for e, z in result.get("noise_for_epsilon", {}).items():
        print(
            f"noise multiplier for ε = {e} over {result['rounds']} rounds at q = {cfg.sample_rate}: {z:.3f} "
            f"(test accuracy {result['accuracy_at_target_epsilon'][e]:.4f})"
        )
    print(
        "ε protects whether one clinic took part (all its patients). client-level ε: against observers who "
        "see every model but not the Poisson sample (amplification by sampling credited). ε knows sample: "
        "against anyone who knows the sample and sees only the models (no amplification). ε server "
        "operator: none, the server adds the noise (central DP) after seeing every clipped update. "
        "—: no clipping, no DP accounting."
    )
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def _register_drift(fsub: argparse._SubParsersAction) -> None:
    d = fsub.add_parser(
        "drift",
        help="non-IID drift: FedAvg vs FedProx vs SCAFFOLD on a label-skewed partition",
        description="Seeded synthetic classes split by Dirichlet(0.1) label skew with per-client feature "
        "shift; FedAvg, FedProx and SCAFFOLD (and FedAvg on an IID split) on the same client schedule; "
        "test accuracy per round (see simulator/scenarios/fl/drift.py).",
    )
    d.add_argument("--rounds", type=_positive_int, default=100)
    d.add_argument("--seed", type=_seed, default=0)
    _add_plot_and_json(d, "write accuracy per round per strategy to this PNG")
    d.add_argument(
        "--dp",
        action="store_true",
        help="also DP-FedAvg and DP-FTRL at equal ε (key dp; see simulator.scenarios.fl.drift.run_drift_dp)",
    )
    d.add_argument("--clip-norm", type=_positive, default=2.0, help="with --dp: clip norm C (default 2)")
    d.add_argument(
        "--noise-multiplier", type=_positive, default=3.0, help="with --dp: DP-FedAvg's noise multiplier (default 3)"
    )
    d.add_argument(
        "--ddg",
        action="store_true",
        help="with --dp: also the distributed discrete Gaussian at DP-FedAvg's known-sample ε, per bit width "
        "(key ddg; see simulator.scenarios.fl.drift.compare_drift_ddg_to_central; one training run per width)",
    )
    d.add_argument(
        "--ddg-bits",
        type=_bits_list,
        default=(8, 10, 12, 16),
        help="with --ddg: comma-separated bits per coordinate (default 8,10,12,16)",
    )
    d.set_defaults(func=run_drift_cmd)


def _seed_list(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated seeds, got {text!r}") from None
    if not out or any(v < 0 for v in out):
        raise argparse.ArgumentTypeError(f"seeds must be integers >= 0, got {text!r}")
    return out


def _register_compress(fsub: argparse._SubParsersAction) -> None:
    d = fsub.add_parser(
        "compress",
        help="compressed uplink updates against the float32 update on the drift partition at equal ε",
        description="DP-FedAvg on the drift scenario's skewed partition with each uplink encoding (float32, "
        "b-bit quantization with unbiased or conditional rounding, rotation then quantization, count sketch, top-k "
        "with error feedback), the noise "
        "scaled to each encoding's sensitivity so that ε is equal (see simulator/scenarios/fl/compress.py).",
    )
    d.add_argument("--rounds", type=_positive_int, default=100, help="rounds (default 100)")
    d.add_argument("--seeds", type=_seed_list, default=(0,), help="comma-separated seeds (default 0)")
    d.add_argument("--clip-norm", type=_positive, default=2.0, help="clip norm C (default 2)")
    d.add_argument("--noise-multiplier", type=_positive, default=3.0, help="σ relative to each sensitivity (default 3)")
    _add_plot_and_json(d, "write accuracy against uplink bytes (and per round) to this PNG")
    d.set_defaults(func=run_compress_cmd)


def run_compress_cmd(args: argparse.Namespace) -> int:
    from simulator.scenarios.fl.compress import plot_compress, run_compress
    from simulator.scenarios.fl.drift import DriftConfig, DriftDPConfig

    cfg = DriftConfig(rounds=args.rounds)
    dp = DriftDPConfig(clip_norm=args.clip_norm, noise_multiplier=args.noise_multiplier)
    result = run_compress(cfg, dp, seeds=args.seeds)
    if _plot_and_json(args, result, plot_compress):
        return 0
    print(
        f"compress: drift partition, {result['rounds']} rounds, seeds {result['seeds']}, "
        f"ε = {result['epsilon']:.2f} (δ = {result['delta']:g}) for every scheme"
    )
    for r in result["schemes"]:
        print(
            f"  {r['scheme']:<22} {r['uplink_bytes']:>5} B  sensitivity {r['sensitivity']:.2f}  accuracy {r['final_accuracy']:.3f}"
        )
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def _bits_list(text: str) -> tuple[int, ...]:
    try:
        out = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not out or any(not 2 <= b <= 32 for b in out):
        raise argparse.ArgumentTypeError(f"bits per coordinate must be in [2, 32], got {text!r}")
    return out


def run_drift_cmd(args: argparse.Namespace) -> int:
    from simulator.scenarios.fl.drift import (
        DriftConfig,
        DriftDPConfig,
        compare_drift_ddg_to_central,
        plot_drift,
        run_drift,
        run_drift_dp,
    )

    if args.ddg and not args.dp:
        raise SystemExit("ldp fl drift: --ddg needs --dp (it is matched to DP-FedAvg's ε)")
    cfg = DriftConfig(rounds=args.rounds, seed=args.seed)
    result = run_drift(cfg)
    if args.dp:
        dp_cfg = DriftDPConfig(args.clip_norm, args.noise_multiplier)
        result["dp"] = run_drift_dp(cfg, dp_cfg)
        if args.ddg:
            result["ddg"] = compare_drift_ddg_to_central(cfg, dp_cfg, args.ddg_bits, (args.seed,))
    if _plot_and_json(args, result, plot_drift):
        return 0
    p, t = result["partition"], result["training"]
    print(
        f"drift: {result['clients']} clients ({result['clients_per_round']} per round), {result['rounds']} rounds, "
        f"{result['model']}; Dirichlet α = {p['alpha']:g} (majority class share {p['majority_class_share_mean']:.2f}), "
        f"feature shift {p['feature_shift']:g}; {t['local_steps_mean']:.0f} local steps on average; {result['data']}"
    )
    print(f"{'strategy':<16} {'final':>7} {'best':>7} {'round':>6} {'mean last 10':>13}")
    for r in result["strategies"]:
        print(
            f"{r['name']:<16} {r['final_accuracy']:>7.4f} {r['best_accuracy']:>7.4f} {r['best_round']:>6} "
            f"{r['mean_accuracy_last_10']:>13.4f}"
        )
    print(f"expected: {result['expectation']}")
    if args.dp:
        dp = result["dp"]
        print(
            f"client-level DP (clip {dp['clip_norm']:g}, δ = {dp['delta']:g}, {dp['neighbors']}); "
            f"server operator: {dp['server_operator']}"
        )
        print(f"{'run':<32} {'z':>6} {'ε':>8} {'final':>7} {'mean last 10':>13}")
        for r in dp["runs"]:
            eps = r.get("epsilon", r.get("epsilon_known_sample"))
            print(
                f"{r['name']:<32} {r['noise_multiplier']:>6.3f} {eps:>8.2f} {r['final_accuracy']:>7.4f} "
                f"{r['mean_accuracy_last_10']:>13.4f}"
            )
        print(
            f"dp_fedavg's ε: {dp['runs'][0]['epsilon_known_sample']:.2f} against whoever knows the sample, "
            f"{dp['runs'][0]['epsilon_observers']:.2f} against observers who do not; DP-FTRL's holds for both."
        )
    if args.ddg:
        ddg = result["ddg"]
        print(f"distributed DG at ε = {ddg['target_epsilon']:.2f} (central's, against whoever knows the sample):")
        for r in ddg["rows"]:
            if r.get("infeasible"):
                print(
                    f"  {r['bits']:>2} bits: infeasible (the rounding floor exceeds the ε, or too few bits for m clients)"
                )
                continue
            label = "central" if r["bits"] is None else f"{r['bits']:>2} bits"
            print(
                f"  {label:<8} z {r['noise_multiplier']:.3f}  operator: {'yes' if r['holds_against_operator'] else 'no'}"
                f"  final {r['final_accuracy_mean']:.4f}  mean last 10 {r['mean_accuracy_last_10_mean']:.4f}"
            )
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def _float_list(text: str) -> tuple[float, ...]:
    try:
        out = tuple(float(t) for t in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not out or any(not (0 < z < float("inf")) for z in out):
        raise argparse.ArgumentTypeError(f"noise multipliers must be finite numbers > 0, got {text!r}")
    return out


def _register_local_dpsgd(fsub: argparse._SubParsersAction) -> None:
    d = fsub.add_parser(
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
        type=_float_list,
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
    _add_plot_and_json(d, "write accuracy against sample-level ε to this PNG")
    d.set_defaults(func=run_local_dpsgd_cmd)


def run_local_dpsgd_cmd(args: argparse.Namespace) -> int:
    from ldp_core.fl.errors import FLError
    from simulator.scenarios.fl.drift import DriftConfig
    from simulator.scenarios.fl.local_dpsgd import LocalDPSGDConfig, plot_local_dpsgd, run_local_dpsgd

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
        raise SystemExit(f"ldp fl local-dpsgd: {exc}") from None
    result = run_local_dpsgd(DriftConfig(rounds=args.rounds, seed=args.seed), dp)
    if _plot_and_json(args, result, plot_local_dpsgd):
        return 0
    cl, ld = result["client_level"], result["local_dp_sgd"]
    print(
        f"local-dpsgd: {result['clients']} clients ({result['clients_per_round']} per round), {result['rounds']} "
        f"rounds, {result['model']}; rounds joined per device {result['rounds_joined']['min']}-"
        f"{result['rounds_joined']['max']} (median {result['rounds_joined']['median']:g})"
    )
    print(
        f"client-level DP: C = {cl['clip_norm']:g}, z = {cl['noise_multiplier']:g}, ε = "
        f"{cl['epsilon_known_sample']:.2f} (knows the sample) / {cl['epsilon_observers']:.2f} (observers) at "
        f"δ = {cl['delta']:g}: {cl['protects']}"
    )
    print(
        f"sample-level DP: c = {ld['clip']:g}, q = {ld['sample_rate']:g}, {ld['steps_per_round']} steps per round, "
        f"η = {ld['learning_rate']:g}, δ = {ld['delta']:g}: {ld['protects']}"
    )
    print(f"{'run':<24} {'σ':>5} {'ε/round':>8} {'ε all':>8} {'ε busiest':>10} {'final':>7} {'last 10':>8}")
    for r in result["runs"]:
        if not r["noise_multiplier"]:
            print(
                f"{r['name']:<24} {'-':>5} {'-':>8} {'-':>8} {'-':>10} {r['final_accuracy']:>7.4f} "
                f"{r['mean_accuracy_last_10']:>8.4f}"
            )
            continue
        print(
            f"{r['name']:<24} {r['noise_multiplier']:>5g} {r['epsilon_per_round']:>8.2f} "
            f"{r['epsilon_worst_case']:>8.2f} {r['epsilon_max_device']:>10.2f} {r['final_accuracy']:>7.4f} "
            f"{r['mean_accuracy_last_10']:>8.4f}"
        )
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def _register_personalize(fsub: argparse._SubParsersAction) -> None:
    d = fsub.add_parser(
        "personalize",
        help="personalization: Ditto, Per-FedAvg, MOON vs FedAvg and SCAFFOLD, per-client accuracy",
        description="The drift scenario's label-skewed partition with an MLP; FedAvg, SCAFFOLD, Ditto, "
        "Per-FedAvg (first-order) and MOON on the same client schedule, and FedAvg fine-tuned by the same "
        "few local steps as Per-FedAvg; each client is scored on its own held-out data: median, 10th "
        "percentile and worst-decile mean of per-client accuracy (see simulator/scenarios/fl/personalize.py).",
    )
    d.add_argument("--rounds", type=_positive_int, default=60, help="rounds (default 60)")
    d.add_argument("--seed", type=_seed, default=0)
    d.add_argument("--lam", type=_nonneg, default=0.1, help="Ditto's λ toward the global model (default 0.1)")
    d.add_argument(
        "--inner-lr", type=_positive, default=0.05, help="Per-FedAvg's inner step α, also at evaluation (default 0.05)"
    )
    d.add_argument(
        "--eval-steps",
        type=_nonneg_int,
        default=10,
        help="Per-FedAvg's (and fedavg_finetune's) SGD steps on the client's data before scoring (default 10)",
    )
    d.add_argument("--moon-mu", type=_nonneg, default=1.0, help="MOON's contrastive weight μ (default 1)")
    d.add_argument("--moon-tau", type=_positive, default=0.5, help="MOON's temperature τ (default 0.5)")
    _add_plot_and_json(d, "write the per-client accuracy distributions (CDFs) to this PNG")
    d.set_defaults(func=run_personalize_cmd)


def _nonneg(v: str) -> float:
    x = float(v)
    if not (x >= 0 and x != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {v!r}")
    return x


def _nonneg_int(v: str) -> int:
    try:
        x = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {v!r}") from None
    if x < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {v!r}")
    return x


def run_personalize_cmd(args: argparse.Namespace) -> int:
    import dataclasses

    from ldp_core.fl.personalization import DittoSpec, MoonSpec, PerFedAvgSpec
    from simulator.scenarios.fl.personalize import PersonalizeConfig, plot_personalize, run_personalize

    base = PersonalizeConfig()
    cfg = PersonalizeConfig(
        drift=dataclasses.replace(base.drift, rounds=args.rounds, seed=args.seed),
        ditto=DittoSpec(args.lam),
        perfedavg=PerFedAvgSpec(args.inner_lr, args.eval_steps),
        moon=MoonSpec(args.moon_mu, args.moon_tau),
    )
    result = run_personalize(cfg)
    if _plot_and_json(args, result, plot_personalize):
        return 0
    print(
        f"personalize: {result['clients']} clients ({result['clients_per_round']} per round), "
        f"{result['rounds']} rounds, {result['model']}; Dirichlet α = {result['partition']['alpha']:g}, "
        f"feature shift {result['partition']['feature_shift']:g}; each client scored on its own test data "
        f"(at least {result['test_examples_per_client_min']} examples)"
    )
    print(f"{'strategy':<18} {'median':>7} {'p10':>6} {'worst 10 %':>10} {'mean':>6} {'pooled':>7}")
    for r in result["strategies"]:
        print(
            f"{r['name']:<18} {r['median']:>7.3f} {r['p10']:>6.3f} {r['worst_decile_mean']:>10.3f} "
            f"{r['mean']:>6.3f} {r['pooled_accuracy']:>7.3f}"
        )
    print(f"expected: {result['expectation']}")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def _register_attack(fsub: argparse._SubParsersAction) -> None:
    a = fsub.add_parser(
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
    _add_plot_and_json(a, "write the advantages and inversion success rates to this PNG")
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
    a.set_defaults(func=run_attack_cmd)


def run_poisoning_cmd(args: argparse.Namespace) -> int:
    from simulator.scenarios.fl.poisoning import (
        AGGREGATORS,
        DP_AGGREGATOR,
        PoisoningConfig,
        plot_fl_poisoning,
        run_fl_poisoning,
    )

    aggs = (*AGGREGATORS, DP_AGGREGATOR) if args.dp_fltrust else AGGREGATORS
    result = run_fl_poisoning(PoisoningConfig(rounds=args.rounds, seed=args.seed), aggregators=aggs)
    if _plot_and_json(args, result, plot_fl_poisoning):
        return 0
    print(
        f"poisoning: {result['model']}, {result['clients']} clients, {result['root_examples']} root examples, "
        f"{result['rounds']} rounds, boost {result['boost']:g}"
    )
    print("clean accuracy: " + ", ".join(f"{k} {v:.3f}" for k, v in result["clean_accuracy"].items()))
    print(f"{'attack':<11} {'malicious':>9} {'aggregator':<13} {'accuracy':>8} {'attack success':>14}")
    for r in result["results"]:
        asr = "—" if r["attack_success_rate"] is None else f"{r['attack_success_rate']:.3f}"
        step = f"  step scale {r['mean_step_scale']:.3f}" if "mean_step_scale" in r else ""
        print(f"{r['attack']:<11} {r['fraction']:>9.0%} {r['aggregator']:<13} {r['accuracy']:>8.3f} {asr:>14}{step}")
    dp = result.get(DP_AGGREGATOR)
    if dp is not None:
        print(
            f"{DP_AGGREGATOR}: C {dp['clip_norm']:g}, noise multiplier {dp['noise_multiplier']:g}, client-level "
            f"epsilon {dp['epsilon']:.1f} at delta {dp['delta']:g} (every client every round: no amplification)"
        )
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def run_attack_cmd(args: argparse.Namespace) -> int:
    if getattr(args, "poisoning", False):
        return run_poisoning_cmd(args)
    if getattr(args, "dp_fltrust", False):
        raise SystemExit("ldp fl attack: --dp-fltrust adds a row to the poisoning scenario; it needs --poisoning")
    from simulator.scenarios.fl.attacks import InversionConfig, MembershipConfig, plot_attacks, run_attacks

    result = run_attacks(
        MembershipConfig(rounds=args.rounds, seed=args.seed), InversionConfig(trials=args.trials, seed=args.seed)
    )
    if _plot_and_json(args, result, plot_attacks):
        return 0
    mi, inv = result["membership_inference"], result["gradient_inversion"]
    print(
        f"membership inference: {mi['candidate_clients']} candidate clients ({mi['joining_clients']} joined), "
        f"{mi['examples_per_client']} examples each, {mi['model']}, {mi['rounds']} rounds, Poisson q = {mi['sampling']['rate']}"
    )
    print(
        f"{'setting':<18} {'ε':>8} {'train acc':>9} {'test acc':>8} {'advantage':>9} {'95 % CI':>16} "
        f"{'Yeom τ':>7} {'TV bound':>8} {'ε,δ bound':>9}"
    )
    for s in mi["settings"]:
        e = s["epsilon"]
        es = "—" if e is None else e if isinstance(e, str) else f"{e:.3g}"
        print(
            f"{s['name']:<18} {es:>8} {s['train_accuracy']:>9.3f} {s['nonmember_accuracy']:>8.3f} {s['advantage']:>9.3f} "
            f"{'[' + format(s['ci'][0], '.3f') + ', ' + format(s['ci'][1], '.3f') + ']':>16} "
            f"{s['yeom_threshold']['advantage']:>7.3f} {s['bound_total_variation']:>8.3f} {s['bound_epsilon_delta']:>9.3f}"
        )
    print(f"gradient inversion: {inv['model']}; {inv['trials']} targets per setting; clip {inv['clip_norm']:g}")
    print(f"{'setting':<28} {'ε (1 round)':>11} {'cos':>6} {'|cos| svd':>9} {'rel. err':>8} {'success':>7}")
    for s in inv["settings"]:
        e = s["epsilon_one_round"]
        es = "—" if e is None else e if isinstance(e, str) else f"{e:.4g}"
        print(
            f"{s['name']:<28} {es:>11} {s['cosine_mean']:>6.3f} {s['svd_abs_cosine_mean']:>9.3f} "
            f"{s['relative_error_median']:>8.3f} {s['success_rate']:>7.2f}"
        )
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def run_job_cmd(args: argparse.Namespace) -> int:
    from estimator.fl.job import AggregationJob, FLTaskSpec, JobSettings
    from ldp_core.fl.errors import FLError
    from pipeline.topics import FL_ROUNDS_TOPIC, FL_STATE_TOPIC, FL_UPDATES_TOPIC
    from pipeline.transport import open_transport

    try:
        spec = FLTaskSpec.from_file(args.task)  # a relative root_data is relative to the task file
    except FLError as exc:
        raise SystemExit(f"ldp fl job: {exc}") from None
    settings = JobSettings(
        group=args.group or f"ldp-fl-{spec.task}",
        member=args.member,
        rounds_topic=args.rounds_topic or FL_ROUNDS_TOPIC,
        updates_topic=args.updates_topic or FL_UPDATES_TOPIC,
        state_topic=args.state_topic or FL_STATE_TOPIC,
        session_timeout=args.session_timeout,
        checkpoint_interval=args.checkpoint_interval,
        status_path=args.status_file,
        max_record_bytes=args.max_record_bytes,
    )
    stop = stop_event()
    with open_transport(args.transport) as transport:
        job = AggregationJob(transport, spec, settings)
        if args.status_file:  # the job writes it as it runs; on each change of state too (waiting for the broker)
            job.state_listeners.append(lambda _job, _state: job._write_status(force=True))
        try:
            if not job.connect(stop):
                return 0
            print(
                f"ldp fl job: running task {spec.task} (round {job.status()['round']}, restores {job.restores})",
                flush=True,
            )
            status = job.supervise(lambda: job.run(stop, exit_when_done=not args.keep_running), stop)
            if status is None:  # stopped while reconnecting
                status = job.status()
        finally:
            job.close()
    status.pop("params", None)
    print(json.dumps(status), flush=True)
    return 0


def run_enroll_cmd(args: argparse.Namespace) -> int:
    import base64
    import os

    from ldp_core.tokens.enrollment import EnrollmentAuthority, EnrollmentError

    try:
        if args.init_authority:
            if os.path.exists(args.authority):
                raise SystemExit(f"ldp fl enroll: {args.authority} exists; refusing to overwrite an authority key")
            auth = EnrollmentAuthority.generate()
            auth.save(args.authority)
        else:
            auth = EnrollmentAuthority.load(args.authority)
        devices = []
        if args.device_id:
            if not args.out:
                raise SystemExit("ldp fl enroll: --device-id needs --out (the folder for the device bundles)")
            os.makedirs(args.out, exist_ok=True)
            for d in args.device_id:
                ident = auth.enroll(d, lifetime=args.lifetime_days * 86400)
                path = os.path.join(args.out, f"{d}.json")
                ident.save(path)
                devices.append({"device_id": d, "path": path, "expires_at": ident.credential.expires_at})
    except EnrollmentError as exc:
        raise SystemExit(f"ldp fl enroll: {exc}") from None
    print(
        json.dumps(
            {"authority_key": base64.b64encode(auth.public_key).decode(), "key_id": auth.key_id, "devices": devices}
        )
    )
    return 0


def run_sign_task_cmd(args: argparse.Namespace) -> int:
    import base64
    import dataclasses
    import os

    from estimator.fl.task import FLTaskSpec, resolve_task_paths
    from ldp_core.fl.errors import FLError
    from ldp_core.tokens.enrollment import EnrollmentAuthority, EnrollmentError

    try:
        auth = EnrollmentAuthority.load(args.authority)
    except EnrollmentError as exc:
        raise SystemExit(f"ldp fl sign-task: {exc}") from None
    with open(args.task) as f:
        d = json.load(f)
    d["enrollment_key"] = base64.b64encode(auth.public_key).decode()
    d.pop("task_signature", None)
    try:  # a relative root_data (fltrust) is checked relative to the task file and written back as it was
        spec = FLTaskSpec.from_dict(resolve_task_paths(d, os.path.dirname(os.path.abspath(args.task))))
    except FLError as exc:
        raise SystemExit(f"ldp fl sign-task: {exc}") from None
    spec = dataclasses.replace(spec, task_signature=base64.b64encode(auth.sign_document(spec.signed_config())).decode())
    out = args.out or args.task
    written = spec.to_dict()
    if isinstance(d.get("aggregator"), dict) and "root_data" in d["aggregator"]:
        written["aggregator"]["root_data"] = d["aggregator"]["root_data"]  # the path as the file wrote it
    with open(out, "w") as f:
        json.dump(written, f, indent=2)
    print(json.dumps({"task": spec.task, "out": out, "signed": spec.signed_config()}))
    return 0
