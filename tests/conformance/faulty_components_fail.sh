#!/usr/bin/env bash
# The component kit fails what breaks its contracts: with MIXTRAIN_CONFORMANCE_FAULTS=1 the
# conformance program also registers a scaler that applies overflowed steps and an optimizer that
# leaves its working copies stale (conformance_main.cpp), and each must fail its test; and a
# scaler and an optimizer whose factories throw (an unknown name, an unknown option), whose every
# test must fail with the factory's message, not skip.
#
# Usage: faulty_components_fail.sh TEST_BINARY
set -uo pipefail
# The faulty backends' tests (conformance/*) are faulty_backends_fail.sh's.
out=$(MIXTRAIN_CONFORMANCE_FAULTS=1 "$1" --gtest_filter='*faulty*-conformance/*' 2>&1)
status=0
for t in scaler/ScalerConformance.ANonFiniteStepIsNeverApplied/faulty_applies_overflows \
         optimizer/OptimizerConformance.WorkingCopiesHoldTheUpdatedMasters/faulty_stale_working_copies; do
  if ! grep -qF "[  FAILED  ] $t" <<<"$out"; then
    echo "the kit passed $t, which breaks its contract"
    status=1
  fi
done
for c in faulty_unknown_name faulty_unknown_option; do
  ran=$(grep -cE "^\[ RUN      \] .*/$c\$" <<<"$out")
  failed=$(grep -cE "^\[  FAILED  \] .*/$c[ ,].*\([0-9]+ ms\)$" <<<"$out")
  if [[ $ran -eq 0 || $failed -ne $ran ]]; then
    echo "$c: $failed of $ran tests failed; a factory that throws must fail every one"
    status=1
  fi
done
if ! grep -qF "could not be made" <<<"$out"; then
  echo "no test said which factory could not be made"
  status=1
fi
[[ $status -eq 0 ]] && echo "the kit failed the faulty components and those it could not make"
exit $status
