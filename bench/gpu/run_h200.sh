#!/usr/bin/env bash
# The whole GPU session in one command, on a machine with an NVIDIA H200 or H100 (x86-64, CUDA
# toolkit and PyTorch installed; no apt, no network; both are sm_90 with the same SMs, clocks and
# peaks, the name is historical): unpack the Debian packages that
# bench/gpu/fetch_debs.sh fetched into .debs/ into a private prefix, build mixtrain with the CUDA
# backend for sm_90, then
#   test  ctest -L gpu_kit -LE gpu_kit_host --output-on-failure (the tests of the programs the
#         CMakeLists mark for the kit, less those that need no GPU: the programs that reach no
#         CUDA library, labelled gpu_kit_host by cmake/MixtrainGpuKit.cmake, and the conformance
#         suite's CPU instances; CI runs those on every push)
#   resnet50, gpt2  the issues' headline models against PyTorch eager (AMP bf16, FP32, TF32;
#         AMP bf16), images/s or tokens/s, RN_POLICIES and GPT_POLICIES
#   profile  where the time goes: `mixtrain train --profile` on ResNet-50 and GPT-2 small, and
#         torch.profiler on the same PyTorch peers (top PROFILE_TOP kernels by GPU time); then
#         mixtrain's fp8-delayed on GPT-2 small (where FP8's time goes); last ResNet-50 with its
#         convolutions autotuned (each shape's default engine beside the fastest of 8)
#   counters  hardware counters (Nsight Compute, ncu) of the element-wise kernels the profiles
#         rank highest: ResNet-50's batch norm, residual, pooling and casts, GPT-2's loss, layer
#         norm and optimizer; per kernel the duration, DRAM and L1 throughput (% of peak),
#         achieved occupancy and registers (whether it waits on DRAM, on L1 or for warps); skipped,
#         saying so, where ncu cannot read the counters
#   gemm  GEMM TFLOP/s per dtype at 8192^3: bench_gemm_cuda (CudaGemm::gemm, cuBLASLt) with
#         the default algorithm and again with gemm_autotune (bf16, fp16, fp8), and PyTorch's
#         matmul on the same GPU for reference
#   resnet50v, gpt2v  the A/B variants (RN_VARIANTS, GPT_VARIANTS: one option each), mixtrain
#         only; their rows join the resnet50 and gpt2 tables
#   wide  the wide-MLP training benchmark, mixtrain under fp32, tf32, bf16-mixed, fp16-mixed and
#         fp8-delayed (configs/mlp-*.toml, --set backend.type=cuda) against PyTorch FP32 eager and
#         AMP bf16 (torch.autocast("cuda", torch.bfloat16)), same model, batch and GPU
#   gemmsweep  why a 16-bit GEMM trails PyTorch: bench_gemm_cuda_sweep (the backend's GemmEngine
#         as it is, with 4/64 MiB workspaces, each of the top-8 heuristic results, autotuned, and
#         cublasGemmEx, PyTorch's path) and torch_gemm.py --sweep, bf16 and fp16, at the square
#         shape and the wide MLP's fwd/dgrad/wgrad GEMMs, one timing method for all
#   gpt2medium  the gpt2 stage at GPT-2 medium's shape (24 layers, 16 heads, 1024 wide), where
#         FP8 has more GEMM to win; last, with what the budget leaves (or alone in a second call)
# A session's device time (15 minutes, the machine's start included) holds two calls, not one
# long one: CALL=1 (the default) builds, tests and measures the headline bf16 pairs, CALL=2 the rest
# on the same warm machine (bench/gpu/README.md, "The GPU session: two calls").
# $OUT holds at most 7 files, none in a folder (the device tool brings back a flat, short list),
# rewritten after every stage (the model tables and profile.md after every run) so a run cut
# short still returns what it measured:
#   summary.txt  every stage's status (ok / FAILED / TIMEOUT / skipped), seconds, the GPU
#   build.log    the configure and build output          tests.log   the test stage's ctest
#   gemm.txt     the gemm and gemmsweep stages            models.md   the model stages' tables
#   profile.md   mixtrain's and PyTorch's profiles        runs.tar.gz every run's raw files
# Every stage runs under `timeout`, clamped to what is left of BUDGET_S; a failed stage never
# stops the next one, except debs, configure and build: when one of those fails the script
# collects what it has and ends (PyTorch rows alone would spend minutes of device time on figures
# with nothing to compare them to).
#
# Usage, from the repository root: bash bench/gpu/run_h200.sh      (see bench/gpu/README.md)
# Environment (defaults in brackets):
#   OUT [build-gpu-out]  results folder (the device tool sets it)
#   STATE [/tmp/mixtrain-gpu-state; /tmp/mixtrain-gpu-state-dry under DRY_RUN]  the working
#          folder (each stage's logs, runs and reports, the token file). It is REMOVED at the
#          start of every call, so it must be new, empty or a folder of this script's own (it
#          marks those with a .run_h200-state file; anything else is refused). Two calls at once,
#          or a dry run beside a real one, need two.
#   TIMEOUT_S [330 for CALL=1, 360 for CALL=2]  the device call's timeout_s, which the script
#          cannot see: give the same number to both
#   BUDGET_S [TIMEOUT_S - 40]  wall-clock budget of the whole script, seconds (the 40: the last
#          stage's kill grace, the final collect and its tar)
#   CALL [1]  which call of the session's plan sets the defaults of STAGES and the model policies:
#          1  STAGES "env debs configure build test resnet50 gpt2 profile", the bf16 pairs only
#             (RN_POLICIES, RN_TORCH, GPT_POLICIES, GPT_TORCH = bf16); the profile if time is left
#          2  STAGES "env build resnet50 gpt2 counters gemm resnet50v gpt2v wide gemmsweep gpt2medium", with
#             debs and configure first unless the first call's prefix and build are still there
#             (a warm machine); RN_POLICIES = RN_TORCH = "fp32 tf32", GPT_POLICIES "bf16 fp8
#             fp8-block" (bf16: the fp8 rows' base), GPT_TORCH none (call 1 measured it)
#          all  every stage and policy, as one call did before (a dry run, or a longer lease)
#   STAGES ["env debs configure build test resnet50 gpt2 profile counters gemm resnet50v gpt2v wide gemmsweep
#           gpt2medium", less what CALL leaves out]  any subset (always run in this order)
#   CHECK_POLICIES [bf16]  the policies whose `mixtrain check` (a CUDA start-up and a rehearsed
#          step each) fills the model tables' predicted column
#   PROFILE_STEPS [8: mixtrain's profiled steps; PyTorch profiles 3 after its warmup]  PROFILE_TOP [30]
#   COUNTER_TARGETS [the counters stage's kernels, model:regex:launches a step[:policy]; see below]
#   DEBS [.debs]  DEBROOT [/tmp/debroot]  BUILD_DIR [build-h200]  JOBS [nproc]  CUDA_ARCHS [90]
#   CMAKE_EXTRA_ARGS  more -D options for the configure stage (word-split)
#   BUILD_TARGETS  [gpu_kit: mixtrain, the plugins and every test and benchmark the CMakeLists
#                   mark with mixtrain_gpu_kit (cmake/MixtrainGpuKit.cmake)]
#   PYTHON [python3: the interpreter with PyTorch]   MIXTRAIN_BIN [$BUILD_DIR/bin/mixtrain]
#   GEMM_SIZE [8192]  GEMM_SECONDS [1]  GEMM_AUTOTUNE [8: the gemm stage's tuned run]  SWEEP_ROUNDS [5]  SWEEP_CANDIDATES [8]  (the sweep's wide
#   cases use WIDE_BATCH and WIDE_HIDDEN)
#   RN_STEPS [60], RN_LOG_EVERY [10], GPT_STEPS [120], GPT_LOG_EVERY [20]: mixtrain's first window
#   is dropped and the median of the rest taken; PyTorch warms up for 5 steps and 1 s at least
#   (TORCH_WARMUP_S), then times the same windows
#   WIDE_BATCH [16384]  WIDE_FEATURES [256]  WIDE_HIDDEN [8192]  WIDE_STEPS [30]  WIDE_LOG_EVERY [5]
#   WIDE_POLICIES ["bf16 fp32 fp8 tf32 fp16"]  WIDE_TORCH ["bf16 fp32"]  (run order: the headline
#   pair first, so a budget that runs out loses the least)  WIDE_BACKEND [cuda]  TORCH_DEVICE [cuda]
#   TORCH_FUSED [true: fused AdamW, PyTorch's fastest on CUDA]  PEAK_TFLOPS [989.4]
#   DRY_RUN=1  a check of the scripting on a machine without a GPU: CPU backend and CPU PyTorch at
#              a tiny size (GPT: 2 layers, 64 wide, a 256-token vocabulary; PROFILE_STEPS=3),
#              /usr/bin/python3, JOBS=2, BUDGET_S=7200 and every stage's cap CAP_SCALE=10 times
#              the GPU's (a 2-core build takes ten minutes, not one; the GPU-only parts then report
#              "no CUDA device" / skip, as they should)
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
HERE=$ROOT/bench/gpu
cd "$ROOT"
# The A/B variants' options (variant_sets) and the policies' names (policy_name).
source "$HERE/variant_sets.sh"

