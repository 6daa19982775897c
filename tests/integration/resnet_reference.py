#!/usr/bin/python3
"""PyTorch reference ResNet for mixtrain's CNN parity test and CNN benchmark (issue 13).

torchvision's ResNet written out for the test (so it needs no torchvision), with its
parameter and buffer names, in the CIFAR form by default:
  stem   conv1.weight [W0, 3, 3, 3] (3x3, stride 1, pad 1, no bias), bn1.*, ReLU
         (--stem imagenet: 7x7 stride 2 pad 3, bn1, ReLU, 3x3 max pool stride 2 pad 1)
  stages layer{s}.{b}: BasicBlock conv3x3(stride)-bn-ReLU-conv3x3-bn, + shortcut, ReLU, with
         s = 1..len(widths), b = 0..blocks[s-1]-1; the first block of every stage after the first
         has stride 2; a block whose stride is not 1 or whose output channels change has the
         "option B" shortcut layer{s}.{b}.downsample.0.weight (1x1 conv, the block's stride, no
         bias) + layer{s}.{b}.downsample.1.* (BN)
         (--block bottleneck: torchvision's Bottleneck, ResNet v1.5, expansion 4, as
         torchvision/models/resnet.py defines it with groups 1 and base_width 64:
         conv1x1-bn-ReLU-conv3x3(stride)-bn-ReLU-conv1x1(4 W)-bn, + shortcut, ReLU; the stage's
         output has 4 W channels, so layer1.0 has a stride-1 shortcut too)
  head   global average pool, fc.weight [K, C_last], fc.bias [K] (C_last = W_last, or 4 W_last
         for bottlenecks)
Batch norm: eps 1e-5, momentum 0.1, the running variance updated with the unbiased batch variance
(PyTorch's rule). Every BN has weight, bias, running_mean and running_var; num_batches_tracked is
neither written nor expected (mixtrain does not keep it): files load with strict=False and any
missing key other than a num_batches_tracked one is an error. Weights are in PyTorch's layout
([O, C, KH, KW] convolutions, [out, in] linear), float32 safetensors read and written by
safetensors_interop.py (json + numpy).

Init (--init): torchvision (default): convolutions kaiming_normal_(mode="fan_out",
nonlinearity="relu"), BN weight 1 and bias 0, fc PyTorch's default (kaiming_uniform_(a=sqrt(5)),
bias U(+-1/sqrt(fan_in))); default: every module's own PyTorch default init. Seeded by --seed
(torch.manual_seed before the model is built).

Data: .npy files, features float32 [N, C, H, W] (channels first; float64 is accepted and
rounded), labels integer [N]. Training step k takes rows [b*B, (b+1)*B) with
b = k mod (N // B): mixtrain's sampler with shuffle = false and eval_fraction = 0 (the N mod B
rows after the last full batch are never trained on). The held-out set is a second pair of files
(--eval-features/--eval-labels), evaluated whole, as mixtrain's `eval` evaluates the config's data
when eval_fraction = 0. Evaluation is in eval mode (running statistics), mean cross-entropy and
accuracy over all rows, in --batch rows at a time.

SGD: torch.optim.SGD with PyTorch's momentum rule (the first step's buffer is the gradient),
--momentum, --dampening, --nesterov, --weight-decay (L2, added to the gradient) on convolution and
linear weights only: BN weights and biases and the fc bias have none, as mixtrain's
ModelParameter::weight_decay = false. --schedule, --warmup-steps and --min-lr are mixtrain's
[optimizer] schedule (core/src/train/lr_schedule.cpp) over --steps steps; constant by default.

--bf16: torch.autocast("cpu", bfloat16) around forward + loss, FP32 master weights, gradients
and momentum. Under 1.13's CPU autocast the convolutions and fc run in bf16, batch norm reads the
bf16 convolution output and keeps FP32 statistics and running buffers (its output is bf16), the
loss is FP32. --channels-last: model and inputs in torch.channels_last.

--fp64-shadow (train, FP32): a float64 copy of the model trains alongside on the same batches;
"losses_fp64" and "fp32_vs_fp64" (per step |fp32 - fp64| / fp64) say how far PyTorch's own FP32
is from exact arithmetic. Batch norm's training-mode backward is ill-conditioned (its gradient
cancels the batch mean and the projection on the normalised input): FP32 gradients of a ResNet at
initialisation are ~1e-3 off in relative terms, so any two FP32 implementations drift apart over
steps at a rate the float64 copy measures; a parity test's tolerance can follow it.
--fp64-shadow-steps K stops the copy after K steps: once the drift it measures is a sizeable part
of the loss, a tolerance that follows it asserts little, while float64 convolutions on the CPU
cost several times the whole FP32 run.

Commands (each prints one JSON object on stdout; errors go to stderr with exit status 2):
  init      --blocks 3,3,3 --widths 16,32,64 --classes 10 --seed S --out W
            [--in-channels 3] [--stem cifar|imagenet] [--block basic|bottleneck]
            [--init torchvision|default]
  make-data --rows N --features X.npy --labels Y.npy --seed S [--classes 10] [--size 32]
            [--channels 3] [--noise 0.2] [--task-seed 0]
  train     --weights W --features X.npy --labels Y.npy --batch B --steps N --lr LR
            [--momentum M --dampening D --nesterov --weight-decay WD]
            [--schedule constant|warmup_cosine --warmup-steps K --min-lr L]
            [--bf16] [--channels-last]
            [--eval-features X2.npy --eval-labels Y2.npy] [--eval-batch E]
            [--save-weights OUT.safetensors] [--fp64-shadow [--fp64-shadow-steps K]]
  eval      --weights W --features X.npy --labels Y.npy [--batch E] [--logits K]
            [--logits-out F.npy] [--bf16] [--channels-last]
  diff      --weights A --other B [--base C]           per-tensor differences of two weight files
            (with --base, also "moved": each tensor's max |B - C|, what training changed)
Every command takes --threads K (default 1: torch.set_num_threads). The architecture comes from
the weights (names and shapes); --blocks/--widths/--classes, when given, are checked against it.
"""
import argparse
import copy
import json
import math
import os
import re
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_interop import read_safetensors, write_safetensors  # noqa: E402

