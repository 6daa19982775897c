#!/usr/bin/env bash
# Every default A/B variant of the GPU kit (bench/gpu/variant_sets.sh) sets options the config
# accepts: a misspelt key or a layer glob that matches nothing would cost a scarce GPU run its row,
# and the kit's dry run on a CPU runs the CPU-backend variants only. Two checks a variant, with
# `mixtrain check --skip-rehearsal` on the model its stage trains (ResNet-50 at 32 px, the GPT
# preset):
# - on the cuda backend, where backend.cuda.* keys are read against the plugin's schema before
#   the device is opened: it must pass, or stop only for want of a device;
# - on the cpu backend, for variants that set more than backend.cuda.* keys: the model is built,
#   so precision.override globs and model options are checked too. It must pass.
# Exits 77 (a skip) where the CUDA backend plugin is not built.
#
#   bash tests/contracts/gpu_kit_variants_test.sh SOURCE_DIR MIXTRAIN_BIN
set -uo pipefail
src=${1:?usage: gpu_kit_variants_test.sh SOURCE_DIR MIXTRAIN_BIN}
bin=${2:?usage: gpu_kit_variants_test.sh SOURCE_DIR MIXTRAIN_BIN}
source "$src/bench/gpu/variant_sets.sh"

# The +jpeg variant reads an image folder: names are enough for --skip-rehearsal without header
# checks (nothing is decoded when the normalisation is given).
export RN_IMAGE=32 KIT_JPEG_DIR
KIT_JPEG_DIR=$(mktemp -d)
trap 'rm -rf "$KIT_JPEG_DIR"' EXIT
for c in a b; do mkdir -p "$KIT_JPEG_DIR/train/$c" && : >"$KIT_JPEG_DIR/train/$c/0.jpg" && : >"$KIT_JPEG_DIR/train/$c/1.jpg"; done
small_resnet=(--set data.image_folder.check_files=false --set data.synthetic.rows=16 --set data.synthetic.height=32 --set data.synthetic.width=32
              --set data.synthetic.max_shift=3 --set data.batch_size=2 --set data.eval_batch_size=2)
failures=0 checked=0 cuda=1
# check_variant CONFIG VARIANT [CPU_ARGS...]
check_variant() {
  local config=$1 v=$2 out rc sets=()
  shift 2
  mapfile -t sets < <(variant_sets "$v")
  [[ ${#sets[@]} -gt 0 ]] || { echo "FAIL: $v sets nothing (an unknown option name?)"; failures=$((failures + 1)); return; }
  local policy
  policy=$(policy_name "${v%%+*}")
  if [[ $cuda == 1 ]]; then
    out=$("$bin" check "$src/$config" --skip-rehearsal --set backend.type=cuda "${sets[@]}" \
          --set "precision.policy=$policy" 2>&1)
    rc=$?
    if [[ $rc -ne 0 && $out == *"no backend named 'cuda'"* ]]; then
      echo "gpu_kit_variants: no cuda backend in this build; its half of the checks is skipped"
      cuda=0
    elif [[ $rc -ne 0 && $out != *"no usable CUDA device"* ]]; then
      echo "FAIL: $v on cuda (exit $rc): $(grep -m1 -A1 'error:' <<<"$out")"
      failures=$((failures + 1))
    fi
  fi
  local model_sets=()
  for ((i = 0; i + 1 < ${#sets[@]}; i += 2))
    do [[ ${sets[i + 1]} == backend.cuda.* ]] || model_sets+=("${sets[i]}" "${sets[i + 1]}"); done
  if [[ ${#model_sets[@]} -gt 0 ]]; then
    out=$("$bin" check "$src/$config" --skip-rehearsal --set backend.type=cpu "$@" "${model_sets[@]}" \
          --set "precision.policy=$policy" 2>&1)
    rc=$?
    [[ $rc -eq 0 ]] || { echo "FAIL: $v on cpu (exit $rc): $(grep -m1 -A1 'error:' <<<"$out")"; failures=$((failures + 1)); }
  fi
  checked=$((checked + 1))
}
for v in $KIT_RN_VARIANTS; do check_variant configs/resnet50-bf16.toml "$v" "${small_resnet[@]}"; done
for v in $KIT_GPT_VARIANTS; do check_variant configs/gpt-tiny-bf16.toml "$v"; done
[[ $failures -eq 0 ]] || exit 1
[[ $cuda == 1 ]] || exit 77
echo "gpu_kit_variants: all $checked variants' options accepted"