if [[ ${DRY_RUN:-0} == 1 ]]; then
  : "${WIDE_BACKEND:=cpu}" "${TORCH_DEVICE:=cpu}" "${TORCH_FUSED:=default}" "${PYTHON:=/usr/bin/python3}"
  : "${WIDE_BATCH:=64}" "${WIDE_FEATURES:=32}" "${WIDE_HIDDEN:=64}" "${WIDE_STEPS:=6}" "${WIDE_LOG_EVERY:=2}"
  : "${JOBS:=2}" "${BUDGET_S:=7200}" "${CAP_SCALE:=10}" "${GEMM_SIZE:=256}" "${DEBROOT:=/tmp/debroot-dry}"
  : "${BUILD_DIR:=$ROOT/build-h200-dry}" "${OUT:=$ROOT/build-gpu-out-dry}"
  : "${MODEL_BACKEND:=cpu}" "${RN_BATCH:=2}" "${RN_IMAGE:=32}" "${RN_STEPS:=6}" "${RN_LOG_EVERY:=2}"
  : "${GPT_BATCH:=2}" "${GPT_LAYERS:=2}" "${GPT_HEADS:=2}" "${GPT_WIDTH:=64}" "${GPT_TOKENS:=64}"
  : "${GPT2M_LAYERS:=3}" "${GPT2M_HEADS:=2}" "${GPT2M_WIDTH:=64}" "${GPT2M_BATCH:=2}" "${GPT2M_POLICIES:=bf16}"
  : "${GPT_STEPS:=6}" "${GPT_LOG_EVERY:=2}" "${GPT_POLICIES:=bf16}" "${MODEL_RUN_CAP:=300}" "${TORCH_WARMUP_S:=0}"
  # GPT-2's 50257-token vocabulary makes the LM head most of a tiny model's work on a CPU: the
  # final eval over the token file's held-out split alone took ~54 s, past the profile stage's
  # 45 s share per GPT run, and 8 profiled steps more. A byte-sized vocabulary and 3 profiled
  # steps check the same scripting in seconds.
  : "${GPT_VOCAB:=256}" "${PROFILE_STEPS:=3}"
  : "${RN_VARIANTS=bf16+pageable}" "${GPT_VARIANTS=bf16+whole}"
  : "${STATE:=/tmp/mixtrain-gpu-state-dry}"  # not a real run's state folder
fi
export OUT=${OUT:-$ROOT/build-gpu-out}
export DEBS=${DEBS:-$ROOT/.debs}
export DEBROOT=${DEBROOT:-/tmp/debroot}
export BUILD=${BUILD_DIR:-$ROOT/build-h200}
# The session's plan (bench/gpu/README.md): 15 minutes of device time hold a machine's start (1-2
# min) and two calls, so no call may take all of them (a 600 s call left no time to run again).
# Call 1 builds, tests and measures the headline bf16 pairs (mixtrain against PyTorch AMP), call 2
# the rest on the same warm machine. The budget is the call's timeout less the last stage's kill
# grace, the final collect and the tar.
export CALL=${CALL:-1}
case $CALL in
  1) : "${TIMEOUT_S:=330}" "${STAGES:=env debs configure build test resnet50 gpt2 profile}"
     : "${RN_POLICIES:=bf16}" "${RN_TORCH:=bf16}" "${GPT_POLICIES:=bf16}" "${GPT_TORCH=bf16}" ;;
  2) : "${TIMEOUT_S:=360}"
     # A warm machine still has the first call's prefix and build: the build stage (ninja, nothing
     # to do) only confirms them. A fresh one (the first went back) unpacks and configures again.
     if [[ -z ${STAGES:-} ]]; then
       STAGES="env build resnet50 gpt2 counters gemm resnet50v gpt2v wide gemmsweep gpt2medium"
       [[ -f $BUILD/build.ninja && -x $DEBROOT/wrap/c++ ]] || STAGES="env debs configure ${STAGES#env }"
     fi
     : "${RN_POLICIES:=fp32 tf32}" "${RN_TORCH:=fp32 tf32}" "${GPT_POLICIES:=bf16 fp8 fp8-block}" "${GPT_TORCH=}" ;;
  all) : "${TIMEOUT_S:=600}" ;;
  *) echo "run_h200.sh: CALL=$CALL: 1, 2 or all" >&2; exit 2 ;;
esac
export TIMEOUT_S BUDGET_S=${BUDGET_S:-$((TIMEOUT_S - 40))} CAP_SCALE=${CAP_SCALE:-1}
# Exported: the stages run in `bash -c` and ask whether the build stage is in this call.
export STAGES=${STAGES:-env debs configure build test resnet50 gpt2 profile counters gemm resnet50v gpt2v wide gemmsweep gpt2medium}
export JOBS=${JOBS:-$(nproc)}
export CUDA_ARCHS=${CUDA_ARCHS:-90}
export BUILD_TARGETS=${BUILD_TARGETS:-gpu_kit}
export PYTHON=${PYTHON:-python3}
export MIXTRAIN_BIN=${MIXTRAIN_BIN:-$BUILD/bin/mixtrain}
export GEMM_SIZE=${GEMM_SIZE:-8192} GEMM_SECONDS=${GEMM_SECONDS:-1} GEMM_AUTOTUNE=${GEMM_AUTOTUNE:-8}
export SWEEP_ROUNDS=${SWEEP_ROUNDS:-5} SWEEP_CANDIDATES=${SWEEP_CANDIDATES:-8}
export WIDE_BATCH=${WIDE_BATCH:-16384} WIDE_FEATURES=${WIDE_FEATURES:-256} WIDE_HIDDEN=${WIDE_HIDDEN:-8192}
export WIDE_STEPS=${WIDE_STEPS:-30} WIDE_LOG_EVERY=${WIDE_LOG_EVERY:-5}
export WIDE_POLICIES=${WIDE_POLICIES:-bf16 fp32 fp8 tf32 fp16} WIDE_TORCH=${WIDE_TORCH:-bf16 fp32}
export WIDE_BACKEND=${WIDE_BACKEND:-cuda} TORCH_DEVICE=${TORCH_DEVICE:-cuda} TORCH_FUSED=${TORCH_FUSED:-true}
export PEAK_TFLOPS=${PEAK_TFLOPS:-989.4}
export MODEL_BACKEND=${MODEL_BACKEND:-cuda} MODEL_RUN_CAP=${MODEL_RUN_CAP:-60}
# Windows long enough to time (GPT-2 small runs a step in ~18 ms: 5-step windows were 90 ms), the
# first dropped as warm-up; a few seconds per run at most, next to its start-up's ten or more.
export RN_BATCH=${RN_BATCH:-128} RN_IMAGE=${RN_IMAGE:-224} RN_STEPS=${RN_STEPS:-60} RN_LOG_EVERY=${RN_LOG_EVERY:-10}
export RN_POLICIES=${RN_POLICIES:-bf16 fp32 tf32} RN_TORCH=${RN_TORCH:-bf16 fp32 tf32}
export RN_VARIANTS=${RN_VARIANTS-$KIT_RN_VARIANTS}
export GPT_BATCH=${GPT_BATCH:-8} GPT_LAYERS=${GPT_LAYERS:-12} GPT_HEADS=${GPT_HEADS:-12} GPT_WIDTH=${GPT_WIDTH:-768}
export GPT_TOKENS=${GPT_TOKENS:-1024} GPT_VOCAB=${GPT_VOCAB:-50257} GPT_STEPS=${GPT_STEPS:-120} GPT_LOG_EVERY=${GPT_LOG_EVERY:-20}
export GPT_POLICIES=${GPT_POLICIES:-bf16 fp8 fp8-block} GPT_TORCH=${GPT_TORCH-bf16}
export TORCH_WARMUP_S=${TORCH_WARMUP_S:-1} CHECK_POLICIES=${CHECK_POLICIES-bf16}
export GPT_VARIANTS=${GPT_VARIANTS-$KIT_GPT_VARIANTS}
export GPT2M_LAYERS=${GPT2M_LAYERS:-24} GPT2M_HEADS=${GPT2M_HEADS:-16} GPT2M_WIDTH=${GPT2M_WIDTH:-1024}
export GPT2M_BATCH=${GPT2M_BATCH:-8} GPT2M_POLICIES=${GPT2M_POLICIES:-bf16 fp8 fp8+plaincast}
export ROOT HERE
export PROFILE_STEPS=${PROFILE_STEPS:-8} PROFILE_TOP=${PROFILE_TOP:-30}
# model:kernel regex:launches a step (step 1's are skipped): ResNet-50's batch norm passes, the
# residual join's backward and the max pool's, GPT-2's loss rows, layer norm and AdamW.
export COUNTER_TARGETS=${COUNTER_TARGETS:-resnet50:bn_apply_packs:53 resnet50:bn_grad_input_packs:53 resnet50:bn_moments:53 resnet50:bn_grad_sums:53 resnet50:residual_backward:16 resnet50:pool_backward:2 gpt2:softmax_xent:8 gpt2:layernorm_add_forward:24 gpt2:adamw:2 gpt2:cast_transpose_kernel:144:fp8-delayed}
export STATE=${STATE:-/tmp/mixtrain-gpu-state}
export PARTS=$STATE/parts  # each stage's report, gathered into $OUT by collect
# STATE is removed below, so only a folder this script made (its marker inside), an empty one or
# a missing one: a STATE set by mistake to a folder of anything else is refused, not wiped. The
# two default paths pass too, as the state of versions before the marker.
if [[ -e $STATE && ! -f $STATE/.run_h200-state && $STATE != /tmp/mixtrain-gpu-state &&
      $STATE != /tmp/mixtrain-gpu-state-dry ]] && [[ ! -d $STATE || -n $(ls -A "$STATE") ]]; then
  echo "run_h200.sh: STATE=$STATE exists and is not this script's state folder (no .run_h200-state" \
    "in it); it would be removed at the start, so give STATE a new folder" >&2
  exit 2
fi
rm -rf "$STATE"
mkdir -p "$OUT" "$STATE" "$PARTS"
touch "$STATE/.run_h200-state"
export LIBDIR=$DEBROOT/usr/lib/x86_64-linux-gnu
# The unpacked libraries, for mixtrain's processes only (the build's RPATHs point there as well);
# never for python3/PyTorch, whose own libraries (zlib, ...) must not be shadowed.
export MIX_LD_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# nvcc where the image keeps it; the prefix's ninja only as a fallback.
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do [[ -x $d/nvcc ]] && { PATH=$PATH:$d; break; }; done
fi
export PATH=$PATH:$DEBROOT/usr/bin

T0=$(date +%s)
left() { echo $((BUDGET_S - ($(date +%s) - T0))); }
names=() statuses=() secs=()

