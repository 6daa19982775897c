#!/usr/bin/env bash
# The precision autopilot on the shipped overflow demo: FP32, naive fp16-mixed, fp16-mixed with the
# precision block `mixtrain calibrate` recommends, and naive fp16-mixed with automatic escalation,
# trained one after the other on this machine and compared by `mixtrain compare` (skipped steps,
# final and held-out loss against FP32, samples/s). Prints the CPU, the commands and the table;
# leaves the runs, calibrated.toml and compare.{md,json,svg} in the work folder.
#
#   bash bench/autopilot/run.sh [BUILD_DIR] [WORK_DIR] [CONFIG]
#
# CONFIG defaults to configs/overflow-demo.toml; configs/underflow-demo.toml is the other demo
# (there the naive run uses scaler "none", and escalation has nothing to do: no value overflows).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(realpath "${1:-$root/build}")
work=${2:-$(mktemp -d /tmp/mixtrain-autopilot.XXXXXX)}
config=$(realpath "${3:-$root/configs/overflow-demo.toml}")
mixtrain=$build/bin/mixtrain
mkdir -p "$work"
cd "$work"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores"
echo "config: $config; work folder: $work"
name=$(sed -n 's/^name = "\(.*\)"/\1/p' "$config" | head -1)
naive=(--set precision.policy=fp16-mixed)
case "$(basename "$config")" in
  underflow-demo.toml) naive+=(--set scaler.type=none) ;;
esac
step() {
  echo "+ mixtrain $*"
  local rc=0
  "$mixtrain" "$@" --log-level warn >"$work/last.log" 2>&1 || rc=$?
  # A naive run may diverge (exit 3): that is a result here, not a failure of the bench.
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ]; then cat "$work/last.log"; exit "$rc"; fi
  tail -n 1 "$work/last.log"
}
step train "$config" --run-dir runs/fp32
step train "$config" "${naive[@]}" --run-dir runs/naive
echo "+ mixtrain calibrate $config ${naive[*]} --output calibrated.toml --force"
"$mixtrain" calibrate "$config" "${naive[@]}" --output calibrated.toml --force
step train "$config" "${naive[@]}" --merge calibrated.toml --run-dir runs/calibrated
step train "$config" "${naive[@]}" --set precision.escalate.after=3 --run-dir runs/escalated
"$mixtrain" compare runs/fp32 runs/naive runs/calibrated runs/escalated --out compare
echo "(runs of $name; compare.md and compare.svg in $work/compare)"
