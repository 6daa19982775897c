#!/usr/bin/env bash
# gpu_kit_packages.sh finds what it is for, on copies of the two scripts: a stale exclusion, and a
# fetch list written by hand again that drops a package the build installs (protobuf-compiler,
# the drift a bare GPU machine once found).
set -uo pipefail
root=${1:?usage: gpu_kit_packages_self_test.sh REPOSITORY_ROOT}
check=$root/tests/contracts/gpu_kit_packages.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
copy() {  # copy DIR: the two scripts under DIR
  mkdir -p "$1/cmake" "$1/bench/gpu"
  cp "$root/cmake/setup-debian.sh" "$1/cmake/"
  cp "$root/bench/gpu/fetch_debs.sh" "$1/bench/gpu/"
}
expect() {  # expect DIR TEXT: the check fails on DIR and says TEXT
  local out
  if out=$(bash "$check" "$1" 2>&1); then echo "FAIL: the check passed on $1: $out"; exit 1; fi
  [[ $out == *"$2"* ]] || { echo "FAIL: expected '$2', got: $out"; exit 1; }
  echo "ok: $2"
}
copy "$work/stale"
sed -i "s/^ccache: .*/&\nlibfoo-dev: it went away/" "$work/stale/bench/gpu/fetch_debs.sh"
expect "$work/stale" "excludes 'libfoo-dev', which setup-debian.sh no longer installs"
copy "$work/hand"
sed -i 's/^  grep -q "^$p:" <<<"$not_fetched" || top+=("$p")$/  [[ $p == protobuf-compiler ]] || grep -q "^$p:" <<<"$not_fetched" || top+=("$p")/' \
  "$work/hand/bench/gpu/fetch_debs.sh"
expect "$work/hand" "installs 'protobuf-compiler', which fetch_debs.sh neither fetches nor excludes"
copy "$work/noreason"
sed -i "s/^ccache: .*/ccache:/" "$work/noreason/bench/gpu/fetch_debs.sh"
expect "$work/noreason" "excluded package 'ccache' gives no reason"
