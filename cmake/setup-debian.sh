#!/usr/bin/env bash
# Installs what mixtrain builds and tests with, from Debian 12 packages. Safe to re-run: it only
# calls apt-get when a package is missing. Needs root (or sudo) to install.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libboost-dev libboost-filesystem-dev libtomlplusplus-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev zlib1g-dev
  libdnnl-dev libopenblas-dev
  python3-numpy
)
# Extra packages for the peer benchmarks (bench/): MIXTRAIN_SETUP_BENCH=1.
if [[ "${MIXTRAIN_SETUP_BENCH:-0}" == "1" ]]; then packages+=(python3-torch); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} Debian packages present"
  exit 0
fi
echo "setup: installing ${missing[*]}"
if [[ $(id -u) -eq 0 ]]; then
  SUDO=""
elif command -v sudo >/dev/null; then
  SUDO="sudo"
else
  echo "setup: not root and no sudo; install these packages, then re-run: ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
