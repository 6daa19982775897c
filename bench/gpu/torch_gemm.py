#!/usr/bin/env python3
"""The PyTorch reference for bench_gemm_cuda: C = A·Bᵀ at m = n = k = SIZE (default 8192) per dtype
through PyTorch's own cuBLAS/cuBLASLt calls on the same GPU, timed with CUDA events.

Rows: fp32 (torch.set_float32_matmul_precision("highest"): no TF32), tf32 ("high"), bf16, fp16
(torch.matmul, output in the input dtype), fp8 (torch._scaled_mm, e4m3 x e4m3 with unit scales,
bf16 output; skipped where this PyTorch or GPU lacks it). Operands: uniform(-1, 1), B stored
[n, k] and used transposed, as bench_gemm_cuda does. Per row: 3 warm-up products, then ITERS
back-to-back products between two CUDA events; TFLOP/s = 2·m·n·k / (elapsed / ITERS).

Prints a markdown table and one JSON line (prefixed "json: "). Without a GPU: one line
"no CUDA device: ..." and exit code 2.
"""
import argparse
import json
import sys

import torch

# Dense H100/H200 SXM datasheet peaks in TFLOP/s (as in bench_gemm_cuda.cpp).
PEAKS = {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: torch.cuda.is_available() is False")
        return 2
    n = args.size
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    a32 = torch.rand(n, n, device=dev, generator=g) * 2 - 1
    b32 = torch.rand(n, n, device=dev, generator=g) * 2 - 1
    flop = 2.0 * n * n * n

    def timed(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / args.iters

    def fp8_fn():
        a8 = a32.to(torch.float8_e4m3fn)
        b8 = b32.to(torch.float8_e4m3fn)  # [n, k] row-major: b8.t() is the column-major operand
        one = torch.ones((), device=dev)
        return lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    results = {}
    rows = []
    for name in ["fp32", "tf32", "bf16", "fp16", "fp8"]:
        try:
            if name in ("fp32", "tf32"):
                torch.set_float32_matmul_precision("highest" if name == "fp32" else "high")
                fn = lambda: a32 @ b32.t()
            elif name in ("bf16", "fp16"):
                dt = torch.bfloat16 if name == "bf16" else torch.float16
                a, b = a32.to(dt), b32.to(dt)
                fn = lambda a=a, b=b: a @ b.t()
            else:
                fn = fp8_fn()
            t = timed(fn)
            tf = flop / t / 1e12
            results[name] = tf
            rows.append(f"| {name:<5} | {tf:9.1f} | {t * 1e3:8.3f} | {100 * tf / PEAKS[name]:8.1f}% |")
        except Exception as e:  # a dtype this PyTorch/GPU lacks must not stop the others
            rows.append(f"| {name:<5} | failed: {type(e).__name__}: {str(e).splitlines()[0][:120]} |")
        finally:
            torch.set_float32_matmul_precision("highest")
    print(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name(dev)}: "
          f"C = A @ B.t(), m=n=k={n}, {args.iters} timed products per dtype (CUDA events)")
    print("| dtype | TFLOP/s | ms/call | % of peak |")
    print("|-------|--------:|--------:|----------:|")
    for r in rows:
        print(r)
    if "fp8" in results and "bf16" in results:
        print(f"FP8 / BF16 = {results['fp8'] / results['bf16']:.2f}x")
    print("json: " + json.dumps({"torch_version": torch.__version__, "size": n, "tflops": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