BN_EPS = 1e-5
BN_MOMENTUM = 0.1
UNTRACKED = "num_batches_tracked"


class ResnetInputError(Exception):
    """Bad input (weights, data, options); main() prints it and exits 2."""


# ---- model ---------------------------------------------------------------------------------

def conv3x3(cin, cout, stride=1):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


def batch_norm(c):
    return nn.BatchNorm2d(c, eps=BN_EPS, momentum=BN_MOMENTUM)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = conv3x3(cin, cout, stride)
        self.bn1 = batch_norm(cout)
        self.conv2 = conv3x3(cout, cout)
        self.bn2 = batch_norm(cout)
        self.downsample = None
        if stride != 1 or cin != cout:  # option B: a projection shortcut
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                            batch_norm(cout))

    def forward(self, x):
        # x is [N, cin, H, W]; the output [N, cout, H / stride, W / stride]
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


class Bottleneck(nn.Module):
    """torchvision's Bottleneck (groups 1, base_width 64, dilation 1): the stride on conv2."""
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = batch_norm(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = batch_norm(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = batch_norm(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                            batch_norm(cout))

    def forward(self, x):
        # x is [N, cin, H, W]; the output [N, 4 width, H / stride, W / stride]
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


BLOCKS = {"basic": (BasicBlock, 1), "bottleneck": (Bottleneck, Bottleneck.expansion)}


class ResNet(nn.Module):
    def __init__(self, blocks, widths, classes, in_channels=3, stem="cifar", block="basic"):
        super().__init__()
        if not blocks or len(blocks) != len(widths):
            raise ResnetInputError(f"blocks {blocks} and widths {widths} must be non-empty lists "
                                   f"of the same length (one entry per stage)")
        if min(blocks) < 1 or min(widths) < 1 or classes < 1 or in_channels < 1:
            raise ResnetInputError("blocks, widths, classes and in_channels must be positive")
        if stem not in ("cifar", "imagenet"):
            raise ResnetInputError(f"stem {stem!r}: cifar or imagenet")
        if block not in BLOCKS:
            raise ResnetInputError(f"block {block!r}: basic or bottleneck")
        block_type, expansion = BLOCKS[block]
        self.arch = dict(blocks=list(blocks), widths=list(widths), classes=classes,
                         in_channels=in_channels, stem=stem, block=block)
        if stem == "cifar":
            self.conv1 = conv3x3(in_channels, widths[0])
        else:
            self.conv1 = nn.Conv2d(in_channels, widths[0], 7, stride=2, padding=3, bias=False)
        self.bn1 = batch_norm(widths[0])
        cin = widths[0]
        for s, (n, width) in enumerate(zip(blocks, widths), start=1):
            stage = []
            for b in range(n):
                stage.append(block_type(cin, width, 2 if s > 1 and b == 0 else 1))
                cin = width * expansion
            setattr(self, f"layer{s}", nn.Sequential(*stage))
        self.stages = len(blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        # x is [N, C, H, W]; logits [N, K]
        x = F.relu(self.bn1(self.conv1(x)))
        if self.arch["stem"] == "imagenet":
            x = F.max_pool2d(x, 3, stride=2, padding=1)
        for s in range(1, self.stages + 1):
            x = getattr(self, f"layer{s}")(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)

    def init_weights(self, scheme):
        """torchvision's ResNet init, or leave PyTorch's per-module defaults ("default")."""
        if scheme == "default":
            return
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)


def parse_list(text, what):
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ResnetInputError(f"--{what} {text!r}: expected comma-separated integers, e.g. 3,3,3")
    if not values:
        raise ResnetInputError(f"--{what} is empty")
    return values


# ---- weights -------------------------------------------------------------------------------

def state_tensors(model):
    """Parameters and buffers by PyTorch name, without num_batches_tracked."""
    return {k: v.detach() for k, v in model.state_dict().items() if not k.endswith(UNTRACKED)}


def infer_arch(tensors, path):
    """blocks, widths, classes, in_channels, stem and block from a file's names and shapes."""
    stem = tensors.get("conv1.weight")
    fc = tensors.get("fc.weight")
    if stem is None or stem.dim() != 4 or fc is None or fc.dim() != 2:
        raise ResnetInputError(f"{path}: conv1.weight (4-D) or fc.weight (2-D) missing; is this a "
                               f"torchvision-named ResNet? (names: "
                               f"{', '.join(sorted(tensors)[:6])}, ...)")
    blocks = {}
    for k in tensors:
        if m := re.match(r"layer(\d+)\.(\d+)\.", k):
            s, b = int(m.group(1)), int(m.group(2))
            blocks[s] = max(blocks.get(s, 0), b + 1)
    if not blocks or sorted(blocks) != list(range(1, len(blocks) + 1)):
        raise ResnetInputError(f"{path}: stages {sorted(blocks)} are not layer1..layerN")
    widths = []
    for s in range(1, len(blocks) + 1):
        w = tensors.get(f"layer{s}.0.conv1.weight")
        if w is None or w.dim() != 4:
            raise ResnetInputError(f"{path}: layer{s}.0.conv1.weight missing or not 4-D")
        widths.append(int(w.shape[0]))
    kernel = int(stem.shape[-1])
    if kernel not in (3, 7):
        raise ResnetInputError(f"{path}: conv1.weight is {list(stem.shape)}: a {kernel}x{kernel} "
                               f"stem is neither cifar (3x3) nor imagenet (7x7)")
    return dict(blocks=[blocks[s] for s in sorted(blocks)], widths=widths,
                classes=int(fc.shape[0]), in_channels=int(stem.shape[1]),
                stem="cifar" if kernel == 3 else "imagenet",
                block="bottleneck" if "layer1.0.conv3.weight" in tensors else "basic")


def load_model(path, given):
    """A ResNet with the file's weights and buffers; `given` arch entries must agree."""
    try:
        tensors, _ = read_safetensors(path)
    except KeyError as e:
        raise ResnetInputError(f"{path}: tensor dtype {e} is not supported (F32, F16, F64, BF16)")
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise ResnetInputError(f"{path}: not a readable safetensors file ({e})")
    arch = infer_arch(tensors, path)
    for key, value in given.items():
        if value is not None and value != arch[key]:
            raise ResnetInputError(f"--{key.replace('_', '-')} {value} but {path} holds a ResNet "
                                   f"with {key} = {arch[key]}")
    model = ResNet(**arch)
    want = model.state_dict()
    problems = [f"{k} is {list(t.shape)}, expected {list(want[k].shape)}"
                for k, t in tensors.items() if k in want and t.shape != want[k].shape]
    if problems:
        raise ResnetInputError(f"{path} does not fit a ResNet with {arch}:\n  "
                               + "\n  ".join(problems[:20]))
    result = model.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(UNTRACKED)]
    if missing or result.unexpected_keys:
        raise ResnetInputError(
            f"{path} does not fit a ResNet with {arch}: "
            + (f"missing {', '.join(missing[:10])}" if missing else "")
            + ("; " if missing and result.unexpected_keys else "")
            + (f"unexpected {', '.join(result.unexpected_keys[:10])}"
               if result.unexpected_keys else "")
            + " (only num_batches_tracked may be absent)")
    return model


def save_model(model, path, extra_meta=None):
    meta = {"format": "pt", "arch": json.dumps(model.arch), **(extra_meta or {})}
    write_safetensors(path, state_tensors(model), meta)


# ---- data ----------------------------------------------------------------------------------

def read_images(features, labels, classes=None):
    """x float32 [N, C, H, W] and y int64 [N] from .npy files, checked."""
    try:
        x = np.load(features, allow_pickle=False)
        y = np.load(labels, allow_pickle=False)
    except ValueError as e:
        raise ResnetInputError(f"{features} / {labels}: not a readable .npy pair ({e})")
    if x.ndim != 4:
        raise ResnetInputError(f"{features}: features have shape {list(x.shape)}, expected "
                               f"[N, C, H, W] (channels first)")
    if x.dtype not in (np.float32, np.float64):
        raise ResnetInputError(f"{features}: dtype {x.dtype}, expected float32")
    if y.ndim == 2 and y.shape[1] == 1:
        y = y.reshape(-1)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise ResnetInputError(f"{labels}: labels are {y.dtype} {list(y.shape)}, expected "
                               f"integer [N]")
    if y.shape[0] != x.shape[0]:
        raise ResnetInputError(f"{features} has {x.shape[0]} rows but {labels} "
                               f"{y.shape[0]} labels")
    if y.size and (y.min() < 0 or (classes is not None and y.max() >= classes)):
        raise ResnetInputError(f"{labels}: labels span [{y.min()}, {y.max()}], outside the "
                               f"model's classes [0, {classes})")
    if not np.isfinite(x).all():
        raise ResnetInputError(f"{features}: holds NaN or infinite values")
    return (torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)),
            torch.from_numpy(y.astype(np.int64)))


