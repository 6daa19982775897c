#!/usr/bin/env bash
# Wide MLP, FP32, CPU: mixtrain vs PyTorch eager vs the oneDNN GEMM-only lower bound, side by side.
#
# Usage: bench/wide_mlp/run.sh [MIXTRAIN_BIN] [THREADS]
#   MIXTRAIN_BIN  default build/bin/mixtrain; bench_wide_mlp_gemm_bound is taken from the same bin/
#   THREADS       default 2 (mixtrain backend.threads, torch.set_num_threads, omp_set_num_threads,
#                 PyTorch's OPENBLAS_NUM_THREADS)
# Environment: STEPS (mixtrain steps, default 40), TORCH_FOREACH (default|true|false, default
#   "false": the faster setting measured here; "both" runs both and keeps the faster),
#   TORCH_OPENBLAS_CORETYPE (default SkylakeX: Debian's OpenBLAS, which PyTorch's GEMMs run on,
#   does not recognise this CPU and runs its SSE3 Prescott kernel unless told; see RESULTS.md),
#   TORCH_OMP_WAIT_POLICY (default "unset PASSIVE ACTIVE": PyTorch runs once under each, "unset"
#   leaving libgomp's default, and the fastest is reported as PyTorch's. Swept rather than fixed:
#   PASSIVE won the paired runs under load (RESULTS.md), but with idle cores it was never measured
#   against the others, and "PyTorch at its best" has to mean the best of what was tried. One
#   value pins it),
#   PYTHON (default /usr/bin/python3: Debian's python3-torch).
# PyTorch runs with OPENBLAS_NUM_THREADS=THREADS: its FP32 GEMMs run on Debian's OpenBLAS, whose
# pthread pool torch.set_num_threads does not bound (it would start one thread per CPU), so
# without it PyTorch's GEMMs could use more threads than mixtrain's. The GPT bench sets it too.
# Builds nothing. Run it from the repository root. Takes about two minutes on an idle 2-core
# machine (a PyTorch run per wait policy and foreach value: three by default, six with "both").
set -euo pipefail

BIN=${1:-build/bin/mixtrain}
THREADS=${2:-2}
STEPS=${STEPS:-40}
TORCH_FOREACH=${TORCH_FOREACH:-false}
PYTHON=${PYTHON:-/usr/bin/python3}
TORCH_OPENBLAS_CORETYPE=${TORCH_OPENBLAS_CORETYPE:-SkylakeX}
TORCH_OMP_WAIT_POLICY=${TORCH_OMP_WAIT_POLICY:-unset PASSIVE ACTIVE}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BOUND=$(dirname "$BIN")/bench_wide_mlp_gemm_bound
CONFIG=$ROOT/configs/mlp-fp32.toml

for f in "$BIN" "$BOUND"; do
  [[ -x $f ]] || { echo "run.sh: $f not found; build first (cmake --build <build-dir>)" >&2; exit 2; }
done
"$PYTHON" -c 'import torch' 2>/dev/null ||
  { echo "run.sh: $PYTHON cannot import torch (use Debian's /usr/bin/python3)" >&2; exit 2; }

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
echo "# $(date -u +%FT%TZ)  $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, threads=$THREADS"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- mixtrain ---------------------------------------------------------------------------------
# Windows of 5 steps (log_every=5); the first window (primitive creation, first touch) is dropped.
# Peak RSS: summary.json's peak_rss_bytes is the training loop's, taken before the final
# checkpoint is staged in host memory (peak_rss_bytes_with_checkpoint includes it, which PyTorch's
# loop never does); the polled VmHWM until the last training record appears in metrics.jsonl is
# reported beside it as a check.
RUN=$WORK/mixtrain-run
"$BIN" train "$CONFIG" --set run.steps="$STEPS" --set run.log_every=5 \
  --set backend.threads="$THREADS" --run-dir "$RUN" >"$WORK/mixtrain.log" 2>&1 &
PID=$!
TRAIN_HWM=0
# Bash builtins only (no awk/grep per poll): forking every few ms would steal CPU from the run.
training_done() {
  local line
  [[ -f $RUN/metrics.jsonl ]] || return 1
  while IFS= read -r line; do [[ $line == *'"eval_loss"'* ]] && return 0; done <"$RUN/metrics.jsonl"
  return 1
}
while kill -0 "$PID" 2>/dev/null; do
  HWM=
  while read -r key val _; do [[ $key == VmHWM: ]] && HWM=$val; done <"/proc/$PID/status" 2>/dev/null || true
  training_done && break  # this poll's HWM may include the checkpoint: keep the previous one
  [[ -n $HWM ]] && TRAIN_HWM=$HWM
  sleep 0.2
done
if ! wait "$PID"; then
  echo "run.sh: mixtrain failed:" >&2; cat "$WORK/mixtrain.log" >&2; exit 1
