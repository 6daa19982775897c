#!/usr/bin/env bash
# Downloads (never installs) the Debian 12 packages that building mixtrain needs and that a bare
# GPU machine may lack, into .debs/ at the repository root (git-ignored), for
# bench/gpu/run_h200.sh, which unpacks them with `dpkg -x` into a private prefix there. Run it
# HERE, on the Debian 12 development machine (amd64), before the GPU session: see bench/gpu/README.md.
#
# Packages: the build's list in cmake/setup-debian.sh (`--print-build-packages`), so the two
# cannot drift, less the ones a GPU build does not need, each named in `not_fetched` below with
# its reason (tests/contracts/gpu_kit_packages.sh holds the exclusions to that list), each with the
# runtime libraries it depends on, resolved with apt-cache (first alternative of each "a | b").
# Never fetched: the base system any machine with a C++ compiler has (libc, libstdc++, libgcc,
# libgomp) and dependencies the build never reads (catch2 via libspdlog-dev, googletest's sources
# via libgtest-dev).
# Not fetched unless asked, because the GPU build does not need them:
#   FETCH_OPENBLAS=1  OpenBLAS (only the CPU bench_gemm links it; ~12 MiB with libgfortran5)
#   FETCH_CMAKE=1     Debian's cmake 3.25 and its libraries (the GPU image has CMake)
#   --print-top       prints the top-level list and exits, without apt (the check's input)
# Environment: DEBS_DIR (default <repo>/.debs), MAX_MIB (default 48: the GPU call carries at most
# 64 MiB, working tree included).
# Prints the resolved package list, each size and the total; exits 1 when the total exceeds
# MAX_MIB or an unpacked symlink would dangle (a runtime package missing from the list).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DEST=${DEBS_DIR:-$ROOT/.debs}
MAX_MIB=${MAX_MIB:-48}

