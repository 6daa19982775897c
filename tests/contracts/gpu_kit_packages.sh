#!/usr/bin/env bash
# The GPU kit fetches what the build installs: bench/gpu/fetch_debs.sh takes its packages from
# cmake/setup-debian.sh's build list, less an exclusion list with a reason per package. This
# holds the exclusions to that list, so a package the build gains is fetched (a bare GPU machine
# once lacked protobuf, which setup-debian.sh had gained), and an exclusion cannot go stale.
# The lists are names; what was fetched is another matter: where ROOT/.debs/MANIFEST.txt exists (a
# checkout that ran fetch_debs.sh, before a GPU session; CI has none), every package the fetch list
# names must be in it, or the .debs are older than the list and the GPU machine would lack one.
# (run_h200.sh's debs stage checks the same on the GPU machine.)
#
#   bash tests/contracts/gpu_kit_packages.sh ROOT      exit 0 when the lists agree, else 1 with
#                                                      one line per disagreement
set -uo pipefail
root=${1:?usage: gpu_kit_packages.sh REPOSITORY_ROOT}
setup=$root/cmake/setup-debian.sh fetch=$root/bench/gpu/fetch_debs.sh
mapfile -t build < <(bash "$setup" --print-build-packages) || { echo "$setup --print-build-packages failed"; exit 1; }
mapfile -t top < <(bash "$fetch" --print-top) || { echo "$fetch --print-top failed"; exit 1; }
# The exclusions as fetch_debs.sh writes them: "name: reason" lines inside not_fetched='...'.
mapfile -t excluded < <(awk "/^not_fetched='/ { on = 1; next } on && /^'/ { exit } on && NF" "$fetch")
((${#build[@]} > 0)) || { echo "$setup printed no build package"; exit 1; }
((${#excluded[@]} > 0)) || { echo "$fetch: no not_fetched list found"; exit 1; }

problems=0
in_list() { local x=$1; shift; local e; for e in "$@"; do [[ $e == "$x" ]] && return 0; done; return 1; }
names=()
for line in "${excluded[@]}"; do
  name=${line%%:*} reason=${line#*:}
  names+=("$name")
  if [[ $line != *:* || -z ${reason// /} ]]; then
    echo "fetch_debs.sh: excluded package '$name' gives no reason (write 'name: reason')"; problems=1
  fi
  if ! in_list "$name" "${build[@]}"; then
    echo "fetch_debs.sh: excludes '$name', which setup-debian.sh no longer installs: remove the line"; problems=1
  fi
  if in_list "$name" "${top[@]}"; then
    echo "fetch_debs.sh: '$name' is both excluded and fetched"; problems=1
  fi
done
for p in "${build[@]}"; do
  if ! in_list "$p" "${top[@]}" && ! in_list "$p" "${names[@]}"; then
    echo "setup-debian.sh installs '$p', which fetch_debs.sh neither fetches nor excludes with a reason"; problems=1
  fi
done
manifest=$root/.debs/MANIFEST.txt checked=""
if [[ -f $manifest ]]; then
  for p in "${top[@]}"; do
    awk -v p="$p" '$1 == p { found = 1 } END { exit !found }' "$manifest" ||
      { echo "$manifest lacks '$p', which fetch_debs.sh fetches today: run bench/gpu/fetch_debs.sh again"; problems=1; }
  done
  checked="; .debs/MANIFEST.txt holds them all"
fi
if ((problems)); then exit 1; fi
echo "gpu kit packages: ${#top[@]} fetched, ${#names[@]} excluded with a reason, of ${#build[@]} the build installs$checked"
