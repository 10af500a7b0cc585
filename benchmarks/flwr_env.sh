#!/usr/bin/env bash
# Flower's virtualenv for bench_flwr_secagg.py (see benchmarks/baseline_env.sh); prints its python path.
exec bash "$(dirname "${BASH_SOURCE[0]}")/baseline_env.sh" flwr