# run_stage NAME WANT_SECONDS RESERVE_SECONDS: runs stage_NAME under timeout
# min(WANT x CAP_SCALE, time left - RESERVE), output to $STATE/NAME.log and stdout.
run_stage() {
  local name=$1 want=$(($2 * CAP_SCALE)) reserve=$3 cap rc start status
  cap=$(($(left) - reserve))
  ((cap > want)) && cap=$want
  start=$(date +%s)
  if [[ " $STAGES " != *" $name "* ]]; then
    status="skipped (not in STAGES)"
  elif [[ -f $STATE/skip-$name ]]; then
    status="skipped ($(cat "$STATE/skip-$name"))"
  elif ((cap < 10)); then
    status="skipped (budget spent: $(left) s left)"
  else
    echo "=== [$(date -u +%T)] stage $name (cap ${cap} s, $(left) s of the budget left) ==="
    # The summary in $OUT names the stage under way: a call killed in it says where it stopped.
    write_summary "$name (since $(date -u +%T), cap ${cap} s)" >"$OUT/summary.txt"
    export STAGE_CAP=$cap
    timeout -k 10 "$cap" bash -c "stage_$name" 2>&1 | tee "$STATE/$name.log"
    rc=${PIPESTATUS[0]}
    case $rc in
      0) status=ok ;;
      124 | 137) status="TIMEOUT after ${cap} s" ;;
      *) status="FAILED (exit $rc)" ;;
    esac
    [[ -f $STATE/$name.note ]] && status="$status; $(cat "$STATE/$name.note")"
  fi
  names+=("$name") statuses+=("$status") secs+=($(($(date +%s) - start)))
  echo "=== stage $name: $status ==="
  [[ $status == ok* ]] && touch "$STATE/ok-$name"
  collect
  return 0
}
needs() {  # needs STAGE REASON...: marks the given later stages skipped unless STAGE succeeded
  local dep=$1; shift
  [[ -f $STATE/ok-$dep || " $STAGES " != *" $dep "* ]] && return 0
  for s in "$@"; do echo "needs the $dep stage, which did not succeed" >"$STATE/skip-$s"; done
}
# reserve STAGE...: the seconds to keep for those later stages, those in STAGES only (a stage this
# call does not run keeps nothing back): each stage's least useful share, the headline pair's
# two runs (a mixtrain run with its bf16 check and its PyTorch peer, start-ups, cuDNN's plans and
# cudnn.benchmark's trials included: ~45-65 s for ResNet-50, ~25-40 s for GPT-2 small).
reserve() {
  local s total=0
  for s in "$@"; do
    [[ " $STAGES " == *" $s "* ]] || continue
    case $s in resnet50) total=$((total + 70)) ;; gpt2) total=$((total + 50)) ;; esac
  done
  echo "$total"
}
# stop_unless_built: after the build stage, ends the script (a final collect, the summary, exit 1)
# when debs, configure or build was asked for and did not succeed. What would follow is either
# skipped for want of the build or PyTorch's rows alone: minutes of device time for no comparison.
stop_unless_built() {
  local s failed="" later=(test resnet50 gpt2 profile counters gemm resnet50v gpt2v wide gemmsweep gpt2medium)
  for s in debs configure build; do
    [[ " $STAGES " == *" $s "* && ! -f $STATE/ok-$s ]] && failed+=" $s"
  done
  [[ -z $failed ]] && return 0
  echo "=== stopping: the${failed} stage did not succeed (see build.log); nothing after it runs ==="
  for s in "${later[@]}"; do
    names+=("$s") secs+=(0)
    if [[ " $STAGES " == *" $s "* ]]; then statuses+=("skipped (the script stopped: the${failed} stage did not succeed)")
    else statuses+=("skipped (not in STAGES)"); fi
  done
  collect
  cat "$OUT/summary.txt"
  exit 1
}

# --- stages (each runs in its own bash under timeout; exported below) -----------------------------
stage_env() {
  {
    echo "date: $(date -u +%FT%TZ)   host: $(uname -srm)   cpus: $(nproc)"
    [[ -r /etc/os-release ]] && echo "os: $(. /etc/os-release; echo "$PRETTY_NAME")"
    if command -v nvidia-smi >/dev/null; then
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm,power.limit,temperature.gpu \
        --format=csv 2>&1
    else
      echo "nvidia-smi: not found"
    fi
    echo "nvcc: $(nvcc --version 2>&1 | tail -2 | tr '\n' ' ')"
    echo "c++: $(${CXX:-g++} --version 2>&1 | head -1)"
    echo "cmake: $(cmake --version 2>&1 | head -1)   ninja: $(ninja --version 2>&1)"
    # One Python start for the versions and the libraries PyTorch loads (cuDNN, cuBLAS, cuBLASLt,
    # the CUDA runtime, each as it reports itself): the other side of mixtrain's, below.
    echo "python: $(command -v "$PYTHON")"
    timeout 60 "$PYTHON" "$HERE/cuda_libs.py" torch 2>&1 | tail -n 8
    echo "debs: $(ls "$DEBS"/*.deb 2>/dev/null | wc -l) in $DEBS"
    echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null) $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed files"
  } | tee "$STATE/env.txt"
  # A build already here (a second call): what mixtrain loads, beside PyTorch's above.
  mixtrain_libs 2>/dev/null
  return 0
}

