#!/usr/bin/env bash
# Which low-precision recipe for my model: the same model and data trained under bf16-mixed,
# fp8-delayed, fp8-current (per-tensor FP8 scales) and the block-scaled fp8-block, mxfp8 and nvfp4
# (the CPU backend's exact simulator of what Hopper and Blackwell compute). Final and held-out
# losses against bf16, and compare's chart of the curves. docs/low-precision-recipes.md reads it.
#
#   bash bench/recipes/run.sh [BUILD_DIR] [WORK_DIR] [STAGES]
# BUILD_DIR: a build or install folder (its bin/mixtrain). STAGES: any of gpt, resnet, outlier
# (default: all three).
#   gpt      the tiny GPT of configs/gpt-tiny-bf16.toml, 500 steps per recipe, and bf16 again
#            with seeds 1 and 2: how far two bf16 runs differ (initialisation and data order)
#   resnet   ResNet-20 of configs/resnet20-bf16.toml on noisier images (noise 1.5: the shipped 0.5
#            is learnt to 99.9% by every recipe), 300 steps; the block recipes keep the
#            convolutions in bf16 (they have no block-scaled convolution; Transformer Engine's
#            recipes quantize linear layers only), so only its classifier is block-scaled
#   outlier  an MLP whose input has a few channels 1000x larger than the rest
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(realpath "${1:-$root/build}")
work=${2:-$(mktemp -d /tmp/mixtrain-recipes.XXXXXX)}
stages=${3:-gpt resnet outlier}
mixtrain=$build/bin/mixtrain
mkdir -p "$work"
cd "$work"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg); work folder: $work"
recipes=(bf16-mixed fp8-delayed fp8-current fp8-block mxfp8 nvfp4)
# The options docs/low-precision-recipes.md's numbers were measured with: fp8-block's exact fp32
# scales and nvfp4 without the Hadamard transform (the defaults before both followed Transformer
# Engine's). Given for every recipe: an unselected recipe's table is checked and left unused.
measured=(--set precision.fp8-block.power_of_two_scales=false
  --set precision.nvfp4.random_hadamard_transform=false)

train() {
  local dir=$1
  shift
  echo "+ mixtrain train $* --run-dir $dir"
  "$mixtrain" train "$@" "${measured[@]}" --run-dir "$dir" --log-level warn >"$work/last.log" 2>&1 ||
    { cat "$work/last.log"; echo "(exit $?: recorded as failed)"; }
  tail -n 2 "$work/last.log"
}

# Prints each recipe's final and held-out loss against the first folder's (bf16), samples/s.
report() {
  /usr/bin/python3 - "$@" <<'PY'
import json, os, sys
runs = sys.argv[1:]
def summary(d):
    p = os.path.join(d, "summary.json")
    return json.load(open(p)) if os.path.exists(p) else None
base = summary(runs[0])
print(f"{'run':28} {'final loss':>10} {'vs bf16':>8} {'held-out':>9} {'vs bf16':>8} {'samples/s':>9}")
for d in runs:
    s = summary(d)
    if s is None:
        print(f"{d:28} (no summary: failed)")
        continue
    f, e = s.get("final_loss"), s.get("eval_loss")
    rel = lambda a, b: f"{100 * (a - b) / b:+.2f}%" if a is not None and b else "-"
    print(f"{d:28} {f:10.4f} {rel(f, base['final_loss']):>8} {e if e is None else round(e, 4)!s:>9} "
          f"{rel(e, base.get('eval_loss')):>8} {s.get('samples_per_s', 0):9.1f}")
PY
}

if [[ " $stages " == *" gpt "* ]]; then
  echo "== tiny GPT: 500 steps per recipe"
  dirs=()
  for r in "${recipes[@]}"; do
    train "runs/gpt-$r" "$root/configs/gpt-tiny-bf16.toml" --set run.steps=500 \
      --set run.eval_every=100 --set "precision.policy=\"$r\""
    dirs+=("runs/gpt-$r")
  done
  for seed in 1 2; do
    train "runs/gpt-bf16-seed$seed" "$root/configs/gpt-tiny-bf16.toml" --set run.steps=500 \
      --set run.eval_every=100 --set run.seed=$seed
    dirs+=("runs/gpt-bf16-seed$seed")
  done
  report "${dirs[@]}"
  "$mixtrain" compare "${dirs[@]}" --out compare-gpt >/dev/null || true
fi

if [[ " $stages " == *" resnet "* ]]; then
  echo "== ResNet-20: 300 steps per recipe (block recipes: convolutions in bf16, the fc block-scaled)"
  cat >convs-bf16.toml <<'TOML'
[[precision.override]]
layers = "*conv*"
gemm_input = "bf16"
[[precision.override]]
layers = "*downsample*"
gemm_input = "bf16"
TOML
  resnet=(--set run.steps=300 --set run.eval_every=100 --set checkpoint.every=0
          --set data.synthetic.noise=1.5)
  dirs=()
  for r in "${recipes[@]}"; do
    extra=()
    case $r in fp8-block | mxfp8 | nvfp4) extra=(--merge convs-bf16.toml) ;; esac
    train "runs/resnet-$r" "$root/configs/resnet20-bf16.toml" "${extra[@]}" "${resnet[@]}" \
      --set "precision.policy=\"$r\""
    dirs+=("runs/resnet-$r")
  done
  for seed in 1 2; do
    train "runs/resnet-bf16-seed$seed" "$root/configs/resnet20-bf16.toml" "${resnet[@]}" \
      --set run.seed=$seed
    dirs+=("runs/resnet-bf16-seed$seed")
  done
  report "${dirs[@]}"
  "$mixtrain" compare "${dirs[@]}" --out compare-resnet >/dev/null || true
fi

if [[ " $stages " == *" outlier "* ]]; then
  echo "== outliers: the trained tiny GPT with 8 channels made FACTOR x larger (the same function),"
  echo "   held-out loss under each recipe (eval from the weights: fp8-current scales from the"
  echo "   batch's amax; fp8-delayed is left out, having no amax history to scale from in eval)"
  if [[ ! -d runs/gpt-bf16-mixed ]]; then
    train runs/gpt-bf16-mixed "$root/configs/gpt-tiny-bf16.toml" --set run.steps=500 \
      --set run.eval_every=100 --set 'precision.policy="bf16-mixed"'
  fi
  "$mixtrain" export runs/gpt-bf16-mixed --format safetensors --out gpt.safetensors --force \
    --log-level warn
  peers=${MIXTRAIN_PEERS:-$HOME/.cache/mixtrain/peers}/bin/python3
  printf '%-8s' factor
  evaluated=(bf16-mixed fp8-current fp8-block mxfp8 nvfp4)
  printf ' %12s' "${evaluated[@]}"
  echo
  for factor in 1 1000 10000 100000 1000000; do
    "$peers" "$root/bench/recipes/inject_outliers.py" gpt.safetensors "$factor" "x$factor.safetensors"
    printf '%-8s' "$factor"
    for r in "${evaluated[@]}"; do
      loss=$("$mixtrain" eval "$root/configs/gpt-tiny-bf16.toml" --checkpoint "x$factor.safetensors" \
        --set "precision.policy=\"$r\"" "${measured[@]}" --log-level warn 2>/dev/null | tail -n 1 |
        /usr/bin/python3 -c 'import json, sys; print("%.4f" % json.load(sys.stdin)["eval_loss"])' ||
        echo failed)
      printf ' %12s' "$loss"
    done
    echo
  done
fi
