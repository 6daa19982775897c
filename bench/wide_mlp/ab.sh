#!/usr/bin/env bash
# The wide MLP's A/B of two builds: bench/ab/ab.sh (which see) on the MLP policies only.
#
# Usage: bench/wide_mlp/ab.sh BIN_A BIN_B [ROUNDS]
# Environment: POLICIES (default "mlp-fp32 mlp-bf16": configs/<name>.toml), STEPS (default 30),
#   THREADS (default 2). Prints per policy and build the median step time over the rounds, its
#   spread, samples/s and the backend's peak bytes, then B/A.
set -euo pipefail
WORKLOADS=${POLICIES:-"mlp-fp32 mlp-bf16"} exec "$(dirname "$0")/../ab/ab.sh" "$@"
