#!/usr/bin/env bash
# Wide MLP, mixed precision, CPU: mixtrain under every precision policy (fp32, tf32, bf16-mixed,
# fp16-mixed; configs/mlp-*.toml) against PyTorch eager FP32 and PyTorch bf16 autocast, in one
# invocation, one table.
#
# Usage: bench/wide_mlp/run_policies.sh [MIXTRAIN_BIN] [THREADS]
#   MIXTRAIN_BIN  default build/bin/mixtrain
#   THREADS       default 2 (mixtrain backend.threads, torch.set_num_threads and PyTorch's
#                 OPENBLAS_NUM_THREADS: its FP32 GEMMs run on Debian's OpenBLAS, whose pthread pool
#                 torch.set_num_threads does not bound; the GPT bench sets it the same way)
# Environment:
#   STEPS      mixtrain steps per policy (default 30; windows of LOG_EVERY=5 steps, the first
#              window dropped as warm-up, steps/s = median of the rest)
#   BATCH      batch size for every run (default 512; data.batch_size / --batch)
#   POLICIES   mixtrain configs to run (default "fp32 tf32 bf16 fp16" -> configs/mlp-<p>.toml)
#   TORCH      PyTorch modes to run (default "fp32 bf16"; "" for none)
#   TORCH_WARMUP / TORCH_WINDOWS / TORCH_STEPS_PER_WINDOW (default 3 / 4 / 4)
#   TORCH_OPENBLAS_CORETYPE (default SkylakeX: Debian's OpenBLAS runs its SSE3 Prescott kernel on
#              this CPU otherwise, 2.5x slower; see RESULTS.md)
#   TORCH_OMP_WAIT_POLICY_FP32, TORCH_OMP_WAIT_POLICY_BF16 (default "unset PASSIVE ACTIVE" each;
#              the value "unset" is libgomp's default): PyTorch runs once under each value and its
#              fastest run is its row in the table (every run is listed above it). Swept, not
#              fixed: FP32 GEMMs run on OpenBLAS's pthread pool, where spinning OpenMP workers steal
#              its cores (PASSIVE won the paired runs under load), while under autocast the Linear
#              GEMMs run on PyTorch's bundled oneDNN (OpenMP pool, brg:avx512_core_bf16), where
#              ACTIVE may win; neither was measured against the others on an idle machine. One
#              value pins it.
#   PYTHON     default /usr/bin/python3 (Debian's python3-torch 1.13)
# Builds nothing. Run it from anywhere. About 5-6 minutes on an idle 2-core machine at batch 512
# (six PyTorch runs by default).
#
# Memory columns: "peak RSS" is summary.json's peak_rss_bytes for mixtrain (the training loop and
# the final eval, read before the final checkpoint is staged) and ru_maxrss for PyTorch (whole
# process); "backend peak" is summary.json's peak_memory_bytes (every tensor the backend
# allocated, plus its GEMM decode scratch). Ratios are against the same framework's FP32 run.
set -euo pipefail

BIN=${1:-build/bin/mixtrain}
THREADS=${2:-2}
STEPS=${STEPS:-30}
LOG_EVERY=${LOG_EVERY:-5}
BATCH=${BATCH:-512}
POLICIES=${POLICIES-fp32 tf32 bf16 fp16}
TORCH=${TORCH-fp32 bf16}
TORCH_WARMUP=${TORCH_WARMUP:-3}
TORCH_WINDOWS=${TORCH_WINDOWS:-4}
TORCH_STEPS_PER_WINDOW=${TORCH_STEPS_PER_WINDOW:-4}
TORCH_OPENBLAS_CORETYPE=${TORCH_OPENBLAS_CORETYPE:-SkylakeX}
TORCH_OMP_WAIT_POLICY_FP32=${TORCH_OMP_WAIT_POLICY_FP32:-unset PASSIVE ACTIVE}
TORCH_OMP_WAIT_POLICY_BF16=${TORCH_OMP_WAIT_POLICY_BF16:-unset PASSIVE ACTIVE}
PYTHON=${PYTHON:-/usr/bin/python3}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)

[[ -x $BIN ]] || { echo "run_policies.sh: $BIN not found; build first (cmake --build <build-dir>)" >&2; exit 2; }
for p in $POLICIES; do
  [[ -f $ROOT/configs/mlp-$p.toml ]] || { echo "run_policies.sh: configs/mlp-$p.toml not found" >&2; exit 2; }
done
if [[ -n $TORCH ]]; then
  "$PYTHON" -c 'import torch' 2>/dev/null ||
    { echo "run_policies.sh: $PYTHON cannot import torch (use Debian's /usr/bin/python3)" >&2; exit 2; }
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "# $(date -u +%FT%TZ)  $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, threads=$THREADS, batch=$BATCH"
echo "# load average before: $(load)"

# --- mixtrain, one policy after the other ---------------------------------------------------------
for p in $POLICIES; do
  "$BIN" train "$ROOT/configs/mlp-$p.toml" --set run.steps="$STEPS" --set run.log_every="$LOG_EVERY" \
    --set backend.threads="$THREADS" --set data.batch_size="$BATCH" --run-dir "$WORK/mixtrain-$p" \
    >"$WORK/mixtrain-$p.log" 2>&1 ||
    { echo "run_policies.sh: mixtrain $p failed:" >&2; cat "$WORK/mixtrain-$p.log" >&2; exit 1; }
  echo "# mixtrain $p done; load average: $(load)"
