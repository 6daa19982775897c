#!/usr/bin/env bash
# The component kit fails what breaks its contracts: with MIXTRAIN_CONFORMANCE_FAULTS=1 the
# conformance program also registers a scaler that applies overflowed steps, an optimizer that
# leaves its working copies stale, a policy that plans fp16 without asking for a loss scaler, one
# whose FP8 scale is infinite after an amax of 0 (and keeps its amaxes out of its saved state), a
# checkpoint format that reads damaged files as empty states and one that leaves a backup beside
# its file (conformance_main.cpp), and each must fail its test; and components whose factories
# throw (an unknown name, an unknown option), whose every test must fail with the factory's
# message, not skip.
#
# Usage: faulty_components_fail.sh TEST_BINARY
set -uo pipefail
# The kit keeps a failed test's scratch folder for its author; these failures are the point.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
# The faulty backends' tests (conformance/*) are faulty_backends_fail.sh's.
out=$(TMPDIR=$scratch MIXTRAIN_CONFORMANCE_FAULTS=1 "$1" --gtest_filter='*faulty*-conformance/*' 2>&1)
status=0
for t in scaler/ScalerConformance.ANonFiniteStepIsNeverApplied/faulty_applies_overflows \
         optimizer/OptimizerConformance.WorkingCopiesHoldTheUpdatedMasters/faulty_stale_working_copies \
         policy/PolicyConformance.TrainsSmallModelsAndPlansTheirOpsDeterministically/faulty_fp16_without_scaler \
         policy/PolicyConformance.ScaledOperandsGetFiniteScalesWhateverTheAmax/faulty_unguarded_fp8_scale \
         policy/PolicyConformance.AResumedRunRepeatsTheLossesBitForBit/faulty_unguarded_fp8_scale \
         checkpoint_format/CheckpointFormatConformance.EveryTruncationIsACheckpointErrorNamingTheFile/faulty_swallows_damage \
         checkpoint_format/CheckpointFormatConformance.AMissingFileAFolderAnEmptyFileAndRandomBytesAreRefused/faulty_swallows_damage \
         checkpoint_format/CheckpointFormatConformance.AWriteReplacesTheFileWholeAndLeavesNothingBeside/faulty_leaves_a_backup; do
  if ! grep -qF "[  FAILED  ] $t" <<<"$out"; then
    echo "the kit passed $t, which breaks its contract"
    status=1
  fi
done
for c in faulty_unknown_name faulty_unknown_option faulty_unknown_policy; do
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
