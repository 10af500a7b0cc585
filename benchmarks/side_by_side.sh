#!/usr/bin/env bash
# Side by side: the oracle and the ingest benchmarks on two checkouts of the project (each with its own
# .venv, made by its scripts/bootstrap), alternating BEFORE and AFTER for ROUNDS rounds so that a change of
# load on the machine falls on both. Raw figures go to OUT (default ./out/side-by-side); print the table with
#   .venv/bin/python benchmarks/side_by_side_table.py OUT
# Usage: benchmarks/side_by_side.sh BEFORE_DIR AFTER_DIR [ROUNDS] [OUT]
# (for example: git worktree add /tmp/before <commit> && (cd /tmp/before && scripts/bootstrap)).
set -euo pipefail
before=$(cd "$1" && pwd); after=$(cd "$2" && pwd); rounds=${3:-2}
out=$(mkdir -p "${4:-out/side-by-side}" && cd "${4:-out/side-by-side}" && pwd)
for i in $(seq 1 "$rounds"); do
  for side in before after; do
    dir=$before; [ "$side" = after ] && dir=$after
    echo "side-by-side: round $i/$rounds, $side ($dir)" >&2
    (
      cd "$dir"
      export NUMBA_CACHE_DIR="$dir/.cache/numba"
      .venv/bin/python benchmarks/bench_oracles.py --n 1000000 --d 1024 --repeats 3 --no-pureldp --no-first-call \
        --out "$out/oracles-$side-$i.json" --plot "$out/oracles-$side-$i.png" > "$out/oracles-$side-$i.txt" 2>&1
      .venv/bin/python benchmarks/bench_ingest.py --transport sqlite --runs 3 --seconds 5 > "$out/ingest-$side-$i.txt" 2>&1
      cp benchmarks/results/ingest-sqlite.json "$out/ingest-$side-$i.json"
      git checkout -q -- benchmarks/results/ 2>/dev/null || true  # keep the checkout's committed figures
    )
  done
done
echo "side-by-side: done; raw figures in $out" >&2