# mixtrain_libs: the CUDA libraries mixtrain's CUDA runtime loads under MIX_LD_PATH (ldd), each with
# the version it reports (cuda_libs.py), into $STATE/mixtrain-libs.txt (summary.txt shows it
# beside PyTorch's). cuDNN's, above all: the build's headers and the library it runs may come from
# two places (the toolkit, PyTorch's wheel).
mixtrain_libs() {
  local so libs=()
  for so in "$BUILD"/lib/mixtrain/plugins/backend_cuda/*.so*; do
    [[ -f $so ]] || continue
    mapfile -t -O "${#libs[@]}" libs < <(LD_LIBRARY_PATH=$MIX_LD_PATH ldd "$so" 2>/dev/null |
      awk '$1 ~ /^lib(cudnn|cublasLt|cublas|cudart)\.so/ && $3 ~ /^\// { print $3 }')
  done
  ((${#libs[@]})) || return 1
  {
    echo "mixtrain's CUDA runtime loads (ldd under the kit's LD_LIBRARY_PATH):"
    "$PYTHON" "$HERE/cuda_libs.py" paths "${libs[@]}" 2>&1
  } | tee "$STATE/mixtrain-libs.txt"
}

stage_debs() {
  set -e
  shopt -s nullglob
  local debs=("$DEBS"/*.deb)
  ((${#debs[@]})) || { echo "no .deb in $DEBS: run bench/gpu/fetch_debs.sh on the dev machine and carry .debs"; exit 1; }
  rm -rf "$DEBROOT"
  mkdir -p "$DEBROOT"
  for f in "${debs[@]}"; do
    if command -v dpkg >/dev/null; then
      dpkg -x "$f" "$DEBROOT"
    else  # no dpkg: a .deb is an ar archive holding data.tar.*
      "$PYTHON" - "$f" "$DEBROOT" <<'PY'
import io, sys, tarfile
path, dest = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    assert f.read(8) == b"!<arch>\n", path + ": not a .deb"
    while True:
        h = f.read(60)
        if len(h) < 60:
            break
        name, size = h[:16].decode().strip().rstrip("/"), int(h[48:58])
        data = f.read(size)
        f.read(size % 2)
        if name.startswith("data.tar"):
            with tarfile.open(fileobj=io.BytesIO(data)) as t:
                try:
                    t.extractall(dest, filter="fully_trusted")
                except TypeError:
                    t.extractall(dest)
PY
    fi
  done
  # Debian's -dev packages link absolutely into the root (zlib1g-dev: usr/lib/.../libz.so ->
  # /lib/.../libz.so.1.2.13); on this image such a link dangles or reaches another version, and
  # CMake then falls back to libz.a, which cannot go into a shared library. Point them inside.
  local link target outside=() dangling=0
  while IFS= read -r link; do
    target=$(readlink "$link")
    if [[ $target == /* && -e $DEBROOT$target ]]; then ln -sfn "$DEBROOT$target" "$link"; fi
  done < <(find "$DEBROOT" -type l)
  # What still points out of the prefix reaches the image's own file (another version, maybe) or
  # nothing; fetch_debs.sh checked the same links against the development machine's root, not this
  # one. A dangling one stops here, naming it; the others are listed. /usr/share and /usr/src
  # (docs, googletest's sources) are never read.
  while IFS= read -r link; do
    target=$(readlink "$link")
    [[ $target == /* && $target != "$DEBROOT"/* ]] || continue
    if [[ -e $target ]]; then outside+=("${link#"$DEBROOT"} -> $target (the image's)")
    else outside+=("${link#"$DEBROOT"} -> $target (dangling)"); dangling=1; fi
  done < <(find "$DEBROOT" -type l -not -path "$DEBROOT/usr/share/*" -not -path "$DEBROOT/usr/src/*")
  ((${#outside[@]})) && printf 'link out of the prefix: %s\n' "${outside[@]}"
  ((dangling == 0)) || { echo "dangling links out of the prefix (above): a package missing from .debs"; exit 1; }
  # The carried .debs against the list the tree asks for today (fetch_debs.sh --print-top, from
  # cmake/setup-debian.sh): the contract test holds the two scripts' lists together, not what was
  # fetched, so a .debs fetched before the list gained a package fails here, naming it.
  local top missing=() p
  if [[ -f $DEBS/MANIFEST.txt ]]; then
    top=$(bash "$HERE/fetch_debs.sh" --print-top) || { echo "bench/gpu/fetch_debs.sh --print-top failed"; exit 1; }
    for p in $top; do awk -v p="$p" '$1 == p { found = 1 } END { exit !found }' "$DEBS/MANIFEST.txt" || missing+=("$p"); done
    ((${#missing[@]} == 0)) || {
      echo "$DEBS/MANIFEST.txt lacks ${missing[*]}, which the build needs today: run bench/gpu/fetch_debs.sh again"
      exit 1
    }
    echo "MANIFEST.txt holds each of the $(wc -w <<<"$top") packages fetch_debs.sh --print-top lists"
  else
    echo "no MANIFEST.txt in $DEBS (fetch_debs.sh writes one): the carried packages are not checked against the list"
  fi
  for f in usr/include/toml++/toml.h usr/include/boost/dll.hpp usr/include/spdlog/spdlog.h \
           usr/include/gtest/gtest.h usr/include/CLI/CLI.hpp usr/include/nlohmann/json.hpp \
           usr/lib/x86_64-linux-gnu/libdnnl.so usr/lib/x86_64-linux-gnu/cmake/dnnl \
           usr/bin/protoc usr/include/google/protobuf/message.h usr/lib/x86_64-linux-gnu/libprotobuf.so \
           usr/include/jpeglib.h usr/include/x86_64-linux-gnu/jconfig.h usr/lib/x86_64-linux-gnu/libjpeg.so; do
    [[ -e $DEBROOT/$f ]] || { echo "missing after unpacking: $DEBROOT/$f"; exit 1; }
  done
  echo "unpacked ${#debs[@]} packages into $DEBROOT ($(du -sh "$DEBROOT" | cut -f1))"
}

stage_configure() {
  set -e
  local real_cxx
  real_cxx=$(command -v "${CXX:-g++}" || command -v c++)
  # The C++ compiler is a wrapper that appends -Wno-error when MIXTRAIN_NO_WERROR is set: the
  # project builds with -Werror under GCC 12, and a newer GCC here may warn where 12 did not.
  # The build stage first builds as the project does and falls back only if that fails. It is
  # nvcc's host compiler too (nvcc hands its --Werror on to the host compiler, so the .cu files'
  # host code needs the same fallback), given through CUDAHOSTCXX: the project's
  # check_language(CUDA) resets a CMAKE_CUDA_HOST_COMPILER given on the command line.
  mkdir -p "$DEBROOT/wrap"
  cat >"$DEBROOT/wrap/c++" <<EOF
#!/bin/sh
if [ -n "\${MIXTRAIN_NO_WERROR:-}" ]; then exec "$real_cxx" "\$@" -Wno-error; fi
exec "$real_cxx" "\$@"
EOF
  chmod +x "$DEBROOT/wrap/c++"
  # GoogleTest discovery runs each test program; at build time it would load the plugins without
  # the prefix's libraries (libdnnl's libOpenCL is found only through MIX_LD_PATH) and fail on a
  # bare machine, so it runs when ctest does (PRE_TEST), under the test stage's MIX_LD_PATH.
  # The build's one generator, protoc (core/proto), runs from the prefix with the prefix's
  # libprotoc/libprotobuf: never the image's protoc, whose version need not match the headers.
  cat >"$DEBROOT/wrap/protoc" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$LIBDIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$DEBROOT/usr/bin/protoc" "\$@"
EOF
  chmod +x "$DEBROOT/wrap/protoc"
  echo "protoc: $("$DEBROOT/wrap/protoc" --version)"
  # cuDNN (the convolution facet): the toolkit's, else the one PyTorch's wheel nvidia-cudnn-cu13
  # carries (include/ and lib/ under site-packages/nvidia/cudnn).
  local cudnn_root=${MIXTRAIN_CUDNN_ROOT:-}
  if [[ -z $cudnn_root ]]; then
    cudnn_root=$("$PYTHON" -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null || true)
  fi
  echo "cuDNN root hint: ${cudnn_root:-none (the toolkit's and the system's directories only)}"
  # The cuDNN frontend's headers (flash attention), carried in .debs by fetch_debs.sh.
  local fe_root=""
  [[ -f $DEBS/cudnn-frontend/include/cudnn_frontend.h ]] && fe_root="$DEBS/cudnn-frontend"
  echo "cuDNN frontend: ${fe_root:-not carried (the CUDA backend builds without flash attention)}"
  # MIXTRAIN_WITH_MPI=OFF: fetch_debs.sh carries no Open MPI (one GPU, one process), and an image's
  # own MPI, where it has one, must not put the mpi communicator into the kit's build.
  CUDAHOSTCXX="$DEBROOT/wrap/c++" cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    ${cudnn_root:+-DMIXTRAIN_CUDNN_ROOT="$cudnn_root"} \
    ${fe_root:+-DMIXTRAIN_CUDNN_FRONTEND_ROOT="$fe_root"} \
    -DCMAKE_CXX_COMPILER="$DEBROOT/wrap/c++" \
    -DProtobuf_PROTOC_EXECUTABLE="$DEBROOT/wrap/protoc" \
    -DCMAKE_GTEST_DISCOVER_TESTS_DISCOVERY_MODE=PRE_TEST \
    -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS" -DMIXTRAIN_WITH_CUDA=ON -DMIXTRAIN_WITH_MPI=OFF \
    -DCMAKE_PREFIX_PATH="$DEBROOT/usr;$LIBDIR/cmake" \
    -DCMAKE_POLICY_VERSION_MINIMUM=3.5 -DCMAKE_MAKE_PROGRAM="$(command -v ninja)" ${CMAKE_EXTRA_ARGS:-}
  grep -i "cudnn" "$STATE/configure.log" 2>/dev/null | tail -3
  # What the build leaves out is said in the summary, not only in build.log.
  grep -hE "mixtrain: (cuDNN 9 not found|CUPTI's headers not found|cuDNN frontend not found|no flash attention)" \
    "$STATE/configure.log" 2>/dev/null | sed 's/^-- //' | tr '\n' ' ' >"$STATE/configure.note"
  [[ -s $STATE/configure.note ]] || rm -f "$STATE/configure.note"
  echo "--- where each package was found:"
  grep -E '^[A-Za-z0-9_]+_(DIR|INCLUDE_DIR|LIBRARY|LIBRARY_RELEASE):[A-Z]+=' "$BUILD/CMakeCache.txt" |
    grep -vE '^(CUDA_|CUDAToolkit_|CMAKE_)' || true
}

stage_build() {
  local targets=() t
  for t in $BUILD_TARGETS; do
    if ninja -C "$BUILD" -t query "$t" >/dev/null 2>&1; then targets+=("$t"); else echo "build: no target $t here, skipped"; fi
  done
  # None left (no build.ninja, or gpu_kit undefined: CMake defines it only with the CUDA backend,
  # i.e. nvcc was not found): `cmake --build --target` with no name would build everything else.
  if ((${#targets[@]} == 0)); then
    echo "build: none of BUILD_TARGETS ($BUILD_TARGETS) is a target in $BUILD (gpu_kit exists only when" \
      "CMake found the CUDA toolkit: see configure's output)" | tee "$STATE/build.note"
    return 1
  fi
  if cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"; then
    # Which cuDNN, cuBLAS, CUPTI and NVRTC the CUDA backend's runtime will load here (an image's
    # LD_LIBRARY_PATH comes before the RUNPATH).
    local so
    for so in "$BUILD"/lib/mixtrain/plugins/backend_cuda/*.so*; do
      [[ -f $so ]] || continue
      echo "--- $(basename "$so") loads:"
      LD_LIBRARY_PATH=$MIX_LD_PATH ldd "$so" 2>&1 | grep -E 'cudnn|cublas|cupti|nvrtc|cudart|not found'
    done
    mixtrain_libs
    return 0
  fi
  echo "=== build failed under the project's -Werror; again with -Wno-error appended, to tell warnings from errors ==="
  # The note says what the fallback found, once it has run: warnings only, or errors.
  if MIXTRAIN_NO_WERROR=1 cmake --build "$BUILD" -j "$JOBS" --target "${targets[@]}"; then
    echo "built only with -Wno-error: this compiler warns where the project's -Werror stops (see build.log)" >"$STATE/build.note"
    mixtrain_libs
    return 0
  fi
  echo "build failed (see build.log)" >"$STATE/build.note"
  return 1
}

stage_gemm() {
  local rc1=0 rc2=0 cap=$((STAGE_CAP > 20 ? STAGE_CAP - 5 : STAGE_CAP))
  {
    echo "## mixtrain CudaGemm::gemm (cuBLASLt): $BUILD/bin/bench_gemm_cuda --size $GEMM_SIZE --seconds $GEMM_SECONDS"
    echo
    LD_LIBRARY_PATH=$MIX_LD_PATH timeout --foreground -k 5 $((cap * 3 / 8)) "$BUILD/bin/bench_gemm_cuda" --size "$GEMM_SIZE" --seconds "$GEMM_SECONDS"
    echo "(exit $?)"
    echo
    echo "## The 16-bit and FP8 rows again with gemm_autotune = $GEMM_AUTOTUNE (the backend option: the fastest of cuBLASLt's first $GEMM_AUTOTUNE heuristic algorithms per plan)"
    echo
    LD_LIBRARY_PATH=$MIX_LD_PATH timeout --foreground -k 5 $((cap / 6)) "$BUILD/bin/bench_gemm_cuda" --size "$GEMM_SIZE" --seconds "$GEMM_SECONDS" --only bf16,fp16,fp8 --gemm-autotune "$GEMM_AUTOTUNE"
    echo "(autotuned exit $?)"
    echo
    echo "## FP8 again with fp8_fast_accumulation = true (CUBLASLT_MATMUL_DESC_FAST_ACCUM)"
    echo
    LD_LIBRARY_PATH=$MIX_LD_PATH timeout --foreground -k 5 $((cap / 8)) "$BUILD/bin/bench_gemm_cuda" --size "$GEMM_SIZE" --seconds "$GEMM_SECONDS" --only fp8 --fp8-fast-accum 1
    echo "(fast-accumulation exit $?)"
    echo
    echo "## PyTorch's matmul on the same GPU (reference, timed as bench_gemm_cuda times): bench/gpu/torch_gemm.py --size $GEMM_SIZE --seconds $GEMM_SECONDS"
    echo
    timeout --foreground -k 5 $((cap / 3)) "$PYTHON" "$HERE/torch_gemm.py" --size "$GEMM_SIZE" --seconds "$GEMM_SECONDS"
    echo "(exit $?)"
  } 2>&1 | tee "$PARTS/gemm.txt"
  rc1=$(grep -m1 -oE '^\(exit [0-9]+\)' "$PARTS/gemm.txt" | grep -oE '[0-9]+')
  rc2=$(grep -oE '^\(exit [0-9]+\)' "$PARTS/gemm.txt" | tail -1 | grep -oE '[0-9]+')
  [[ $rc1 == 0 && $rc2 == 0 ]] ||
    echo "bench_gemm_cuda exit $rc1, torch_gemm.py exit $rc2 (2: no CUDA device)" >"$STATE/gemm.note"
  [[ $rc1 == 0 ]]
}

stage_gemmsweep() {
  local cap=$((STAGE_CAP > 20 ? STAGE_CAP - 5 : STAGE_CAP)) rc1 rc2
  local smi="nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv,noheader"
  {
    echo "GPU clocks, power, temperature before: $($smi 2>&1 | head -1)"
    echo
    echo "## mixtrain GemmEngine variants: $BUILD/bin/bench_gemm_cuda_sweep --size $GEMM_SIZE --batch $WIDE_BATCH --hidden $WIDE_HIDDEN --rounds $SWEEP_ROUNDS --candidates $SWEEP_CANDIDATES"
    echo
    LD_LIBRARY_PATH=$MIX_LD_PATH timeout --foreground -k 5 $((cap * 2 / 3)) "$BUILD/bin/bench_gemm_cuda_sweep" --size "$GEMM_SIZE" \
      --batch "$WIDE_BATCH" --hidden "$WIDE_HIDDEN" --rounds "$SWEEP_ROUNDS" --candidates "$SWEEP_CANDIDATES"
    echo "(exit $?)"
    echo
    echo "GPU clocks, power, temperature after: $($smi 2>&1 | head -1)"
    echo
    echo "## PyTorch on the same cases, timed the same way: bench/gpu/torch_gemm.py --sweep"
    echo
    timeout --foreground -k 5 $((cap / 4)) "$PYTHON" "$HERE/torch_gemm.py" --sweep --size "$GEMM_SIZE" --batch "$WIDE_BATCH" \
      --hidden "$WIDE_HIDDEN" --rounds "$SWEEP_ROUNDS"
    echo "(exit $?)"
  } 2>&1 | tee "$PARTS/gemm_sweep.txt"
  echo
  "$PYTHON" "$HERE/gemm_sweep_table.py" "$PARTS/gemm_sweep.txt" 2>&1 | tee "$STATE/gemm_sweep_table.md" |
    tee -a "$PARTS/gemm_sweep.txt"
  rc1=$(grep -m1 -oE '^\(exit [0-9]+\)' "$PARTS/gemm_sweep.txt" | grep -oE '[0-9]+')
  rc2=$(grep -oE '^\(exit [0-9]+\)' "$PARTS/gemm_sweep.txt" | tail -1 | grep -oE '[0-9]+')
  [[ $rc1 == 0 && $rc2 == 0 ]] ||
    echo "bench_gemm_cuda_sweep exit $rc1, torch_gemm.py --sweep exit $rc2 (2: no CUDA device)" >"$STATE/gemmsweep.note"
  [[ $rc1 == 0 ]]
}

# The kit's tests that need the device: -LE gpu_kit_host leaves out the programs that reach no CUDA
# library (cmake/MixtrainGpuKit.cmake labels them), -E the conformance suite's CPU instances
# (conformance/<test>/cpu_one_thread: the CPU backend, through the same program as the CUDA
# instances). CI runs both on every push; here they would cost the device's time for nothing.
stage_test() {
  local sel=(-L gpu_kit -LE gpu_kit_host -E '^conformance/.*/cpu[^/]*$') all run
  # -N lists (discovery, PRE_TEST, runs each program: the prefix's libraries too).
  all=$(LD_LIBRARY_PATH=$MIX_LD_PATH ctest --test-dir "$BUILD" -N -L gpu_kit 2>/dev/null | grep -oE '^Total Tests: [0-9]+' | grep -oE '[0-9]+')
  run=$(LD_LIBRARY_PATH=$MIX_LD_PATH ctest --test-dir "$BUILD" -N "${sel[@]}" 2>/dev/null | grep -oE '^Total Tests: [0-9]+' | grep -oE '[0-9]+')
  echo "ctest ${sel[*]}: ${run:-?} of the ${all:-?} gpu_kit tests (the rest need no GPU)" | tee "$PARTS/tests.log"
  LD_LIBRARY_PATH=$MIX_LD_PATH ctest --test-dir "$BUILD" "${sel[@]}" --output-on-failure \
    -j "$((JOBS < 8 ? JOBS : 8))" --timeout $((STAGE_CAP > 30 ? STAGE_CAP - 10 : STAGE_CAP)) 2>&1 | tee -a "$PARTS/tests.log"
  local rc=${PIPESTATUS[0]} skipped
  skipped=$(grep -cE '\*\*\*Skipped|Not Run.*Skipped' "$PARTS/tests.log")
  [[ $skipped == 0 ]] && skipped=""  # grep -c prints 0 when nothing matched
  echo "$(grep -m1 -E 'tests passed' "$PARTS/tests.log")${skipped:+; $skipped skipped}; ${run:-?} of ${all:-?} gpu_kit tests (the host-only ones left out)" >"$STATE/test.note"
  return "$rc"
}

