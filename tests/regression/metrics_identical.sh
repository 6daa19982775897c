#!/usr/bin/env bash
# No behaviour change: every shipped config trained by two builds gives the same metrics.jsonl,
# byte for byte, once the measured fields (time, memory) are removed.
#
# Usage: tests/regression/metrics_identical.sh BIN_BEFORE BIN_AFTER [CONFIG...]
#   BIN_BEFORE, BIN_AFTER  two mixtrain executables (each loads the plugins of its own build)
#   CONFIG                 default: every configs/*.toml; a path or a name (configs/<name>.toml).
#                          A config reading a ../data/ path that is not there (the user's images,
#                          the README walk's GPT-2 folder) is SKIPPED, named, not failed.
# Run it from the repository root (or anywhere: configs resolve against the repository). It
# builds nothing, registers nothing in ctest, and needs python3 (json, re; the stdlib only).
#
# Each config is trained on the CPU once by each build, one after the other, into its own run
# folder, with --set backend.threads=$THREADS (a config that sets [backend.cpu] threads itself,
# underflow-demo, keeps its own) and everything else as configured (seed, eval, checkpoints),
# except that a config matching CAPS trains for fewer steps, logging every max(1, steps/5) (see
# CAPS; the table says "N of M" steps). Then tests/regression/compare_runs.py compares the two
# run folders:
#   metrics.jsonl  every line less its measured fields, byte for byte. Fields removed:
#                  samples_per_s (the clock) and device_memory_bytes, device_peak_memory_bytes,
#                  host_peak_rss_bytes (the allocator and the process; a build before them has
#                  none); there is no wall time or timestamp field in metrics.jsonl: see
#                  compare_runs.py. The key is cut out of the line's text and the rest is proven
#                  unchanged, so the numbers keep the trainer's own formatting.
#   checkpoints    checkpoints/*.mxt: tensor table, tensor bytes (the final weights, optimizer
#                  state, ...) and metadata, less metadata["config"] (the resolved config holds
#                  each side's own run.dir). Same file names on both sides.
# summary.json (wall time, samples/s, memory peaks) and the logs are not compared.
#
# Prints a table (config, steps, seconds per side, result) and, for each difference, the first
# differing line of each side. Exit status: 0 all identical, 1 any DIFFERENT or failed run, 2 usage.
#
# Environment:
#   THREADS     backend.threads (default 2)
#   CAPS        step caps, "GLOB=STEPS ..." (first match wins; "" = every config in full).
#               Default "mlp-*=10 resnet20-*=10 resnet18-bf16=4 resnet50-bf16=2 gpt-tiny-*=20 cnn-small=100":
#               in full the set takes over an hour per side on 2 shared cores (measured with
#               the base build, 2026-11-26, load ~8: wide MLP 2.2 s/step × 50 steps,
#               ResNet-20 1.7 s/step × 1500, ResNet-18 8 s/step × 1000, tiny GPT 0.6 s/step ×
#               300, cnn-small 0.25 s/step × 500; ResNet-50, added later, 13 s/step × 1000);
#               quickstart and underflow-demo run in full
#   EXTRA_AFTER extra `--set k=v` words for BIN_AFTER only: a test hook to prove the check fails
#               (e.g. EXTRA_AFTER="--set run.seed=7"); never set it for a real comparison
#   REPEAT=1    also train each config a second time with BIN_BEFORE and report a config whose
#               two BIN_BEFORE runs differ as NONDETERMINISTIC (excluded from the verdict, named)
#   WORK        folder for the run folders (kept); default a fresh temporary one, removed when
#               all is identical unless KEEP=1
#   PYTHON      default python3
set -uo pipefail
BEFORE=${1:?usage: $0 BIN_BEFORE BIN_AFTER [CONFIG...]}; AFTER=${2:?usage: $0 BIN_BEFORE BIN_AFTER [CONFIG...]}
shift 2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
THREADS=${THREADS:-2}
CAPS=${CAPS-"mlp-*=10 resnet20-*=10 resnet18-bf16=4 resnet50-bf16=2 gpt-tiny-*=20 cnn-small=100"}
EXTRA_AFTER=${EXTRA_AFTER:-}
REPEAT=${REPEAT:-0}
PYTHON=${PYTHON:-python3}
for bin in "$BEFORE" "$AFTER"; do
  [[ -x $bin ]] || { echo "metrics_identical.sh: $bin is not an executable" >&2; exit 2; }
done
BEFORE=$(realpath "$BEFORE"); AFTER=$(realpath "$AFTER")

