#!/usr/bin/env python3
"""The markdown table of bench/gpu/run_h200.sh's model stages (resnet50, gpt2) from the run
folders they left.

Usage: model_table.py WORK --model resnet50|gpt2 --batch B --policies "bf16 fp32" --torch "bf16 fp32"
                      [model sizes as torch_models.py takes them] [--peak-tflops 989.4]
WORK holds mixtrain-<policy>/ (metrics.jsonl, summary.json), mixtrain-<policy>.log and
torch-<mode>.json (bench/gpu/torch_models.py's output). A missing or failed run becomes a row
saying so; the others are still tabulated.

Throughput: images/s (resnet50) or tokens/s (gpt2). mixtrain: the median of metrics.jsonl's
samples_per_s windows after dropping the first (warm-up: plans, allocator growth), × tokens per
sample for the GPT; PyTorch: the median of its timed windows after its warm-up steps.
Model FLOPs (the usual MFU convention: 3 × the forward's multiply-adds × 2, i.e. forward, input
gradient and weight gradient of every GEMM and convolution; no recomputation counted):
  resnet50  every convolution and the fc layer, from the architecture at --image pixels
            (≈ 4.1 GMAC per 224² image forward for ResNet-50);
  gpt2      per token 2·(12·L·C² + C·V) forward for the linear layers and lm_head, plus 4·L·T·C
            for QKᵀ and PV over the whole T×T square (the causal half is not discounted, as
            PaLM's and nanoGPT's MFU do not).
MFU = model FLOP/s ÷ --peak-tflops (default 989.4: H100/H200 SXM dense BF16) for every row.
Peak memory, like with like. "whole run": mixtrain's summary.json peak_memory_bytes (the backend's
high-water mark from the start: every tensor and scratch, no trial workspaces, since convolution
autotuning is off unless a +convtune row says so); PyTorch's torch.cuda.max_memory_allocated() over
the whole run, cudnn.benchmark's trial workspaces included. "steady": the timed windows alone
(PyTorch: after torch.cuda.reset_peak_memory_stats() following the warm-up). mixtrain records no
steady figure (metrics.jsonl's device_peak_memory_bytes is the same running high-water mark, never
reset), so its column says "-" and its whole-run peak, an upper bound of its steady one, is
compared with PyTorch's steady peak too: that comparison favours PyTorch.
Predicted: the peak `mixtrain check` predicted for the same run (check-<policy>.txt), so a GPU run
shows how far the memory plan's forecast is from the device allocator's count.
"""
import argparse
import json
import os
import re
import statistics

NAMES = {"fp32": "fp32", "tf32": "tf32", "bf16": "bf16-mixed", "fp16": "fp16-mixed",
         "fp8": "fp8-delayed", "fp8-block": "fp8-block"}
MiB = 1024.0 ** 2


def resnet_forward_macs(image, blocks, widths, classes):
    """Multiply-adds of one image's forward through a Bottleneck ResNet (torchvision v1.5)."""
    def out(size, k, s, p):
        return (size + 2 * p - k) // s + 1

    h = out(image, 7, 2, 3)
    macs = h * h * 64 * 3 * 49
    h = out(h, 3, 2, 1)  # max pool
    c = 64
    for s, (n, w) in enumerate(zip(blocks, widths)):
        for b in range(n):
            stride = 2 if s > 0 and b == 0 else 1
            ho = out(h, 3, stride, 1)
            macs += h * h * w * c           # conv1 1x1
            macs += ho * ho * w * w * 9     # conv2 3x3, stride
            macs += ho * ho * 4 * w * w     # conv3 1x1
            if stride != 1 or c != 4 * w:
                macs += ho * ho * 4 * w * c  # downsample 1x1
            h, c = ho, 4 * w
    return macs + c * classes


def gpt_forward_flops_per_token(layers, width, tokens, vocab):
    return 2 * (12 * layers * width * width + width * vocab) + 4 * layers * tokens * width


def predicted_peak(work, p):
    """The bytes of check-<p>.txt's "predicted peak" line, or None."""
    try:
        text = open(os.path.join(work, f"check-{p}.txt")).read()
    except OSError:
        return None
    m = re.search(r"predicted peak\s.*\((\d+) bytes\)", text)
    return int(m.group(1)) if m else None


