#!/usr/bin/env bash
# Where a mixtrain FP32 wide-MLP training step spends its time (companion to run.sh).
#
# Usage: bench/wide_mlp/profile.sh [MIXTRAIN_BIN] [THREADS]     (defaults: build/bin/mixtrain, 2)
# 1. ONEDNN_VERBOSE=1 run (STEPS, default 20; log_every=5): per step, the sum of oneDNN exec times
#    of the matmuls (11 per step) and of the ReLU eltwise primitives (6 per step) over the steps
#    after the first window, against the step time of the same windows from metrics.jsonl. The
#    rest ("outside oneDNN") is the backend's own OpenMP kernels (loss, bias_grad, AdamW, finite
#    check, grad norm), host copies and framework overhead.
# 2. perf record attached to the training loop only (from the first metrics record to the eval
#    record, so data synthesis, init, eval and the checkpoint are excluded): CPU samples by
#    shared object and by symbol. oneDNN's JIT kernels show as [JIT]/anonymous code.
# Builds nothing; needs perf for part 2 (skipped if missing).
set -euo pipefail
BIN=${1:-build/bin/mixtrain}
THREADS=${2:-2}
STEPS=${STEPS:-20}
PYTHON=${PYTHON:-/usr/bin/python3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CONFIG=$ROOT/configs/mlp-fp32.toml
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

ONEDNN_VERBOSE=1 "$BIN" train "$CONFIG" --set run.steps="$STEPS" --set run.log_every=5 \
  --set backend.threads="$THREADS" --run-dir "$WORK/v" >"$WORK/verbose.log" 2>&1
"$PYTHON" - "$WORK" "$STEPS" <<'PY'
import json, statistics, sys
work, steps = sys.argv[1], int(sys.argv[2])
execs = [l.strip().split(",") for l in open(f"{work}/verbose.log") if l.startswith("onednn_verbose,exec,")]
per_step = 17  # 4 fwd + 7 bwd matmuls, 3 ReLU fwd + 3 ReLU bwd eltwise
train = execs[: steps * per_step]
kinds = {}
for e in train:
    kinds.setdefault(e[3], []).append(float(e[-1]))
assert len(kinds.get("matmul", [])) == 11 * steps, {k: len(v) for k, v in kinds.items()}
skip = 5  # the first window (warm-up) is dropped
later = train[skip * per_step:]
mm = sum(float(e[-1]) for e in later if e[3] == "matmul") / (steps - skip)
el = sum(float(e[-1]) for e in later if e[3] == "eltwise") / (steps - skip)
recs = [json.loads(l) for l in open(f"{work}/v/metrics.jsonl") if "samples_per_s" in l]
step_ms = 1000.0 * statistics.mean(512.0 / r["samples_per_s"] for r in recs[1:])
print(f"step time (ONEDNN_VERBOSE run, steps {skip + 1}-{steps}): {step_ms:.1f} ms")
print(f"  oneDNN matmul (11 GEMMs):   {mm:8.1f} ms  {100 * mm / step_ms:5.1f}%")
print(f"  oneDNN eltwise (6 ReLU):    {el:8.1f} ms  {100 * el / step_ms:5.1f}%")
rest = step_ms - mm - el
print(f"  outside oneDNN primitives:  {rest:8.1f} ms  {100 * rest / step_ms:5.1f}%")
by_shape = {}
for e in later:
    if e[3] == "matmul":
        by_shape.setdefault(e[-2], []).append(float(e[-1]))
for shape, t in sorted(by_shape.items(), key=lambda kv: -sum(kv[1])):
    print(f"    matmul {shape:<28} {statistics.median(t):8.2f} ms median")
PY

if ! command -v perf >/dev/null; then echo "# perf not found: part 2 skipped"; exit 0; fi
RUN=$WORK/p
"$BIN" train "$CONFIG" --set run.steps="$STEPS" --set run.log_every=5 \
  --set backend.threads="$THREADS" --run-dir "$RUN" >"$WORK/perf-run.log" 2>&1 &
PID=$!
until [[ -s $RUN/metrics.jsonl ]]; do sleep 0.05; done
perf record -F 999 -p "$PID" -o "$WORK/perf.data" >/dev/null 2>&1 &
PERF=$!
until grep -q '"eval_loss"' "$RUN/metrics.jsonl" 2>/dev/null; do sleep 0.05; done
kill -INT "$PERF"; wait "$PERF" || true
wait "$PID"
echo "# perf, training steps 6-$STEPS only, share of CPU samples (both threads):"
perf report -i "$WORK/perf.data" --no-children --sort dso --stdio 2>/dev/null | grep '%' | grep -v '^#' | head -12
echo "# top symbols:"
perf report -i "$WORK/perf.data" --no-children --sort dso,sym --stdio 2>/dev/null | grep '%' | grep -v '^#' | head -25
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