stage_wide() {
  local W=$STATE/wide H=$WIDE_HIDDEN p m rc cap t0
  rm -rf "$W"
  mkdir -p "$W"
  local layers="$WIDE_FEATURES,$H,$H,$H,10" rows=$((WIDE_BATCH * 2 + 2048))
  local sets=(--set "backend.type=$WIDE_BACKEND" --set "data.batch_size=$WIDE_BATCH" --set "data.rows=$rows"
              --set "data.features=$WIDE_FEATURES" --set "model.layers.0.out=$H" --set "model.layers.2.out=$H"
              --set "model.layers.4.out=$H" --set "run.steps=$WIDE_STEPS" --set "run.log_every=$WIDE_LOG_EVERY"
              --set run.underflow_every=0 --set run.eval_every=0 --set checkpoint.final=false)
  echo "mixtrain overrides: ${sets[*]}" | tee "$W/overrides.txt"
  local end=$(($(date +%s) + STAGE_CAP - 15))  # leave time for the table
  local order=() torch_left=" $WIDE_TORCH " mix_left=" $WIDE_POLICIES "
  # Interleave: mixtrain bf16, PyTorch bf16, mixtrain fp32, PyTorch fp32, then the rest.
  for p in $WIDE_POLICIES; do
    order+=("mixtrain:$p")
    case $p in bf16 | fp32) [[ $torch_left == *" $p "* ]] && order+=("torch:$p") && torch_left=${torch_left/ $p / } ;; esac
  done
  for m in $torch_left; do order+=("torch:$m"); done
  local mix=1
  if [[ " $STAGES " == *" build "* && ! -f $STATE/ok-build ]]; then
    mix=0; echo "the build failed: mixtrain rows skipped" | tee "$W/note.txt"
  elif [[ ! -x $MIXTRAIN_BIN ]]; then
    mix=0; echo "no $MIXTRAIN_BIN: mixtrain rows skipped" | tee "$W/note.txt"
  fi
  for job in "${order[@]}"; do
    cap=$((end - $(date +%s)))
    ((cap > 120)) && cap=120
    if ((cap < 10)); then echo "$job: skipped, stage budget spent" | tee -a "$W/note.txt"; continue; fi
    t0=$(date +%s)
    case $job in
      mixtrain:*)
        p=${job#mixtrain:}
        ((mix)) || continue
        [[ -f $ROOT/configs/mlp-$p.toml ]] || { echo "configs/mlp-$p.toml not found" | tee -a "$W/note.txt"; continue; }
        LD_LIBRARY_PATH=$MIX_LD_PATH timeout --foreground -k 5 20 "$MIXTRAIN_BIN" check "$ROOT/configs/mlp-$p.toml" "${sets[@]}" \
          >"$W/check-$p.txt" 2>&1
        LD_LIBRARY_PATH=$MIX_LD_PATH timeout --foreground -k 5 "$cap" "$MIXTRAIN_BIN" --log-level info train "$ROOT/configs/mlp-$p.toml" \
          "${sets[@]}" --run-dir "$W/mixtrain-$p" >"$W/mixtrain-$p.log" 2>&1
        rc=$?
        ;;
      torch:*)
        m=${job#torch:}
        timeout --foreground -k 5 "$cap" "$PYTHON" "$ROOT/bench/wide_mlp/torch_wide_mlp.py" --device "$TORCH_DEVICE" \
          --threads "$(nproc)" --batch "$WIDE_BATCH" --rows "$rows" --layers "$layers" \
          --autocast "$([[ $m == bf16 ]] && echo bf16 || echo none)" --fused "$TORCH_FUSED" --warmup 3 \
          --windows $((WIDE_STEPS / WIDE_LOG_EVERY - 1)) --steps-per-window "$WIDE_LOG_EVERY" \
          >"$W/torch-$m.json" 2>"$W/torch-$m.log"
        rc=$?
        ;;
    esac
    echo "$job: exit $rc, $(($(date +%s) - t0)) s"
  done
  "$PYTHON" "$HERE/wide_mlp_table.py" "$W" --batch "$WIDE_BATCH" --layers "$layers" --policies "$WIDE_POLICIES" \
    --torch "$WIDE_TORCH" --peak-tflops "$PEAK_TFLOPS" --backend "$WIDE_BACKEND" >"$W/table.md" 2>"$W/table.err"
  rc=$?
  {
    echo "# Wide MLP training on $( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "no GPU") | head -1), $(date -u +%FT%TZ)"
    echo
    echo "Command: bash bench/gpu/run_h200.sh (stage wide); mixtrain: \`mixtrain train configs/mlp-<policy>.toml ${sets[*]}\`;"
    echo "PyTorch: \`bench/wide_mlp/torch_wide_mlp.py --device $TORCH_DEVICE --batch $WIDE_BATCH --layers $layers --fused $TORCH_FUSED --autocast none|bf16\`."
    echo
    cat "$W/table.md"
    [[ -s $W/table.err ]] && { echo; echo '```'; cat "$W/table.err"; echo '```'; }
    [[ -f $W/note.txt ]] && { echo; echo "Notes:"; sed 's/^/- /' "$W/note.txt"; }
  } >"$PARTS/wide_mlp.md"
  cat "$PARTS/wide_mlp.md"
  ((mix)) || { echo "wide: no mixtrain build, so no mixtrain row: FAILED"; return 1; }
  [[ $rc == 0 ]] && ! grep -qE '^\| [^|]+ \| +failed +\|' "$PARTS/wide_mlp.md"
}
# model_run MODEL JOB CAP CONFIG OVERRIDES...: one mixtrain run (mixtrain:<policy>) or one PyTorch
# run (torch:<mode>) of a model stage into $W; the PyTorch arguments come from $TORCH_ARGS.
model_run() {
  local job=$1 cap=$2 config=$3 p rc t0=$(date +%s)
  shift 3
  case $job in
    mixtrain:*)
      # <base>[+<option>...]: the options of bench/gpu/variant_sets.sh.
      p=${job#mixtrain:}
      local variant=() base=${p%%+*}
      mapfile -t variant < <(variant_sets "$p")
      # The memory plan's forecast, the table's "predicted" column: for the CHECK_POLICIES (bf16)
      # as they are, in the base stages only, not for every policy or variant: each check is a CUDA
      # start-up and a rehearsed step, device time; cuDNN's plans for every convolution shape
      # take a while on a fresh GPU, hence the minute.
      # The check counts against the job's cap: a third of it at most, the rest trains.
      [[ $p == "$base" && " $CHECK_POLICIES " == *" $p "* && -z ${TABLE_STAGE:-} ]] &&
        LD_LIBRARY_PATH=$MIX_LD_PATH timeout --foreground -k 5 \
        $((cap / 3 < 60 ? cap / 3 : 60)) "$MIXTRAIN_BIN" check "$config" "$@" \
        --set "precision.policy=$(policy_name "$base")" >"$W/check-$p.txt" 2>&1
      cap=$((cap - ($(date +%s) - t0)))
      if ((cap < 10)); then echo "$job: its check left no time to train"; return 0; fi
      LD_LIBRARY_PATH=$MIX_LD_PATH timeout --foreground -k 5 "$cap" "$MIXTRAIN_BIN" --log-level info train "$config" "$@" \
        "${variant[@]}" --set "precision.policy=$(policy_name "$base")" --run-dir "$W/mixtrain-$p" \
        >"$W/mixtrain-$p.log" 2>&1
      rc=$?
      ;;
    torch:*)
      p=${job#torch:}
      # shellcheck disable=SC2086
      timeout --foreground -k 5 "$cap" "$PYTHON" "$HERE/torch_models.py" --device "$TORCH_DEVICE" --precision "$p" \
        $TORCH_ARGS >"$W/torch-$p.json" 2>"$W/torch-$p.log"
      rc=$?
      ;;
  esac
  echo "$job: exit $rc, $(($(date +%s) - t0)) s"
}

