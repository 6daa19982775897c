#!/usr/bin/env python3
"""The markdown table of bench/gpu/run_h200.sh's wide-MLP stage, from the run folders it left.

Usage: wide_mlp_table.py WORK --batch B --layers F,H1,...,C --policies "fp32 tf32 ..." \
                         --torch "fp32 bf16" [--peak-tflops 989.4] [--backend cuda]
WORK holds mixtrain-<policy>/ (metrics.jsonl, summary.json), mixtrain-<policy>.log, torch-<mode>.json.
A run that is missing or failed becomes a row saying so; the others are still tabulated.

steps/s: mixtrain, the median over metrics.jsonl's windows (samples_per_s / batch) after
dropping the first (warm-up: cuBLASLt plans, allocator growth); PyTorch, the median over its timed
windows after its warm-up steps. Model FLOPs per step: the GEMMs of the MLP, 2·B·in·out per
Linear forward and twice that backward, less the input gradient of the first layer (no framework
computes it): 6·B·Σ in·out − 2·B·F·H1. MFU = model FLOP/s ÷ the peak given (default: the H200 SXM's
dense BF16 Tensor Core peak, 989.4 TFLOP/s, NVIDIA's datasheet, the same as the H100 SXM's; every
row is measured against that one peak, as MFU usually is, whatever dtype the row computes in).
Peak memory: mixtrain's summary.json peak_memory_bytes (every tensor the backend allocated plus
its GEMM scratch); PyTorch's torch.cuda.max_memory_allocated().
"""
import argparse
import json
import os
import statistics

NAMES = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16-mixed", "fp16": "fp16-mixed",
         "fp8": "fp8-delayed", "fp8-current": "fp8-current"}
MiB = 1024.0 ** 2


def mixtrain_row(work, p, batch):
    run = os.path.join(work, f"mixtrain-{p}")
    name = f"mixtrain {NAMES.get(p, p)}"
    try:
        s = json.load(open(os.path.join(run, "summary.json")))
        recs = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
    except (OSError, ValueError) as e:
        return {"name": name, "error": f"no results ({type(e).__name__}: see mixtrain-{p}.log)"}
    w = [r["samples_per_s"] / batch for r in recs if "samples_per_s" in r]
    if len(w) > 1:
        w = w[1:]
    if not w:
        return {"name": name, "error": "no timed windows in metrics.jsonl"}
    return {"name": name, "fw": "mixtrain", "key": p, "sps": statistics.median(w), "windows": w,
            "peak": s.get("peak_memory_bytes"), "loss": s.get("final_loss"),
            "skipped": s.get("skipped_steps"), "steps": s.get("steps"), "wall": s.get("wall_seconds")}


