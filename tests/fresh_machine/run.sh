#!/usr/bin/env bash
# Proves the README's two commands on a fresh Debian 12: debootstraps a minimal bookworm root,
# copies this checkout in (tracked and untracked-but-not-ignored files, so uncommitted work is
# tested too), and runs each README command in its own pristine copy of that root, in a chroot.
# Prints one PASS or FAIL line per command; the logs stay beside the roots.
#
#   sudo bash tests/fresh_machine/run.sh [--work DIR] [--mirror URL] [--keep] [--only 1|2]
#
# --only N runs the README's command N alone (each command starts from its own pristine root, so
# either proves itself without the other).
# Not part of .ci/run: it downloads about 1 GiB of packages, so its time depends on the mirror.
# Needs root (debootstrap, chroot, bind mounts) and about 8 GiB of disk under --work.
set -euo pipefail

work=/var/tmp/mixtrain-fresh-machine
mirror=http://deb.debian.org/debian
keep=0
only=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --work) work=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --only) only=$2; shift 2
            [[ $only == 1 || $only == 2 ]] || { echo "fresh_machine: --only takes 1 or 2, not '$only'" >&2; exit 2; } ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "fresh_machine: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "fresh_machine: needs root (debootstrap and chroot)" >&2; exit 2; }
src=$(cd "$(dirname "$0")/../.." && pwd)

# The README's two commands, read as .ci/run reads the second (.ci/readme_commands.sh).
mapfile -t commands < <(bash "$src/.ci/readme_commands.sh" "$src/README.md")
[[ ${#commands[@]} -eq 2 ]] || exit 2  # readme_commands.sh said why

if ! command -v debootstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap
fi

# Removes a root only when nothing is mounted below it: rm -r follows bind mounts, and a root
# with /dev still bound would take the host's device nodes with it.
remove_root() {
  local root=$1
  [[ -e $root ]] || return 0
  if findmnt -rn -o TARGET | grep -q -F "$(realpath "$root")/"; then
    echo "fresh_machine: $root still has mounts below it; unmount them, then remove it" >&2
    return 1
  fi
  rm -rf --one-file-system "$root"
}

mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  if [[ $keep == 0 ]]; then remove_root "$work/cmd1" && remove_root "$work/cmd2"; fi
}
trap cleanup EXIT

mkdir -p "$work"
base="$work/base"
if [[ ! -f "$base/.debootstrap-done" ]]; then
  remove_root "$base"
  echo "fresh_machine: debootstrap bookworm (minbase) into $base"
  debootstrap --variant=minbase bookworm "$base" "$mirror" > "$work/debootstrap.log" 2>&1 ||
    { echo "fresh_machine: debootstrap failed, see $work/debootstrap.log" >&2; exit 1; }
  touch "$base/.debootstrap-done"
fi

# One snapshot of the checkout for both commands, taken now: edits made while this runs are not
# picked up half-way.
snapshot="$work/src.tar"
# Tracked files deleted in the working tree are left out; names pass as arguments, never as code.
(cd "$src" && git ls-files -z --cached --others --exclude-standard |
   xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done; exit 0' sh |
   tar --null -T - -cf -) > "$snapshot"

results=()
status=0
for i in 0 1; do
  [[ -z $only || $only == $((i + 1)) ]] || continue
  root="$work/cmd$((i + 1))"
  log="$work/cmd$((i + 1)).log"
  remove_root "$root"
  cp -a "$base" "$root"
  mkdir -p "$root/src"
  tar -xf "$snapshot" -C "$root/src"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  # A machine on this network trusts what this one trusts beyond Debian's bundle (a proxy's CA in
  # /usr/local/share/ca-certificates): the ca-certificates package, once setup installs it, adds
  # them, and pip reaches PyPI through the proxy.
  if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
  fi
  for m in proc sys dev dev/pts; do
    mount --bind "/$m" "$root/$m"
    mounted+=("$root/$m")
  done
  echo "fresh_machine: command $((i + 1)): ${commands[$i]}"
  start=$(date +%s)
  if chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
       /bin/bash -c "cd /src && ${commands[$i]}" > "$log" 2>&1; then
    verdict=PASS
  else
    verdict=FAIL
    status=1
  fi
  secs=$(( $(date +%s) - start ))
  for ((j = ${#mounted[@]} - 1; j >= 0; j--)); do umount -l "${mounted[$j]}"; done
  mounted=()
  summary=$(grep -E 'tests passed|tests failed|eval.*acc|accuracy' "$log" | tail -n 1 || true)
  results+=("$verdict command $((i + 1)) (${secs} s): ${commands[$i]}${summary:+  [$summary]}  log: $log")
done
printf '%s\n' "${results[@]}"
exit $status