# model_stage NAME CONFIG POLICIES TORCH_MODES TABLE_ARGS OVERRIDES...: the mixtrain policies and
# PyTorch modes interleaved (headline pair first), each capped at MODEL_RUN_CAP, the table rewritten
# after every job (a stage its timeout cuts keeps what it measured). With TABLE_STAGE (a variant
# stage: resnet50v, gpt2v), the runs go beside that stage's and its table grows by them: only
# RUN_POLICIES are run (no PyTorch mode), and the table lists POLICIES (the base stage's and these).
model_stage() {
  local name=$1 config=$2 policies=$3 modes=$4 table_args=$5 job cap order=() left run_policies
  shift 5
  local table=${TABLE_STAGE:-$name} w seen=" "
  export W=$STATE/$table
  # Each policy once in the table (a variant stage adds its bases, which the base stage may list).
  for w in $policies; do [[ $seen == *" $w "* ]] || seen+="$w "; done
  policies=$seen
  if [[ -z ${TABLE_STAGE:-} ]]; then
    rm -rf "$W"; mkdir -p "$W"
    echo "mixtrain: $config $*" | tee "$W/overrides.txt"
    echo "PyTorch: torch_models.py $TORCH_ARGS" | tee -a "$W/overrides.txt"
    run_policies=$policies left=" $modes "
  else
    mkdir -p "$W"
    # A variant stage alone writes the overrides its base stage would have.
    [[ -f $W/overrides.txt ]] || echo "mixtrain: $config $*" | tee "$W/overrides.txt"
    run_policies=$RUN_POLICIES left=" "
  fi
  for p in $run_policies; do
    order+=("mixtrain:$p")
    [[ $left == *" $p "* ]] && order+=("torch:$p") && left=${left/ $p / }
  done
  for p in $left; do order+=("torch:$p"); done
  local end=$(($(date +%s) + STAGE_CAP - 10)) mix=1
  if [[ " $STAGES " == *" build "* && ! -f $STATE/ok-build ]] || [[ ! -x $MIXTRAIN_BIN ]]; then
    mix=0; echo "no mixtrain build: mixtrain rows skipped" | tee -a "$W/note.txt"
  fi
  for job in "${order[@]}"; do
    cap=$((end - $(date +%s)))
    ((cap > MODEL_RUN_CAP)) && cap=$MODEL_RUN_CAP
    if ((cap < 10)); then echo "$job: not run, stage budget spent" | tee -a "$W/note.txt"; continue; fi
    [[ $job == mixtrain:* ]] && ((!mix)) && continue
    model_run "$job" "$cap" "$config" "$@"
    model_stage_table "$table" "$policies" "$modes" "$table_args" >/dev/null
    collect_tables  # into $OUT now: a call killed in the next run still returns this one
  done
  model_stage_table "$table" "$policies" "$modes" "$table_args"
  local rc=$?
  collect_tables
  for p in $run_policies; do tail -n 40 "$W/mixtrain-$p.log" >"$W/mixtrain-$p.tail" 2>/dev/null; done
  # PyTorch's rows alone compare with nothing: a stage without its mixtrain rows failed.
  ((mix)) || { echo "$name: no mixtrain build, so no mixtrain row: FAILED"; return 1; }
  return $rc
}

# collect_tables: the model tables and profile.md so far into $OUT (models.md, profile.md), from the
# stages' bash as well as from collect: a model stage and the profile call it after every run.
collect_tables() {
  local f
  for f in resnet50.md gpt2.md gpt2medium.md wide_mlp.md; do [[ -f $PARTS/$f ]] && { cat "$PARTS/$f"; echo; }; done >"$STATE/models.all"
  [[ -s $STATE/models.all ]] && cp "$STATE/models.all" "$OUT/models.md"
  [[ -f $PARTS/profile.md ]] && cp "$PARTS/profile.md" "$OUT/profile.md"
  return 0
}

# model_stage_table NAME POLICIES MODES TABLE_ARGS: $PARTS/NAME.md from the runs in $W so far
# (printed too); fails when a run that ran has no results.
model_stage_table() {
  local name=$1 policies=$2 modes=$3 table_args=$4 rc
  # shellcheck disable=SC2086
  "$PYTHON" "$HERE/model_table.py" "$W" --policies "$policies" --torch "$modes" \
    --peak-tflops "$PEAK_TFLOPS" $table_args >"$W/table.md" 2>"$W/table.err"
  rc=$?
  {
    echo "# $name training on $( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "no GPU") | head -1), $(date -u +%FT%TZ)"
    echo
    echo "Command: bash bench/gpu/run_h200.sh (stage $name)."
    sed 's/^/    /' "$W/overrides.txt"
    echo
    cat "$W/table.md"
    [[ -s $W/table.err ]] && { echo; echo '```'; cat "$W/table.err"; echo '```'; }
    [[ -f $W/note.txt ]] && { echo; echo "Notes:"; sed 's/^/- /' "$W/note.txt"; }
  } >"$PARTS/$name.md"
  cat "$PARTS/$name.md"
  return $rc
}

# The models' mixtrain overrides, one argument per line (resnet50_sets, gpt2_sets), shared by
# their stages and the profile stage. No checkpoint: PyTorch's peers write none either, and a
# GPT-2's is GBs of the budget's disk time. No flip: the config mirrors half of each batch on the
# host, the PyTorch peer trains on one resident batch untouched; the same work on both sides.
# gpt2_tokens writes the random token file they train on.
resnet50_sets() {
  printf '%s\n' --set "backend.type=$MODEL_BACKEND" --set "data.batch_size=$RN_BATCH" \
    --set "data.eval_batch_size=$RN_BATCH" --set "data.synthetic.rows=$((RN_BATCH * 2 + 64))" \
    --set "data.synthetic.height=$RN_IMAGE" --set "data.synthetic.width=$RN_IMAGE" \
    --set "data.synthetic.max_shift=$((RN_IMAGE / 10))" --set data.synthetic.num_classes=1000 \
    --set model.resnet.classes=1000 --set data.pixels=uint8 --set data.augment.horizontal_flip=false \
    --set "run.log_every=$RN_LOG_EVERY" \
    --set run.eval_every=0 \
    --set run.underflow_every=0 --set checkpoint.every=0 --set checkpoint.final=false
  # PyTorch AMP's weight gradients: cuDNN's bf16 dw, rounded once (the backend's default, an FP32
  # dw, has only a slow fallback engine in cuDNN 9: 31 of 67 ms a step on an H200, session 57;
  # the variant +wgrad32 measures it).
  [[ $MODEL_BACKEND == cuda ]] && printf '%s\n' --set backend.cuda.conv_wgrad_in_operand_dtype=true
  return 0
}
# optimizer.clip_grad_norm=0: gpt-tiny-bf16.toml clips at 1.0, and its PyTorch peer
# (torch_models.py) does not clip; clipping costs mixtrain a gradient-norm pass and a scale every
# step, so it is off here, as the CPU GPT bench (bench/gpt/mixtrain_gpt_bench.py) sets it.
# (resnet50-bf16.toml already has clip_grad_norm = 0.)
gpt2_sets() {
  printf '%s\n' --set "backend.type=$MODEL_BACKEND" --set "model.gpt.n_layer=$GPT_LAYERS" \
    --set "model.gpt.n_head=$GPT_HEADS" --set "model.gpt.n_embd=$GPT_WIDTH" --set data.source=tokens \
    --set "data.tokens.train=$STATE/gpt2-tokens.bin" --set "data.tokens.vocab_size=$GPT_VOCAB" \
    --set "data.block_size=$GPT_TOKENS" --set "data.batch_size=$GPT_BATCH" \
    --set "data.eval_batch_size=$GPT_BATCH" --set "run.log_every=$GPT_LOG_EVERY" --set run.eval_every=0 \
    --set optimizer.clip_grad_norm=0 \
    --set run.underflow_every=0 --set checkpoint.every=0 --set checkpoint.final=false
}
gpt2_tokens() {
  [[ -s $STATE/gpt2-tokens.bin ]] && return 0
  # llm.c's token file: 256 int32 header (magic 20240520, version 1, count), then uint16 ids.
  "$PYTHON" - "$STATE/gpt2-tokens.bin" "$GPT_VOCAB" <<'PY'
import random, struct, sys
n = 1 << 21
random.seed(0)
ids = [random.randrange(int(sys.argv[2])) for _ in range(n)]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *ids))
PY
}
RN_TORCH_SHAPE='--model resnet50 --batch $RN_BATCH --image $RN_IMAGE --classes 1000'
GPT_TORCH_SHAPE='--model gpt2 --batch $GPT_BATCH --layers $GPT_LAYERS --heads $GPT_HEADS --width $GPT_WIDTH --tokens $GPT_TOKENS --vocab $GPT_VOCAB'
export RN_TORCH_SHAPE GPT_TORCH_SHAPE

