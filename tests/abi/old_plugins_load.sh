#!/usr/bin/env bash
# Plugins built against an earlier SDK load into this one (docs/architecture.md, "Plugins and the
# ABI"): the scaler sample and the backend sample (the core and gemm 1.0) are compiled against the
# SDK headers of baseline_commit.txt's commit, taken from git, then test_old_plugins loads them
# into this build's host, whose gemm is a later minor, and uses them.
#
# Usage: old_plugins_load.sh SOURCE_DIR SDK_LIBRARY_DIR TEST_BINARY WORK_DIR CXX
# Exit 77 (ctest: skipped) when the checkout has no git history holding the commit (a source
# archive, a shallow clone), saying so.
set -euo pipefail
root=$1 libdir=$2 test_bin=$3 work=$4 cxx=$5
commit=$(grep -v '^#' "$root/tests/abi/baseline_commit.txt" | head -n 1)
if ! git -C "$root" cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "skipped: commit $commit (the SDK the old plugins are built against) is not in this" \
       "checkout's history (a source archive or a shallow clone)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work/plugins"
git -C "$root" archive "$commit" sdk/include samples/custom_scaler samples/custom_backend |
  tar -x -C "$work"
# As mixtrain_add_plugin builds a plugin (cmake/MixtrainPlugin.cmake), against the old headers
# and this build's libmixtrain_sdk.
build() {
  local name=$1
  shift
  "$cxx" -std=c++20 -O1 -shared -fPIC -fvisibility=hidden -fvisibility-inlines-hidden \
    -I "$work/sdk/include" "$@" -L "$libdir" -lmixtrain_sdk -Wl,-rpath,"$libdir" \
    -Wl,--no-undefined -o "$work/plugins/libmixtrain_$name.so"
}
build reference_backend "$work/samples/custom_backend/reference_backend.cpp"
build adaptive_scaler "$work/samples/custom_scaler/adaptive_loss_scaler.cpp"
echo "built against $commit: $(ls "$work/plugins" | tr '\n' ' ')"
MIXTRAIN_OLD_PLUGIN_DIR="$work/plugins" "$test_bin"