# The build's packages that a GPU build does not need, with the reason (one line each; the check
# reads "name: reason").
not_fetched='
build-essential: the GPU image has the C++ compiler that nvcc uses as its host compiler
cmake: the GPU image has CMake (FETCH_CMAKE=1 fetches Debian'"'"'s)
ccache: a one-off build has nothing to cache
pkg-config: no CMake file of the build calls pkg-config
libbenchmark-dev: only the CPU benchmarks use Google Benchmark; the kit builds none of them
libopenblas-dev: only the CPU bench_gemm links OpenBLAS (FETCH_OPENBLAS=1 fetches it)
python3-numpy: the image'"'"'s own Python, the one with PyTorch, runs the peers
python3-venv: the image'"'"'s own Python, the one with PyTorch, runs the peers
libopenmpi-dev: the kit runs one GPU in one process; the mpi communicator is not built
openmpi-bin: the kit runs one GPU in one process; the mpi communicator is not built
'
top=()
while read -r p; do
  grep -q "^$p:" <<<"$not_fetched" || top+=("$p")
done < <(bash "$ROOT/cmake/setup-debian.sh" --print-build-packages)
[[ ${FETCH_OPENBLAS:-0} == 1 ]] && top+=(libopenblas-dev)
[[ ${FETCH_CMAKE:-0} == 1 ]] && top+=(cmake)
if [[ ${1:-} == --print-top ]]; then printf '%s\n' "${top[@]}"; exit 0; fi
[[ $# -eq 0 ]] || { echo "fetch_debs: unknown argument '$1' (known: --print-top)" >&2; exit 2; }
skip=" libc6 libc6-dev libc-dev libgcc-s1 libstdc++6 libstdc++-12-dev gcc-12-base libgomp1 catch2 googletest "

command -v apt-get >/dev/null && command -v apt-cache >/dev/null ||
  { echo "fetch_debs: needs apt-get and apt-cache (Debian 12)" >&2; exit 2; }
grep -q 'VERSION_ID="12"' /etc/os-release 2>/dev/null ||
  echo "fetch_debs: WARNING: this is not Debian 12; the packages will be this distribution's" >&2
[[ $(dpkg --print-architecture) == amd64 ]] ||
  { echo "fetch_debs: the GPU machine is x86-64: run this on an amd64 Debian" >&2; exit 2; }

# Direct dependencies of one package: the first alternative of each group, real packages only.
deps_of() {
  apt-cache depends --no-recommends --no-suggests --no-conflicts --no-breaks --no-replaces \
    --no-enhances --no-pre-depends "$1" 2>/dev/null | awk '
    /^ \|Depends:/ { if (!alt) { print $2; alt = 1 } next }
    /^  Depends:/  { if (!alt) print $2; alt = 0; next }'
}

declare -A seen=()
queue=("${top[@]}")
pkgs=()
while ((${#queue[@]})); do
  p=${queue[0]}
  queue=("${queue[@]:1}")
  [[ -n ${seen[$p]:-} ]] && continue
  seen[$p]=1
  [[ $skip == *" $p "* ]] && continue
  if [[ $p == \<*\> ]]; then echo "fetch_debs: skipping virtual package $p" >&2; continue; fi
  apt-cache show --no-all-versions "$p" >/dev/null 2>&1 ||
    { echo "fetch_debs: no package '$p' in the apt lists (apt-get update?)" >&2; exit 1; }
  pkgs+=("$p")
  while read -r d; do [[ -n $d ]] && queue+=("$d"); done < <(deps_of "$p")
done

echo "fetch_debs: ${#pkgs[@]} packages: ${pkgs[*]}"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/debs"
if ! (cd "$WORK/debs" && apt-get download -q "${pkgs[@]}" >"$WORK/download.log" 2>&1); then
  echo "fetch_debs: apt-get download failed; refreshing the lists once (apt-get update)" >&2
  if [[ $(id -u) -eq 0 ]]; then apt-get update -qq; else sudo apt-get update -qq; fi
  (cd "$WORK/debs" && apt-get download -q "${pkgs[@]}") || { cat "$WORK/download.log" >&2; exit 1; }
fi

# Check: unpacked together, every library and header symlink resolves inside the prefix (or the
# base system); /usr/src and /usr/share (googletest's sources, docs) are never read.
mkdir -p "$WORK/root"
for f in "$WORK"/debs/*.deb; do dpkg-deb -x "$f" "$WORK/root"; done
dangling=()
while IFS= read -r l; do
  t=$(readlink "$l")
  [[ $t == /* ]] && [[ -e $t ]] && continue  # absolute link into the base system
  dangling+=("${l#"$WORK/root"} -> $t")
done < <(find "$WORK/root" -xtype l -not -path "$WORK/root/usr/src/*" -not -path "$WORK/root/usr/share/*")
if ((${#dangling[@]})); then
  printf 'fetch_debs: dangling symlink after unpacking: %s\n' "${dangling[@]}" >&2
  exit 1
fi

mkdir -p "$DEST"
rm -f "$DEST"/*.deb "$DEST"/MANIFEST.txt
mv "$WORK"/debs/*.deb "$DEST"/
{
  echo "# .debs for bench/gpu/run_h200.sh, fetched $(date -u +%FT%TZ) on $(. /etc/os-release; echo "$PRETTY_NAME")"
  for f in "$DEST"/*.deb; do
    printf '%-40s %-28s %8d KiB\n' "$(dpkg-deb -f "$f" Package)" "$(dpkg-deb -f "$f" Version)" \
      $(( $(stat -c %s "$f") / 1024 ))
  done
} >"$DEST/MANIFEST.txt"
# The cuDNN frontend's headers (flash attention; not a Debian package): the copy
# cmake/setup-debian.sh unpacked from the PyPI wheel, carried as they are. run_h200.sh points CMake
# at them; without them the kit builds the CUDA backend without flash attention, as CMake says.
fe_src=$(ls -d "${XDG_CACHE_HOME:-$HOME/.cache}"/mixtrain/cudnn-frontend-* 2>/dev/null | sort -V | tail -1 || true)
rm -rf "$DEST/cudnn-frontend"
if [[ -n $fe_src && -f $fe_src/include/cudnn_frontend.h ]]; then
  cp -r "$fe_src" "$DEST/cudnn-frontend"
  echo "cudnn-frontend (headers)                 ${fe_src##*cudnn-frontend-}                   $(( $(du -sb "$DEST/cudnn-frontend" | cut -f1) / 1024 )) KiB" >>"$DEST/MANIFEST.txt"
else
  echo "fetch_debs: WARNING: no cuDNN frontend headers under ${XDG_CACHE_HOME:-$HOME/.cache}/mixtrain" \
    "(bash cmake/setup-debian.sh fetches them): the kit builds without flash attention" >&2
fi
cat "$DEST/MANIFEST.txt"
total=$(du -cb "$DEST"/*.deb | tail -1 | cut -f1)
[[ -d $DEST/cudnn-frontend ]] && total=$((total + $(du -sb "$DEST/cudnn-frontend" | cut -f1)))
unpacked=$(du -sb "$WORK/root" | cut -f1)
awk -v n="$(ls "$DEST"/*.deb | wc -l)" -v t="$total" -v u="$unpacked" -v d="$DEST" -v m="$MAX_MIB" \
  'BEGIN { printf "fetch_debs: %d .debs, %.1f MiB in %s (unpacked %.0f MiB); limit %d MiB\n", n, t / 1048576, d, u / 1048576, m }'
if ((total > MAX_MIB * 1048576)); then
  echo "fetch_debs: over the ${MAX_MIB} MiB budget" >&2
  exit 1
fi
git -C "$ROOT" check-ignore -q "$DEST" 2>/dev/null ||
  echo "fetch_debs: WARNING: $DEST is not git-ignored; do not commit it" >&2