# The +jpeg variant's image folder (variant_sets.sh): 1,024 JPEGs of 500x375 (ImageNet's typical
# size), quality 90, in 10 class folders, of smooth random content, written once per state folder
# on every core the machine has.
export KIT_JPEG_DIR=${KIT_JPEG_DIR:-$STATE/jpeg}
kit_jpeg_folder() {
  [[ -f $KIT_JPEG_DIR/.complete ]] && return 0
  rm -rf "$KIT_JPEG_DIR"
  "$PYTHON" - "$KIT_JPEG_DIR/train" <<'PY' && touch "$KIT_JPEG_DIR/.complete"
import multiprocessing, os, sys
import numpy as np
from PIL import Image
root = sys.argv[1]
def write(i):
    rng = np.random.default_rng(i)
    small = (rng.random((12, 16, 3)) * 255).astype(np.uint8)
    folder = os.path.join(root, "class%d" % (i % 10))
    os.makedirs(folder, exist_ok=True)
    Image.fromarray(small).resize((500, 375), Image.BICUBIC).save(
        os.path.join(folder, "%04d.jpg" % i), quality=90)
with multiprocessing.Pool() as pool:
    pool.map(write, range(1024))
PY
}

stage_resnet50() {
  local sets shape
  [[ " $RN_POLICIES " == *+jpeg* ]] && { kit_jpeg_folder || echo "resnet50: the +jpeg folder could not be written"; }
  mapfile -t sets < <(resnet50_sets)
  shape=$(eval echo "$RN_TORCH_SHAPE")
  export TORCH_ARGS="$shape --warmup 5 --warmup-seconds $TORCH_WARMUP_S --windows $((RN_STEPS / RN_LOG_EVERY - 1)) --steps-per-window $RN_LOG_EVERY"
  model_stage resnet50 "$ROOT/configs/resnet50-bf16.toml" "$RN_POLICIES" "$RN_TORCH" \
    "--model resnet50 --batch $RN_BATCH --image $RN_IMAGE --classes 1000" \
    "${sets[@]}" --set "run.steps=$RN_STEPS"
}

stage_gpt2() {
  local sets shape
  gpt2_tokens || return 1
  mapfile -t sets < <(gpt2_sets)
  shape=$(eval echo "$GPT_TORCH_SHAPE")
  export TORCH_ARGS="$shape --warmup 5 --warmup-seconds $TORCH_WARMUP_S --windows $((GPT_STEPS / GPT_LOG_EVERY - 1)) --steps-per-window $GPT_LOG_EVERY"
  model_stage "${STAGE_NAME:-gpt2}" "$ROOT/configs/gpt-tiny-bf16.toml" "$GPT_POLICIES" "$GPT_TORCH" \
    "--model gpt2 --batch $GPT_BATCH --layers $GPT_LAYERS --width $GPT_WIDTH --tokens $GPT_TOKENS --vocab $GPT_VOCAB" \
    "${sets[@]}" --set "run.steps=$GPT_STEPS"
}

# The variants (A/B of one option each against the base stage's bf16 or fp8 row), after the
# headline stages and the profiles; their rows join the base stage's table.
stage_resnet50v() {
  local bases
  bases=$(variant_bases resnet50 "$RN_VARIANTS")
  TABLE_STAGE=resnet50 RUN_POLICIES="$bases $RN_VARIANTS" RN_POLICIES="$RN_POLICIES $bases $RN_VARIANTS" \
    stage_resnet50
}
stage_gpt2v() {
  local bases
  bases=$(variant_bases gpt2 "$GPT_VARIANTS")
  TABLE_STAGE=gpt2 RUN_POLICIES="$bases $GPT_VARIANTS" GPT_POLICIES="$GPT_POLICIES $bases $GPT_VARIANTS" stage_gpt2
}
# variant_bases TABLE VARIANTS: the base policies (bf16 of bf16+nographs, fp8 of fp8+plaincast) that
# have not run in $STATE/TABLE (this call), first one first: a variant stage alone (STAGES="env
# gpt2v"), or one whose base stage ran other policies (call 2's resnet50: fp32, tf32), runs its
# bases too, or its rows would have nothing to be read against.
variant_bases() {
  local v b out=" "
  for v in $2; do
    b=${v%%+*}
    [[ -d $STATE/$1/mixtrain-$b || $out == *" $b "* ]] || out+="$b "
  done
  echo "$out"
}

# GPT-2 medium: the gpt2 stage with GPT2M_* in place of the shape (batch GPT2M_BATCH), same policies.
stage_gpt2medium() {
  GPT_LAYERS=$GPT2M_LAYERS GPT_HEADS=$GPT2M_HEADS GPT_WIDTH=$GPT2M_WIDTH GPT_BATCH=$GPT2M_BATCH \
    GPT_POLICIES=$GPT2M_POLICIES STAGE_NAME=gpt2medium stage_gpt2
}

# profile_mixtrain RUN_DIR CAP MIN_CAP CONFIG POLICY OVERRIDES...: `mixtrain train --profile` for
# PROFILE_STEPS steps into RUN_DIR (its log beside it, RUN_DIR.log), under timeout CAP; not run
# (and said so in the log) without a build or with CAP below MIN_CAP. Fails when it did not run
# or failed.
profile_mixtrain() {
  local dir=$1 cap=$2 min=$3 config=$4 policy=$5 rc=0
  shift 5
  if [[ -x $MIXTRAIN_BIN ]] && ((cap >= min)); then
    LD_LIBRARY_PATH=$MIX_LD_PATH timeout --foreground -k 5 "$cap" "$MIXTRAIN_BIN" --log-level info train "$config" \
      "$@" --set "precision.policy=$policy" --set "run.steps=$PROFILE_STEPS" --profile \
      --run-dir "$dir" >"$dir.log" 2>&1 || rc=1
  else
    echo "no mixtrain build or no time left: not run" >"$dir.log"; rc=1
  fi
  return $rc
}

# mixtrain_profile_section TITLE LOG: a profile.md section with LOG's profile tables (its op
# table, then its node table: the top 30 (layer, op) rows, a convolution's with its shapes and
# TFLOP/s, to read beside PyTorch's convolutions by input shapes), then the device's kernels (the kernel_trace: CUPTI's records, the top 30 by device time, as
# torch.profiler's table lists PyTorch's), then the plans that ran its ops (the backend's
# plan_report: each cuBLASLt, cuDNN convolution and SDPA plan, its engine and notes, runs, and
# what autotuning measured), and its first errors.
mixtrain_profile_section() {
  echo
  echo "## $1"
  echo
  echo '```'
  sed -n '/^profile: /,/^plans: /p' "$2" 2>/dev/null | grep -v '^plans: ' | head -n 120
  sed -n '/^kernels: /,$p' "$2" 2>/dev/null | grep -E '^(kernels: |  )' | head -n 40
  sed -n '/^plans: /,/^kernels: /p' "$2" 2>/dev/null | grep -E '^(plans: |  )' | head -n 400
  grep -m3 -iE 'error|exit' "$2" 2>/dev/null
  echo '```'
}

# Where the time goes, both sides, bf16 (AMP for PyTorch): mixtrain's `train --profile` table
# (every backend op timed one by one, grouped by caller; README, "train --profile") and
# torch.profiler's top PROFILE_TOP kernels by GPU time, for ResNet-50 and GPT-2 small at the
# model stages' shapes; then mixtrain's fp8-delayed on GPT-2 small (where FP8's time goes); last,
# with what is left, ResNet-50 again with its convolutions autotuned (conv_autotune = 8: per shape,
# the default engine's time beside the fastest of 8, where wgrad's time goes; it builds 8 cuDNN
# plans per shape, so it comes after everything else). profile.md is rewritten after every run.
stage_profile() {
  local P=$STATE/profile sets shape end rc=0
  rm -rf "$P"; mkdir -p "$P"
  gpt2_tokens || return 1
  end=$(($(date +%s) + STAGE_CAP - 10))
  # share SECONDS: at most that, and never past the stage's end.
  share() { local c=$((end - $(date +%s))); echo $((c < $1 ? c : $1)); }
  torch_profile() {  # torch_profile MODEL SHAPE
    local cap; cap=$(share 35)
    ((cap >= 10)) || return 1
    # shellcheck disable=SC2086
    timeout --foreground -k 5 "$cap" "$PYTHON" "$HERE/torch_models.py" --device "$TORCH_DEVICE" --precision bf16 $2 \
      --warmup 3 --warmup-seconds "$TORCH_WARMUP_S" --profile-steps 3 --profile-top "$PROFILE_TOP" --profile-out "$P/torch-$1.txt" \
      >"$P/torch-$1.json" 2>"$P/torch-$1.log"
  }
  local model config cap
  for model in resnet50 gpt2; do
    if [[ $model == resnet50 ]]; then
      config=$ROOT/configs/resnet50-bf16.toml cap=$(share 50)
      mapfile -t sets < <(resnet50_sets); shape=$(eval echo "$RN_TORCH_SHAPE")
    else
      config=$ROOT/configs/gpt-tiny-bf16.toml cap=$(share 45)
      mapfile -t sets < <(gpt2_sets); shape=$(eval echo "$GPT_TORCH_SHAPE")
    fi
    profile_mixtrain "$P/mixtrain-$model" "$cap" 10 "$config" bf16-mixed "${sets[@]}" || rc=1
    profile_md
    torch_profile "$model" "$shape" || rc=1
    profile_md
  done
  mapfile -t sets < <(gpt2_sets)
  profile_mixtrain "$P/mixtrain-gpt2-fp8" "$(share 40)" 15 "$ROOT/configs/gpt-tiny-bf16.toml" \
    fp8-delayed "${sets[@]}" || rc=1
  profile_md
  mapfile -t sets < <(resnet50_sets)
  profile_mixtrain "$P/mixtrain-resnet50-convtune" "$(share 120)" 30 \
    "$ROOT/configs/resnet50-bf16.toml" bf16-mixed "${sets[@]}" --set backend.cuda.conv_autotune=8 || rc=1
  profile_md
  cat "$PARTS/profile.md"
  return $rc
}

