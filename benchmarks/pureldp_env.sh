#!/usr/bin/env bash
# Create (idempotently) the separate virtual environment in which the
# benchmarks run the pure-ldp package, the baseline of benchmarks/bench_oracles.py.
#
# pure-ldp 1.2.0 fails on xxhash 4 and numpy 2, and imports scikit-learn and
# statsmodels without declaring them, so it cannot share the project's .venv.
#
# Usage: bash benchmarks/pureldp_env.sh   (from anywhere; prints the python path)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BENCH_VENV:-$ROOT/.bench-venv}"
PY="${PYTHON:-python3.11}"
PINS=(pure-ldp==1.2.0 xxhash==3.8.2 numpy==1.26.4 scikit-learn statsmodels)
STAMP="$VENV/.pins"
WANT="${PINS[*]}"

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] \
   && "$VENV/bin/python" -c "import pure_ldp, xxhash, numpy, sklearn, statsmodels" 2>/dev/null; then
  echo "$VENV/bin/python"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}" >&2
"$VENV/bin/python" -c "import pure_ldp, xxhash, numpy, sklearn, statsmodels" >&2
echo "$WANT" > "$STAMP"
echo "$VENV/bin/python"
