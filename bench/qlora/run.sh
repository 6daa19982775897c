#!/usr/bin/env bash
# LoRA on a quantized base (NF4, and the FP8 block formats fp8-block and mxfp8) against LoRA on a
# bf16 base (QLoRA's claim: the 4-bit base costs next to nothing in fine-tuning loss). The tiny GPT of configs/gpt-tiny-bf16.toml is pretrained for its
# 300 steps on five licence texts; from its checkpoint, rank-8 adapters on every attention and MLP
# projection (c_attn, c_proj, c_fc, mlp.c_proj) train for 200 steps on two other texts, once with
# the frozen base in bf16 (train.frozen_format = "compute"), as NF4 (blocks of 64), as fp8-block
# and as mxfp8.
# Prints the CPU, the commands, every run's final and held-out losses, the relative gap, and
# check's bytes per parameter; leaves the runs and compare.{md,json,svg} in the work folder.
#
#   bash bench/qlora/run.sh [BUILD_DIR] [WORK_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(realpath "${1:-$root/build}")
work=${2:-$(mktemp -d /tmp/mixtrain-qlora.XXXXXX)}
config=$root/configs/gpt-tiny-bf16.toml
mixtrain=$build/bin/mixtrain
mkdir -p "$work"
cd "$work"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); work folder: $work"
lic=/usr/share/common-licenses
pretrain="[\"$lic/GPL-3\", \"$lic/GPL-2\", \"$lic/LGPL-2.1\", \"$lic/Apache-2.0\", \"$lic/MPL-2.0\"]"
finetune="[\"$lic/GFDL-1.3\", \"$lic/Artistic\"]"
cat >lora.toml <<TOML
[model.lora]
r = 8
alpha = 16
targets = ["h.*.attn.c_attn", "h.*.attn.c_proj", "h.*.mlp.c_fc", "h.*.mlp.c_proj"]
TOML
step() {
  echo "+ mixtrain $*"
  "$mixtrain" "$@" --log-level warn >"$work/last.log" 2>&1 || { cat "$work/last.log"; exit 1; }
  tail -n 2 "$work/last.log"
}
step train "$config" --set "data.text.path=$pretrain" --run-dir runs/base
base=$(ls runs/base/checkpoints/*.mxt | tail -n 1)
lora=(--merge lora.toml --set "data.text.path=$finetune" --set run.steps=200
      --set "checkpoint.init_from=\"$work/$base\"")
step train "$config" "${lora[@]}" --run-dir runs/lora-bf16
for format in nf4 fp8-block mxfp8; do
  step train "$config" "${lora[@]}" --set "train.frozen_format=\"$format\"" \
    --run-dir "runs/lora-$format"
done
"$mixtrain" compare runs/lora-bf16 runs/lora-nf4 runs/lora-fp8-block runs/lora-mxfp8 \
  --out compare >/dev/null
python3 - <<'PY'
import json
formats = ("bf16", "nf4", "fp8-block", "mxfp8")
s = {k: json.load(open(f"runs/lora-{k}/summary.json")) for k in formats}
for key in ("final_loss", "eval_loss"):
    a = s["bf16"][key]
    for k in formats[1:]:
        b = s[k][key]
        print(f"{key}: bf16 base {a:.5f}, {k} base {b:.5f}, {k} - bf16 = {b - a:+.5f} "
              f"({100 * (b - a) / a:+.2f}%)")
for k in formats:
    m = s[k]["parameter_memory"]
    print(f"{k} base: bytes/parameter {json.dumps(m['bytes_per_parameter'])}, masters + optimizer "
          f"state {100 * m['masters_and_state_share_of_full_fine_tune']:.2f}% of a full fine-tune's, "
          f"{s[k]['samples_per_s']:.1f} samples/s, peak {s[k]['peak_memory_bytes'] / 2**20:.1f} MiB")
PY
echo "(compare.md and compare.svg in $work/compare)"
