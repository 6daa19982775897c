#!/usr/bin/env bash
# The README's first command builds the `mixtrain_runtime` target only (plugins/CMakeLists.txt),
# so that target must hold the CLI and every plugin the build puts where the CLI looks: a plugin
# left out would be missing for a user of that command and only for them. The plugins are the
# build's own outputs under lib/mixtrain/plugins, as Ninja lists them (a file left there by an
# earlier configuration is not one). Ninja builds only: exits 77 (a skip) under another
# generator.
#
#   bash tests/contracts/runtime_target_test.sh BUILD_DIR
set -uo pipefail
build=${1:?usage: runtime_target_test.sh BUILD_DIR}
[[ -f $build/build.ninja ]] || { echo "runtime_target: $build is not a Ninja build; skipped"; exit 77; }

# The target's inputs, through the phony targets CMake chains it by.
declare -A inputs=()
pending=(mixtrain_runtime)
while [[ ${#pending[@]} -gt 0 ]]; do
  node=${pending[0]}
  pending=("${pending[@]:1}")
  while read -r line; do
    [[ $line == outputs: ]] && break
    [[ $line == input:* || $line == "$node:" || -z $line ]] && continue
    [[ -n ${inputs[$line]:-} ]] && continue
    inputs[$line]=1
    [[ $line == */mixtrain_runtime || $line == */CMakeFiles/* ]] && pending+=("$line")
  done < <(ninja -C "$build" -t query "$node" 2>/dev/null | tail -n +2)
done

failures=0
[[ -n ${inputs[bin/mixtrain]:-} ]] || { echo "FAIL: mixtrain_runtime does not build bin/mixtrain"; failures=$((failures + 1)); }
plugins=0
while read -r so; do
  plugins=$((plugins + 1))
  [[ -n ${inputs[$so]:-} ]] || { echo "FAIL: $so is a plugin the CLI loads, but mixtrain_runtime does not build it"; failures=$((failures + 1)); }
done < <(ninja -C "$build" -t targets all 2>/dev/null | sed -n 's|^\(lib/mixtrain/plugins/[^:]*libmixtrain_[^:]*\.so\):.*|\1|p' | sort)
[[ $plugins -gt 0 ]] || { echo "FAIL: the build makes no plugin under lib/mixtrain/plugins"; failures=$((failures + 1)); }
[[ $failures -eq 0 ]] && echo "runtime_target: mixtrain_runtime builds the CLI and all $plugins plugins"
exit $((failures > 0))
