#!/usr/bin/env bash
# Create (idempotently) the separate virtual environment in which
# benchmarks/bench_flwr_secagg.py runs Flower's SecAgg+ primitives next to ours.
#
# flwr pulls grpcio, protobuf, pycryptodome, typer, rich and more; none of that
# belongs in the project's .venv, so flwr and this project (editable, with the
# `fl` extra, plus numba for the server's mask kernel) share a venv of their
# own, `.bench-flwr-venv` (git-ignored).
#
# Usage: bash benchmarks/flwr_env.sh   (from anywhere; prints the python path)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${BENCH_FLWR_VENV:-$ROOT/.bench-flwr-venv}"
PY="${PYTHON:-python3.11}"
PINS=(flwr==1.42.0 "numba>=0.60")
STAMP="$VENV/.pins"
WANT="${PINS[*]} -e $ROOT[fl] $(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
CHECK="import flwr, numpy, cryptography, client_sdk.fl.secagg, estimator.fl.secagg_server"

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] \
   && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
  echo "$VENV/bin/python"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}" -e "$ROOT[fl]" >&2
"$VENV/bin/python" -c "$CHECK" >&2
echo "$WANT" > "$STAMP"
echo "$VENV/bin/python"