def training_batch(x, y, batch, step):
    """Rows of optimizer step `step` (mixtrain's sampler, shuffle = false, eval_fraction = 0)."""
    per_epoch = x.shape[0] // batch
    if per_epoch < 1:
        raise ResnetInputError(f"{x.shape[0]} training rows are fewer than one batch of {batch}")
    first = (step % per_epoch) * batch
    return x[first:first + batch], y[first:first + batch]


def make_data(rows, classes, size, channels, noise, seed, task_seed):
    """A learnable image set: class c is a grating at orientation pi*c/K with a class colour,
    random phase, contrast and brightness per image, plus Gaussian noise."""
    task = np.random.default_rng(task_seed)
    colours = task.normal(0.0, 1.0, size=(classes, channels))
    colours /= np.linalg.norm(colours, axis=1, keepdims=True)
    freqs = task.uniform(2.0, 4.0, size=classes) / size  # cycles per pixel
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=rows)
    theta = np.pi * y / classes
    phase = rng.uniform(0.0, 2 * np.pi, size=rows)
    contrast = rng.uniform(0.6, 1.4, size=rows)
    brightness = rng.normal(0.0, 0.3, size=(rows, channels))
    ii, jj = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")
    along = (np.cos(theta)[:, None, None] * jj + np.sin(theta)[:, None, None] * ii)
    wave = np.sin(2 * np.pi * freqs[y][:, None, None] * along + phase[:, None, None])
    x = (contrast[:, None, None, None] * colours[y][:, :, None, None] * wave[:, None]
         + brightness[:, :, None, None]
         + rng.normal(0.0, noise, size=(rows, channels, size, size)))
    return x.astype(np.float32), y.astype(np.int64)


