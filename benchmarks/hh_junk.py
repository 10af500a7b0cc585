"""Junk among discovered heavy hitters: real-looking Zipf words, with and without the end marker and the rule.

    .venv/bin/python benchmarks/hh_junk.py --users 1000000 --epsilon 4 --top 32 --seeds 1,2

For each seed: ``simulator.heavy_hitters.word_population`` (Zipf(1.1) over 5,000 words of 3 to 12 letters,
one in six also with a suffix), PEM over 12 bytes with ``pem_parameters``, end_marker 0 and 1, the same
reports decoded once each; prints per run the values nobody typed (``false``), those that are a typed word
plus junk (``junk_suffix``) and recall@top, for the unfiltered top K and for the values reported by the
Bonferroni rule (docs/HEAVY_HITTERS.md, *What is reported*). One JSON line per run.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from estimator.jobs.heavy_hitters import discovery_table
from estimator.mechanisms.heavy_hitters import discover_pem
from ldp_core.mechanisms.heavy_hitters import PEMSpec, pad_values, pem_parameters
from simulator.heavy_hitters import junk_discoveries, word_population


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--users", type=int, default=1_000_000)
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--top", type=int, default=32)
    ap.add_argument("--seeds", default="1")
    args = ap.parse_args()
    for seed in (int(s) for s in args.seeds.split(",")):
        rng = np.random.default_rng(seed)
        pop = word_population(args.users, 5000, rng)
        padded = np.repeat(pad_values(pop.values, 12, "truncate", 1), pop.counts, axis=0)
        order = np.argsort(-pop.counts, kind="stable")[: args.top]
        truth = {pop.values[i] for i in order}
        s, eta, c = pem_parameters(pop.users, args.epsilon, 12, args.top)
        for marker in (0, 1):
            spec = PEMSpec(epsilon=args.epsilon, length=12, start_bits=s, step_bits=eta, end_marker=marker)
            t0 = time.perf_counter()
            disc = discover_pem(spec, spec.encode(padded, np.random.default_rng(seed + 1000)), args.top, keep=c)
            top = [h.value for h in disc.top(args.top)]
            reported = list(discovery_table(disc, args.top)["value"])
            row = {
                "seed": seed,
                "users": pop.users,
                "epsilon": args.epsilon,
                "top": args.top,
                "end_marker": marker,
                "candidates": disc.tested,
                "seconds": round(time.perf_counter() - t0, 1),
            }
            for name, found in (("top_k", top), ("reported", reported)):
                j = junk_discoveries(found, pop)
                row[name] = {
                    "listed": len(found),
                    "false": j["false"],
                    "junk_suffix": j["junk_suffix"],
                    "recall": round(len(set(found) & truth) / len(truth), 3),
                    "junk_examples": [repr(v) for v in j["junk_values"][:3]],
                }
            print(json.dumps(row, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
