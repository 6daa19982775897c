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
  -DMIXTRAIN_WITH_CUDA=OFF -DMIXTRAIN_WITH_MPI=AUTO -DMIXTRAIN_BUILD_BENCH=OFF -DMIXTRAIN_BUILD_TESTS=ON
cmake --build "$build" -j"${JOBS:-2}"

# LeakSanitizer stays on in the fuzz leg but is off here: the suites start the multi-threaded
# `mixtrain` hundreds of times, and at its exit LSan's stop-the-world tracer intermittently
# crashes itself ("Tracer caught signal 11 ... LeakSanitizer has encountered a fatal error",
# google/sanitizers#1353) while worker threads wind down: 4 of about 1,000 tests in one run
# here. That makes CI flaky without finding anything.
export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"

# Left out, each with the reason:
# - ConfigSwaps: the cross product of every shipped config x policy x scaler (168 checks and
#   runs) takes about 20 minutes under ASan on 2 cores; the README's test command runs it
#   unsanitized, and the sanitized suite still trains, resumes and swaps components elsewhere.
# - ResnetParityTorch.Bf16MixedHeldOutAccuracyWithinOnePointOfFp32: ResNet-20 trained 100 steps
#   in fp32 and in bf16-mixed for their held-out accuracies, 76 s under ASan on 2 cores; bf16-mixed
#   ResNets train sanitized in Cnn.ReducedResNet50LearnsAtSmallResolutionInFp32AndBf16Mixed and
#   Cnn.SmallCnnLearnsItsImagesUnderEveryPolicy. (Its two siblings, the fp32 and two-step
#   parities, run here: 28 s. All three were left out while they asked for two OpenMP threads
#   under OMP_NUM_THREADS=1, which made them minutes long beside another test; tests/CMakeLists.txt.)
# - Precision.UnderflowDemoFailsInFp16AndIsRescuedByTheDynamicScalerAndByBf16: four 400-step
#   runs of the underflow demo (batch 2048) for their held-out accuracy, about 3 minutes under
#   ASan; the demo's config, fp16-mixed and the dynamic scaler run sanitized in Calibrate.* and
#   RunControl.*, and the accuracy claims in the README's test command.
# - install.samples_out_of_tree: it builds the samples out of tree against the installed SDK,
#   without the sanitizer flags, so its programs cannot load this build's instrumented
#   libraries; it tests the install layout, which the README's test command covers.
exclude='ConfigSwaps|^ResnetParityTorch\.Bf16Mixed|^Precision\.UnderflowDemo|^install\.samples_out_of_tree$'
# --timeout: a hang fails its test after 20 minutes instead of running into CI's 90-minute limit.
ctest --test-dir "$build" --output-on-failure -j"${JOBS:-2}" -E "$exclude" --timeout 1200