# ---- training and evaluation ---------------------------------------------------------------

def to_layout(t, channels_last):
    return t.contiguous(memory_format=torch.channels_last) if channels_last else t


def loss_of(model, x, y, bf16):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        return F.cross_entropy(model(x), y)


def make_sgd(model, lr, momentum=0.0, dampening=0.0, nesterov=False, weight_decay=0.0,
             foreach=False):
    """torch.optim.SGD; weight decay on convolution and linear weights (rank >= 2) only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    try:
        return torch.optim.SGD(groups, lr=lr, momentum=momentum, dampening=dampening,
                               nesterov=nesterov, foreach=foreach)
    except ValueError as e:  # nesterov without momentum, negative values
        raise ResnetInputError(f"SGD: {e}")


def lr_at(step, lr, schedule, total_steps, warmup_steps=0, min_lr=0.0):
    """mixtrain's schedule (core/src/train/lr_schedule.cpp) at `step` applied steps."""
    if schedule == "constant":
        return lr
    if warmup_steps > 0 and step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    span = max(1, total_steps - warmup_steps)
    t = min(max((step - warmup_steps) / span, 0.0), 1.0)
    return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * t))


def train_step(model, opt, x, y, bf16, lr=None):
    if lr is not None:
        for group in opt.param_groups:
            group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    loss = loss_of(model, x, y, bf16)
    loss.backward()
    opt.step()
    return loss


