#!/usr/bin/env bash
# The multi-freq-ldpy baseline's virtualenv (see benchmarks/baseline_env.sh); prints its python path.
exec bash "$(dirname "${BASH_SOURCE[0]}")/baseline_env.sh" mfl
