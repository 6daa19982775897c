#!/bin/bash
# mixtrain against PyTorch on this machine's CPU: ResNet-50 (batch 8, 224 px, 1000 classes) and
# GPT-2 small (12 x 12 x 768, 1 x 1024 tokens, vocabulary 50257), bf16 and fp32, 2 threads, in one
# sitting, the two frameworks interleaved; with the CPU backend's A/B variants of its per-CPU rules
# (conv_gemm, flash_products). What bench/RESULTS.md's CPU rows for ResNet-50 and GPT-2 small come
# from (session 85 on AMD Zen 4; sessions 70 and 73 ran the same commands by hand).
#
#   bash bench/cpu_models/run.sh rn_bf16 rn_fp32 gpt_bf16 gpt_fp32     (any of them, in order)
#
# PyTorch: bench/gpu/torch_models.py --device cpu (Debian's python3-torch under /usr/bin/python3),
# under OMP_WAIT_POLICY ACTIVE and PASSIVE (fp32 GPT-2 also with OPENBLAS_CORETYPE=SkylakeX: see
# that script's help); one JSON line per run, its windows' steps/s and peak RSS. mixtrain: the
# shipped configs with --set overrides, a step's time = batch / samples_per_s of metrics.jsonl,
# the median of the steps after the third; peak RSS from /usr/bin/time -v (the final checkpoint
# included). The machine's CPU and load are printed first; the load again on every line.
# Environment: MIXTRAIN (default build/bin/mixtrain), OUT (default /tmp/mixtrain-cpu-models),
# RN_STEPS (12), GPT_STEPS (6), THREADS (2).
set -eu
cd "$(dirname "$0")/../.."
M=${MIXTRAIN:-build/bin/mixtrain}
OUT=${OUT:-/tmp/mixtrain-cpu-models}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
TOK=$OUT/tokens.bin
if [ ! -f "$TOK" ]; then  # 1 M random GPT-2 ids in llm.c's token file layout (README, "tokens")
  /usr/bin/python3 - "$TOK" <<'PY'
import sys
import numpy as np
n = 1_000_000
header = np.zeros(256, dtype=np.int32)
header[:3] = [20240520, 1, n]
with open(sys.argv[1], "wb") as f:
    f.write(header.tobytes())
    f.write(np.random.default_rng(0).integers(0, 50257, n, dtype=np.uint16).tobytes())
PY
fi
echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, flags:" \
  "$(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
echo "# load: $(cut -d' ' -f1-3 /proc/loadavg)"
RN=(configs/resnet50-bf16.toml --set backend.type=cpu --set backend.threads=$THREADS
  --set data.batch_size=8 --set data.synthetic.rows=80 --set data.synthetic.height=224
  --set data.synthetic.width=224 --set data.synthetic.num_classes=1000
  --set model.resnet.classes=1000 --set data.pixels=uint8 --set run.steps=${RN_STEPS:-12}
  --set run.log_every=1 --set run.eval_every=0 --set data.eval_fraction=0)
GPT=(configs/gpt-tiny-bf16.toml --set backend.type=cpu --set backend.threads=$THREADS
  --set model.gpt.n_layer=12 --set model.gpt.n_head=12 --set model.gpt.n_embd=768
  --set data.source=tokens --set data.tokens.train=$TOK --set data.tokens.vocab_size=50257
  --set data.block_size=1024 --set data.batch_size=1 --set run.steps=${GPT_STEPS:-6}
  --set run.log_every=1 --set run.eval_every=0)
GPT_SHAPE=(--model gpt2 --batch 1 --tokens 1024 --layers 12 --heads 12 --width 768 --vocab 50257)

mt() {  # label, batch, then the train arguments
  local label=$1 batch=$2
  shift 2
  local dir=$OUT/run-$label-$$-$RANDOM
  /usr/bin/time -v "$M" train "$@" --run-dir "$dir" > "$dir.log" 2>&1 ||
    { echo "mixtrain $label failed: $dir.log"; return 1; }
  /usr/bin/python3 - "$dir/metrics.jsonl" "$label" "$batch" "$dir.log" <<'PY'
import json, re, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"samples_per_s"' in l]
ms = sorted(float(sys.argv[3]) * 1000 / r["samples_per_s"] for r in rows if r.get("samples_per_s"))
ms = sorted(ms[3:] if len(ms) > 3 else ms)
rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(sys.argv[4]).read())[1])
print(json.dumps({"framework": "mixtrain", "run": sys.argv[2], "step_ms_median": statistics.median(ms),
                  "step_ms": ms, "peak_rss_mib": rss // 1024,
                  "load": float(open("/proc/loadavg").read().split()[0])}))
PY
}
pt() {  # label, environment, then torch_models.py's arguments
  local label=$1 envs=$2
  shift 2
  env $envs /usr/bin/python3 bench/gpu/torch_models.py --device cpu --threads "$THREADS" \
    --warmup 2 --windows 3 --steps-per-window 2 "$@" > "$OUT/pt-$label.json" 2> "$OUT/pt-$label.err" ||
    { echo "pytorch $label failed: $OUT/pt-$label.err"; return 1; }
  /usr/bin/python3 - "$OUT/pt-$label.json" "$label" <<'PY'
import json, sys
d = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(json.dumps({"framework": "pytorch", "run": sys.argv[2],
                  "window_step_ms": [1000 / w for w in d["window_steps_per_s"]],
                  "peak_rss_mib": d["peak_rss_bytes"] // 2**20, "openblas_core": d.get("openblas_core"),
                  "load": float(open("/proc/loadavg").read().split()[0])}))
PY
}
for what in "$@"; do
  case $what in
    rn_bf16 | rn_fp32)
      p=${what#rn_}
      pol=$([ "$p" = fp32 ] && echo fp32 || echo bf16-mixed)
      for wait in ACTIVE PASSIVE; do
        pt "rn-$p-$wait" "OMP_WAIT_POLICY=$wait" --model resnet50 --batch 8 --precision "$p"
        mt "rn-$p-auto" 8 "${RN[@]}" --set precision.policy=$pol
        mt "rn-$p-conv_gemm=gemm" 8 "${RN[@]}" --set precision.policy=$pol --set backend.conv_gemm=gemm
      done ;;
    gpt_bf16)
      for wait in ACTIVE PASSIVE; do
        pt "gpt-bf16-$wait" "OMP_WAIT_POLICY=$wait" "${GPT_SHAPE[@]}" --precision bf16
        mt gpt-bf16-auto 1 "${GPT[@]}"
        mt gpt-bf16-flash_products=fp32 1 "${GPT[@]}" --set backend.flash_products=fp32
      done ;;
    gpt_fp32)
      for core in "" SkylakeX; do
        pt "gpt-fp32-PASSIVE${core:+-$core}" "OMP_WAIT_POLICY=PASSIVE${core:+ OPENBLAS_CORETYPE=$core}" \
          "${GPT_SHAPE[@]}" --precision fp32
        mt gpt-fp32-auto 1 "${GPT[@]}" --set precision.policy=fp32
      done ;;
    *) echo "unknown: $what (rn_bf16 rn_fp32 gpt_bf16 gpt_fp32)" >&2; exit 2 ;;
  esac
done
