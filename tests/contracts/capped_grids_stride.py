#!/usr/bin/env python3
"""Every CUDA kernel launched over grid_for(n) walks its items with a grid-stride loop.

grid_for (plugins/backend_cuda/cuda_device.cuh) caps a grid at 8192 blocks, so a kernel that
takes one item per thread and returns past the end silently skips every item beyond 2,097,152
(8192 x 256): no error, and no small test shape ever reaches it. This check reads each .cu/.cuh
under the given folder, finds the kernels launched with grid_for, and requires each kernel's body
to step by the grid (grid_threads(), gridDim, or for_each_element, the walk cuda_device.cuh
defines).

usage: capped_grids_stride.py FOLDER   (exit 1 and one line per kernel that does not)
"""
import pathlib
import re
import sys

LAUNCH = re.compile(r"(\w+)\s*(?:<[^;{}<>]*(?:<[^;{}<>]*>[^;{}<>]*)*>)?\s*<<<\s*(?:\w+::)*grid_for\s*\(")
STRIDES = ("grid_threads()", "gridDim", "for_each_element")


def kernel_body(text, name):
    """The braces of `__global__ ... name(...) {...}`, or None where no definition is found."""
    for m in re.finditer(r"__global__[^;{]*?\b" + re.escape(name) + r"\s*\(", text):
        open_at = text.find("{", m.end())
        if open_at < 0:
            return None
        depth = 0
        for i in range(open_at, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[open_at:i + 1]
    return None


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip().splitlines()[-1])
        return 2
    root = pathlib.Path(sys.argv[1])
    files = sorted(p for p in root.rglob("*") if p.suffix in (".cu", ".cuh"))
    texts = {p: p.read_text(encoding="utf-8") for p in files}
    launched = {}
    for p, t in texts.items():
        for m in LAUNCH.finditer(t):
            line = t.count("\n", 0, m.start()) + 1
            launched.setdefault(m.group(1), f"{p.relative_to(root)}:{line}")
    bad = 0
    for name, where in sorted(launched.items()):
        bodies = [b for b in (kernel_body(t, name) for t in texts.values()) if b is not None]
        if not bodies:
            print(f"{where}: `{name}` is launched over grid_for but its __global__ definition "
                  "was not found here")
            bad += 1
        elif not all(any(s in b for s in STRIDES) for b in bodies):
            print(f"{where}: `{name}` is launched over grid_for (at most 8192 blocks) but does not "
                  "step by the grid: items past 8192 x blockDim.x are never touched; loop "
                  "`for (i = global_thread(); i < n; i += grid_threads())`")
            bad += 1
    print(f"{len(launched)} kernel(s) launched over grid_for, {bad} without a grid-stride walk")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
