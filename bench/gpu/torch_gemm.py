#!/usr/bin/env python3
"""The PyTorch reference for bench_gemm_cuda: C = A·Bᵀ at m = n = k = SIZE (default 8192) per dtype
through PyTorch's own cuBLAS/cuBLASLt calls on the same GPU, timed with CUDA events.

Rows: fp32 (torch.set_float32_matmul_precision("highest"): no TF32), tf32 ("high"), bf16, fp16
(torch.matmul, output in the input dtype), fp8 (torch._scaled_mm, e4m3 x e4m3 with unit scales,
bf16 output; skipped where this PyTorch or GPU lacks it). Operands: uniform(-1, 1), B stored
[n, k] and used transposed, as bench_gemm_cuda does. Timed as bench_gemm_cuda times (its
time_gemm): 3 warm-up products, one more sizes a batch (>= 50 ms, at least 2 products), then
batches of back-to-back products bracketed by torch.cuda.synchronize() and the host's clock for
--seconds per dtype (at least 5 batches); TFLOP/s = 2·m·n·k / time per product, for the median
and the fastest batch. (20 products straight after the warm-up, as this script once timed, caught
the clocks before a sustained load brings them down: session 10 read 794 TFLOP/s for bf16 that way
against 672 for bench_gemm_cuda's median.)

Prints a markdown table and one JSON line (prefixed "json: "). Without a GPU: one line
"no CUDA device: ..." and exit code 2.

--sweep: instead, bench_gemm_cuda_sweep's cases timed as that benchmark times them (batches of
~BATCH_MS ms between CUDA events, operand sets rotated past the L2 cache, median and fastest of
ROUNDS rounds), for bf16 and fp16: square (a @ b.t()), fwd (relu(F.linear(x, W, bias)) with the
bias in the input dtype, as autocast runs it), dgrad (dy @ W), wgrad (dy.t() @ x, output in the
input dtype, as autograd produces it under autocast).
"""
import argparse
import json
import statistics
import sys
import time

import torch

# Dense H100/H200 SXM datasheet peaks in TFLOP/s (as in bench_gemm_cuda.cpp).
PEAKS = {"fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--seconds", type=float, default=1.0, help="timed seconds per dtype (>= 5 batches)")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--batch", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-ms", type=float, default=25.0)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: torch.cuda.is_available() is False")
        return 2
    if args.sweep:
        return sweep(args)
    n = args.size
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    a32 = torch.rand(n, n, device=dev, generator=g) * 2 - 1
    b32 = torch.rand(n, n, device=dev, generator=g) * 2 - 1
    flop = 2.0 * n * n * n

    def timed(fn):  # bench_gemm_cuda.cpp's time_gemm: (median, fastest) seconds per call, calls
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        per_batch = max(2, int(0.05 / max(time.perf_counter() - t0, 1e-6)))
        per_call, calls, start = [], 0, time.perf_counter()
        while len(per_call) < 5 or time.perf_counter() - start < args.seconds:
            t0 = time.perf_counter()
            for _ in range(per_batch):
                fn()
            torch.cuda.synchronize()
            per_call.append((time.perf_counter() - t0) / per_batch)
            calls += per_batch
        return statistics.median(per_call), min(per_call), calls

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
            med, best, calls = timed(fn)
            tf = flop / med / 1e12
            results[name] = tf
            rows.append(f"| {name:<5} | {tf:14.1f} | {flop / best / 1e12:12.1f} | {med * 1e3:7.3f} | "
                        f"{100 * tf / PEAKS[name]:18.1f}% | {calls:5d} |")
        except Exception as e:  # a dtype this PyTorch/GPU lacks must not stop the others
            rows.append(f"| {name:<5} | failed: {type(e).__name__}: {str(e).splitlines()[0][:120]} |")
        finally:
            torch.set_float32_matmul_precision("highest")
    print(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name(dev)}: "
          f"C = A @ B.t(), m=n=k={n}, >= {args.seconds:g} s of >= 50 ms batches per dtype, median / fastest batch")
    print("| dtype | TFLOP/s median | TFLOP/s best | ms/call | % of peak (median) | calls |")
    print("|-------|---------------:|-------------:|--------:|-------------------:|------:|")
    for r in rows:
        print(r)
    if "fp8" in results and "bf16" in results:
        print(f"FP8 / BF16 = {results['fp8'] / results['bf16']:.2f}x")
    print("json: " + json.dumps({"torch_version": torch.__version__, "size": n, "tflops": results}))
    return 0


def sweep(args):
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20)
    S, B, H = args.size, args.batch, args.hidden
    # name: (m, n, k, A stored, B stored, fn(a, b, bias))
    cases = {
        "square": (S, S, S, (S, S), (S, S), lambda a, b, bias: a @ b.t()),
        "fwd": (B, H, H, (B, H), (H, H), lambda a, b, bias: torch.relu(torch.nn.functional.linear(a, b, bias))),
        "dgrad": (B, H, H, (B, H), (H, H), lambda a, b, bias: a @ b),
        "wgrad": (H, H, B, (B, H), (B, H), lambda a, b, bias: a.t() @ b),
    }
    print(f"PyTorch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name(dev)}: "
          f"bench_gemm_cuda_sweep's cases, median (fastest) of {args.rounds} rounds of ~{args.batch_ms} ms batches")
    print("| case | dtype | PyTorch call | ms median | TFLOP/s median | TFLOP/s best |")
    print("|---|---|---|---:|---:|---:|")
    results = {}
    for dt_name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        for name, (m, n, k, a_shape, b_shape, fn) in cases.items():
            try:
                set_bytes = 2 * (a_shape[0] * a_shape[1] + b_shape[0] * b_shape[1] + m * n)
                sets = min(8, max(2, -(-2 * l2 // set_bytes)))
                ops = [((torch.rand(a_shape, device=dev, generator=g) * 2 - 1).to(dt),
                        (torch.rand(b_shape, device=dev, generator=g) * 2 - 1).to(dt)) for _ in range(sets)]
                bias = (torch.rand(n, device=dev, generator=g) * 2 - 1).to(dt)
                for i in range(3):
                    fn(*ops[i % sets], bias)
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for i in range(3):
                    fn(*ops[i % sets], bias)
                end.record()
                torch.cuda.synchronize()
                per_batch = max(2, min(500, int(args.batch_ms / max(start.elapsed_time(end) / 3, 1e-3))))
                times, nxt = [], 0
                for _ in range(args.rounds):
                    start.record()
                    for _ in range(per_batch):
                        fn(*ops[nxt % sets], bias)
                        nxt += 1
                    end.record()
                    torch.cuda.synchronize()
                    times.append(start.elapsed_time(end) / per_batch)
                times.sort()
                med, best = times[len(times) // 2], times[0]
                flop = 2.0 * m * n * k
                results[f"{name}/{dt_name}"] = flop / med / 1e9
                call = {"square": "a @ b.t()", "fwd": "relu(linear(x, W, b))", "dgrad": "dy @ W",
                        "wgrad": "dy.t() @ x"}[name]
                print(f"| {name} | {dt_name} | {call} | {med:.3f} | {flop / med / 1e9:.1f} | {flop / best / 1e9:.1f} |")
                del ops
            except Exception as e:  # one case failing must not stop the others
                print(f"| {name} | {dt_name} | failed: {type(e).__name__}: {str(e).splitlines()[0][:120]} | | | |")
    print("json: " + json.dumps({"torch_version": torch.__version__, "sweep_tflops": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
