#!/usr/bin/env bash
# Two builds of mixtrain, A/B, on the CPU training step of the wide MLP, ResNet-20 and the tiny
# GPT: the builds alternate run by run, so that drift in the machine's load falls on both alike.
#
# Usage: bench/ab/ab.sh BIN_A BIN_B [ROUNDS]
#   BIN_A, BIN_B  two mixtrain executables (each loads the plugins of its own build); A is the
#                 reference (the commit before), B the candidate
#   ROUNDS        default 3; each round trains every workload once with each build, A first in
#                 odd rounds and B first in even ones
# Environment:
#   WORKLOADS  default "mlp-fp32:18 resnet20-bf16:12 gpt-tiny-bf16:24": configs/<name>.toml,
#              each with its own step count after a colon (else STEPS)
#   STEPS      steps of a workload without its own count (default 30)
#   THREADS    backend.threads (default 2)
#   PYTHON     default python3 (the json/statistics/tomllib stdlib only)
# Each run: the shipped config with --set run.steps=<steps>, run.eval_every=0 (the one final
# evaluation runs after the timed loop), run.log_every=max(1, steps/6), backend.threads; nothing
# else changed. A run's step time is the median over its metrics.jsonl windows (log_every steps
# each) of rows-per-step / samples_per_s, the first window (primitive creation, first touch)
# dropped. Per workload and build: the median over the rounds, min..max, samples/s, the backend's
# peak bytes (summary.json), then B/A of the step time (> 1: B is slower). Prints the CPU model
# and the load average before and after. Builds nothing; run it from anywhere.
set -euo pipefail
A=${1:?usage: $0 BIN_A BIN_B [ROUNDS]}; B=${2:?usage: $0 BIN_A BIN_B [ROUNDS]}; ROUNDS=${3:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORKLOADS=${WORKLOADS:-"mlp-fp32:18 resnet20-bf16:12 gpt-tiny-bf16:24"}
STEPS=${STEPS:-30}; THREADS=${THREADS:-2}; PYTHON=${PYTHON:-python3}
for bin in "$A" "$B"; do
  [[ -x $bin ]] || { echo "ab.sh: $bin is not an executable" >&2; exit 2; }
done
names=()
for w in $WORKLOADS; do
  name=${w%%:*}
  [[ -f $ROOT/configs/$name.toml ]] || { echo "ab.sh: no configs/$name.toml" >&2; exit 2; }
  names+=("$name")
done
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
echo "# $(date -u +%FT%TZ)  $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, threads=$THREADS, rounds=$ROUNDS"
echo "# A = $A"; echo "# B = $B"; echo "# workloads (config:steps): $WORKLOADS (default steps $STEPS)"
echo "# load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
t0=$SECONDS
for r in $(seq 1 "$ROUNDS"); do
  sides="A B"; ((r % 2 == 0)) && sides="B A"
  for w in $WORKLOADS; do
    name=${w%%:*}; steps=$STEPS; [[ $w == *:* ]] && steps=${w#*:}
    log_every=$((steps / 6)); ((log_every < 1)) && log_every=1
    for side in $sides; do
      bin=$A; [[ $side == B ]] && bin=$B
      dir=$WORK/$name-$side-$r
      "$bin" train "$ROOT/configs/$name.toml" --set run.steps="$steps" --set run.eval_every=0 \
        --set run.log_every="$log_every" --set backend.threads="$THREADS" --set run.dir="$dir" \
        </dev/null >"$dir.log" 2>&1 ||
        { echo "ab.sh: $bin failed on $name (its log below)"; cat "$dir.log"; exit 1; }
    done
  done
  echo "# round $r done at $((SECONDS - t0)) s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
done
"$PYTHON" - "$WORK" "$ROUNDS" "${names[@]}" <<'PY'
import json, statistics, sys, tomllib
work, rounds, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]

def step_ms(run):
    cfg = tomllib.load(open(f"{run}/config.toml", "rb"))
    rows = cfg["data"]["batch_size"] * cfg["run"].get("accumulate", 1)
    sps = [json.loads(l)["samples_per_s"] for l in open(f"{run}/metrics.jsonl")
           if '"samples_per_s"' in l]
    windows = sps[1:] or sps  # drop the warm-up window
    return statistics.median(1000.0 * rows / x for x in windows), rows

print(f"{'workload':<14} {'build':<5} {'step ms (median)':>16} {'min..max':>17} {'samples/s':>10} {'peak MiB':>9}")
ratios = {}
for n in names:
    med = {}
    for side in "AB":
        runs = [f"{work}/{n}-{side}-{r}" for r in range(1, rounds + 1)]
        ms = [step_ms(r) for r in runs]
        t = [m for m, _ in ms]
        peak = max(json.load(open(f"{r}/summary.json"))["peak_memory_bytes"] for r in runs) / 2**20
        med[side] = statistics.median(t)
        print(f"{n:<14} {side:<5} {med[side]:>16.2f} {min(t):>8.2f}..{max(t):<8.2f} "
              f"{1000.0 * ms[0][1] / med[side]:>10.1f} {peak:>9.2f}")
    ratios[n] = med["B"] / med["A"]
    print(f"{n:<14} B/A   {ratios[n]:>16.3f}   (step time; > 1: B slower)")
print("# B/A step time: " + ", ".join(f"{n} {x:.3f}" for n, x in ratios.items()))
PY
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg); $((SECONDS - t0)) s of runs"