done

# --- PyTorch --------------------------------------------------------------------------------------
# One run per mode and OMP_WAIT_POLICY; the table takes each mode's fastest.
for m in $TORCH; do
  case $m in
    fp32) ac=none; wps=$TORCH_OMP_WAIT_POLICY_FP32 ;;
    bf16) ac=bf16; wps=$TORCH_OMP_WAIT_POLICY_BF16 ;;
    *) echo "run_policies.sh: unknown TORCH mode $m (fp32, bf16)" >&2; exit 2 ;;
  esac
  for wp in $wps; do
    [[ $wp == unset ]] && wp=
    # env -u: "unset" means libgomp's default even when the caller exported a policy.
    env -u OMP_WAIT_POLICY OPENBLAS_CORETYPE="$TORCH_OPENBLAS_CORETYPE" \
      OPENBLAS_NUM_THREADS="$THREADS" ${wp:+OMP_WAIT_POLICY=$wp} \
      "$PYTHON" "$HERE/torch_wide_mlp.py" --threads "$THREADS" --batch "$BATCH" --foreach false \
      --autocast "$ac" --warmup "$TORCH_WARMUP" --windows "$TORCH_WINDOWS" \
      --steps-per-window "$TORCH_STEPS_PER_WINDOW" >"$WORK/torch-$m-${wp:-unset}.json"
    echo "# pytorch $m OMP_WAIT_POLICY=${wp:-unset} done; load average: $(load)"
  done
done
echo "# load average after: $(load)"

# --- table ----------------------------------------------------------------------------------------
"$PYTHON" - "$WORK" "$BATCH" "$POLICIES" "$TORCH" <<'PY'
import glob, json, os, statistics, sys
work, batch, policies, torches = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
MiB = 1024.0 * 1024.0
NAMES = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16-mixed", "fp16": "fp16-mixed"}
rows = []  # (name, framework, steps/s, rss, backend peak)
for p in policies:
    run = os.path.join(work, f"mixtrain-{p}")
    s = json.load(open(os.path.join(run, "summary.json")))
    recs = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
    w = [r["samples_per_s"] / batch for r in recs if "samples_per_s" in r][1:]
    sps = statistics.median(w)
    print(f"mixtrain {NAMES[p]:<10}: windows {[round(x, 3) for x in w]} steps/s; applied "
          f"{s['applied_steps']}/{s['steps']} steps, final loss {s['final_loss']:.4f}, "
          f"final loss scale {s['final_loss_scale']:g}, wall {s['wall_seconds']:.1f} s, "
          f"RSS incl. checkpoint {s.get('peak_rss_bytes_with_checkpoint', 0) / MiB:.0f} MiB")
    rows.append((f"mixtrain {NAMES[p]}", "mixtrain", p, sps, s["peak_rss_bytes"], s["peak_memory_bytes"]))
for m in torches:
    label = "PyTorch FP32" if m == "fp32" else "PyTorch bf16 autocast"
    runs = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(work, f"torch-{m}-*.json")))]
    for t in runs:
        print(f"{label:<20}: windows {t['window_steps_per_s']} steps/s; OPENBLAS_CORETYPE="
              f"{t['openblas_coretype']} OPENBLAS_NUM_THREADS={t.get('openblas_num_threads') or '(unset)'} "
              f"OMP_WAIT_POLICY={t['omp_wait_policy'] or '(unset)'} foreach={t['foreach']}, "
              f"final loss {t['final_loss']:.4f}")
    # The fastest wait policy is PyTorch's figure (its best of the policies swept).
    t = max(runs, key=lambda r: r["steps_per_s"])
    label += f" (OMP_WAIT_POLICY={t['omp_wait_policy'] or 'unset'})"
    rows.append((label, "pytorch", m, t["steps_per_s"], t["peak_rss_bytes"], None))

def find(fw, key):
    for r in rows:
        if r[1] == fw and r[2] == key:
            return r
    return None
mfp32, tfp32, tbf16 = find("mixtrain", "fp32"), find("pytorch", "fp32"), find("pytorch", "bf16")
def ratio(a, b):
    return f"{a / b:.2f}x" if a and b else "-"
print()
cols = ["run", "steps/s", "ms/step", "vs mixtrain FP32", "vs PyTorch FP32", "vs PyTorch bf16 AC",
        "peak RSS MiB", "RSS vs own FP32", "backend peak MiB", "backend vs FP32"]
table = []
for name, fw, key, sps, rss, peak in rows:
    own = mfp32 if fw == "mixtrain" else tfp32
    table.append([name, f"{sps:.3f}", f"{1000.0 / sps:.0f}",
                  ratio(sps, mfp32[3] if mfp32 else None), ratio(sps, tfp32[3] if tfp32 else None),
                  ratio(sps, tbf16[3] if tbf16 else None),
                  f"{rss / MiB:.0f}", ratio(rss, own[4] if own else None),
                  f"{peak / MiB:.0f}" if peak else "-",
                  ratio(peak, mfp32[5] if (peak and mfp32) else None)])
width = [max(len(c), *(len(r[i]) for r in table)) for i, c in enumerate(cols)]
fmt = lambda cells: "| " + " | ".join(c.ljust(w) if i == 0 else c.rjust(w)
                                      for i, (c, w) in enumerate(zip(cells, width))) + " |"
print(fmt(cols))
print("|" + "|".join("-" * (w + 2) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(width)) + "|")
for r in table:
    print(fmt(r))
PY
