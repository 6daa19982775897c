#!/usr/bin/env bash
# The backend kit fails what breaks a backend's contract: with MIXTRAIN_CONFORMANCE_FAULTS=1 the
# conformance program also registers the backends of faulty_backends.h (the CPU backend with a
# faulty gemm facet), and each must fail the cases named here with a message that says what is
# wrong:
# - faulty_gemm_square_transposes (ignores the transposes of square operands) and
#   faulty_gemm_short_k (drops a reduction's last term past k = 64) fail
#   GemmSquareLongAndThinShapesWithEveryTranspose, naming the shapes and transposes they got wrong
#   and none they got right;
# - faulty_gemm_other_major (a gemm facet of the next major) fails every case that uses the gemm
#   facet, naming both versions, and skips none of them as a facet it does not have.
#
# Usage: faulty_backends_fail.sh TEST_BINARY SOURCE_DIR
set -uo pipefail
bin=$1 src=$2
status=0
# Every test whose body takes the gemm facet (MIXTRAIN_FACETS(gemm, ...)): the cases run here.
gemm_tests=$(awk '
  match($0, /TEST_P\(Conformance, [A-Za-z0-9_]+/) { name = substr($0, RSTART + 20, RLENGTH - 20) }
  /MIXTRAIN_FACETS\(gemm,/ { print name }' "$src"/*.cpp | sort -u)
if [[ -z $gemm_tests ]]; then
  echo "no test in $src takes the gemm facet"
  exit 1
fi
filter=$(for t in $gemm_tests; do printf 'conformance/Conformance.%s/faulty_gemm_*:' "$t"; done)
out=$(MIXTRAIN_CONFORMANCE_FAULTS=1 "$bin" --gtest_filter="$filter" 2>&1)
# The text of one backend's run of one test, from its RUN line to its result line.
run_of() {
  awk -v start="[ RUN      ] conformance/Conformance.$1/$2" '
    $0 == start { on = 1 }
    on { print }
    on && /^\[ +(OK|FAILED|SKIPPED) +\]/ { exit }' <<<"$out"
}
must_fail() {  # TEST BACKEND [text the failure must show]... ; ! text it must not show
  local test=$1 backend=$2 run
  shift 2
  run=$(run_of "$test" "$backend")
  if ! grep -qE "^\[  FAILED  \] conformance/Conformance\.$test/$backend, .*\([0-9]+ ms\)$" \
      <<<"$run"; then
    echo "the kit did not fail $test for $backend"
    status=1
    return
  fi
  for want in "$@"; do
    if [[ $want == !* ]]; then
      if grep -qF -- "${want#!}" <<<"$run"; then
        echo "$test/$backend names '${want#!}', which that backend computes right"
        status=1
      fi
    elif ! grep -qF -- "$want" <<<"$run"; then
      echo "$test/$backend failed without naming '$want'"
      status=1
    fi
  done
}

square=GemmSquareLongAndThinShapesWithEveryTranspose
must_fail $square faulty_gemm_square_transposes \
  "m 16 n 16 k 16 At B: relative difference" "m 16 n 16 k 16 A Bt: relative difference" \
  "m 16 n 16 k 16 At Bt: relative difference" "m 20 n 7 k 20 At B:" "m 7 n 20 k 20 A Bt:" \
  "!m 16 n 16 k 16 A B:" "!m 6 n 5 k 65" "!m 1 n 29 k 53"
must_fail $square faulty_gemm_short_k \
  "m 6 n 5 k 65 A B: relative difference" "m 5 n 7 k 127 At Bt:" "m 3 n 5 k 1000 At B:" \
  "m 1 n 1 k 65 A Bt:" "!k 53" "!m 16 n 16 k 16"

for t in $gemm_tests; do
  must_fail "$t" faulty_gemm_other_major \
    "backend 'faulty_gemm_other_major' offers gemm facet 2.0, built against a newer SDK" \
    "this kit speaks gemm 1." "!has no gemm facet"
done
if grep -qF "backend 'faulty_gemm_other_major' has no gemm facet" <<<"$out"; then
  echo "a case skipped faulty_gemm_other_major's gemm facet of another major as one it lacks"
  status=1
fi
[[ $status -eq 0 ]] &&
  echo "the kit failed the faulty backends: $(grep -cE '^\[  FAILED  \] .*/faulty_gemm_[a-z_]+, .*ms\)$' <<<"$out") failures, $(wc -w <<<"$gemm_tests") gemm cases for the facet of another major"
exit $status
