#!/usr/bin/python3
"""Wide MLP (1024 -> 4096 -> 4096 -> 1024 -> 10), batch 512, AdamW, in PyTorch eager on CPU.

The PyTorch twin of configs/mlp-fp32.toml (and, with --autocast bf16, of configs/mlp-bf16.toml)
for bench/wide_mlp/run.sh and run_policies.sh. Run it with Debian's interpreter
(/usr/bin/python3: python3-torch 1.13), not the python3 first on PATH.

--autocast bf16 is PyTorch's recommended CPU mixed precision: torch.autocast("cpu",
dtype=torch.bfloat16) around forward + loss only; parameters, gradients and AdamW state stay
FP32 (no loss scaler: bf16 has fp32's exponent range). Linear layers then run as bf16 matmuls
(oneDNN/mkldnn in PyTorch 1.13), cross_entropy autocasts to fp32.

Prints one JSON object: steps/s (median over timed windows, after warm-up), the per-window
figures, peak RSS (ru_maxrss) and the configuration used.
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
                    help="bf16: torch.autocast('cpu', dtype=torch.bfloat16) around forward+loss")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    mods = []
    for i in range(len(LAYERS) - 1):
        mods.append(nn.Linear(LAYERS[i], LAYERS[i + 1]))
        if i + 2 < len(LAYERS):
            mods.append(nn.ReLU())
    model = nn.Sequential(*mods)
    kw = {} if args.foreach == "default" else {"foreach": args.foreach == "true"}
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, **kw)

    # Synthetic "teacher" data of the same shapes as mixtrain's: features [rows, 1024], labels
    # from a fixed random linear teacher. Batches are gathered by index like mixtrain's sampler.
    g = torch.Generator().manual_seed(0)
    x_all = torch.randn(args.rows, LAYERS[0], generator=g)
    teacher = torch.randn(LAYERS[0], LAYERS[-1], generator=g)
    y_all = (x_all @ teacher).argmax(dim=1)
    perm = torch.randperm(args.rows, generator=g)

    cursor = 0

    def step():
        nonlocal cursor
        if cursor + args.batch > args.rows:
            cursor = 0
        idx = perm[cursor:cursor + args.batch]
        cursor += args.batch
        xb = x_all.index_select(0, idx)
        yb = y_all.index_select(0, idx)
        opt.zero_grad(set_to_none=args.zero_grad == "none")
        if args.autocast == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(xb), yb)
        else:
            loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    window_sps = []
    loss = None
    for _ in range(args.windows):
        t0 = time.perf_counter()
        for _ in range(args.steps_per_window):
            loss = step()
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
        "warmup_steps": args.warmup,
        "steps_per_window": args.steps_per_window,
        "window_steps_per_s": [round(v, 4) for v in window_sps],
        "steps_per_s": statistics.median(window_sps),
        "samples_per_s": statistics.median(window_sps) * args.batch,
        "final_loss": float(loss.item()),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
