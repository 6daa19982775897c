#!/usr/bin/python3
"""PyTorch reference GPT for mixtrain's GPT parity test and GPT benchmark (issue 14).

A nanoGPT-style GPT-2 written for the test: learned token and position embeddings, pre-norm
blocks (LayerNorm eps 1e-5, causal self-attention as an explicit masked softmax, GELU-tanh MLP),
a final LayerNorm and an LM head tied to wte.weight. Dropout 0. Parameter names are Hugging Face
GPT2Model's (no "transformer." prefix):
  wte.weight [V, C], wpe.weight [T, C],
  h.{i}.ln_1.{weight,bias} [C], h.{i}.attn.c_attn.{weight,bias} (3C outputs: q, k, v, heads
  contiguous within each), h.{i}.attn.c_proj.*, h.{i}.ln_2.*, h.{i}.mlp.c_fc.* (4C),
  h.{i}.mlp.c_proj.*, ln_f.{weight,bias}; the head is wte.weight and is not stored.
--layout gpt2 (default): linear weights stored [in, out] as HF's Conv1D; native: [out, in] as
torch.nn.Linear. Safetensors are read and written by safetensors_interop.py (json + numpy).

Data: llm.c's .bin token files (256 little-endian int32 header: magic 20240520, version 1, token
count; then uint16 tokens). Training row r is tokens[r : r+T+1] (stride 1, rows = n - T); step k
takes rows [b*B, (b+1)*B) with b = k mod (rows // B), as mixtrain's sampler with shuffle = false.
Held-out windows have stride T (rows = (n - T - 1) // T + 1); the held-out loss is the mean
cross-entropy over every target token of every window.

--bf16: torch.autocast("cpu", bfloat16) around forward + loss, FP32 master weights, gradients and
AdamW state. PyTorch 1.13's CPU autocast leaves softmax in bf16, so the attention scores are
upcast explicitly: softmax, layer norms (they read the FP32 residual stream) and the loss run in
FP32, as mixtrain's bf16-mixed policy does (docs/architecture.md, "One training step").

Commands (each prints one JSON object on stdout; errors go to stderr with exit status 2):
  init  --n-layer L --n-head H --n-embd C --block-size T --vocab-size V --seed S --out W
        [--layout gpt2|native]
  train --weights W --tokens train.bin --block-size T --batch B --steps N --lr LR
        [--beta1 --beta2 --eps --weight-decay WD] [--eval-tokens eval.bin] [--bf16]
        [--threads K] [--save OUT] [--layout] [--n-head H]
  loss  --weights W --tokens eval.bin --block-size T [--logits-out F.npy] [--bf16] [--layout]
        [--n-head H]      (--logits-out: every held-out window's logits, float32 [W, T, V])
Dims come from the weights (wte, wpe, the h.{i} count); the head count from --n-head or the file's
metadata "n_head" (init writes it). --n-layer/--n-embd/--vocab-size, when given, are checked.
"""
import argparse
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

LINEAR_NAMES = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
TOKEN_MAGIC = 20240520
TOKEN_VERSION = 1
HEADER_INTS = 256
HF_MASK_BUFFER = re.compile(r"h\.\d+\.attn\.(masked_)?bias")


class GptInputError(Exception):
    """Bad input (weights, tokens, options); main() prints it and exits 2."""


