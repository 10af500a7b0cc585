"""Which SFP words to report: recall@K and precision of cuts on the word sketch's z, per seed and ε.

Runs SFP in process with ``ldp simulate``'s settings (``heavy_hitter_spec``) on the side-by-side's
populations (``bench_hh_side.py``: Zipf(1.1) six-letter words), ranks every assembled word as
``discover_sfp`` does, and applies each cut to z = estimate / std_error; the m of the Bonferroni-type cuts
is the number of words ranked. Tune on seeds other than the side-by-side's 1-3 (docs/HEAVY_HITTERS.md,
*Which SFP words are reported*).

Usage: .venv/bin/python benchmarks/sweep_sfp_cut.py [--users N] [--seeds 4 5 6 7 8 9] [--epsilons 1 2 4]
       [--top K] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
from scipy.stats import norm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from estimator.mechanisms.heavy_hitters import discover_sfp  # noqa: E402
from ldp_core.mechanisms.heavy_hitters import pad_value  # noqa: E402
from simulator.heavy_hitters import heavy_hitter_spec, synthetic_population  # noqa: E402
from simulator.population import parse_distribution  # noqa: E402

#: name -> the z a word must exceed, given m words ranked
CUTS = {
    "per word 95% (z > 1.96)": lambda m: 1.96,
    "z > 2.5": lambda m: 2.5,
    "z > Φ⁻¹(1 − 1/m)": lambda m: float(norm.isf(1.0 / m)),
    "Bonferroni 50% (shipped)": lambda m: float(norm.isf(0.25 / m)),
    "Bonferroni 95%": lambda m: float(norm.isf(0.025 / m)),
}


def run(seed: int, eps: float, users: int, top: int) -> dict:
    rng = np.random.default_rng(seed)
    pop = synthetic_population(users, parse_distribution("zipf:1.1", 100_000), 6, rng)
    spec, keep = heavy_hitter_spec("sfp", eps, 6, users, top)
    raws = [pad_value(v, spec.length) for v in pop.values]
    counts = np.asarray(pop.counts)
    table = np.frombuffer(b"".join(raws), dtype=np.uint8).reshape(len(raws), spec.length)
    records = spec.encode(np.repeat(table, counts, axis=0), np.random.default_rng(1000 + seed))
    disc = discover_sfp(spec, records, top, fragments=keep)
    truth = {raws[i] for i in np.argsort(-counts, kind="stable")[:top]}
    z = np.array([h.estimate / np.sqrt(h.variance) for h in disc.found])
    real = np.array([h.raw in truth for h in disc.found], dtype=bool)
    out = {"seed": seed, "epsilon": eps, "words_ranked": disc.tested, "cuts": {}}
    for name, cut in CUTS.items():
        sel = z > cut(disc.tested)
        sel &= np.cumsum(sel) <= top
        hits, listed = int((sel & real).sum()), int(sel.sum())
        out["cuts"][name] = {"recall": hits / top, "precision": hits / listed if listed else 0.0, "listed": listed}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--seeds", type=int, nargs="+", default=[4, 5, 6, 7, 8, 9])
    ap.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    ap.add_argument("--top", type=int, default=32)
    ap.add_argument("--json", action="store_true", help="one JSON object per run, then the medians")
    a = ap.parse_args()
    runs = [run(s, e, a.users, a.top) for s in a.seeds for e in a.epsilons]
    med = {
        name: {
            eps: [
                statistics.median(r["cuts"][name][k] for r in runs if r["epsilon"] == eps)
                for k in ("recall", "precision")
            ]
            for eps in a.epsilons
        }
        for name in CUTS
    }
    if a.json:
        print(json.dumps({"runs": runs, "medians": med}))
        return 0
    print("| cut on z | " + " | ".join(f"ε = {e:g}" for e in a.epsilons) + " |")
    print("|---|" + "---|" * len(a.epsilons))
    for name, by_eps in med.items():
        print(f"| {name} | " + " | ".join(f"{r:.3f} / {p:.3f}" for r, p in by_eps.values()) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
