#!/usr/bin/env bash
# Two builds of mixtrain on the wide MLP, side by side in one run: throughput and backend peak
# memory per policy, the builds alternating round by round so that drift in the machine's load
# falls on both alike.
#
# Usage: bench/wide_mlp/ab.sh BIN_A BIN_B [ROUNDS]
#   BIN_A, BIN_B  two mixtrain executables (each loads the plugins of its own build)
#   ROUNDS        default 3; each round trains every policy once with each build
# Environment: STEPS (default 30), POLICIES (default "mlp-fp32 mlp-bf16": configs/<name>.toml),
#   THREADS (backend.threads, default 2).
# Prints per policy and build the median samples/s over the rounds, its spread, and the backend's
# peak bytes (summary.json), then B/A. Builds nothing; run it from the repository root.
set -euo pipefail
A=${1:?BIN_A}; B=${2:?BIN_B}; ROUNDS=${3:-3}
STEPS=${STEPS:-30}; POLICIES=${POLICIES:-"mlp-fp32 mlp-bf16"}; THREADS=${THREADS:-2}
PYTHON=${PYTHON:-/usr/bin/python3}
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
echo "# $(date -u +%FT%TZ)  $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, threads=$THREADS, steps=$STEPS"
echo "# A = $A"; echo "# B = $B"; echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$ROUNDS"); do
  for p in $POLICIES; do
    for side in A B; do
      bin=$A; [[ $side == B ]] && bin=$B
      dir=$WORK/$p-$side-$r
      "$bin" train "configs/$p.toml" --set run.steps="$STEPS" --set run.eval_every=0 \
        --set backend.threads="$THREADS" --set run.dir="$dir" > "$dir.log" 2>&1 ||
        { echo "ab.sh: $bin failed on $p (see below)"; cat "$dir.log"; exit 1; }
    done
  done
done
"$PYTHON" - "$WORK" "$ROUNDS" $POLICIES <<'PY'
import json, statistics, sys
work, rounds, policies = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print(f"{'policy':<10} {'build':<5} {'samples/s (median)':>19} {'min..max':>18} {'peak MiB':>9}")
for p in policies:
    med = {}
    for side in "AB":
        runs = [json.load(open(f"{work}/{p}-{side}-{r}/summary.json")) for r in range(1, rounds + 1)]
        sps = [x["samples_per_s"] for x in runs]
        peak = max(x["peak_memory_bytes"] for x in runs) / 2**20
        med[side] = statistics.median(sps)
        print(f"{p:<10} {side:<5} {med[side]:>19.1f} {min(sps):>8.1f}..{max(sps):<9.1f} {peak:>9.2f}")
    print(f"{p:<10} B/A   {med['B'] / med['A']:>19.3f}")
PY
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
