#!/usr/bin/env python3
"""Which cuDNN, cuBLAS, cuBLASLt and CUDA runtime each side of the GPU kit loads, with the versions
the libraries themselves report (bench/gpu/run_h200.sh: its env stage for PyTorch, its build stage
for mixtrain; both go into summary.txt). Two builds of the same GEMM or convolution can differ by
library alone: a figure is read beside the versions that made it.

  cuda_libs.py torch         this Python's versions and PyTorch's, then, after a bf16 matmul and a
                             convolution on the GPU, each of those libraries this process mapped
                             (/proc/self/maps): what PyTorch runs on
  cuda_libs.py paths LIB...  each library at these paths (what ldd resolved for mixtrain's CUDA
                             runtime under the kit's LD_LIBRARY_PATH), loaded and asked its version

The versions come from the libraries' own calls: cudnnGetVersion(), cublasLtGetVersion(),
cublasGetProperty(MAJOR_VERSION/MINOR_VERSION/PATCH_LEVEL), cudaRuntimeGetVersion(). A library
that does not load says why. Exits 0 whatever it finds (a report, not a check).
"""
import ctypes
import os
import re
import sys

LIB = re.compile(r"/lib(cudnn|cublasLt|cublas|cudart)\.so[.0-9]*$")
NAMES = {"cudnn": "cuDNN", "cublasLt": "cuBLASLt", "cublas": "cuBLAS", "cudart": "CUDA runtime"}


def version(kind, path):
    """The version the library at PATH reports, as text."""
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        return f"not loaded ({e})"
    try:
        if kind == "cudnn":
            f = lib.cudnnGetVersion
            f.restype = ctypes.c_size_t
            v = f()  # cuDNN 9: major * 10000 + minor * 100 + patch; 8: major * 1000 + ...
            major = v // 10000 if v >= 90000 else v // 1000
            minor = (v % 10000 if v >= 90000 else v % 1000) // 100
            return f"{major}.{minor}.{v % 100}"
        if kind == "cublasLt":
            f = lib.cublasLtGetVersion
            f.restype = ctypes.c_size_t
            v = f()  # major * 10000 + minor * 100 + patch
            return f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
        if kind == "cublas":
            parts = []
            for prop in (0, 1, 2):  # libraryPropertyType: MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
                x = ctypes.c_int()
                if lib.cublasGetProperty(prop, ctypes.byref(x)) != 0:
                    return "cublasGetProperty failed"
                parts.append(str(x.value))
            return ".".join(parts)
        x = ctypes.c_int()
        if lib.cudaRuntimeGetVersion(ctypes.byref(x)) != 0:
            return "cudaRuntimeGetVersion failed"
        return f"{x.value // 1000}.{x.value % 1000 // 10}"
    except AttributeError as e:
        return f"no version call ({e})"


def report(paths):
    seen = set()
    for p in paths:
        m = LIB.search(p)
        real = os.path.realpath(p)
        if not m or real in seen:
            continue
        seen.add(real)
        print(f"  {NAMES[m.group(1)]:<12} {version(m.group(1), p):<10} {p}" + (f" -> {real}" if real != p else ""))
    if not seen:
        print("  none of cuDNN, cuBLAS, cuBLASLt, the CUDA runtime")


def torch_side():
    try:
        import torch
    except Exception as e:  # noqa: BLE001 (any import failure is the answer)
        print(f"python {sys.version.split()[0]}: no PyTorch ({type(e).__name__}: {e})")
        return 0
    cuda = torch.cuda.is_available()
    print(f"python {sys.version.split()[0]} torch {torch.__version__} cuda {torch.version.cuda} "
          f"available {cuda}; torch.backends.cudnn.version() {torch.backends.cudnn.version()}")
    if not cuda:
        print("PyTorch loads: nothing on a GPU (no CUDA device)")
        return 0
    # Load what the peers use: cuBLAS(Lt) through a bf16 matmul, cuDNN through a convolution.
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    x = torch.randn(2, 8, 16, 16, device="cuda")
    torch.nn.functional.conv2d(x, torch.randn(8, 8, 3, 3, device="cuda")).sum().item()
    torch.cuda.synchronize()
    with open("/proc/self/maps") as f:
        paths = sorted({line.split()[-1] for line in f if LIB.search(line.split()[-1] if line.split() else "")})
    print("PyTorch loads:")
    report(paths)
    return 0


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "torch":
        return torch_side()
    if len(sys.argv) >= 2 and sys.argv[1] == "paths":
        report(sys.argv[2:])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
