#!/usr/bin/env python3
"""PyTorch eager peers of the GPU kit's model stages (bench/gpu/run_h200.sh: resnet50, gpt2).

  --model resnet50  torchvision's ResNet-50 (v1.5, Bottleneck, stride on the 3x3), --image
                    pixels square, --classes outputs; SGD (lr 0.1, momentum 0.9, weight decay
                    1e-4), as configs/resnet50-bf16.toml, fused on CUDA where this PyTorch has
                    it (fused=True: one kernel over every parameter, as mixtrain's update is;
                    else the default foreach); channels_last unless --layout nchw.
                    Without torchvision (the CPU dry run's PyTorch 1.13), the same network
                    written out below with torchvision's module names.
  --model gpt2      a GPT-2 decoder as mixtrain's `gpt` preset builds it (pre-LN blocks, GELU
                    tanh, fused QKV, lm_head tied to wte, biases): --layers, --heads, --width,
                    --tokens of context, --vocab; AdamW (fused on CUDA), as the gpt configs.
                    Attention: F.scaled_dot_product_attention (is_causal=True: flash attention on
                    a GPU) where PyTorch has it, what a PyTorch user writes today; --attention math
                    forces the written-out softmax(QK^T)V.
  --precision fp32  FP32 everywhere, TF32 off for matmuls AND cuDNN convolutions (PyTorch allows
                    TF32 convolutions by default; mixtrain's fp32 policy never uses TF32, so the
                    peer must not either); bf16: torch.autocast(device, torch.bfloat16) around
                    forward + loss, FP32 weights (PyTorch AMP); tf32: FP32 with TF32 allowed in
                    matmuls and cuDNN convolutions (the peer of mixtrain's tf32 policy).

Inputs are one random batch resident on the device (labels/tokens too): the peer pays no data
loading, which favours it (mixtrain's synthetic/token sources run its host pipeline every step).
Timed windows are bracketed by a device synchronize; steps/s is the median over windows after
the warm-up: at least --warmup steps and at least --warmup-seconds (cudnn.benchmark's trials, the
allocator's growth and the clocks' ramp all land in it, not in a window). Peak memory:
torch.cuda.max_memory_allocated() twice: peak_device_memory_bytes over the whole run, warm-up
included (cudnn.benchmark's trial workspaces too), as mixtrain's summary.json peak covers its
whole run; and steady_peak_device_memory_bytes over the timed windows alone
(torch.cuda.reset_peak_memory_stats() after the warm-up), a training step's own peak. On the CPU:
ru_maxrss, whole run.
On the CPU, PyTorch's FP32 matmuls go to the BLAS it was built with: Debian's python3-torch calls
OpenBLAS, whose run-time detection may not know a virtual CPU and falls back to its SSE3
"Prescott" kernel (3-5x slower; bench/RESULTS.md, "FP32 GEMM library"). The JSON names the core
OpenBLAS picked (openblas_core); a fair FP32 peer sets OPENBLAS_CORETYPE (SkylakeX on AVX-512,
Haswell on AVX2) and sweeps OMP_WAIT_POLICY, as bench/gpt/torch_gpt_bench.py does.
Prints one JSON object (the kit's model_table.py reads it); {"error": ...} and exit 2 when the
device asked for is missing.

--profile-steps N (the kit's profile stage): instead of the timed windows, N steps after the
warm-up under torch.profiler; --profile-out FILE gets its table of the top --profile-top kernels
and ops by self GPU time (self CPU time on the CPU), headed on CUDA by the self GPU time per step
of every cuDNN convolution kernel named wgrad, dgrad or fprop, then the convolution ops' time by
input shapes (record_shapes: forward, and the backward's both gradients, beside the node table of
mixtrain's `train --profile`), and the JSON the per-step totals (conv_kernels: the same sums).
"""
import argparse
import importlib.util
import json
import math
import os
import resource
import statistics
import sys
import time


