#!/usr/bin/env bash
# Create (idempotently) the separate virtual environment in which benchmarks/bench_repeated.py runs
# multi-freq-ldpy, the baseline of the repeated-collection mechanisms (its dBitFlipPM, Ding et al. 2017).
# It needs numba and numpy of its own choosing, so it does not share the project's .venv.
#
# Usage: bash benchmarks/mfl_env.sh   (from anywhere; prints the python path)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BENCH_MFL_VENV:-$ROOT/.bench-mfl-venv}"
PY="${PYTHON:-python3.11}"
PINS=(multi-freq-ldpy==0.2.5 numpy numba xxhash)
STAMP="$VENV/.pins"
WANT="${PINS[*]}"

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] \
   && "$VENV/bin/python" -c "import multi_freq_ldpy.long_freq_est.dBitFlipPM" 2>/dev/null; then
  echo "$VENV/bin/python"
  exit 0
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}" >&2
"$VENV/bin/python" -c "import multi_freq_ldpy.long_freq_est.dBitFlipPM" >&2
echo "$WANT" > "$STAMP"
echo "$VENV/bin/python"
