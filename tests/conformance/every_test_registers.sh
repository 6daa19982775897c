#!/usr/bin/env bash
# Every TEST_P(Conformance, ...) in the kit's sources is one the linked kit runs. The tests live in
# several objects of a static library, kept by set_reference()'s calls of their link_<file>()
# (backend_conformance.cpp); a file left out of those calls loses its tests without a word.
#
# Usage: every_test_registers.sh SOURCE_DIR TEST_BINARY
set -euo pipefail
src=$1 bin=$2
want=$(grep -ho 'TEST_P(Conformance, [A-Za-z0-9_]*' "$src"/*.cpp | sed 's/.*, //' | sort -u)
got=$("$bin" --gtest_list_tests | awk '/^  /{print $1}' | sed 's|/.*||' | sort -u)
missing=$(comm -23 <(echo "$want") <(echo "$got"))
if [[ -n $missing ]]; then
  echo "tests in the sources that the linked kit does not run (is their file's link_<file>()"
  echo "called from link_all_test_files() in backend_conformance.cpp?):"
  echo "$missing"
  exit 1
fi
echo "all $(echo "$want" | wc -l) conformance tests in the sources are registered"
