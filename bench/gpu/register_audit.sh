#!/usr/bin/env bash
# Registers, stack and spills of every CUDA kernel of the backend, from ptxas (no GPU needed):
# recompiles each .cu of mixtrain_backend_cuda_impl for one architecture with -Xptxas -v, into a
# scratch folder (the build's objects are untouched), and lists the kernels over a register limit.
# Why: a memory-bound kernel that ptxas gives over 64 registers runs fewer than 4 blocks of 256
# threads an SM, too few loads in flight; session 57 found the residual backward at 161 registers
# running at a third of the H200's bandwidth (bench/RESULTS.md).
# Usage: bash bench/gpu/register_audit.sh [BUILD_DIR (build)] [LIMIT (64)] [ARCH (90)]
# Prints "registers  spill-bytes  stack-bytes  file  kernel" for each kernel over LIMIT, or with
# spills, or with a stack frame (a by-value parameter indexed at run time is copied into every
# thread's local memory: session 80's NF4 decode, 64 bytes); exits 1 if a compile fails. Needs a configured Ninja build with the CUDA backend, nvcc and c++filt.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
LIMIT=${2:-64}
ARCH=${3:-90}
command -v ninja >/dev/null || { echo "register_audit: needs ninja" >&2; exit 2; }
OUTDIR=$(mktemp -d)
trap 'rm -rf "$OUTDIR"' EXIT
mapfile -t objects < <(ninja -C "$BUILD" -t targets all |
  grep -oE 'plugins/backend_cuda/CMakeFiles/mixtrain_backend_cuda_impl.dir/[A-Za-z0-9_]+\.cu\.o' | sort -u)
((${#objects[@]})) || { echo "register_audit: no CUDA objects in $BUILD (configured without CUDA?)" >&2; exit 2; }
failed=0
for o in "${objects[@]}"; do
  b=$(basename "$o" .cu.o)
  cmd=$(ninja -C "$BUILD" -t commands "$o" | tail -1)
  # One architecture's machine code, no PTX, no dependency file, the object into the scratch.
  cmd=$(sed -E "s# -o [^ ]+# -o $OUTDIR/$b.o#; s/--generate-code=arch=compute_[0-9]+,code=\[[a-z_0-9]+\]//g; s/-MD -MT [^ ]+ -MF [^ ]+//" <<<"$cmd")
  (cd "$BUILD" && eval "$cmd --generate-code=arch=compute_$ARCH,code=[sm_$ARCH] -Xptxas -v") \
    >"$OUTDIR/$b.txt" 2>&1 || { echo "register_audit: $b failed to compile" >&2; failed=1; }
done
python3 - "$OUTDIR" "$LIMIT" <<'PY'
import glob, re, subprocess, sys
out, limit = sys.argv[1], int(sys.argv[2])
rows = []
for f in sorted(glob.glob(out + "/*.txt")):
    name, spill, stack = None, 0, 0
    for line in open(f):
        m = re.search(r"entry function '([^']+)'", line)
        if m:
            name, spill, stack = m.group(1), 0, 0
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores", line)
        if m:
            stack, spill = int(m.group(1)), int(m.group(2))
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            rows.append((int(m.group(1)), spill, stack, f.rsplit("/", 1)[1][:-4], name))
names = subprocess.run(["c++filt"], input="\n".join(r[4] for r in rows), capture_output=True,
                       text=True).stdout.splitlines()
flagged = [(r, s, k, f, n) for (r, s, k, f, _), n in zip(rows, names)
           if r > limit or s > 0 or k > 0]
print(f"register_audit: {len(rows)} kernels, {len(flagged)} over {limit} registers, spilling or "
      "with a stack frame")
for r, s, k, f, n in sorted(flagged, reverse=True):
    print(f"{r:4d} {s:6d} {k:6d}  {f}  {n[:160]}")
PY
exit $failed