# Hardware counters of the element-wise kernels: `ncu --print-summary per-kernel` on 3 launches,
# in step 2, of each kernel of COUNTER_TARGETS (model:kernel-name regex:launches a step, the
# launches of step 1 skipped, and optionally :policy, bf16-mixed by default: the FP8 casts' kernel
# runs under fp8-delayed, 144 launches a step on GPT-2 small, x, W and dy of 48 linears), each in a
# 3-step run of its model at the model stages' shape,
# op by op (run.step_graphs = false: a replayed graph's kernels are not launches of their own). The
# first launches of a step are the first layers', the largest. The sections: speed of light
# (duration, DRAM and L1/TEX throughput as % of peak), occupancy (achieved against the registers'
# and blocks' limits) and launch statistics (registers, grid). --clock-control none: the clocks
# as the runs have them (the device README's method). One run per kernel: ncu can filter launches
# by name but not sample them through a step. Without ncu, or where it cannot read the counters
# (gVisor machines), the stage says so and passes.
stage_counters() {
  local C=$STATE/counters ncu target model regex per config sets rc=0 end cap
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)
  if [[ -z $ncu || ! -x $ncu ]]; then
    echo "no ncu on this machine: not run" >"$STATE/counters.note"
    return 0
  fi
  rm -rf "$C"; mkdir -p "$C"
  gpt2_tokens || return 1
  end=$(($(date +%s) + STAGE_CAP - 5))
  for target in $COUNTER_TARGETS; do
    IFS=: read -r model regex per policy <<<"$target"
    if [[ $model == resnet50 ]]; then
      config=$ROOT/configs/resnet50-bf16.toml; mapfile -t sets < <(resnet50_sets)
    else
      config=$ROOT/configs/gpt-tiny-bf16.toml; mapfile -t sets < <(gpt2_sets)
    fi
    cap=$((end - $(date +%s)))
    ((cap > 40)) && cap=40
    ((cap >= 15)) || { echo "$target: no time left" >>"$C/$model.txt"; rc=1; continue; }
    {
      echo "### $regex${policy:+ ($policy)}"
      LD_LIBRARY_PATH=$MIX_LD_PATH timeout --foreground -k 5 "$cap" "$ncu" --clock-control none \
        --kernel-name "regex:$regex" --launch-skip "$per" --launch-count 3 \
        --section SpeedOfLight --section Occupancy --section LaunchStats --print-summary per-kernel \
        "$MIXTRAIN_BIN" train "$config" "${sets[@]}" --set "precision.policy=${policy:-bf16-mixed}" \
        --set run.steps=3 --set run.step_graphs=false --run-dir "$C/run" 2>&1 || { rc=1; echo "(exit $?)"; }
    } >>"$C/$model.txt"
    rm -rf "$C/run"
    profile_md
  done
  return $rc
}

# profile_md: $PARTS/profile.md from the profile stage's runs so far, and the counters stage's.
profile_md() {
  local P=$STATE/profile model
  {
    echo "# Profiles on $( (nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "no GPU") | head -1), $(date -u +%FT%TZ)"
    echo
    echo "bf16 (mixtrain bf16-mixed, PyTorch AMP bf16), the model stages' shapes. mixtrain: \`train --profile\`,"
    echo "$PROFILE_STEPS steps (timed from the end of the first; each op waited for, so GPU ops are timed one by one),"
    echo "then the device's kernels as CUPTI traced them (the top 30, to read beside PyTorch's table), then the plans"
    echo "that ran the ops. PyTorch: torch.profiler over 3 steps after a warm-up of 3 steps and ${TORCH_WARMUP_S} s at least, top $PROFILE_TOP by GPU (self) time."
    for model in resnet50 gpt2; do
      [[ -f $P/mixtrain-$model.log ]] && mixtrain_profile_section "$model: mixtrain" "$P/mixtrain-$model.log"
      if [[ -f $P/torch-$model.log ]]; then
        echo
        echo "## $model: PyTorch"
        echo
        echo '```'
        if [[ -s $P/torch-$model.txt ]]; then cat "$P/torch-$model.txt"; else tail -n 5 "$P/torch-$model.log"; fi
        echo '```'
      fi
    done
    [[ -f $P/mixtrain-gpt2-fp8.log ]] &&
      mixtrain_profile_section "gpt2: mixtrain fp8-delayed (where FP8's time goes: casts, transposes, GEMMs)" \
        "$P/mixtrain-gpt2-fp8.log"
    [[ -f $P/mixtrain-resnet50-convtune.log ]] &&
      mixtrain_profile_section "resnet50: mixtrain, convolutions autotuned over 8 cuDNN engines per shape (each plan line: the default engine's time beside the fastest)" \
        "$P/mixtrain-resnet50-convtune.log"
    for model in resnet50 gpt2; do
      [[ -f $STATE/counters/$model.txt ]] || continue
      echo
      echo "## $model: hardware counters of the element-wise kernels (ncu, per kernel name, step 2 on)"
      echo
      echo '```'
      # ncu's own lines (==PROF== ...) and the run's log are left out; the summary is what stays.
      grep -vE '^(==PROF==|\[[0-9:.]+\] )' "$STATE/counters/$model.txt" | head -n 600
      echo '```'
    done
  } >"$PARTS/profile.md"
  collect_tables  # into $OUT after every profiled run
  return 0
}

# Gathers the stages' reports into $OUT's seven files (see the top), the summary included; runs
# after every stage, so a call cut short still returns its status table.
collect() {
  local f
  # At most 8 MB (the device tool returns files up to its limit; a flood of failures says enough in
  # its last 8 MB).
  [[ -f $PARTS/tests.log ]] && tail -c 8000000 "$PARTS/tests.log" >"$OUT/tests.log"
  for f in gemm.txt gemm_sweep.txt; do [[ -f $PARTS/$f ]] && cat "$PARTS/$f"; done >"$STATE/gemm.all"
  [[ -s $STATE/gemm.all ]] && cp "$STATE/gemm.all" "$OUT/gemm.txt"
  collect_tables
  local runs=()
  for f in wide resnet50 gpt2 gpt2medium profile counters; do [[ -d $STATE/$f ]] && runs+=("$f"); done
  # Checkpoints never travel: a run cut by its stage's timeout may leave GBs of them.
  ((${#runs[@]})) && tar -czf "$OUT/runs.tar.gz" -C "$STATE" --exclude '*.bin' --exclude checkpoints \
    "${runs[@]}" 2>/dev/null
  { for f in configure build; do [[ -f $STATE/$f.log ]] && { echo "=== $f ==="; tail -c 3000000 "$STATE/$f.log"; }; done; } >"$STATE/build.all"
  [[ -s $STATE/build.all ]] && cp "$STATE/build.all" "$OUT/build.log"
  write_summary >"$OUT/summary.txt"
  return 0
}

# write_summary [RUNNING]: the status table (RUNNING: the stage under way, a last row), the
# headline ratio lines of the model tables so far, the gemm sweep's table, the versions.
write_summary() {
  local i f
  echo "run_h200.sh summary ($(date -u +%FT%TZ), $(($(date +%s) - T0)) s of ${BUDGET_S} s; call $CALL)"
  echo
  printf '| %-10s | %-5s | %s\n' stage secs status
  for i in "${!names[@]}"; do printf '| %-10s | %5s | %s\n' "${names[$i]}" "${secs[$i]}" "${statuses[$i]}"; done
  [[ -n ${1:-} ]] && printf '| %-10s | %5s | %s\n' "${1%% *}" - "running ${1#* }"
  echo
  # The tables' headline lines (models.md has the tables themselves): their ratios, those with
  # a figure (a line of "-" alone compares rows this call did not run).
  for f in resnet50 gpt2 gpt2medium wide_mlp; do
    [[ -f $PARTS/$f.md ]] || continue
    grep -E '^- (mixtrain .* vs |peak memory)' "$PARTS/$f.md" | grep -E '[0-9]x' | sed "s/^- /- $f: /"
  done
  echo
  if [[ -s $STATE/gemm_sweep_table.md ]]; then
    echo "gemm sweep (TFLOP/s medians, one timing method; details in gemm_sweep.txt):"
    cat "$STATE/gemm_sweep_table.md"
    echo
  fi
  cat "$STATE/env.txt" 2>/dev/null
  cat "$STATE/mixtrain-libs.txt" 2>/dev/null
  echo
  echo "files in \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
}
export -f stage_env mixtrain_libs stage_debs stage_configure stage_build stage_gemm stage_gemmsweep stage_test stage_wide \
  stage_resnet50 stage_gpt2 stage_resnet50v stage_gpt2v stage_gpt2medium stage_profile profile_md stage_counters \
  profile_mixtrain mixtrain_profile_section model_stage model_stage_table model_run policy_name variant_sets \
  resnet50_sets gpt2_sets gpt2_tokens kit_jpeg_folder collect_tables variant_bases

# --- the run --------------------------------------------------------------------------------------
echo "run_h200.sh: call $CALL, budget ${BUDGET_S} s (TIMEOUT_S ${TIMEOUT_S}), stages: $STAGES; results in $OUT"
run_stage env 30 0
run_stage debs 60 0
needs debs configure build
run_stage configure 120 0
needs configure build
# The build keeps back only what the headline pair needs at least (the tests get what is left
# after that pair's share); a build its cap cuts keeps its objects, so the next call's build goes
# on from there.
run_stage build 300 "$(reserve resnet50 gpt2)"
stop_unless_built
needs build gemm gemmsweep test
# The CUDA tests first: whether the backend is right matters more than how fast it is.
run_stage test 120 "$(reserve resnet50 gpt2)"
# The issues' headline measurements next, before anything can starve them: ResNet-50 and GPT-2
# small against PyTorch (bf16, fp32, tf32; bf16, fp8, fp8-block), then where their time goes
# (the profiles). Then the GEMM rates, the A/B variants (their rows join the same tables), the
# wide MLP, the GEMM sweep and GPT-2 medium, with what is left.
run_stage resnet50 200 "$(reserve gpt2)"
run_stage gpt2 160 0
run_stage profile 260 0
run_stage counters 150 0
run_stage gemm 60 0
# gpt2v keeps 60 s back, or half of what is left when that is less: in session 57 a fixed 60
# left resnet50v 16 s of 76, not enough for one run.
run_stage resnet50v 300 "$(l=$(left); echo $((l / 2 < 60 ? l / 2 : 60)))"
run_stage gpt2v 240 0
run_stage wide 180 0
run_stage gemmsweep 70 0
run_stage gpt2medium 240 0
# Everything once more (the build log included), and the summary.
collect
cat "$OUT/summary.txt"
