#!/usr/bin/env bash
# The component kit fails what breaks its contracts: with MIXTRAIN_CONFORMANCE_FAULTS=1 the
# conformance program also registers a scaler that applies overflowed steps and an optimizer that
# leaves its working copies stale (conformance_main.cpp), and each must fail its test.
#
# Usage: faulty_components_fail.sh TEST_BINARY
set -uo pipefail
out=$(MIXTRAIN_CONFORMANCE_FAULTS=1 "$1" --gtest_filter='*faulty*' 2>&1)
status=0
for t in scaler/ScalerConformance.ANonFiniteStepIsNeverApplied/faulty_applies_overflows \
         optimizer/OptimizerConformance.WorkingCopiesHoldTheUpdatedMasters/faulty_stale_working_copies; do
  if ! grep -qF "[  FAILED  ] $t" <<<"$out"; then
    echo "the kit passed $t, which breaks its contract"
    status=1
  fi
done
[[ $status -eq 0 ]] && echo "the kit failed both faulty components"
exit $status
