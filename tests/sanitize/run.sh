#!/usr/bin/env bash
# The sanitizer leg of CI: builds the core, the plugins, the unit + integration tests and the fuzz
# harnesses with clang 14, AddressSanitizer + UndefinedBehaviorSanitizer (the first finding aborts)
# and libFuzzer's coverage instrumentation (MIXTRAIN_BUILD_FUZZERS, so tests/fuzz/run.sh reuses
# this build), then runs ctest. Building with clang also keeps the tree compiling with clang 14
# under -Werror.
#
#   bash tests/sanitize/run.sh [build-folder]     default: build-asan
#
# Needs clang-14, libclang-rt-14-dev, libomp-14-dev and llvm-14 (llvm-symbolizer):
# cmake/setup-debian.sh --ci installs them.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-asan}
source tests/sanitize/sanitizer_options.sh

# -O1: ASan's recommended level, and a third of -O3's build time.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DMIXTRAIN_BUILD_FUZZERS=ON \
  -DMIXTRAIN_WITH_CUDA=OFF -DMIXTRAIN_WITH_MPI=OFF -DMIXTRAIN_BUILD_BENCH=OFF -DMIXTRAIN_BUILD_TESTS=ON
cmake --build "$build" -j"${JOBS:-2}"

# Excluded, each too slow under ASan for CI and covered unsanitized by the README's test command:
# - ConfigSwaps: the 168-run cross product of every policy x scaler x optimizer x format; the
#   sanitized suite still trains, resumes and swaps components in test_integration's other tests.
exclude='ConfigSwaps'
ctest --test-dir "$build" --output-on-failure -j"${JOBS:-2}" -E "$exclude"
