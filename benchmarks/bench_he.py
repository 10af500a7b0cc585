"""Threshold-CKKS aggregation next to SecAgg+, and private inference (estimator.he).

1. **FedAvg** (``estimator.he.aggregate.compare``): 20 clients, 5 rounds, a softmax regression on a
   seeded 10-class task, each round aggregated by the plaintext weighted mean, SecAgg+ and threshold
   CKKS (3 key parties) from the same updates: accuracy, bytes per client, time, CKKS error.
2. **Aggregation alone** at d = 10^4 and 10^5 parameters, 20 clients: upload bytes per client, client
   time (encryption / masking with key agreement), server time, threshold decryption time.
3. **Private inference** (``estimator.he.inference.measure``): 20 encrypted test inputs through a
   32-16-10 square-activation network: ciphertext expansion and slowdown against plaintext numpy.
4. **t-of-n and the variance** (``compare(..., threshold=3, key_dropouts=2, stat="variance")``): the same
   FedAvg with 5 key parties of which any 3 decrypt and 2 never answer, each round also aggregating the
   per-coordinate weighted variance (CKKS: squares by the server under the collective relinearisation
   key; SecAgg+: squares uploaded as a second masked vector): bytes, time, error against the plaintext.

Times are wall-clock medians on a shared 2-core machine (load averages recorded).

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_he.py            # a few minutes
    .venv/bin/python benchmarks/bench_he.py --quick    # fewer rounds, d = 10^4 only, 5 inputs

Results print as JSON lines and go to ``benchmarks/results/he.json`` (plots ``he_aggregate.png``,
``he_inference.png``, ``he_threshold_variance.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import time

import numpy as np

from estimator.he.aggregate import compare, he_weighted_mean, precision_bound, secagg_weighted_mean
from estimator.he.inference import measure
from estimator.he.plots import plot_aggregate, plot_inference
from ldp_core.he.threshold import CkksContext, KeyParty, collective_public_key

RESULTS = pathlib.Path(__file__).parent / "results" / "he.json"


def aggregation_only(d: int, clients: int, parties: int, rng: np.random.Generator) -> dict:
    ctx = CkksContext()
    key_parties = [KeyParty(ctx) for _ in range(parties)]
    pk = collective_public_key(ctx, [p.public_share() for p in key_parties])
    updates = [rng.normal(scale=0.01, size=d) for _ in range(clients)]
    weights = rng.integers(50, 150, size=clients).astype(np.float64)
    truth = (weights[:, None] * np.stack(updates)).sum(0) / weights.sum()
    he = he_weighted_mean(ctx, key_parties, pk, updates, weights)
    sa = secagg_weighted_mean(updates, weights, rng)
    return {
        "d": d,
        "clients": clients,
        "key_parties": parties,
        "plaintext_bytes_per_client": 4 * d,
        "he_upload_bytes_per_client": he.upload_bytes_per_client,
        "he_partial_bytes_per_party": he.partial_bytes_per_party,
        "he_encrypt_s_per_client": he.encrypt_s_per_client,
        "he_server_s": he.server_s,
        "he_decrypt_s": he.decrypt_s,
        "he_max_abs_error": float(np.abs(he.mean - truth).max()),
        "he_precision_bound": precision_bound(ctx.params, parties),
        "secagg_upload_bytes_per_client": sa["upload_bytes_per_client"],
        "secagg_client_s": sa["client_s"],
        "secagg_server_s": sa["server_s"],
        "secagg_max_abs_error": float(np.abs(sa["mean"] - truth).max()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    started, load_start = time.strftime("%Y-%m-%d %H:%M:%S %Z"), os.getloadavg()
    rng = np.random.default_rng(0)
    fedavg = compare(clients=20, rounds=2 if args.quick else 5, key_parties=3, seed=0)
    print(json.dumps({"fedavg_final_accuracy": fedavg["final_accuracy"]}), flush=True)
    scaling = [aggregation_only(d, 20, 3, rng) for d in ((10**4,) if args.quick else (10**4, 10**5))]
    for row in scaling:
        print(json.dumps(row), flush=True)
    threshold_variance = compare(
        clients=20, rounds=2 if args.quick else 3, key_parties=5, seed=0, threshold=3, key_dropouts=2, stat="variance"
    )
    print(json.dumps({"threshold_variance_final_accuracy": threshold_variance["final_accuracy"]}), flush=True)
    inference = measure(samples=5 if args.quick else 20, seed=0)
    print(json.dumps(inference), flush=True)
    out = {
        "started": started,
        "machine": platform.platform(),
        "load_start": [round(x, 2) for x in load_start],
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "fedavg": fedavg,
        "aggregation": scaling,
        "inference": inference,
        "threshold_variance": threshold_variance,
    }
    if not args.quick:
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps(out, indent=2))
        plot_aggregate(fedavg, str(RESULTS.with_name("he_aggregate.png")))
        plot_inference(inference, str(RESULTS.with_name("he_inference.png")))
        plot_aggregate(threshold_variance, str(RESULTS.with_name("he_threshold_variance.png")))


if __name__ == "__main__":
    main()