def mixtrain_row(work, p, per_sample):
    run = os.path.join(work, f"mixtrain-{p}")
    base, *extras = p.split("+")
    what = {"nographs": "no step graphs", "tune": "gemm_autotune 8", "whole": "whole logits",
            "nopad": "unpadded LM head", "headfp8": "LM head in FP8",
            "nogradcast": "bias and gelu gradients apart from the FP8 cast",
            "bf16sums": "bf16 gradient sums", "chunk2048": "LM head in blocks of 2048 rows"}
    name = f"mixtrain {NAMES.get(base, base)}" + "".join(f" + {what.get(x, x)}" for x in extras)
    if not os.path.isdir(run):
        return {"name": name, "error": "not run (see the stage's notes)"}
    try:
        recs = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if l.strip()]
    except (OSError, ValueError) as e:
        return {"name": name, "error": f"no results ({type(e).__name__}: see mixtrain-{p}.log)"}
    try:
        s = json.load(open(os.path.join(run, "summary.json")))
    except (OSError, ValueError):
        # A run its cap cut short (killed before it wrote its summary): its timed windows still
        # count; the peak is the last record's, the loss the last logged.
        peaks = [r["device_peak_memory_bytes"] for r in recs if "device_peak_memory_bytes" in r]
        losses = [r["loss"] for r in recs if "loss" in r]
        s = {"peak_memory_bytes": peaks[-1] if peaks else None,
             "final_loss": f"{losses[-1]:.4f} (cut short)" if losses else None}
    w = [r["samples_per_s"] * per_sample for r in recs if "samples_per_s" in r]
    if len(w) > 1:
        w = w[1:]
    if not w:
        return {"name": name, "error": "no timed windows in metrics.jsonl"}
    return {"name": name, "fw": "mixtrain", "key": p, "rate": statistics.median(w),
            "peak": s.get("peak_memory_bytes"), "predicted": predicted_peak(work, p),
            "loss": s.get("final_loss")}