def openblas_core():
    """The kernel family OpenBLAS chose: the CPU GPT bench's probe (bench/gpt/torch_gpt_bench.py),
    loaded from its file; None where this process has no OpenBLAS."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "gpt",
                        "torch_gpt_bench.py")
    spec = importlib.util.spec_from_file_location("torch_gpt_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.openblas_core()


def bottleneck_resnet(torch, blocks, widths, classes):
    """torchvision.models.resnet.ResNet(Bottleneck, blocks) written out, for PyTorch builds
    without torchvision (same module names, same v1.5 strides, same init)."""
    nn = torch.nn

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, inplanes, planes, stride, downsample):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(planes)
            self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(planes)
            self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(planes * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = downsample

        def forward(self, x):
            idt = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            return self.relu(self.bn3(self.conv3(out)) + idt)

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inplanes = 64
            for s, (n, w) in enumerate(zip(blocks, widths)):
                layers = []
                for b in range(n):
                    stride = 2 if s > 0 and b == 0 else 1
                    down = None
                    if stride != 1 or inplanes != w * 4:
                        down = nn.Sequential(nn.Conv2d(inplanes, w * 4, 1, stride, bias=False),
                                             nn.BatchNorm2d(w * 4))
                    layers.append(Bottleneck(inplanes, w, stride, down))
                    inplanes = w * 4
                setattr(self, f"layer{s + 1}", nn.Sequential(*layers))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(inplanes, classes)
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            for s in range(len(blocks)):
                x = getattr(self, f"layer{s + 1}")(x)
            return self.fc(torch.flatten(self.avgpool(x), 1))

    return ResNet()


def gpt(torch, a):
    nn, F = torch.nn, torch.nn.functional
    sdpa = hasattr(F, "scaled_dot_product_attention") and a.attention == "sdpa"

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            c = a.width
            self.ln_1, self.ln_2 = nn.LayerNorm(c), nn.LayerNorm(c)
            self.c_attn, self.attn_proj = nn.Linear(c, 3 * c), nn.Linear(c, c)
            self.c_fc, self.mlp_proj = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

        def forward(self, x):
            n, t, c = x.shape
            h = a.heads
            q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
            q, k, v = (z.view(n, t, h, c // h).transpose(1, 2) for z in (q, k, v))
            if sdpa:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                s = (q @ k.transpose(-2, -1)) / math.sqrt(c // h)
                mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
                y = s.float().masked_fill(~mask, float("-inf")).softmax(-1).to(v.dtype) @ v
            x = x + self.attn_proj(y.transpose(1, 2).reshape(n, t, c))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(a.vocab, a.width)
            self.wpe = nn.Embedding(a.tokens, a.width)
            self.h = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.width)
            self.lm_head = nn.Linear(a.width, a.vocab, bias=False)
            self.lm_head.weight = self.wte.weight
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * a.layers) if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.h:
                # --checkpoint: each block's activations computed again in the backward from its
                # input (Hugging Face's gradient_checkpointing_enable(); mixtrain's
                # model.recompute = ["layernorm", "linear", "attention", "gelu"]).
                # Under --lora the blocks' input needs no gradient (the embeddings are frozen):
                # the reentrant form would then give the adapters none, so the non-reentrant one
                # (PEFT's advice, Hugging Face's gradient_checkpointing_kwargs) runs there.
                if a.checkpoint:
                    x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=a.lora == 0)
                else:
                    x = b(x)
            return self.lm_head(self.ln_f(x))

    model = GPT()
    if a.lora > 0:
        # PEFT's LoRA layer, written out (peft is not a Debian package): y = W·x + b +
        # B·A·x · (alpha / r) on the four linears of each block, A Kaiming-uniform, B zero, every
        # other parameter frozen; the same targets as mixtrain's [model.lora] on its gpt preset.
        class LoRA(nn.Module):
            def __init__(self, base):
                super().__init__()
                self.base = base
                self.lora_A = nn.Linear(base.in_features, a.lora, bias=False)
                self.lora_B = nn.Linear(a.lora, base.out_features, bias=False)
                nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
                nn.init.zeros_(self.lora_B.weight)
                self.scaling = a.lora_alpha / a.lora

            def forward(self, x):
                return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling

        for p in model.parameters():
            p.requires_grad_(False)
        for b in model.h:
            for name in ("c_attn", "attn_proj", "c_fc", "mlp_proj"):
                setattr(b, name, LoRA(getattr(b, name)))
    return model, ("sdpa" if sdpa else "math")


def convolutions_by_shape(prof, a, cuda):
    """The convolution ops' time by input shapes (record_shapes), most first: beside the node
    table of mixtrain's `train --profile`, which times each convolution layer's forward, data
    gradient and weight gradient apart (aten::convolution_backward computes both gradients)."""
    ops = ("aten::cudnn_convolution", "aten::mkldnn_convolution", "aten::convolution_backward")
    names = (["device_time_total", "cuda_time_total"] if cuda else ["cpu_time_total"])
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key not in ops:
            continue
        us = next((getattr(e, n) for n in names if hasattr(e, n)), None)
        if us is None:
            continue
        shapes = " ".join(str(list(s)) for s in (e.input_shapes or []) if s)
        rows.append((us / 1000.0 / a.profile_steps, e.count / a.profile_steps, e.key, shapes))
    rows.sort(reverse=True)
    what = "device" if cuda else "CPU"
    out = [f"convolutions by input shapes ({what} time of the op and what it launched, ms/step):",
           f"  {'ms/step':>8} {'calls/step':>10}  op  input shapes"]
    out += [f"  {ms:8.3f} {calls:10.1f}  {key}  {shapes}" for ms, calls, key, shapes in rows]
    return "\n".join(out) + "\n"


def profile(torch, a, meta, step, sync, cuda):
    """--profile-steps: the steps under torch.profiler; writes the top table, returns totals."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities, record_shapes=True) as prof:
        for _ in range(a.profile_steps):
            loss = step()
        sync()
    events = prof.key_averages()
    table = None
    # PyTorch 2.4+ names device time "device"; 1.13 and 2.0-2.3 "cuda".
    keys = ["self_device_time_total", "self_cuda_time_total"] if cuda else ["self_cpu_time_total"]
    for key in keys:
        try:
            table = events.table(sort_by=key, row_limit=a.profile_top)
            break
        except (AttributeError, KeyError, ValueError, RuntimeError):
            continue
    if table is None:
        table = events.table(row_limit=a.profile_top)
    # cuDNN names its convolution kernels by direction (sm90_xmma_wgrad_..., ..._dgrad_...,
    # ..._fprop_...): their self GPU time per step, beside mixtrain's conv2d_backward_weights,
    # backward_data and forward rows (issue 36's wgrad target), whatever the top-N cut leaves out.
    families = {}
    if cuda:
        for word in ("wgrad", "dgrad", "fprop"):
            ms, kinds = 0.0, 0
            for e in events:
                if word not in e.key.lower():
                    continue
                for n in ("self_device_time_total", "self_cuda_time_total"):
                    if hasattr(e, n):
                        ms += getattr(e, n) / 1000.0 / a.profile_steps
                        kinds += 1
                        break
            families[word] = {"ms_per_step": ms, "kernels": kinds}
    head = (f"torch.profiler: {meta['model']} {a.precision} batch {a.batch}, {a.profile_steps} steps, "
            f"sorted by {key}\n")
    if families:
        head += ("convolution kernels by name, self GPU ms/step (all of them, not only the top): " +
                 ", ".join(f"{w} {f['ms_per_step']:.3f} ({f['kernels']} kernels)"
                           for w, f in families.items()) + "\n")
    table += "\n" + convolutions_by_shape(prof, a, cuda)
    if a.profile_out:
        with open(a.profile_out, "w") as f:
            f.write(head + table + "\n")
    else:
        print(head + table, file=sys.stderr)

    def total(attr_names):
        # The kernels' own rows only: an op's row repeats the time of the kernels it launched, and
        # a user annotation's (the optimizer step) repeats it again; torch.profiler's own "Self
        # CUDA time total" sums the same rows.
        from torch.autograd import DeviceType

        def kernel(e):
            return getattr(e, "device_type", None) == DeviceType.CUDA and \
                not getattr(e, "is_user_annotation", False)
        for n in attr_names:
            try:
                return sum(getattr(e, n) for e in events if kernel(e)) / 1000.0 / a.profile_steps
            except AttributeError:
                continue
        return None
    return dict(meta, profiled_steps=a.profile_steps, final_loss=float(loss), conv_kernels=families,
                self_device_ms_per_step=total(["self_device_time_total", "self_cuda_time_total"]) if cuda else None,
                self_cpu_ms_per_step=total(["self_cpu_time_total"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["resnet50", "gpt2"], required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--precision", choices=["fp32", "tf32", "bf16"], default="bf16")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up steps, at least")
    ap.add_argument("--warmup-seconds", type=float, default=1.0,
                    help="warm-up time, at least (steps go on until both are reached)")
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--steps-per-window", type=int, default=5)
    ap.add_argument("--profile-steps", type=int, default=0,
                    help="profile this many steps with torch.profiler instead of timing windows")
    ap.add_argument("--profile-top", type=int, default=30)
    ap.add_argument("--profile-out", default="", help="the profile's table (default: stderr)")
    # resnet50
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--blocks", default="3,4,6,3")
    ap.add_argument("--widths", default="64,128,256,512")
    ap.add_argument("--layout", choices=["channels_last", "nchw"], default="channels_last")
    # gpt2
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--attention", choices=["sdpa", "math"], default="sdpa")
    ap.add_argument("--lora", type=int, default=0,
                    help="gpt2: LoRA of this rank on each block's four linears, the rest frozen (0: off)")
    ap.add_argument("--lora-alpha", type=float, default=16.0)
    ap.add_argument("--checkpoint", action="store_true",
                    help="gpt2: torch.utils.checkpoint around each block (non-reentrant with "
                         "--lora, whose frozen embeddings give the blocks an input without a "
                         "gradient)")
    a = ap.parse_args()

    import torch
    import torch.utils.checkpoint
    cuda = a.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device: torch.cuda.is_available() is False"}))
        return 2
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dev = torch.device(a.device)
    # fp32 means fp32: no TF32 in matmuls or in cuDNN convolutions (on by default for the latter);
    # tf32 allows both.
    torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
    torch.backends.cudnn.benchmark = True  # what a PyTorch CNN user turns on for fixed shapes
    torch.manual_seed(0)
    meta = {"model": a.model, "device": a.device, "precision": a.precision, "batch": a.batch,
            "torch": torch.__version__}
    if a.model == "resnet50":
        blocks = [int(x) for x in a.blocks.split(",")]
        widths = [int(x) for x in a.widths.split(",")]
        try:
            import torchvision
            from torchvision.models.resnet import Bottleneck, ResNet
            if widths != [64, 128, 256, 512]:
                raise ImportError("torchvision's ResNet has fixed widths")
            model = ResNet(Bottleneck, blocks, num_classes=a.classes)
            meta["module"] = f"torchvision {torchvision.__version__} ResNet(Bottleneck, {blocks})"
        except Exception:  # not installed, fixed widths, or built for another torch (RuntimeError)
            model = bottleneck_resnet(torch, blocks, widths, a.classes)
            meta["module"] = f"written-out Bottleneck ResNet {blocks} x {widths}"
        model = model.to(dev)
        x = torch.randn(a.batch, 3, a.image, a.image, device=dev)
        if a.layout == "channels_last":
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, a.classes, (a.batch,), device=dev)
        decay = [p for n, p in model.named_parameters() if p.dim() > 1]
        rest = [p for n, p in model.named_parameters() if p.dim() <= 1]
        groups = [{"params": decay, "weight_decay": 1e-4}, {"params": rest, "weight_decay": 0.0}]
        # fused=True (PyTorch 2.3+ on CUDA): one kernel for the whole update, as mixtrain's SGD is;
        # an older PyTorch refuses the argument and gets the default (foreach) instead.
        kw = {"fused": True} if cuda else {}
        try:
            opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9, **kw)
        except (TypeError, RuntimeError, ValueError):
            opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
            kw = {}
        meta.update(image=a.image, classes=a.classes, layout=a.layout, blocks=blocks, widths=widths,
                    fused_sgd=bool(kw))
        per_step = {"images": a.batch}
    else:
        model, attn = gpt(torch, a)
        model = model.to(dev)
        x = torch.randint(0, a.vocab, (a.batch, a.tokens), device=dev)
        y = torch.randint(0, a.vocab, (a.batch, a.tokens), device=dev)
        decay = [p for n, p in model.named_parameters() if p.dim() > 1 and p.requires_grad]
        rest = [p for n, p in model.named_parameters() if p.dim() <= 1 and p.requires_grad]
        kw = {"fused": True} if cuda else {}
        try:
            opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                    lr=6e-4, betas=(0.9, 0.95), **kw)
        except (TypeError, RuntimeError):
            opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                    lr=6e-4, betas=(0.9, 0.95))
            kw = {}
        meta.update(layers=a.layers, heads=a.heads, width=a.width, tokens=a.tokens, vocab=a.vocab,
                    attention=attn, fused_adamw=bool(kw), lora=a.lora, checkpoint=a.checkpoint,
                    trainable=sum(p.numel() for p in model.parameters() if p.requires_grad))
        per_step = {"tokens": a.batch * a.tokens}
    meta["parameters"] = sum(p.numel() for p in model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            out = model(x)
            loss = loss_fn(out.reshape(-1, out.shape[-1]).float(), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    t0, warm = time.perf_counter(), 0
    while warm < a.warmup or time.perf_counter() - t0 < a.warmup_seconds:
        step()
        sync()
        warm += 1
    meta.update(warmup_steps=warm, warmup_s=time.perf_counter() - t0)
    if a.profile_steps > 0:
        print(json.dumps(profile(torch, a, meta, step, sync, cuda)))
        return 0
    # Both peaks: the whole run's (mixtrain's summary.json peak covers its whole run, warm-up
    # included; PyTorch's then holds cudnn.benchmark's trial workspaces), and the timed windows'
    # alone, after a reset: what a training step itself holds at its peak.
    whole_peak = torch.cuda.max_memory_allocated() if cuda else None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    windows, loss = [], None
    for _ in range(a.windows):
        t0 = time.perf_counter()
        for _ in range(a.steps_per_window):
            loss = step()
        sync()
        windows.append(a.steps_per_window / (time.perf_counter() - t0))
    sps = statistics.median(windows)
    out = dict(meta, steps_per_s=sps, window_steps_per_s=windows, final_loss=float(loss),
               peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    if not cuda:
        out["openblas_core"] = openblas_core()
    for k, v in per_step.items():
        out[f"{k}_per_s"] = sps * v
    if cuda:
        steady = torch.cuda.max_memory_allocated()
        out["peak_device_memory_bytes"] = max(whole_peak, steady)
        out["steady_peak_device_memory_bytes"] = steady
        out["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
