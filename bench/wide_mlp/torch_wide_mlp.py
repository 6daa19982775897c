#!/usr/bin/python3
"""Wide MLP (1024 -> 4096 -> 4096 -> 1024 -> 10), batch 512, AdamW, in PyTorch eager.

The PyTorch twin of configs/mlp-fp32.toml (and, with --autocast bf16, of configs/mlp-bf16.toml)
for bench/wide_mlp/run.sh and run_policies.sh (CPU) and bench/gpu/run_h200.sh (--device cuda).
On the CPU, run it with Debian's interpreter (/usr/bin/python3: python3-torch 1.13), not the
python3 first on PATH.

--autocast bf16 is PyTorch's recommended mixed precision: torch.autocast(<device>,
dtype=torch.bfloat16) around forward + loss only; parameters, gradients and AdamW state stay
FP32 (no loss scaler: bf16 has fp32's exponent range). Linear layers then run as bf16 matmuls
(oneDNN/mkldnn on the CPU in PyTorch 1.13, cuBLAS on CUDA), cross_entropy autocasts to fp32.

--device cuda: the model, AdamW state and every step on the GPU. FP32 means FP32 there:
TF32 matmuls are switched off (torch.set_float32_matmul_precision("highest")).
--data host (default) gathers each batch on the host and copies it to the GPU every step, as
mixtrain's trainer does; --data device keeps the whole data set on the GPU. Timed windows are
bracketed by torch.cuda.synchronize(); peak memory is torch.cuda.max_memory_allocated() (every
tensor PyTorch allocated on the GPU since the start: weights, gradients, AdamW state,
activations, batches). --layers sets the widths (first = input features, last = classes).

Prints one JSON object: steps/s (median over timed windows, after warm-up), the per-window
figures, peak RSS (ru_maxrss), peak device memory (cuda) and the configuration used.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

LAYERS = [1024, 4096, 4096, 1024, 10]


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--windows", type=int, default=5, help="timed windows")
    ap.add_argument("--steps-per-window", type=int, default=5)
    ap.add_argument("--foreach", choices=["default", "true", "false"], default="default",
                    help="torch.optim.AdamW(foreach=...); default leaves PyTorch's choice")
    ap.add_argument("--zero-grad", choices=["none", "zero"], default="none",
                    help="zero_grad(set_to_none=True) (PyTorch 2.x default) or zero in place")
    ap.add_argument("--rows", type=int, default=16384, help="synthetic dataset rows")
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none",
                    help="bf16: torch.autocast(<device>, dtype=torch.bfloat16) around forward+loss")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--layers", default=",".join(str(w) for w in LAYERS),
                    help="comma-separated widths: input features, hidden..., classes")
    ap.add_argument("--fused", choices=["default", "true", "false"], default="default",
                    help="torch.optim.AdamW(fused=...) (cuda); default leaves PyTorch's choice")
    ap.add_argument("--data", choices=["host", "device"], default="host",
                    help="host: gather each batch on the host and copy it to the device per step")
    args = ap.parse_args()
    layers = [int(w) for w in args.layers.split(",")]
    if len(layers) < 2 or min(layers) < 1:
        ap.error("--layers needs at least two positive widths")
    if args.rows < args.batch:
        ap.error("--rows must be >= --batch")
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device: torch.cuda.is_available() is False",
                          "torch_version": torch.__version__}))
        sys.exit(2)

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = torch.device(args.device)
    if cuda:
        # FP32 is FP32 (mixtrain's fp32 policy): no TF32 in matmuls ("highest" is PyTorch's default;
        # set anyway, through the API that exists from 1.12 to the 2.9+ fp32_precision switches).
        torch.set_float32_matmul_precision("highest")

    mods = []
    for i in range(len(layers) - 1):
        mods.append(nn.Linear(layers[i], layers[i + 1]))
        if i + 2 < len(layers):
            mods.append(nn.ReLU())
    model = nn.Sequential(*mods).to(dev)
    kw = {} if args.foreach == "default" else {"foreach": args.foreach == "true"}
    if args.fused != "default":
        kw["fused"] = args.fused == "true"
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, **kw)

    # Synthetic "teacher" data of the same shapes as mixtrain's: features [rows, 1024], labels
    # from a fixed random linear teacher. Batches are gathered by index like mixtrain's sampler.
    g = torch.Generator().manual_seed(0)
    x_all = torch.randn(args.rows, layers[0], generator=g)
    teacher = torch.randn(layers[0], layers[-1], generator=g)
    y_all = (x_all @ teacher).argmax(dim=1)
    perm = torch.randperm(args.rows, generator=g)
    if cuda and args.data == "device":
        x_all, y_all, perm = x_all.to(dev), y_all.to(dev), perm.to(dev)

    cursor = 0

    def step():
        nonlocal cursor
        if cursor + args.batch > args.rows:
            cursor = 0
        idx = perm[cursor:cursor + args.batch]
        cursor += args.batch
        xb = x_all.index_select(0, idx).to(dev)
        yb = y_all.index_select(0, idx).to(dev)
        opt.zero_grad(set_to_none=args.zero_grad == "none")
        if args.autocast == "bf16":
            with torch.autocast(args.device, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(xb), yb)
        else:
            loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    window_sps = []
    loss = None
    for _ in range(args.windows):
        t0 = time.perf_counter()
        for _ in range(args.steps_per_window):
            loss = step()
        sync()
        dt = time.perf_counter() - t0
        window_sps.append(args.steps_per_window / dt)

    out = {
        "framework": "pytorch",
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "batch": args.batch,
        "foreach": args.foreach,
        "zero_grad": args.zero_grad,
        "autocast": args.autocast,
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
        # Debian's OpenBLAS sizes its pthread pool from this, not from torch.set_num_threads.
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS", ""),
        "warmup_steps": args.warmup,
        "steps_per_window": args.steps_per_window,
        "window_steps_per_s": [round(v, 4) for v in window_sps],
        "steps_per_s": statistics.median(window_sps),
        "samples_per_s": statistics.median(window_sps) * args.batch,
        "final_loss": float(loss.item()),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "device": args.device,
        "layers": layers,
        "fused": args.fused,
        "data": args.data,
        "rows": args.rows,
        # GEMM FLOPs per step: forward 2*B*in*out per Linear, backward twice that, minus the input
        # gradient of the first layer (the data needs none).
        "gemm_flop_per_step": 6 * args.batch * sum(a * b for a, b in zip(layers, layers[1:]))
        - 2 * args.batch * layers[0] * layers[1],
    }
    if cuda:
        out["device_name"] = torch.cuda.get_device_name(dev)
        out["cuda_version"] = torch.version.cuda
        out["float32_matmul_precision"] = torch.get_float32_matmul_precision()
        out["peak_device_memory_bytes"] = torch.cuda.max_memory_allocated(dev)
        out["peak_device_memory_reserved_bytes"] = torch.cuda.max_memory_reserved(dev)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
