"""SFP parameter sweep: recall@32 of discover_sfp on a seeded Zipf(1.1) population of six-letter words.

Usage: .venv/bin/python benchmarks/sweep_sfp.py USERS SEED {cms,hcms} FRAGMENTS_KEPT WORD_SHARE HASH_BITS EPS[,EPS...]
(sketches 16 x 1024
the population is ``bench_hh_side.py``'s for that seed). Prints one line per ε.
"""

import sys
import time

import numpy as np

sys.path.insert(0, ".")
from estimator.mechanisms.heavy_hitters import discover_sfp  # noqa: E402
from ldp_core.mechanisms.heavy_hitters import SFPSpec  # noqa: E402
from simulator.heavy_hitters import synthetic_population  # noqa: E402
from simulator.population import parse_distribution  # noqa: E402


def main() -> None:
    n = int(sys.argv[1])
    seed = int(sys.argv[2])
    sketch = sys.argv[3]
    keep = int(sys.argv[4])
    share = float(sys.argv[5])
    hb = int(sys.argv[6])
    eps_list = [float(e) for e in sys.argv[7].split(",")]
    rng = np.random.default_rng(seed)
    pop = synthetic_population(n, parse_distribution("zipf:1.1", 100_000), 6, rng)
    order = np.argsort(-pop.counts, kind="stable")[:32]
    truth = {pop.values[i] for i in order}
    users = np.repeat(np.frombuffer("".join(pop.values).encode(), dtype=np.uint8).reshape(-1, 6), pop.counts, axis=0)
    for eps in eps_list:
        spec = SFPSpec(epsilon=eps, length=6, sketch=sketch, num_hashes=16, width=1024, word_share=share, hash_bits=hb)
        rec = spec.encode(users, np.random.default_rng(seed))
        t = time.perf_counter()
        d = discover_sfp(spec, rec, 32, fragments=keep)
        t = time.perf_counter() - t
        f = [h.value for h in d.top(32)]
        hits = sum(v in truth for v in f)
        print(
            f"{sketch} keep={keep} share={share} hb={hb} eps={eps} recall={hits / 32:.3f} prec={hits / max(1, len(f)):.3f} cand={d.candidates} {t:.1f}s",
            flush=True,
        )


if __name__ == "__main__":
    main()
