"""The pure-ldp half of ``bench_hh_side.py``; runs inside ``.bench-venv``.

Imports nothing from this project. Reads a JSON job::

    {"input": "pop.tsv", "epsilons": [2, 4, 8], "top": 32, "seed": 1, "out": "res.json",
     "mechanisms": ["pem", "sfp", "treehist"], "cms": {"k": 16, "m": 1024}}

``chunk`` (default 50,000): users privatised, then aggregated, at a time (memory stays bounded at
n = 10^6; encode and server seconds are summed over the chunks). ``input`` holds ``value<TAB>count`` lines (six lowercase letters). Every
class gets explicit settings (see ``SETTINGS``): alphabet a..z, an index
mapper from a string to 1 + its base-26 value (pure-ldp's oracles expect
items 1..d), Apple's Count Mean Sketch (k x m) as the frequency oracle
(pure-ldp's default local hashing loops over the whole domain of 26^6 per
report in ``aggregate``), and top-k selection (``find_heavy_hitters(k=K)``),
never its default threshold. pure-ldp draws from ``random`` and
``numpy.random`` module state, which is seeded here once per run.
"""

from __future__ import annotations

import json
import random
import resource
import string
import sys
import time
import warnings
from typing import Any

import numpy as np

ALPHABET = list(string.ascii_lowercase)

#: the settings each class runs with (characters, not bits)
SETTINGS: dict[str, str] = {
    "pem": "PEMClient/PEMServer(start_length=2, fragment_length=1, max_string_length=6): 4 levels, top-K kept",
    "sfp": "SFPClient/SFPServer(fragment_length=2, max_string_length=6): 3 positions",
    "treehist": "TreeHistClient/TreeHistServer(fragment_length=1, max_string_length=6)",
}


def _index(x: str) -> int:
    v = 0
    for ch in x:
        v = v * 26 + (ord(ch) - 97)
    return v + 1


def _build(name: str, eps: float, cms: dict[str, int]) -> tuple[Any, Any]:
    from pure_ldp.frequency_oracles.apple_cms import CMSClient, CMSServer

    k, m = int(cms["k"]), int(cms["m"])
    fo_server = CMSServer(eps, k, m)
    fo_client = CMSClient(eps, fo_server.get_hash_funcs(), m)
    common = dict(alphabet=ALPHABET, index_mapper=_index)
    if name == "pem":
        from pure_ldp.heavy_hitters.prefix_extending import PEMClient, PEMServer

        return (
            PEMClient(eps, 2, 6, 1, fo_client=fo_client, **common),
            PEMServer(eps, 2, 6, 1, fo_server=fo_server, **common),
        )
    if name == "sfp":
        from pure_ldp.heavy_hitters.apple_sfp import SFPClient, SFPServer

        # SFPServer.find_heavy_hitters adds its padding character to the alphabet: it must be a set
        sfp = dict(alphabet=set(ALPHABET), index_mapper=_index)
        return SFPClient(eps, 2, 6, fo_client=fo_client, **sfp), SFPServer(eps, 2, 6, fo_server=fo_server, **sfp)
    if name == "treehist":
        from pure_ldp.heavy_hitters.treehistogram import TreeHistClient, TreeHistServer

        return (
            TreeHistClient(eps, 1, 6, fo_client=fo_client, **common),
            TreeHistServer(eps, 6, 1, fo_server=fo_server, **common),
        )
    raise ValueError(name)


def main(argv: list[str]) -> int:
    job = json.loads(open(argv[0]).read())
    warnings.filterwarnings("ignore")
    values, counts = [], []
    for line in open(job["input"]):
        v, c = line.rstrip("\n").split("\t")
        values.append(v)
        counts.append(int(c))
    top = int(job["top"])
    chunk = int(job.get("chunk", 50_000))
    order = sorted(range(len(values)), key=lambda i: -counts[i])
    true_top = {values[i] for i in order[:top]}
    users = [v for v, c in zip(values, counts) for _ in range(c)]
    out: dict[str, Any] = {"settings": SETTINGS, "runs": []}
    for name in job["mechanisms"]:
        for eps in job["epsilons"]:
            random.seed(f"pure-ldp-hh/{job['seed']}/{name}/{eps}")
            np.random.seed((int(job["seed"]) * 7919 + int(eps * 1000) + sum(map(ord, name))) % 2**32)
            random.shuffle(users)
            client, server = _build(name, float(eps), job["cms"])
            # privatise and aggregate chunk by chunk: a CMS report is a 1024-entry array (~8 kB), so holding
            # all 10^6 reports at once needs ~9 GB; the times are summed per phase, as one pass would give
            t_enc = t_agg = 0.0
            for lo in range(0, len(users), chunk):
                t0 = time.perf_counter()
                reports = [client.privatise(u) for u in users[lo : lo + chunk]]
                t1 = time.perf_counter()
                for r in reports:
                    server.aggregate(r)
                t_enc += t1 - t0
                t_agg += time.perf_counter() - t1
            del reports
            t1 = time.perf_counter()
            hh, _freq = server.find_heavy_hitters(k=top)
            t2 = time.perf_counter()
            peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            found = [str(h).split("*")[0] for h in hh][:top]
            hits = len(set(found) & true_top)
            run = {
                "mechanism": f"pure-ldp {name}",
                "epsilon": float(eps),
                "users": len(users),
                "seed": int(job["seed"]),
                "recall": hits / top,
                "precision": hits / len(found) if found else 0.0,
                "found": len(found),
                "seconds": {"encode": t_enc, "server": t_agg + (t2 - t1), "find": t2 - t1},
                "peak_rss_mb": peak_mb,
                "chunk": chunk,
            }
            print(f"[pure-ldp] {json.dumps(run)}", file=sys.stderr, flush=True)
            out["runs"].append(run)
    with open(job["out"], "w") as fh:
        json.dump(out, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
