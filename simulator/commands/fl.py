"""``ldp fl``: federated-learning scenarios.

* ``clinics``: 20 synthetic clinics, logistic regression, FedAvg without DP and
  with clipping 0.5 and noise multipliers 0 / 0.5 / 2.0; test accuracy, the
  client-level ε each setting gives and the noise needed for ε = 1, 3, 8
  (``--json``: one object, see :func:`simulator.scenarios.clinics.run_clinics`).
* ``drift``: FedAvg, FedProx and SCAFFOLD on a label-skewed, feature-shifted
  partition, test accuracy per round (:func:`simulator.scenarios.drift.run_drift`).
"""

from __future__ import annotations

import argparse
import json

__all__ = ["register"]


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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fl", help="federated-learning scenarios with client-level DP",
                       description="Federated-learning scenarios that reproduce published set-ups on seeded synthetic data.")
    fsub = p.add_subparsers(dest="scenario", required=True)
    c = fsub.add_parser("clinics", help="20 clinics, logistic regression, DP-FedAvg at σ = 0 / 0.5 / 2.0",
                        description="20 synthetic clinics with shifted features; FedAvg and DP-FedAvg (clip 0.5) "
                        "with Poisson sampling of clinics; prints accuracy and the client-level ε of each setting.")
    c.add_argument("--rounds", type=_positive_int, default=100)
    c.add_argument("--sample-rate", type=_prob, default=0.5, help="Poisson rate q (default 0.5: 10 of 20 clinics expected)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--plot", default=None, help="write accuracy per round per setting to this PNG")
    c.add_argument("--no-noise-search", action="store_true", help="skip the noise needed for ε = 1, 3, 8")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.set_defaults(func=run_clinics_cmd)
    _register_drift(fsub)


def run_clinics_cmd(args: argparse.Namespace) -> int:
    from simulator.scenarios.clinics import ClinicsConfig, plot_accuracy, run_clinics

    if not 0 <= args.seed < 2**63:
        raise ValueError(f"--seed must be an integer in [0, 2**63), got {args.seed}")
    cfg = ClinicsConfig(rounds=args.rounds, sample_rate=args.sample_rate, seed=args.seed)
    result = run_clinics(cfg, noise_for_targets=not args.no_noise_search)
    if args.plot:
        plot_accuracy(result, args.plot)
        result["plot"] = args.plot
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"clinics: {result['clinics']} clinics, {result['rounds']} rounds, Poisson q = {cfg.sample_rate} "
          f"(mean {cfg.sample_rate * cfg.clinics:g} per round), δ = {cfg.delta:g}; {result['data']}")
    print(f"{'setting':<22} {'clip':>6} {'σ':>6} {'accuracy':>9} {'client-level ε':>15}")
    for s in result["settings"]:
        eps = s["epsilon"]
        eps_s = "—" if eps is None else eps if isinstance(eps, str) else f"{eps:.4g}"
        clip = "—" if s["clip_norm"] is None else f"{s['clip_norm']:g}"
        sig = "—" if s["noise_multiplier"] is None else f"{s['noise_multiplier']:g}"
        print(f"{s['name']:<22} {clip:>6} {sig:>6} {s['test_accuracy']:>9.4f} {eps_s:>15}")
    for e, z in result.get("noise_for_epsilon", {}).items():
        print(f"noise multiplier for ε = {e} over {result['rounds']} rounds at q = {cfg.sample_rate}: {z:.3f} "
              f"(test accuracy {result['accuracy_at_target_epsilon'][e]:.4f})")
    print("ε protects whether one clinic took part (all its patients), against anyone who sees every model; "
          "it assumes the Poisson sample stays secret.")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0


def _register_drift(fsub: argparse._SubParsersAction) -> None:
    d = fsub.add_parser("drift", help="non-IID drift: FedAvg vs FedProx vs SCAFFOLD on a label-skewed partition",
                        description="Seeded synthetic classes split by Dirichlet(0.1) label skew with per-client feature "
                        "shift; FedAvg, FedProx and SCAFFOLD (and FedAvg on an IID split) on the same client schedule; "
                        "test accuracy per round (see simulator/scenarios/drift.py).")
    d.add_argument("--rounds", type=_positive_int, default=100)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--plot", default=None, help="write accuracy per round per strategy to this PNG")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=run_drift_cmd)


def run_drift_cmd(args: argparse.Namespace) -> int:
    from simulator.scenarios.drift import DriftConfig, plot_drift, run_drift

    if not 0 <= args.seed < 2**63:
        raise ValueError(f"--seed must be an integer in [0, 2**63), got {args.seed}")
    result = run_drift(DriftConfig(rounds=args.rounds, seed=args.seed))
    if args.plot:
        plot_drift(result, args.plot)
        result["plot"] = args.plot
    if args.json:
        print(json.dumps(result))
        return 0
    p, t = result["partition"], result["training"]
    print(f"drift: {result['clients']} clients ({result['clients_per_round']} per round), {result['rounds']} rounds, "
          f"{result['model']}; Dirichlet α = {p['alpha']:g} (majority class share {p['majority_class_share_mean']:.2f}), "
          f"feature shift {p['feature_shift']:g}; {t['local_steps_mean']:.0f} local steps on average; {result['data']}")
    print(f"{'strategy':<16} {'final':>7} {'best':>7} {'round':>6} {'mean last 10':>13}")
    for r in result["strategies"]:
        print(f"{r['name']:<16} {r['final_accuracy']:>7.4f} {r['best_accuracy']:>7.4f} {r['best_round']:>6} "
              f"{r['mean_accuracy_last_10']:>13.4f}")
    print(f"expected: {result['expectation']}")
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
