#!/usr/bin/env bash
# Create (idempotently) the separate virtual environment of one benchmark baseline and print its
# python path. Baselines pin their own numpy/xxhash/numba (or import undeclared packages), so none
# shares the project's .venv.
#
#   pureldp  pure-ldp 1.2.0, the baseline of bench_oracles.py. It fails on xxhash 4 and numpy 2 and
#            imports scikit-learn and statsmodels without declaring them.      venv: .bench-venv
#   mfl      multi-freq-ldpy 0.2.5 (its dBitFlipPM, Ding et al. 2017), the baseline of
#            bench_repeated.py; numba and numpy of its own choosing.             venv: .bench-mfl-venv
#   flwr     Flower 1.42.0 beside this project (editable, `fl` extra, numba for the server's mask
#            kernel), for bench_flwr_secagg.py; flwr pulls grpcio, protobuf, typer and more, none
#            of which belongs in .venv. Rebuilt when pyproject.toml changes.    venv: .bench-flwr-venv
#   opacus   Opacus 1.6.0 beside this project (editable; `torch` extra, and `server` for the
#            accountant), for bench_opacus.py: both sides of the DP-SGD comparison run on one
#            torch, PyPI's CUDA build (~5 GB; pip's cache serves it when scripts/test-torch
#            fetched it already). Rebuilt when pyproject.toml changes.  venv: .bench-opacus-venv
#
# Usage: bash benchmarks/baseline_env.sh NAME   (from anywhere; $BENCH_VENV overrides the folder)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3.11}"
case "${1:-}" in
  pureldp)
    VENV="${BENCH_VENV:-$ROOT/.bench-venv}"
    PINS=(pure-ldp==1.2.0 xxhash==3.8.2 numpy==1.26.4 scikit-learn statsmodels)
    CHECK="import pure_ldp, xxhash, numpy, sklearn, statsmodels" ;;
  mfl)
    VENV="${BENCH_VENV:-${BENCH_MFL_VENV:-$ROOT/.bench-mfl-venv}}"
    PINS=(multi-freq-ldpy==0.2.5 numpy numba xxhash)
    CHECK="import multi_freq_ldpy.long_freq_est.dBitFlipPM" ;;
  flwr)
    VENV="${BENCH_VENV:-${BENCH_FLWR_VENV:-$ROOT/.bench-flwr-venv}}"
    PINS=(flwr==1.42.0 "numba>=0.60" -e "$ROOT[fl]")
    STAMP_EXTRA="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
    CHECK="import flwr, numpy, cryptography, ldp_core.fl.secagg, estimator.fl.secagg_server" ;;
  opacus)
    VENV="${BENCH_VENV:-${BENCH_OPACUS_VENV:-$ROOT/.bench-opacus-venv}}"
    PINS=(opacus==1.6.0 -e "$ROOT[torch,server]")
    STAMP_EXTRA="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
    CHECK="import opacus, torch, client_sdk.fl.torch_dpsgd, estimator.jobs.dpsgd" ;;
  *)
    echo "usage: bash benchmarks/baseline_env.sh {pureldp|mfl|flwr|opacus}" >&2
    exit 2 ;;
esac
STAMP="$VENV/.pins"
WANT="${PINS[*]}${STAMP_EXTRA:+ $STAMP_EXTRA}"

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] \
   && "$VENV/bin/python" -c "$CHECK" 2>/dev/null; then
  echo "$VENV/bin/python"
  exit 0
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PY" -m venv "$VENV" >&2
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PINS[@]}" >&2
"$VENV/bin/python" -c "$CHECK" >&2
echo "$WANT" > "$STAMP"
echo "$VENV/bin/python"