class Attention(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        mask = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        # x is [B, T, C]; q, k, v are [B, H, T, D]
        B, T, C = x.shape
        H = self.n_head
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, H, C // H).transpose(1, 2)
        k = k.view(B, T, H, C // H).transpose(1, 2)
        v = v.view(B, T, H, C // H).transpose(1, 2)
        # Scores [B, H, T, T] in FP32 even under autocast (1.13 would keep softmax in bf16).
        att = (q @ k.transpose(-2, -1)).float() * (1.0 / math.sqrt(C // H))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Mlp(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = Attention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = Mlp(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        super().__init__()
        if n_layer < 1 or n_head < 1 or n_embd < 1 or block_size < 1 or vocab_size < 1:
            raise GptInputError("model dims must be positive")
        if n_embd % n_head:
            raise GptInputError(f"n_embd {n_embd} is not a multiple of n_head {n_head}")
        self.dims = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
                         vocab_size=vocab_size)
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(Block(n_embd, n_head, block_size) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)

    def init_weights(self, seed):
        """GPT-2 / nanoGPT init: N(0, 0.02), residual projections N(0, 0.02/sqrt(2L))."""
        g = torch.Generator().manual_seed(seed)
        proj_std = 0.02 / math.sqrt(2 * self.dims["n_layer"])
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("c_proj.weight"):
                    p.normal_(0.0, proj_std, generator=g)
                elif name.endswith(".bias"):
                    p.zero_()
                elif ".ln_" in name or name.startswith("ln_f."):
                    p.fill_(1.0)
                else:  # wte, wpe, c_attn, c_fc weights
                    p.normal_(0.0, 0.02, generator=g)

    def forward(self, idx):
        # idx is [B, T] int64; logits are [B, T, V]
        T = idx.shape[1]
        if T > self.dims["block_size"]:
            raise GptInputError(f"sequence length {T} exceeds block_size "
                                 f"{self.dims['block_size']}")
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def loss_of(model, inputs, targets, bf16):
    """Mean cross-entropy of [B, T] windows; under bf16 autocast when asked."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(inputs)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---- weights -------------------------------------------------------------------------------

def is_linear_weight(name):
    return name.endswith(".weight") and any(f".{k}." in name for k in LINEAR_NAMES)


def to_file_layout(tensors, layout):
    """Native [out, in] linear weights -> the file's layout."""
    if layout == "native":
        return dict(tensors)
    return {k: (v.t().contiguous() if is_linear_weight(k) else v) for k, v in tensors.items()}


def expected_shapes(d, layout):
    L, C, T, V = d["n_layer"], d["n_embd"], d["block_size"], d["vocab_size"]
    out = {"wte.weight": [V, C], "wpe.weight": [T, C]}
    linears = {"attn.c_attn": (C, 3 * C), "attn.c_proj": (C, C), "mlp.c_fc": (C, 4 * C),
               "mlp.c_proj": (4 * C, C)}
    for i in range(L):
        for ln in ("ln_1", "ln_2"):
            out[f"h.{i}.{ln}.weight"] = [C]
            out[f"h.{i}.{ln}.bias"] = [C]
        for name, (fan_in, fan_out) in linears.items():
            out[f"h.{i}.{name}.weight"] = ([fan_in, fan_out] if layout == "gpt2"
                                           else [fan_out, fan_in])
            out[f"h.{i}.{name}.bias"] = [fan_out]
    out["ln_f.weight"] = [C]
    out["ln_f.bias"] = [C]
    return out


def infer_dims(tensors, metadata, given):
    """Model dims from the tensors (and metadata n_head); checks the dims the caller gave."""
    for key in ("wte.weight", "wpe.weight"):
        if key not in tensors or tensors[key].dim() != 2:
            raise GptInputError(f"weights: {key} missing or not 2-D; is this a GPT-2-named file? "
                                 f"(names: {', '.join(sorted(tensors)[:6])}, ...)")
    V, C = tensors["wte.weight"].shape
    T, C2 = tensors["wpe.weight"].shape
    if C2 != C:
        raise GptInputError(f"weights: wpe.weight is [{T}, {C2}] but wte.weight is [{V}, {C}]: "
                             f"the embedding widths differ")
    layers = {int(m.group(1)) for k in tensors if (m := re.match(r"h\.(\d+)\.", k))}
    L = max(layers) + 1 if layers else 0
    stored_heads = int(metadata.get("n_head", 0))
    d = dict(n_layer=L, n_embd=C, block_size=T, vocab_size=V, n_head=stored_heads)
    if not given.get("n_head") and not stored_heads:
        raise GptInputError("the head count is not in the weights' metadata: pass --n-head")
    for key, value in given.items():
        if value is not None and value != d[key] and not (key == "n_head" and not stored_heads):
            raise GptInputError(f"--{key.replace('_', '-')} {value} but the weights have "
                                 f"{key} = {d[key]}")
    d["n_head"] = d["n_head"] or given["n_head"]
    return d


def load_model(path, layout, given):
    try:
        tensors, metadata = read_safetensors(path)
    except KeyError as e:
        raise GptInputError(f"{path}: tensor dtype {e} is not supported (F32, F16, F64, BF16)")
    except ValueError as e:
        raise GptInputError(f"{path}: not a readable safetensors file ({e})")
    d = infer_dims(tensors, metadata, given)
    model = GPT(**d)
    want = expected_shapes(d, layout)
    problems = []
    for name, shape in want.items():
        if name not in tensors:
            problems.append(f"missing {name} (expected {shape})")
        elif list(tensors[name].shape) != shape:
            problems.append(f"{name} is {list(tensors[name].shape)}, expected {shape}")
    # Hugging Face checkpoints may carry the causal-mask buffers h.{i}.attn.bias / masked_bias.
    extra = [k for k in set(tensors) - set(want) if not HF_MASK_BUFFER.fullmatch(k)]
    problems += [f"unexpected tensor {k}" for k in sorted(extra)]
    if problems:
        other = "native" if layout == "gpt2" else "gpt2"
        c_attn = tensors.get("h.0.attn.c_attn.weight")
        hint = ""
        if c_attn is not None and list(c_attn.shape) == expected_shapes(d, other).get(
                "h.0.attn.c_attn.weight"):
            hint = f"\nh.0.attn.c_attn.weight has the {other} layout's shape: pass --layout {other}"
        raise GptInputError(f"weights {path} do not fit a GPT with {d} in the {layout} layout:\n  "
                             + "\n  ".join(problems[:20])
                             + (f"\n  ... {len(problems) - 20} more" if len(problems) > 20 else "")
                             + hint)
    native = {k: (v.t() if layout == "gpt2" and is_linear_weight(k) else v)
              for k, v in tensors.items()}
    model.load_state_dict({k: native[k] for k in want}, strict=True)
    return model


def save_model(model, path, layout):
    tensors = {k: p.detach() for k, p in model.named_parameters()}
    meta = {"format": "pt", "n_head": str(model.dims["n_head"]), "layout": layout}
    write_safetensors(path, to_file_layout(tensors, layout), meta)


# ---- tokens --------------------------------------------------------------------------------

def read_tokens(path):
    """uint16 tokens of an llm.c .bin file, as an int64 tensor."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < HEADER_INTS * 4:
        raise GptInputError(f"{path}: {len(blob)} bytes is shorter than the 1024-byte header")
    header = np.frombuffer(blob[:HEADER_INTS * 4], dtype="<i4")
    if header[0] != TOKEN_MAGIC or header[1] != TOKEN_VERSION:
        raise GptInputError(f"{path}: header magic/version {header[0]}/{header[1]}, expected "
                             f"{TOKEN_MAGIC}/{TOKEN_VERSION} (llm.c uint16 token file)")
    n = int(header[2])
    if len(blob) != HEADER_INTS * 4 + 2 * n:
        raise GptInputError(f"{path}: header says {n} tokens but the file holds "
                             f"{(len(blob) - HEADER_INTS * 4) / 2} after the header")
    return torch.from_numpy(np.frombuffer(blob[HEADER_INTS * 4:], dtype="<u2").astype(np.int64))


def check_vocab(tokens, vocab_size, path):
    if tokens.numel() and int(tokens.max()) >= vocab_size:
        raise GptInputError(f"{path}: token {int(tokens.max())} is outside the vocabulary "
                             f"(vocab_size {vocab_size})")


def training_batch(tokens, block_size, batch, step):
    """Inputs and targets [B, T] of optimizer step `step` (sampler with shuffle = false)."""
    rows = tokens.numel() - block_size
    per_epoch = rows // batch if rows > 0 else 0
    if per_epoch < 1:
        raise GptInputError(f"{tokens.numel()} training tokens give {max(rows, 0)} windows of "
                             f"block_size {block_size}, fewer than one batch of {batch}")
    first = (step % per_epoch) * batch
    starts = torch.arange(first, first + batch).unsqueeze(1) + torch.arange(block_size + 1)
    w = tokens[starts]
    return w[:, :-1], w[:, 1:]


def heldout_windows(tokens, block_size):
    """All held-out windows [rows, T + 1] at stride T."""
    n = tokens.numel()
    if n < block_size + 1:
        raise GptInputError(f"{n} held-out tokens are fewer than one window (block_size + 1 = "
                             f"{block_size + 1})")
    rows = (n - block_size - 1) // block_size + 1
    starts = torch.arange(rows).unsqueeze(1) * block_size + torch.arange(block_size + 1)
    return tokens[starts]


@torch.no_grad()
def heldout_loss(model, tokens, block_size, bf16, chunk=32):
    """Mean cross-entropy over every target token of every held-out window."""
    windows = heldout_windows(tokens, block_size)
    total = 0.0
    for i in range(0, windows.shape[0], chunk):
        w = windows[i:i + chunk]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(w[:, :-1])
            s = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1),
                                reduction="sum")
        total += float(s.double())
    return total / windows[:, 1:].numel(), int(windows.shape[0])


# ---- training ------------------------------------------------------------------------------

def make_adamw(model, lr, betas, eps, weight_decay, foreach=False):
    """torch.optim.AdamW; decay on parameters of rank >= 2 (wte, wpe, linear weights) only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps, foreach=foreach)


def train_step(model, opt, inputs, targets, bf16):
    opt.zero_grad(set_to_none=True)
    loss = loss_of(model, inputs, targets, bf16)
    loss.backward()
    opt.step()
    return loss


# ---- command line --------------------------------------------------------------------------

def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["init", "train", "loss"])
    ap.add_argument("--n-layer", type=int)
    ap.add_argument("--n-head", type=int)
    ap.add_argument("--n-embd", type=int)
    ap.add_argument("--block-size", type=int)
    ap.add_argument("--vocab-size", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out")
    ap.add_argument("--layout", choices=["gpt2", "native"], default="gpt2")
    ap.add_argument("--weights")
    ap.add_argument("--tokens")
    ap.add_argument("--eval-tokens")
    ap.add_argument("--batch", type=int)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save")
    ap.add_argument("--logits-out")
    a = ap.parse_args(argv)
    need = {"init": ["n_layer", "n_head", "n_embd", "block_size", "vocab_size", "out"],
            "train": ["weights", "tokens", "block_size", "batch", "steps", "lr"],
            "loss": ["weights", "tokens", "block_size"]}[a.command]
    missing = [f"--{k.replace('_', '-')}" for k in need if getattr(a, k) is None]
    if missing:
        ap.error(f"{a.command} needs {' '.join(missing)}")
    return a


def run(a):
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if a.command == "init":
        model = GPT(a.n_layer, a.n_head, a.n_embd, a.block_size, a.vocab_size)
        model.init_weights(a.seed)
        save_model(model, a.out, a.layout)
        return {"parameters": sum(p.numel() for p in model.parameters()), "layout": a.layout,
                **model.dims}

    given = dict(n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd, vocab_size=a.vocab_size)
    model = load_model(a.weights, a.layout, given)
    if a.block_size > model.dims["block_size"]:
        raise GptInputError(f"--block-size {a.block_size} exceeds the weights' position table "
                             f"(wpe.weight has {model.dims['block_size']} rows)")
    tokens = read_tokens(a.tokens)
    check_vocab(tokens, model.dims["vocab_size"], a.tokens)
    out = {"dims": model.dims, "bf16": a.bf16}

    if a.command == "loss":
        model.eval()
        out["loss"], out["windows"] = heldout_loss(model, tokens, a.block_size, a.bf16)
        if a.logits_out:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.bf16):
                logits = model(heldout_windows(tokens, a.block_size)[:, :-1])
            np.save(a.logits_out, logits.float().numpy())
            out["logits_shape"] = list(logits.shape)
        return out

    eval_tokens = None
    if a.eval_tokens:
        eval_tokens = read_tokens(a.eval_tokens)
        check_vocab(eval_tokens, model.dims["vocab_size"], a.eval_tokens)
        heldout_windows(eval_tokens, a.block_size)  # fail before training, not after
    training_batch(tokens, a.block_size, a.batch, 0)  # likewise
    opt = make_adamw(model, a.lr, (a.beta1, a.beta2), a.eps, a.weight_decay)
    model.train()
    losses = []
    for step in range(a.steps):
        inputs, targets = training_batch(tokens, a.block_size, a.batch, step)
        losses.append(float(train_step(model, opt, inputs, targets, a.bf16)))
    out["losses"] = losses
    if eval_tokens is not None:
        model.eval()
        out["eval_loss"], out["eval_windows"] = heldout_loss(model, eval_tokens, a.block_size,
                                                             a.bf16)
    if a.save:
        save_model(model, a.save, a.layout)
        out["saved"] = a.save
    return out


def main(argv=None):
    a = parse_args(argv)
    try:
        out = run(a)
    except (GptInputError, OSError) as e:
        print(f"gpt_reference.py {a.command}: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
