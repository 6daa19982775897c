#!/usr/bin/env bash
# The communicator kit fails what breaks its contract: with MIXTRAIN_CONFORMANCE_FAULTS=1 the
# communicator program also registers wrappers of the MPI communicator with one fault each
# (communicator_main.cpp), and each must fail the tests named below; and a communicator whose
# factory throws must fail every test with the factory's message, not skip.
#
# One launch per faulty communicator, of the tests it must fail: a fault may leave one rank
# waiting in a collective the other never joins, which ends that launch by MPI_Abort after the
# communicator's timeout (5 s). A test counts as failed when a rank reports it FAILED, or when the
# launch was aborted while it ran (fewer than two ranks reported it OK).
#
# Usage: faulty_communicators_fail.sh TEST_BINARY MPIRUN ARGS...
set -uo pipefail
binary=$1
shift
mpirun=("$@")
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
c=communicator/CommunicatorConformance
t=communicator/CommunicatorTraining
status=0
launch() {  # the output of one launch of $filter: each rank's in turn, then whether it aborted
  # Each rank's lines are read from its own files (--output-filename): in mpirun's merged
  # stream a line of one rank could be cut by the other rank's output, and a count below miss it
  # (about one run in three on a loaded 2-core machine). mpirun gives the ranks a terminal:
  # GoogleTest would colour the lines this script reads.
  local dir
  dir=$(mktemp -d "$scratch/launch.XXXXXX")
  TMPDIR=$scratch MIXTRAIN_CONFORMANCE_FAULTS=1 "${mpirun[@]}" --output-filename "$dir/ranks" \
    -x TMPDIR -x MIXTRAIN_CONFORMANCE_FAULTS "$binary" --gtest_color=no \
    --gtest_filter="$filter" >"$dir/mpirun.log" 2>&1
  find "$dir/ranks" -type f -name stdout -print0 | sort -z | xargs -0 -r cat
  find "$dir/ranks" -type f -name stderr -print0 | sort -z | xargs -0 -r cat
  grep -m1 -F "MPI_ABORT was invoked" "$dir/mpirun.log"
  return 0
}
expect_failed() {  # OUTPUT TEST...
  local out=$1
  shift
  for test in "$@"; do
    local oks
    oks=$(grep -cF "[       OK ] $test " <<<"$out")
    if grep -qF "[  FAILED  ] $test" <<<"$out"; then continue; fi
    if grep -qF "[ RUN      ] $test" <<<"$out" && grep -qF "MPI_ABORT was invoked" <<<"$out" &&
       [[ $oks -lt 2 ]]; then continue; fi
    echo "the kit passed $test, which breaks its contract"
    echo "--- that launch's output:"
    tail -60 <<<"$out"
    status=1
  done
}
check() {  # FAULTY TEST...
  local faulty=$1
  shift
  local tests=("${@/%//$faulty}")
  filter=$(IFS=:; echo "${tests[*]}")
  expect_failed "$(launch)" "${tests[@]}"
}
check faulty_avg_is_sum $c.AllReduceSumsAveragesAndTakesTheMaxOfFp32
check faulty_wrong_piece $c.ReduceScatterGivesEachRankTheReductionOfItsPiece \
                         $t.TheRanksTrainAsOneProcessOnTheGlobalBatch
check faulty_gathers_fp32_only $c.AllGatherPutsEachRanksSendAtItsPieceInEveryDtype
check faulty_host_broadcast_keeps_size $c.HostCollectivesReduceDoublesAndBroadcastBytes
check faulty_skips_big_buckets $c.AllReduceSumsAveragesAndTakesTheMaxOfFp32 \
                               $t.TheRanksTrainAsOneProcessOnTheGlobalBatch
filter='*/faulty_unknown_name'
out=$(launch)
ran=$(grep -cE '^\[ RUN      \] .*/faulty_unknown_name$' <<<"$out")
failed=$(grep -cE '^\[  FAILED  \] .*/faulty_unknown_name[ ,].*\([0-9]+ ms\)$' <<<"$out")
if [[ $ran -eq 0 || $failed -ne $ran ]]; then
  echo "faulty_unknown_name: $failed of $ran tests failed; a factory that throws must fail every one"
  status=1
fi
if ! grep -qF "could not be made" <<<"$out"; then
  echo "no test said which communicator could not be made"
  status=1
fi
[[ $status -eq 0 ]] && echo "the kit failed the faulty communicators and the one it could not make"
exit $status