@torch.no_grad()
def evaluate(model, x, y, batch, bf16, channels_last, keep_logits=False):
    """Eval-mode mean cross-entropy and accuracy over all rows (and the logits when asked)."""
    model.eval()
    total, correct, logits_all = 0.0, 0, []
    for i in range(0, x.shape[0], batch):
        xb = to_layout(x[i:i + batch], channels_last)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(xb)
            s = F.cross_entropy(logits, y[i:i + batch], reduction="sum")
        total += float(s.double())
        correct += int((logits.argmax(1) == y[i:i + batch]).sum())
        if keep_logits:
            logits_all.append(logits.float())
    n = x.shape[0]
    out = {"loss": total / n, "accuracy": correct / n, "correct": correct, "rows": n}
    return out, (torch.cat(logits_all) if keep_logits else None)


# ---- commands ------------------------------------------------------------------------------

def cmd_init(a):
    torch.manual_seed(a.seed)
    model = ResNet(parse_list(a.blocks, "blocks"), parse_list(a.widths, "widths"), a.classes,
                   a.in_channels, a.stem, a.block)
    model.init_weights(a.init)
    save_model(model, a.out, {"init": a.init, "seed": str(a.seed)})
    return {"arch": model.arch, "init": a.init, "seed": a.seed,
            "parameters": sum(p.numel() for p in model.parameters()),
            "tensors": len(state_tensors(model)), "out": a.out}


def cmd_make_data(a):
    if a.rows < 1 or a.classes < 2 or a.size < 1 or a.channels < 1 or a.noise < 0:
        raise ResnetInputError("make-data: --rows >= 1, --classes >= 2, --size and --channels "
                               ">= 1, --noise >= 0")
    x, y = make_data(a.rows, a.classes, a.size, a.channels, a.noise, a.seed, a.task_seed)
    np.save(a.features, x)
    np.save(a.labels, y)
    return {"rows": a.rows, "shape": list(x.shape), "classes": a.classes,
            "counts": np.bincount(y, minlength=a.classes).tolist(), "features": a.features,
            "labels": a.labels}


def given_arch(a):
    return {"blocks": parse_list(a.blocks, "blocks") if a.blocks else None,
            "widths": parse_list(a.widths, "widths") if a.widths else None,
            "classes": a.classes}


