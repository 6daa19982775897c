#!/usr/bin/env bash
# Installs what mixtrain builds and tests with, from Debian 12 packages. Safe to re-run: it only
# calls apt-get when a package is missing. Needs root (or sudo) to install.
#
#   bash cmake/setup-debian.sh           build and train (the README's first command)
#   bash cmake/setup-debian.sh --tests   also the PyTorch peer of the parity tests (the second), and
#                                        the PyPI peers (tensorboard, transformers, ml_dtypes, peft)
#                                        in a venv
#   bash cmake/setup-debian.sh --ci      --tests, plus clang 14 with its sanitizer and libFuzzer
#                                        runtimes for .ci/run's sanitizer and fuzz legs
#   bash cmake/setup-debian.sh --print-build-packages
#                                        prints the build's packages (the first list), one per
#                                        line, and installs nothing: bench/gpu/fetch_debs.sh
#                                        fetches the GPU kit's packages from it
#
# MIXTRAIN_SETUP_BENCH=1 is the older spelling of --tests (bench/ uses the same peer).
set -euo pipefail

with_tests=0 with_ci=0 print_build=0
for arg in "$@"; do
  case "$arg" in
    --tests) with_tests=1 ;;
    --ci) with_tests=1 with_ci=1 ;;
    --print-build-packages) print_build=1 ;;
    *) echo "setup: unknown argument '$arg' (known: --tests, --ci, --print-build-packages)" >&2; exit 2 ;;
  esac
done
[[ "${MIXTRAIN_SETUP_BENCH:-0}" == "1" ]] && with_tests=1

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libboost-dev libboost-filesystem-dev libtomlplusplus-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev zlib1g-dev
  libdnnl-dev libopenblas-dev
  # TensorBoard event files: the records are protobuf messages (core/proto/).
  libprotobuf-dev protobuf-compiler
  # Image folders (core/src/data/image_folder/): JPEG through libjpeg-turbo, PNG through libpng.
  libjpeg62-turbo-dev libpng-dev
  # Debian's dnnl-config.cmake calls find_package(OpenCL) unconditionally, while libdnnl-dev only
  # recommends the OpenCL headers, which --no-install-recommends skips.
  ocl-icd-opencl-dev
  python3-numpy python3-venv
  # Data parallel on the CPU: the mpi communicator plugin builds against Open MPI, and the
  # 2-rank tests launch with its mpirun.
  libopenmpi-dev openmpi-bin
)
if [[ $print_build == 1 ]]; then printf '%s\n' "${packages[@]}"; exit 0; fi
# tests/sanitize/run.sh and tests/fuzz/run.sh: clang 14, its ASan/UBSan/libFuzzer runtimes, the
# OpenMP runtime clang links (the CPU backend uses OpenMP) and llvm-symbolizer for readable stacks.
if [[ $with_ci == 1 ]]; then packages+=(clang-14 libclang-rt-14-dev libomp-14-dev llvm-14); fi
# The parity tests' peer: Debian's PyTorch 1.13 (CPU) under /usr/bin/python3, and its
# torchvision 0.14 (the ResNet export's strict load into torchvision.models.resnet18). Optional:
# where they cannot be installed, those tests skip or fall back to offline checks with a message.
# Under --ci they are required: CI must not go green with the parity tests skipped.
optional=()
if [[ $with_ci == 1 ]]; then
  packages+=(python3-torch python3-torchvision)
elif [[ $with_tests == 1 ]]; then
  optional+=(python3-torch python3-torchvision)
fi

