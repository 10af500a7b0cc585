"""``ldp he``: homomorphic encryption beside local DP (docs/HE.md).

* ``ldp he aggregate``: FedAvg rounds aggregated three ways on the same clients: the plaintext weighted
  mean, SecAgg+ and threshold CKKS (a committee of key parties, each holding a secret-key share; the
  aggregate decrypts only with every party's partial decryption). Prints accuracy, bytes and time per
  round and the CKKS error against the plaintext mean (``max_abs_error``, within ``he_precision_bound``).
* ``ldp he infer``: private inference: inputs encrypted by the client, a small square-activation network
  evaluated by the server on the ciphertexts, results decrypted by the client; ciphertext expansion and
  slowdown against plaintext arithmetic.

``--json`` prints one object; ``--plot FILE.png`` draws the comparison. Needs the ``pets`` extra.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ldp_cli.commands.argtypes import nonnegative_int as _non_negative_int
from ldp_cli.commands.argtypes import positive_int as _positive_int
from ldp_cli.commands.argtypes import seed as _seed

__all__ = ["register"]

STATS = ("mean", "variance")  # estimator.he.aggregate.STATS, without importing TenSEAL to build the parser


def _parties(text: str) -> int:
    v = _positive_int(text)
    if v < 2:
        raise argparse.ArgumentTypeError(f"threshold decryption needs at least 2 key parties, got {text}")
    return v


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("he", help="homomorphic encryption: FL aggregation under threshold CKKS, private inference")
    verbs = p.add_subparsers(dest="he_command", required=True)
    a = verbs.add_parser(
        "aggregate",
        help="FedAvg under threshold CKKS next to SecAgg+ and the plaintext mean",
        description="Trains a softmax regression on a seeded task with FedAvg, aggregating each round with the "
        "plaintext weighted mean, SecAgg+ and threshold CKKS (n-of-n key parties), and compares them.",
    )
    a.add_argument("--clients", type=_positive_int, default=10, help="clients per round (default 10)")
    a.add_argument("--rounds", type=_positive_int, default=3, help="rounds (default 3)")
    a.add_argument("--key-parties", type=_parties, default=3, help="holders of secret-key shares (default 3)")
    a.add_argument(
        "--threshold",
        type=_parties,
        default=None,
        metavar="T",
        help="t-of-n decryption: any T of the key parties decrypt, T-1 cannot (Shamir-shared key); "
        "default: n-of-n, every key party must answer",
    )
    a.add_argument(
        "--key-dropouts",
        type=_non_negative_int,
        default=0,
        help="key parties that never answer a decryption (at most key parties - T; needs --threshold)",
    )
    a.add_argument(
        "--stat",
        choices=STATS,
        default="mean",
        help="mean (default), or variance: also the per-coordinate weighted variance of the updates, "
        "squared by the server under a collective relinearisation key (SecAgg: squares uploaded)",
    )
    a.add_argument("--seed", type=_seed, default=0, help="seed of the data and local training (default 0)")
    a.add_argument("--json", action="store_true", help="print one JSON object")
    a.add_argument("--plot", default=None, help="write accuracy per round and upload bytes to this PNG")
    a.set_defaults(func=_run_aggregate)
    i = verbs.add_parser(
        "infer",
        help="private inference on encrypted inputs (CKKS)",
        description="Encrypts test inputs on the client, evaluates a trained square-activation network on the "
        "ciphertexts on the server, decrypts on the client; reports expansion and slowdown.",
    )
    i.add_argument("--samples", type=_positive_int, default=5, help="test inputs classified (default 5)")
    i.add_argument("--hidden", type=_positive_int, default=16, help="hidden width (default 16)")
    i.add_argument("--seed", type=_seed, default=0, help="seed of the data and training (default 0)")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.add_argument("--plot", default=None, help="write bytes and time, plaintext against encrypted, to this PNG")
    i.set_defaults(func=_run_infer)


def _emit(result: dict[str, Any], args: argparse.Namespace, lines: list[str]) -> int:
    if args.json:
        print(json.dumps(result))
    else:
        print("\n".join(lines))
    return 0


def _run_aggregate(args: argparse.Namespace) -> int:
    from estimator.he.aggregate import compare
    from estimator.he.plots import plot_aggregate

    r = compare(
        args.clients,
        args.rounds,
        args.key_parties,
        args.seed,
        threshold=args.threshold,
        key_dropouts=args.key_dropouts,
        stat=args.stat,
    )
    if args.plot:
        plot_aggregate(r, args.plot)
        r["plot"] = args.plot
    last = r["per_round"][-1]
    lines = [
        f"{r['clients']} clients, {r['rounds']} rounds, {r['parameters']} parameters, {r['key_parties']} key parties"
        + (f" (any {r['threshold']} decrypt; {r['key_dropouts']} absent)" if r["threshold"] else " (all must answer)"),
        "final accuracy: " + ", ".join(f"{k} {v:.4f}" for k, v in r["final_accuracy"].items()),
        f"upload per client: plaintext {r['plaintext_bytes_per_client']:,} B, "
        f"SecAgg+ {last['secagg']['upload_bytes_per_client']:,} B, CKKS {last['he']['upload_bytes_per_client']:,} B",
        f"CKKS max |error| vs plaintext mean {last['he']['max_abs_error']:.3g} "
        f"(bound {r['he_precision_bound']:.3g}); server {last['he']['server_s']:.3f} s, "
        f"threshold decryption {last['he']['decrypt_s']:.3f} s; SecAgg+ server {last['secagg']['server_s']:.3f} s",
    ]
    if r["stat"] == "variance":
        lines.append(
            f"variance: CKKS max |error| {last['he']['variance_max_abs_error']:.3g} "
            f"(bound {last['he']['variance_bound']:.3g}; squares {last['he']['square_max_abs_error']:.3g}, "
            f"bound {last['he']['square_bound']:.3g}), no extra upload, relinearisation key "
            f"{r['he_relin_key_bytes']:,} B in {r['he_rkg_s']:.2f} s; SecAgg+ "
            f"{last['secagg']['variance_max_abs_error']:.3g} with {last['secagg']['square_upload_bytes_per_client']:,} B "
            "more per client"
        )
    return _emit(r, args, lines)


def _run_infer(args: argparse.Namespace) -> int:
    from estimator.he.inference import measure
    from estimator.he.plots import plot_inference

    r = measure(args.samples, args.seed, args.hidden)
    if args.plot:
        plot_inference(r, args.plot)
        r["plot"] = args.plot
    lines = [
        f"model {r['model']}: plaintext test accuracy {r['plaintext_accuracy_test']:.3f}, "
        f"encrypted predictions agree {r['he_agrees_with_plaintext']:.0%} (max logit error {r['max_abs_logit_error']:.2g})",
        f"input: {r['input_plaintext_bytes_float32']} B as float32, ciphertext {r['input_ciphertext_bytes']:,} B "
        f"({r['expansion_vs_float32']:,.0f}×); result ciphertexts {r['result_ciphertext_bytes']:,} B",
        f"server time {r['he_eval_s_median'] * 1e3:.1f} ms encrypted vs {r['plain_eval_s_median'] * 1e6:.2f} µs "
        f"plaintext ({r['slowdown']:,.0f}× slower)",
    ]
    return _emit(r, args, lines)