def cmd_train(a):
    model = load_model(a.weights, given_arch(a))
    x, y = read_images(a.features, a.labels, model.arch["classes"])
    ex = ey = None
    if a.eval_features:
        ex, ey = read_images(a.eval_features, a.eval_labels, model.arch["classes"])
    training_batch(x, y, a.batch, 0)  # fail before training, not after
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
    opt = make_sgd(model, a.lr, a.momentum, a.dampening, a.nesterov, a.weight_decay)
    model.train()
    shadow = None
    if a.fp64_shadow_steps is None:
        a.fp64_shadow_steps = a.steps
    elif not a.fp64_shadow or a.fp64_shadow_steps < 1:
        raise ResnetInputError("--fp64-shadow-steps K (K >= 1) limits --fp64-shadow: give both")
    if a.fp64_shadow:
        if a.bf16:
            raise ResnetInputError("--fp64-shadow measures FP32's own rounding: not with --bf16")
        shadow = copy.deepcopy(model).double()
        shadow_opt = make_sgd(shadow, a.lr, a.momentum, a.dampening, a.nesterov, a.weight_decay)
    losses, losses64 = [], []
    for step in range(a.steps):
        xb, yb = training_batch(x, y, a.batch, step)
        lr = lr_at(step, a.lr, a.schedule, a.steps, a.warmup_steps, a.min_lr)
        losses.append(float(train_step(model, opt, to_layout(xb, a.channels_last), yb, a.bf16,
                                       lr)))
        if shadow is not None and step < a.fp64_shadow_steps:
            losses64.append(float(train_step(shadow, shadow_opt,
                                             to_layout(xb.double(), a.channels_last), yb, False,
                                             lr)))
    out = {"arch": model.arch, "bf16": a.bf16, "channels_last": a.channels_last,
           "losses": losses, "batches_per_epoch": x.shape[0] // a.batch}
    if shadow is not None:
        out["losses_fp64"] = losses64
        out["fp32_vs_fp64"] = [abs(p - q) / abs(q) if q else abs(p) for p, q in
                               zip(losses, losses64)]
    if ex is not None:
        r, _ = evaluate(model, ex, ey, a.eval_batch, a.bf16, a.channels_last)
        out.update({"eval_loss": r["loss"], "eval_accuracy": r["accuracy"],
                    "eval_rows": r["rows"]})
    if a.save_weights:
        save_model(model, a.save_weights, {"steps": str(a.steps)})
        out["saved"] = a.save_weights
    return out


def cmd_eval(a):
    model = load_model(a.weights, given_arch(a))
    x, y = read_images(a.features, a.labels, model.arch["classes"])
    if a.channels_last:
        model = model.to(memory_format=torch.channels_last)
    keep = a.logits > 0 or a.logits_out
    r, logits = evaluate(model, x, y, a.eval_batch, a.bf16, a.channels_last, keep)
    out = {"arch": model.arch, "bf16": a.bf16, **r}
    if keep:
        out["logits"] = logits[:a.logits].tolist()
        if a.logits_out:
            np.save(a.logits_out, logits.numpy())
            out["logits_out"] = a.logits_out
    return out


def cmd_diff(a):
    ta, _ = read_safetensors(a.weights)
    tb, _ = read_safetensors(a.other)
    ta = {k: v for k, v in ta.items() if not k.endswith(UNTRACKED)}
    tb = {k: v for k, v in tb.items() if not k.endswith(UNTRACKED)}
    rows, worst = {}, None
    for k in sorted(set(ta) & set(tb)):
        if ta[k].shape != tb[k].shape:
            raise ResnetInputError(f"{k}: {list(ta[k].shape)} in {a.weights}, "
                                   f"{list(tb[k].shape)} in {a.other}")
        d = float((ta[k] - tb[k]).abs().max()) if ta[k].numel() else 0.0
        scale = float(tb[k].abs().max()) if tb[k].numel() else 0.0
        rows[k] = {"max_abs": d, "max_rel": d / scale if scale > 0 else d}
        if worst is None or rows[k]["max_rel"] > rows[worst]["max_rel"]:
            worst = k
    if a.base:
        tc, _ = read_safetensors(a.base)
        for k, r in rows.items():
            if k not in tc or tc[k].shape != tb[k].shape:
                raise ResnetInputError(f"{k}: not in {a.base} with the shape {list(tb[k].shape)}")
            r["moved"] = float((tb[k] - tc[k]).abs().max()) if tb[k].numel() else 0.0
    by_kind = {}
    for k, r in rows.items():
        kind = k.rsplit(".", 1)[-1]
        by_kind[kind] = max(by_kind.get(kind, 0.0), r["max_rel"])
    return {"only_in_weights": sorted(set(ta) - set(tb)),
            "only_in_other": sorted(set(tb) - set(ta)), "worst": worst,
            "worst_max_rel": rows[worst]["max_rel"] if worst else 0.0,
            "max_rel_by_kind": by_kind, "tensors": rows}


COMMANDS = {"init": cmd_init, "make-data": cmd_make_data, "train": cmd_train, "eval": cmd_eval,
            "diff": cmd_diff}
NEEDS = {"init": ["blocks", "widths", "classes", "out"],
         "make-data": ["rows", "features", "labels"],
         "train": ["weights", "features", "labels", "batch", "steps", "lr"],
         "eval": ["weights", "features", "labels"],
         "diff": ["weights", "other"]}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=list(COMMANDS))
    ap.add_argument("--threads", type=int, default=1)
    # architecture (init; checked against the weights elsewhere)
    ap.add_argument("--blocks", help="blocks per stage, e.g. 3,3,3")
    ap.add_argument("--widths", help="channels per stage, e.g. 16,32,64")
    ap.add_argument("--classes", type=int)
    ap.add_argument("--in-channels", type=int, default=3)
    ap.add_argument("--stem", choices=["cifar", "imagenet"], default="cifar")
    ap.add_argument("--block", choices=list(BLOCKS), default="basic")
    ap.add_argument("--init", choices=["torchvision", "default"], default="torchvision")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    # data
    ap.add_argument("--features")
    ap.add_argument("--labels")
    ap.add_argument("--eval-features")
    ap.add_argument("--eval-labels")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--channels", type=int, default=3)
    ap.add_argument("--noise", type=float, default=0.2)
    ap.add_argument("--task-seed", type=int, default=0)
    # training and evaluation
    ap.add_argument("--weights")
    ap.add_argument("--other")
    ap.add_argument("--base", help="diff: the weights --other started from")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--eval-batch", type=int, default=256)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--momentum", type=float, default=0.0)
    ap.add_argument("--dampening", type=float, default=0.0)
    ap.add_argument("--nesterov", action="store_true")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--schedule", choices=["constant", "warmup_cosine"], default="constant")
    ap.add_argument("--warmup-steps", type=int, default=0)
    ap.add_argument("--min-lr", type=float, default=0.0)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--channels-last", action="store_true")
    ap.add_argument("--fp64-shadow", action="store_true",
                    help="train: also train a float64 copy on the same batches")
    ap.add_argument("--fp64-shadow-steps", type=int,
                    help="train: the float64 copy trains the first K steps only (default: all)")
    ap.add_argument("--save-weights")
    ap.add_argument("--logits", type=int, default=4, help="eval: logits of the first K rows")
    ap.add_argument("--logits-out", help="eval: every row's logits as a float32 .npy")
    a = ap.parse_args(argv)
    if a.command == "make-data" and a.classes is None:
        a.classes = 10
    missing = [f"--{k.replace('_', '-')}" for k in NEEDS[a.command] if getattr(a, k) is None]
    if missing:
        ap.error(f"{a.command} needs {' '.join(missing)}")
    if a.command == "eval" and a.batch is not None:
        a.eval_batch = a.batch  # eval's --batch is its evaluation batch
    if bool(a.eval_features) != bool(a.eval_labels):
        ap.error("--eval-features and --eval-labels go together")
    if a.threads < 1 or (a.batch is not None and a.batch < 1) or a.eval_batch < 1 or (
            a.steps is not None and a.steps < 0):
        ap.error("--threads, --batch and --eval-batch must be >= 1, --steps >= 0")
    return a


def main(argv=None):
    a = parse_args(argv)
    torch.set_num_threads(a.threads)
    try:
        out = COMMANDS[a.command](a)
    except (ResnetInputError, OSError) as e:
        print(f"resnet_reference.py {a.command}: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