is_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=() missing_optional=()
for p in "${packages[@]}"; do is_installed "$p" || missing+=("$p"); done
for p in "${optional[@]}"; do is_installed "$p" || missing_optional+=("$p"); done
# The PyPI peers of the interop tests, in a venv that sees Debian's torch and numpy: TensorBoard's
# own event reader (the metrics sink's test), transformers 4.30.2, the last to support torch
# 1.13 (GPT2LMHeadModel.from_pretrained on `export --layout hf`), and ml_dtypes 0.5.1 (numpy
# >= 1.23.3, Debian's 1.24 does), whose float4_e2m1fn / float8_e8m0fnu check the SDK's fp4 and E8M0
# encodes and its block-scaled quantizers, and peft 0.4.0 with accelerate 0.21.0 (LoRA's parity:
# `export --layout peft` and --merge-lora). Those two go in with --no-deps: their requirement
# torch >= 1.13.0 is not met by Debian's 1.13.0a0 (a pre-release), and pip would replace it; every
# other dependency (numpy, psutil, pyyaml, safetensors, packaging) is Debian's or transformers'.
# Optional everywhere: without PyPI those tests fall back
# to the protobuf definitions, the documented names and a committed table of ml_dtypes' answers,
# saying so. tests/integration/python_peers.h finds the venv at the same path.
peers_venv="${MIXTRAIN_PEERS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mixtrain/peers}"
install_peers() {
  [[ $with_tests == 1 ]] || return 0
  local py="$peers_venv/bin/python"
  if [[ -x "$py" ]] &&
    "$py" -c 'import tensorboard, transformers, torch, ml_dtypes, peft' 2>/dev/null; then
    echo "setup: PyPI peers present in $peers_venv"
    return 0
  fi
  echo "setup: installing the PyPI peers (tensorboard, transformers==4.30.2, ml_dtypes==0.5.1," \
    "peft==0.4.0) into $peers_venv"
  if /usr/bin/python3 -m venv --system-site-packages "$peers_venv" &&
    "$py" -m pip install -q --disable-pip-version-check tensorboard 'transformers==4.30.2' \
      'ml_dtypes==0.5.1' 'psutil' 'pyyaml' &&
    "$py" -m pip install -q --disable-pip-version-check --no-deps 'peft==0.4.0' \
      'accelerate==0.21.0'; then
    return 0
  fi
  # Under --ci they are required too, as Debian's torch is: their tests would skip, and CI pass.
  if [[ $with_ci == 1 ]]; then
    echo "setup: error: could not install the PyPI peers into $peers_venv; CI needs them (the" \
      "TensorBoard, Hugging Face, ml_dtypes and PEFT interop tests would skip). Check PyPI" \
      "access, or install them by hand into that venv" >&2
    exit 1
  fi
  echo "setup: warning: could not install the PyPI peers; the TensorBoard, Hugging Face," \
    "ml_dtypes and PEFT interop tests fall back to their offline checks (or skip)" >&2
}

# The cuDNN frontend's C++ headers (header-only), for the CUDA backend's flash attention (cuDNN's
# SDPA graphs): only where the CUDA backend is built (nvcc found, as CMake's AUTO finds it). They
# ship in the PyPI wheel nvidia-cudnn-frontend, under include/; its version is pinned, and CMake
# (plugins/backend_cuda/CMakeLists.txt) looks in the same folder. Optional: without them the CUDA
# backend builds without flash attention and says so.
cudnn_frontend_version=1.32.0
cudnn_frontend_dir="${XDG_CACHE_HOME:-$HOME/.cache}/mixtrain/cudnn-frontend-$cudnn_frontend_version"
install_cudnn_frontend() {
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || return 0
  if [[ -f "$cudnn_frontend_dir/include/cudnn_frontend.h" ]]; then
    echo "setup: cuDNN frontend $cudnn_frontend_version headers present in $cudnn_frontend_dir"
    return 0
  fi
  echo "setup: fetching the cuDNN frontend $cudnn_frontend_version headers (PyPI" \
    "nvidia-cudnn-frontend) into $cudnn_frontend_dir"
  local tmp
  tmp=$(mktemp -d)
  # A throwaway venv for its pip: Debian's python3 has none without python3-pip.
  if /usr/bin/python3 -m venv "$tmp/venv" &&
    "$tmp/venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
      --only-binary=:all: -d "$tmp/wheel" "nvidia-cudnn-frontend==$cudnn_frontend_version" &&
    /usr/bin/python3 - "$tmp/wheel" "$tmp/out" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("include/")])
PY
  then
    mkdir -p "$(dirname "$cudnn_frontend_dir")"
    rm -rf "$cudnn_frontend_dir" && mv "$tmp/out" "$cudnn_frontend_dir"
  else
    echo "setup: warning: could not fetch the cuDNN frontend; the CUDA backend builds without" \
      "flash attention" >&2
  fi
  rm -rf "$tmp"
}

if [[ ${#missing[@]} -eq 0 && ${#missing_optional[@]} -eq 0 ]]; then
  echo "setup: all $(( ${#packages[@]} + ${#optional[@]} )) Debian packages present"
  install_peers
  install_cudnn_frontend
  exit 0
fi
echo "setup: installing ${missing[*]} ${missing_optional[*]}"
if [[ $(id -u) -eq 0 ]]; then
  SUDO=""
elif command -v sudo >/dev/null; then
  SUDO="sudo"
else
  echo "setup: not root and no sudo; install these packages, then re-run: ${missing[*]} ${missing_optional[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
if [[ ${#missing[@]} -gt 0 ]]; then
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if [[ ${#missing_optional[@]} -gt 0 ]]; then
  $SUDO apt-get install -y -qq --no-install-recommends "${missing_optional[@]}" ||
    echo "setup: warning: could not install ${missing_optional[*]}; the PyTorch parity tests will skip" >&2
fi
install_peers
install_cudnn_frontend
