#!/usr/bin/env python3
"""One row per (case, dtype) from gemm_sweep.txt: the backend, its fastest variant, cublasGemmEx
and PyTorch, all timed the same way (bench_gemm_cuda_sweep and torch_gemm.py --sweep), in TFLOP/s
(medians), with the ratios to PyTorch. Reads the two markdown tables the programs print; prints
nothing but a note when either is missing (no GPU)."""
import sys


def cells(line):
    return [c.strip() for c in line.strip().strip("|").split("|")]


def main():
    mix, torch = {}, {}
    for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
        if not line.startswith("| ") or line.startswith("| case"):
            continue
        c = cells(line)
        try:
            if len(c) == 9 and c[6]:  # bench_gemm_cuda_sweep: case dtype variant algo ms med best vs err
                mix.setdefault((c[0], c[1]), []).append((c[2], float(c[5])))
            elif len(c) == 6 and c[5]:  # torch_gemm.py --sweep: case dtype call ms med best
                torch[(c[0], c[1])] = float(c[4])
        except ValueError:
            continue
    if not mix or not torch:
        print("(no sweep figures to compare: the GPU runs did not both print their tables)")
        return 0
    print("| case | dtype | backend | fastest variant | cublasGemmEx | PyTorch | backend / PyTorch | fastest / PyTorch |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for key, rows in mix.items():
        d = dict(rows)
        backend = d.get("backend")
        fused = [(v, t) for v, t in rows if "no epilogue" not in v and not v.startswith("cublasGemmEx")]
        best = max(fused, key=lambda r: r[1]) if fused else ("-", 0.0)
        gemmex = next((t for v, t in rows if v.startswith("cublasGemmEx")), None)
        pt = torch.get(key)
        fmt = lambda x: f"{x:.1f}" if x else "-"
        ratio = lambda x: f"{x / pt:.3f}x" if x and pt else "-"
        print(f"| {key[0]} | {key[1]} | {fmt(backend)} | {best[0]}: {best[1]:.1f} | {fmt(gemmex)} | {fmt(pt)} | "
              f"{ratio(backend)} | {ratio(best[1])} |")
    print("\nfwd: the backend rows include the fused bias + ReLU epilogue, PyTorch's a separate ReLU kernel;"
          " cublasGemmEx there has no epilogue.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
