#!/usr/bin/env bash
# Recall at K=32 of PEM and SFP on a Zipf population of 10^6 six-letter words (docs/HEAVY_HITTERS.md).
# Usage: benchmarks/bench_heavy_hitters.sh [OUT.jsonl]   (runs `ldp simulate`, 3 seeds per ε)
set -euo pipefail
out=${1:-benchmarks/results/heavy_hitters.jsonl}
: > "$out"
for mech in ${MECHS:-pem sfp}; do
  for eps in 2 4 8; do
    for seed in 1 2 3; do
      .venv/bin/ldp simulate --mechanism "$mech" --epsilon "$eps" --users 1000000 --distribution zipf:1.1 \
        --domain 100000 --length 6 --top 32 --seed "$seed" --json \
        | .venv/bin/python -c 'import json,sys; o=json.load(sys.stdin); o.pop("found"); o.pop("true_top"); print(json.dumps(o))' >> "$out"
    done
  done
done