configs=()
if (($# == 0)); then
  configs=("$ROOT"/configs/*.toml)
else
  for c in "$@"; do
    if [[ -f $c ]]; then configs+=("$(realpath "$c")")
    elif [[ -f $ROOT/configs/$c.toml ]]; then configs+=("$ROOT/configs/$c.toml")
    else echo "metrics_identical.sh: no config $c" >&2; exit 2; fi
  done
fi

OWN_WORK=0
if [[ -n ${WORK:-} ]]; then mkdir -p "$WORK"; else WORK=$(mktemp -d); OWN_WORK=1; fi
echo "# $(date -u +%FT%TZ)  $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs, threads=$THREADS"
echo "# before = $BEFORE"
echo "# after  = $AFTER${EXTRA_AFTER:+   (test hook EXTRA_AFTER: $EXTRA_AFTER)}"
if [[ -n $CAPS ]]; then echo "# step caps (CAPS; capped runs log every max(1, steps/5)): $CAPS"
else echo "# every config trained in full (CAPS empty)"; fi
echo "# runs in $WORK"

# train BIN NAME SIDE CONFIG [EXTRA...]: one run into $WORK/NAME/SIDE; prints its seconds.
train() {
  local bin=$1 name=$2 side=$3 cfg=$4; shift 4
  local dir=$WORK/$name/$side t0 t1
  rm -rf "$dir"
  t0=$(date +%s%N)
  # No stdin: a run never waits on a terminal. Its log sits beside its folder.
  "$bin" train "$cfg" "${sets[@]}" --set run.dir="$dir" "$@" </dev/null >"$dir.log" 2>&1 ||
    { echo "FAILED"; return 1; }
  t1=$(date +%s%N)
  echo $(((t1 - t0 + 500000000) / 1000000000))
}

status=0
rows=()
details=()
total0=$(date +%s)
for cfg in "${configs[@]}"; do
  name=$(basename "$cfg" .toml)
  mkdir -p "$WORK/$name"
  sets=()
  # A config that pins its threads ([backend.cpu] threads = 1, underflow-demo) keeps them.
  grep -Eq '^[[:space:]]*threads[[:space:]]*=' "$cfg" || sets+=(--set backend.threads="$THREADS")
  steps=$("$PYTHON" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["run"]["steps"])' "$cfg" 2>/dev/null || echo "?")
  read -ra caps <<<"$CAPS"  # read, not $CAPS unquoted: the globs must not expand to files
  for cap in "${caps[@]}"; do
    # shellcheck disable=SC2053  # the pattern is a glob on purpose
    if [[ $name == ${cap%%=*} ]]; then
      cap=${cap#*=}
      [[ $steps =~ ^[0-9]+$ ]] && ((steps <= cap)) && break  # a cap never adds steps
      sets+=(--set run.steps="$cap" --set run.log_every=$((cap / 5 > 1 ? cap / 5 : 1)))
      steps="$cap of $steps"
      break
    fi
  done
  # A config that reads the user's files (own-images.toml's images, gpt2-tiny-lora.toml's
  # README walk folder, under ../data/) is skipped, named, while they are not there.
  missing=$("$PYTHON" - "$cfg" <<'PY'
import os, sys, tomllib
cfg = sys.argv[1]
def strings(v):
    if isinstance(v, str): yield v
    elif isinstance(v, dict): yield from (s for x in v.values() for s in strings(x))
    elif isinstance(v, list): yield from (s for x in v for s in strings(x))
for s in strings(tomllib.load(open(cfg, "rb"))):
    if s.startswith("../data/") and not os.path.exists(os.path.join(os.path.dirname(cfg), s)):
        print(s); break
PY
)
  if [[ -n $missing ]]; then
    rows+=("$(printf '%-18s %-16s %7s %7s %7s  %s' "$name" "$steps" - - - "SKIPPED (reads $missing, not there)")")
    echo "# $name: SKIPPED (reads $missing, not there)" >&2
    continue
  fi
  result=
  tb=$(train "$BEFORE" "$name" before "$cfg") || result="FAILED (before: $WORK/$name/before.log)"
  # shellcheck disable=SC2086  # EXTRA_AFTER is words on purpose
  ta=$(train "$AFTER" "$name" after "$cfg" $EXTRA_AFTER) || result="${result:+$result; }FAILED (after: $WORK/$name/after.log)"
  tr=-
  if [[ -z $result && $REPEAT == 1 ]]; then
    tr=$(train "$BEFORE" "$name" before2 "$cfg") || result="FAILED (before2: $WORK/$name/before2.log)"
    if [[ -z $result ]] && ! out=$("$PYTHON" "$HERE/compare_runs.py" "$WORK/$name/before" "$WORK/$name/before2"); then
      result="NONDETERMINISTIC (excluded: two runs of BIN_BEFORE differ)"
      details+=("$name (BIN_BEFORE run twice): $out")
    fi
  fi
  if [[ -z $result ]]; then
    out=$("$PYTHON" "$HERE/compare_runs.py" "$WORK/$name/before" "$WORK/$name/after")
    rc=$?
    result=$(head -1 <<<"$out")
    ((rc != 0)) && { status=1; details+=("$name: $out"); }
  else
    [[ $result == NONDETERMINISTIC* ]] || status=1
  fi
  rows+=("$(printf '%-18s %-16s %7s %7s %7s  %s' "$name" "$steps" "$tb" "$ta" "$tr" "$result")")
  echo "# $name: ${result%%$'\n'*}" >&2  # progress, as each config finishes
done

echo
printf '%-18s %-16s %7s %7s %7s  %s\n' config steps "s:bef" "s:aft" "s:bef2" result
for r in "${rows[@]}"; do echo "$r"; done
for d in "${details[@]}"; do echo; echo "$d"; done
echo
echo "# $(( $(date +%s) - total0 )) s in all; load average $(cut -d' ' -f1-3 /proc/loadavg)"
if ((status == 0)); then
  echo "# all identical"
  [[ ${KEEP:-0} == 1 || $OWN_WORK == 0 ]] || rm -rf "$WORK"
else
  echo "# DIFFERENCES found; run folders kept in $WORK (metrics.stripped.jsonl beside each metrics.jsonl)"
fi
exit "$status"