def torch_row(work, m, unit):
    name = {"fp32": "PyTorch FP32 eager (TF32 off)", "tf32": "PyTorch FP32 eager, TF32 allowed"}.get(
        m, "PyTorch AMP bf16 (autocast)")
    if not os.path.exists(os.path.join(work, f"torch-{m}.log")):
        return {"name": name, "error": "not run (see the stage's notes)"}
    try:
        t = json.load(open(os.path.join(work, f"torch-{m}.json")))
    except (OSError, ValueError) as e:
        return {"name": name, "error": f"no results ({type(e).__name__}: see torch-{m}.log)"}
    if "error" in t:
        return {"name": name, "error": t["error"]}
    extra = t.get("layout") or t.get("attention")
    return {"name": f"{name}{', ' + extra if extra else ''}", "fw": "pytorch", "key": m,
            "rate": t[f"{unit}_per_s"], "peak": t.get("peak_device_memory_bytes"),
            "steady": t.get("steady_peak_device_memory_bytes"), "loss": t.get("final_loss")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("work")
    ap.add_argument("--model", choices=["resnet50", "gpt2"], required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--policies", default="bf16 fp32")
    ap.add_argument("--torch", default="bf16 fp32")
    ap.add_argument("--peak-tflops", type=float, default=989.4)
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--blocks", default="3,4,6,3")
    ap.add_argument("--widths", default="64,128,256,512")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    a = ap.parse_args()

    if a.model == "resnet50":
        unit, per_sample = "images", 1
        blocks = [int(x) for x in a.blocks.split(",")]
        widths = [int(x) for x in a.widths.split(",")]
        flop_per_unit = 6 * resnet_forward_macs(a.image, blocks, widths, a.classes)
        what = (f"ResNet-50-shaped (Bottleneck {blocks} x {widths}) at {a.image}x{a.image}, "
                f"{a.classes} classes, batch {a.batch}, SGD momentum")
    else:
        unit, per_sample = "tokens", a.tokens
        flop_per_unit = 3 * gpt_forward_flops_per_token(a.layers, a.width, a.tokens, a.vocab)
        what = (f"GPT-2-shaped ({a.layers} layers, {a.width} wide, {a.tokens} tokens, vocab "
                f"{a.vocab}), batch {a.batch}, AdamW")

    rows = [mixtrain_row(a.work, p, per_sample) for p in a.policies.split()]
    rows += [torch_row(a.work, m, unit) for m in a.torch.split()]

    def find(fw, key):
        return next((r for r in rows if r.get("fw") == fw and r.get("key") == key), None)

    tbf16, mbf16 = find("pytorch", "bf16"), find("mixtrain", "bf16")

    def ratio(x, y):
        return f"{x / y:.2f}x" if x and y else "-"

    print(f"{what}; {flop_per_unit / 1e9:.2f} GFLOP of model math per {unit[:-1]} (training); MFU "
          f"against {a.peak_tflops:g} TFLOP/s.")
    print()
    cols = ["run", f"{unit}/s", "model TFLOP/s", "MFU", "peak MiB, whole run", "peak MiB, steady",
            "predicted MiB",
            "vs PyTorch AMP bf16", "vs mixtrain bf16", "final loss"]
    table = []
    for r in rows:
        if "error" in r:
            state = "not run" if r["error"].startswith("not run") else "failed"
            table.append([r["name"], state, "-", "-", "-", "-", "-", "-", "-", r["error"]])
            continue
        tflops = r["rate"] * flop_per_unit / 1e12
        table.append([r["name"], f"{r['rate']:.0f}", f"{tflops:.1f}",
                      f"{100.0 * tflops / a.peak_tflops:.1f}%",
                      f"{r['peak'] / MiB:.0f}" if r.get("peak") else "-",
                      f"{r['steady'] / MiB:.0f}" if r.get("steady") else "-",
                      f"{r['predicted'] / MiB:.0f}" if r.get("predicted") else "-",
                      ratio(r["rate"], tbf16 and tbf16["rate"]),
                      ratio(r["rate"], mbf16 and mbf16["rate"]),
                      f"{r['loss']:.4f}" if isinstance(r.get("loss"), (int, float))
                      else r["loss"] if isinstance(r.get("loss"), str) else "-"])
    width = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    last = len(cols) - 1
    fmt = lambda cells: "| " + " | ".join(c.ljust(w) if i in (0, last) else c.rjust(w)
                                          for i, (c, w) in enumerate(zip(cells, width))) + " |"
    print(fmt(cols))
    print("|" + "|".join("-" * (w + 2) if i in (0, last) else "-" * (w + 1) + ":"
                         for i, w in enumerate(width)) + "|")
    for t in table:
        print(fmt(t))
    print()
    print(f"- mixtrain bf16-mixed vs PyTorch AMP bf16, {unit}/s: "
          f"{ratio(mbf16 and mbf16['rate'], tbf16 and tbf16['rate'])}")
    print(f"- peak memory, mixtrain bf16-mixed vs PyTorch AMP bf16, whole run against whole run: "
          f"{ratio(mbf16 and mbf16.get('peak'), tbf16 and tbf16.get('peak'))}; mixtrain's whole run "
          f"against PyTorch's steady peak (timed windows, no cudnn.benchmark trials; favours PyTorch): "
          f"{ratio(mbf16 and mbf16.get('peak'), tbf16 and tbf16.get('steady'))}")
    # Issue 36's fp32 targets: each FP32 mode against PyTorch's same mode.
    for p in ("fp32", "tf32"):
        m, t = find("mixtrain", p), find("pytorch", p)
        if m and t:
            print(f"- mixtrain {p} vs {t['name']}, {unit}/s: {ratio(m['rate'], t['rate'])}")
    for p in a.policies.split():
        r = find("mixtrain", p)
        if p != "bf16" and r:
            print(f"- mixtrain {NAMES.get(p, p)} vs mixtrain bf16-mixed: {ratio(r['rate'], mbf16 and mbf16['rate'])}")
    # A row the stage's budget left unrun is said so in its table, not a failure of the stage.
    return 1 if any("error" in r and not r["error"].startswith("not run") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
