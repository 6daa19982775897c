#!/usr/bin/env bash
# Builds the libFuzzer harnesses with clang 14 + ASan + UBSan and runs each for a bounded time,
# starting from its committed seed corpus (tests/fuzz/corpus/<harness>). Any crash, leak, UB
# report, timeout or uncaught exception fails the run (exit 1); the input that triggered it is
# left in <build>/fuzz/findings/<harness>/ and the log in <build>/fuzz/logs/<harness>.log.
# Prints one line per harness with its executions (libFuzzer's stat::number_of_executed_units).
#
#   bash tests/fuzz/run.sh [build-folder]     default: build-fuzz
#   FUZZ_SECONDS=300 bash tests/fuzz/run.sh   (default 60 s per harness)
#   FUZZ_ONLY="fuzz_npy fuzz_idx" ...         a subset
#   JOBS=1 ...                                one harness at a time (default 2 at once)
#
# Reproduce a finding: <build>/fuzz/<harness> <build>/fuzz/findings/<harness>/crash-...
# The folder's configuration is the sanitizer leg's (tests/sanitize/run.sh), so CI fuzzes in
# build-asan without a second build. Needs what `cmake/setup-debian.sh --ci` installs.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
build=${1:-build-fuzz}
seconds=${FUZZ_SECONDS:-60}
source tests/sanitize/sanitizer_options.sh

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DMIXTRAIN_BUILD_FUZZERS=ON \
  -DMIXTRAIN_WITH_CUDA=OFF -DMIXTRAIN_WITH_MPI=OFF -DMIXTRAIN_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target mixtrain_fuzzers
# The build folder may be given relative to the repository or absolute.
build_abs=$(cd "$build" && pwd)

# -max_len per harness: a little over the largest seed, enough room for the structure to grow.
declare -A max_len=([fuzz_config]=4096 [fuzz_checkpoint_native]=4096 [fuzz_safetensors]=2048
                    [fuzz_npy]=1024 [fuzz_idx]=1024 [fuzz_tokens]=2048 [fuzz_cifar]=16384
                    [fuzz_training_state]=4096 [fuzz_pretrained_config]=4096
                    [fuzz_image_file]=8192)
harnesses=${FUZZ_ONLY:-fuzz_config fuzz_checkpoint_native fuzz_safetensors fuzz_npy fuzz_idx fuzz_tokens fuzz_cifar fuzz_training_state fuzz_pretrained_config fuzz_image_file}
out="$build_abs/fuzz"
mkdir -p "$out/logs"

# One harness for `seconds`; its exit status lands in $out/logs/<harness>.rc.
fuzz_one() {
  local h=$1 rc=0
  local work="$out/work/$h" findings="$out/findings/$h" log="$out/logs/$h.log"
  rm -rf "$work" "$findings" && mkdir -p "$work" "$findings"
  # New inputs go to a scratch corpus (first folder); the committed seeds are only read.
  (cd "$findings" && "$out/$h" -max_total_time="$seconds" -max_len="${max_len[$h]}" \
     -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$findings/" \
     "$work" "$root/tests/fuzz/corpus/$h") >"$log" 2>&1 || rc=$?
  echo "$rc" >"$out/logs/$h.rc"
}

# Each harness is one single-threaded process, so JOBS of them run at once (CI's two cores
# halve the leg's time); the summary keeps the harnesses' order.
jobs=${JOBS:-2} running=0
for h in $harnesses; do
  rm -f "$out/logs/$h.rc"
  fuzz_one "$h" &
  running=$((running + 1))
  if ((running >= jobs)); then wait -n || true; running=$((running - 1)); fi
done
wait

failed=0 summary=()
for h in $harnesses; do
  log="$out/logs/$h.log" findings="$out/findings/$h"
  rc=$(cat "$out/logs/$h.rc" 2>/dev/null || echo "?")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  if [[ $rc == 0 ]]; then
    summary+=("fuzz: $h: ok, ${execs:-?} executions in ${seconds} s")
  else
    failed=1
    artifact=$(ls "$findings" 2>/dev/null | head -1)
    summary+=("fuzz: $h: FAILED (exit $rc) after ${execs:-?} executions; input: $findings/${artifact:-?}; log: $log")
    grep -a -m1 -E "ERROR: |runtime error:|uncaught exception|deadly signal" "$log" >&2 || tail -20 "$log" >&2
  fi
done
printf '%s\n' "${summary[@]}"
exit $failed