fi
echo "$TRAIN_HWM" >"$WORK/mixtrain.train_hwm_kib"
echo "# mixtrain done; load average: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- PyTorch ----------------------------------------------------------------------------------
# One run per foreach setting and OMP_WAIT_POLICY; the table keeps the fastest as PyTorch's.
torch_run() {  # $1: foreach, $2: OMP_WAIT_POLICY ("unset": libgomp's default, even if exported)
  local wp=()
  [[ $2 == unset ]] || wp=("OMP_WAIT_POLICY=$2")
  env -u OMP_WAIT_POLICY OPENBLAS_CORETYPE="$TORCH_OPENBLAS_CORETYPE" OPENBLAS_NUM_THREADS="$THREADS" \
    "${wp[@]}" "$PYTHON" "$HERE/torch_wide_mlp.py" --threads "$THREADS" --foreach "$1" \
    --warmup 3 --windows 5 --steps-per-window 5
}
[[ $TORCH_FOREACH == both ]] && FOREACHES="false true" || FOREACHES=$TORCH_FOREACH
for fe in $FOREACHES; do
  for wp in $TORCH_OMP_WAIT_POLICY; do
    torch_run "$fe" "$wp" >"$WORK/torch-$fe-$wp.json"
    echo "# pytorch foreach=$fe OMP_WAIT_POLICY=$wp done; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
echo "# pytorch done; load average: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- GEMM lower bound -------------------------------------------------------------------------
"$BOUND" --threads "$THREADS" --warmup 3 --windows 5 --steps-per-window 5 >"$WORK/bound.json"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

# --- table ------------------------------------------------------------------------------------
"$PYTHON" - "$WORK" "$STEPS" <<'PY'
import glob, json, os, statistics, sys
work, steps = sys.argv[1], int(sys.argv[2])
run = os.path.join(work, "mixtrain-run")
summary = json.load(open(os.path.join(run, "summary.json")))
recs = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
train = [r for r in recs if "samples_per_s" in r]
windows = [r["samples_per_s"] / 512.0 for r in train[1:]]  # drop the warm-up window
mix_sps = statistics.median(windows)
mix_rss_train = int(open(os.path.join(work, "mixtrain.train_hwm_kib")).read()) * 1024
mix_rss_summary = summary["peak_rss_bytes"]
torches = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(work, "torch-*.json")))]
torch = max(torches, key=lambda t: t["steps_per_s"])
bound = json.load(open(os.path.join(work, "bound.json")))
MiB = 1024.0 * 1024.0

print(f"mixtrain windows (steps/s, 5 steps each, first dropped): {[round(w, 3) for w in windows]}")
for t in torches:
    print(f"pytorch foreach={t['foreach']} OPENBLAS_CORETYPE={t['openblas_coretype']} "
          f"OPENBLAS_NUM_THREADS={t.get('openblas_num_threads') or '(unset)'} "
          f"OMP_WAIT_POLICY={t['omp_wait_policy'] or '(unset)'}: {t['steps_per_s']:.3f} steps/s, "
          f"windows {t['window_steps_per_s']}, peak RSS {t['peak_rss_bytes'] / MiB:.0f} MiB")
print(f"PyTorch's row below: the fastest of these {len(torches)} run(s)")
print(f"gemm bound windows: {bound['window_steps_per_s']}, {bound['gflop_per_s']:.1f} GFLOP/s, "
      f"{bound['gflop_per_step']:.2f} GFLOP/step")
print(f"mixtrain backend peak tensor memory (peak_memory_bytes): {summary['peak_memory_bytes'] / MiB:.0f} MiB")
print()
hdr = f"| {'run':<60} | {'steps/s':>7} | {'vs PyTorch':>10} | {'of GEMM bound':>13} | {'peak RSS MiB':>12} | {'RSS vs PyTorch':>14} |"
print(hdr)
print("|" + "|".join("-" * (len(c)) for c in hdr.split("|")[1:-1]) + "|")
def row(name, sps, rss):
    rss_s = f"{rss / MiB:.0f}" if rss else "-"
    rr = f"{rss / torch['peak_rss_bytes']:.2f}x" if rss else "-"
    print(f"| {name:<60} | {sps:>7.3f} | {sps / torch['steps_per_s']:>9.2f}x | "
          f"{100.0 * sps / bound['steps_per_s']:>12.1f}% | {rss_s:>12} | {rr:>14} |")
row("mixtrain (training loop)", mix_sps, mix_rss_train)
row("mixtrain (summary.json)", summary["samples_per_s"] / 512.0, mix_rss_summary)
row(f"PyTorch eager (foreach={torch['foreach']}, OMP_WAIT_POLICY={torch['omp_wait_policy'] or 'unset'})",
    torch["steps_per_s"], torch["peak_rss_bytes"])
row("oneDNN GEMMs only (lower bound)", bound["steps_per_s"], 0)
PY