def torch_row(work, m):
    name = "PyTorch FP32 eager" if m == "fp32" else "PyTorch AMP bf16 (autocast)"
    try:
        t = json.load(open(os.path.join(work, f"torch-{m}.json")))
    except (OSError, ValueError) as e:
        return {"name": name, "error": f"no results ({type(e).__name__}: see torch-{m}.log)"}
    if "error" in t:
        return {"name": name, "error": t["error"]}
    return {"name": name, "fw": "pytorch", "key": m, "sps": t["steps_per_s"],
            "windows": t["window_steps_per_s"], "peak": t.get("peak_device_memory_bytes"),
            "loss": t.get("final_loss"), "meta": t}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("work")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--layers", required=True)
    ap.add_argument("--policies", default="fp32 tf32 bf16 fp16 fp8")
    ap.add_argument("--torch", default="fp32 bf16")
    ap.add_argument("--peak-tflops", type=float, default=989.4)
    ap.add_argument("--backend", default="cuda")
    args = ap.parse_args()
    layers = [int(x) for x in args.layers.split(",")]
    b = args.batch
    flop = 6 * b * sum(x * y for x, y in zip(layers, layers[1:])) - 2 * b * layers[0] * layers[1]

    rows = [mixtrain_row(args.work, p, b) for p in args.policies.split()]
    rows += [torch_row(args.work, m) for m in args.torch.split()]

    def find(fw, key):
        return next((r for r in rows if r.get("fw") == fw and r.get("key") == key), None)

    mfp32, mbf16, mfp8 = find("mixtrain", "fp32"), find("mixtrain", "bf16"), find("mixtrain", "fp8")
    tfp32, tbf16 = find("pytorch", "fp32"), find("pytorch", "bf16")

    def ratio(a, b_):
        return f"{a / b_:.2f}x" if a and b_ else "-"

    print(f"Wide MLP {' -> '.join(map(str, layers))} (ReLU between), batch {b}, AdamW, "
          f"backend {args.backend}; {flop / 1e12:.2f} TFLOP of GEMMs per step; MFU against "
          f"{args.peak_tflops:g} TFLOP/s (H200 SXM dense BF16 peak).")
    print()
    cols = ["run", "steps/s", "ms/step", "model TFLOP/s", "MFU", "peak mem MiB", "mem vs own FP32",
            "vs mixtrain fp32", "vs PyTorch AMP bf16", "final loss"]
    table = []
    for r in rows:
        if "error" in r:
            table.append([r["name"], "failed", "-", "-", "-", "-", "-", "-", "-", r["error"]])
            continue
        own = mfp32 if r["fw"] == "mixtrain" else tfp32
        tflops = r["sps"] * flop / 1e12
        table.append([
            r["name"], f"{r['sps']:.2f}", f"{1000.0 / r['sps']:.1f}", f"{tflops:.1f}",
            f"{100.0 * tflops / args.peak_tflops:.1f}%",
            f"{r['peak'] / MiB:.0f}" if r.get("peak") else "-",
            ratio(r.get("peak"), own.get("peak") if own else None),
            ratio(r["sps"], mfp32["sps"] if mfp32 else None),
            ratio(r["sps"], tbf16["sps"] if tbf16 else None),
            f"{r['loss']:.4f}" if isinstance(r.get("loss"), (int, float)) else "-"])
    width = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) if i in (0, 9) else c.rjust(w)
                                          for i, (c, w) in enumerate(zip(cells, width))) + " |"
    print(fmt(cols))
    print("|" + "|".join("-" * (w + 2) if i in (0, 9) else "-" * (w + 1) + ":"
                         for i, w in enumerate(width)) + "|")
    for t in table:
        print(fmt(t))
    print()
    print("Headline ratios:")
    print(f"- mixtrain bf16-mixed vs PyTorch AMP bf16, steps/s: {ratio(mbf16 and mbf16['sps'], tbf16 and tbf16['sps'])}")
    print(f"- mixtrain fp32 vs PyTorch FP32, steps/s: {ratio(mfp32 and mfp32['sps'], tfp32 and tfp32['sps'])}")
    print(f"- mixtrain bf16-mixed vs mixtrain fp32, steps/s: {ratio(mbf16 and mbf16['sps'], mfp32 and mfp32['sps'])}")
    print(f"- mixtrain fp8-delayed vs bf16-mixed, steps/s: {ratio(mfp8 and mfp8['sps'], mbf16 and mbf16['sps'])}")
    print(f"- peak memory, mixtrain bf16-mixed / fp32: {ratio(mbf16 and mbf16.get('peak'), mfp32 and mfp32.get('peak'))}")
    print(f"- peak memory, PyTorch AMP bf16 / FP32: {ratio(tbf16 and tbf16.get('peak'), tfp32 and tfp32.get('peak'))}")
    print(f"- peak memory, mixtrain bf16-mixed / PyTorch AMP bf16: {ratio(mbf16 and mbf16.get('peak'), tbf16 and tbf16.get('peak'))}")
    print()
    print("Windows (steps/s; mixtrain: first window dropped):")
    for r in rows:
        if "error" not in r:
            extra = ""
            if r["fw"] == "mixtrain":
                extra = f"; skipped steps {r.get('skipped')}/{r.get('steps')}, wall {r.get('wall') or 0:.1f} s"
            else:
                m = r["meta"]
                extra = (f"; torch {m.get('torch_version')}, fused={m.get('fused')}, data={m.get('data')}, "
                         f"matmul precision {m.get('float32_matmul_precision', '-')}")
            print(f"- {r['name']}: {[round(x, 3) for x in r['windows']]}{extra}")


if __name__ == "__main__":
    main()
