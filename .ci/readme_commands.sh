#!/usr/bin/env bash
# Prints the README's two commands, one per line: the first line of each of its first two fenced
# blocks, both ```sh (the README's contract: the first sets up and trains the quickstart, the
# second sets up and passes the test suite). .ci/run runs the second; tests/fresh_machine/run.sh
# proves both.
# One reader for both, so what CI runs and what the fresh machine proves cannot differ.
#
#   bash .ci/readme_commands.sh [README]     (default: the README.md beside .ci/)
#
# Exits 2, naming the file, unless it finds exactly two.
set -euo pipefail
readme=${1:-$(dirname "$0")/../README.md}
[[ -f $readme ]] || { echo "readme_commands: no file '$readme'" >&2; exit 2; }
# The first two fenced blocks of the file, whatever comes between them, must be ```sh blocks: a
# README whose top block became another language must not hand CI a later example instead.
commands=$(awk '/^```/ {
                  if (open) { open = 0; next }
                  if ($0 != "```sh") exit
                  open = 1; getline; print; if (++n == 2) exit
                }' "$readme")
[[ $(grep -c . <<<"$commands") -eq 2 ]] || {
  echo "readme_commands: the first two fenced blocks of $readme are not two \`\`\`sh blocks, each a command on its first line" >&2
  exit 2
}
printf '%s\n' "$commands"
