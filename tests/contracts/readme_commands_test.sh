#!/usr/bin/env bash
# The README's contract (its first two fenced blocks are its two commands, ```sh, one command on
# the first line of each) as .ci/readme_commands.sh reads it for CI and for the fresh-machine
# proof: the real README yields the quickstart's command and a test command that runs ctest, and
# the reader refuses what would hand CI the wrong command.
#
#   bash tests/contracts/readme_commands_test.sh SOURCE_DIR
set -uo pipefail
src=${1:?usage: readme_commands_test.sh SOURCE_DIR}
reader=$src/.ci/readme_commands.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

mapfile -t got < <(bash "$reader" "$src/README.md")
[[ ${#got[@]} -eq 2 ]] || fail "README.md: ${#got[@]} commands, not 2"
[[ ${got[0]:-} == *"mixtrain train configs/quickstart.toml"* ]] || fail "README.md's first command trains no quickstart: '${got[0]:-}'"
[[ ${got[1]:-} == *"ctest "* ]] || fail "README.md's second command runs no ctest: '${got[1]:-}'"

# expect_refused NAME CONTENT: the reader exits 2 and says why.
expect_refused() {
  printf '%b' "$2" >"$tmp/$1.md"
  local out rc
  out=$(bash "$reader" "$tmp/$1.md" 2>&1)
  rc=$?
  [[ $rc -eq 2 && $out == *"not two"* ]] || fail "$1: rc $rc, output '$out' (want 2 and why)"
}
expect_refused top_block_not_sh '# x\n```text\nnot a command\n```\n```sh\nb\n```\n```sh\nc\n```\n'
expect_refused second_block_not_sh '```sh\na\n```\n```python\nx\n```\n```sh\nc\n```\n'
expect_refused one_block '```sh\na\n```\n'
expect_refused empty_first_line '```sh\n\n```\n```sh\nb\n```\n'

# Only the first line of a block is its command; prose between the blocks is skipped.
printf '# t\nprose\n```sh\nfirst one\nsecond line\n```\nmore prose\n```sh\nthe second\n```\n```sh\nthird\n```\n' >"$tmp/ok.md"
[[ $(bash "$reader" "$tmp/ok.md") == $'first one\nthe second' ]] || fail "ok.md: '$(bash "$reader" "$tmp/ok.md")'"
bash "$reader" "$tmp/missing.md" 2>/dev/null
[[ $? -eq 2 ]] || fail "a missing file is not refused with 2"

[[ $failures -eq 0 ]] && echo "readme_commands: all checks passed"
exit $((failures > 0))
