#!/usr/bin/env python3
"""PyTorch side of the safetensors interop tests (tests/integration/test_safetensors.cpp).

Reads and writes the public safetensors layout with its own minimal code (json + numpy; the
`safetensors` package is deliberately not used), builds the torch equivalent of a mixtrain
[model] from a resolved config.toml, and prints one JSON object on stdout.

Commands
  data     --out DIR --rows N --features D --classes K --seed S   writes x.npy (float32), y.npy (int32)
  init     --config C --features D --out W --seed S              torch-initialised weights -> W
  loss     --config C --weights W --x X --y Y [--eval-fraction F --seed S]
           mean cross-entropy over all rows, or over mixtrain's held-out rows
  train    --config C --weights W --x X --y Y --steps N --lr LR [--eval-fraction F --seed S]
           [--optimizer sgd|adamw --weight-decay WD]
           full-batch SGD (or AdamW) on mixtrain's training rows, per-step losses
The model is the config's model.layers (sequential) or model.nodes (a graph: linear, relu, gelu,
layernorm, add, reshape, flatten).
"""
import argparse
import json
import struct
import sys
import tomllib

import numpy as np
import torch

DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    buf = blob[8 + n:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = buf[begin:end]
        if info["dtype"] == "BF16":
            # bf16 is the top half of an fp32: widen exactly.
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(DTYPES[info["dtype"]]).newbyteorder("<"))
        tensors[name] = torch.from_numpy(arr.astype(np.float32).reshape(info["shape"]).copy())
    return tensors, header.get("__metadata__", {})


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata} if metadata else {}
    offset = 0
    chunks = []
    for name, t in tensors.items():
        data = t.detach().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        chunks.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


class GraphModel(torch.nn.Module):
    """mixtrain's model graph in PyTorch: nodes in declaration order (they are topologically
    ordered in the configs this test writes), each reading named inputs ("input" is the batch)."""

    def __init__(self, nodes, features):
        super().__init__()
        self.nodes = nodes
        self.mods = torch.nn.ModuleDict()
        shapes = {"input": [features]}
        for n in nodes:
            kind, name, ins = n["type"], n["name"], n["inputs"]
            shape = list(shapes[ins[0]])
            if kind == "linear":
                self.mods[name] = torch.nn.Linear(shape[-1], n["out"], bias=n.get("bias", True))
                shape[-1] = n["out"]
            elif kind == "layernorm":
                self.mods[name] = torch.nn.LayerNorm(shape[-1], eps=n.get("eps", 1e-5))
            elif kind == "reshape":
                numel = int(np.prod(shape))
                shape = [numel // -int(np.prod(n["shape"])) if d == -1 else d for d in n["shape"]]
            elif kind == "flatten":
                shape = [int(np.prod(shape))]
            elif kind not in ("relu", "gelu", "add"):
                sys.exit(f"safetensors_interop.py: node type {kind!r} is not supported here")
            shapes[name] = shape
        self.shapes = shapes

    def forward(self, x):
        values = {"input": x}
        for n in self.nodes:
            kind, name, ins = n["type"], n["name"], [values[i] for i in n["inputs"]]
            if kind in ("linear", "layernorm"):
                y = self.mods[name](ins[0])
            elif kind == "relu":
                y = torch.relu(ins[0])
            elif kind == "gelu":
                y = torch.nn.functional.gelu(ins[0], approximate="tanh")
            elif kind == "add":
                y = ins[0]
                for other in ins[1:]:
                    y = y + other
            else:  # reshape, flatten: per-sample shapes, batch first
                y = ins[0].reshape([ins[0].shape[0]] + self.shapes[name])
            values[name] = y
        return values[self.nodes[-1]["name"]]


def build_model(config_path, features):
    """The model of a mixtrain config (model.layers or model.nodes)."""
    with open(config_path, "rb") as f:
        cfg = tomllib.load(f)
    nodes = cfg["model"].get("nodes")
    if nodes is None:  # the sequential form: each layer reads the one before
        nodes, prev, counts = [], "input", {}
        for layer in cfg["model"]["layers"]:
            kind = layer["type"]
            counts[kind] = counts.get(kind, 0) + 1
            node = dict(layer, name=layer.get("name", f"{kind}{counts[kind]}"), inputs=[prev])
            nodes.append(node)
            prev = node["name"]
    return GraphModel(nodes, features)


def named_weights(model):
    out = {}
    for name, m in model.mods.items():
        out[f"{name}.weight"] = m.weight
        if m.bias is not None:
            out[f"{name}.bias"] = m.bias
    return out


def load_weights(model, path):
    tensors, _ = read_safetensors(path)
    with torch.no_grad():
        for key, p in named_weights(model).items():
            t = tensors[key]
            assert tuple(t.shape) == tuple(p.shape), (key, t.shape, p.shape)
            p.copy_(t)


# mixtrain's held-out split (core/src/data/dataset.cpp): xoshiro256** seeded by splitmix64,
# Fisher-Yates, the first round(N * eval_fraction) rows of the permutation are held out.
M64 = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & M64


class DataRng:
    def __init__(self, seed, stream=0):
        _, mix = splitmix64(stream ^ 0xD1B54A32D192ED03)
        sm = seed ^ mix
        self.s = []
        for _ in range(4):
            sm, w = splitmix64(sm)
            self.s.append(w)

    def next_u64(self):
        s = self.s
        result = (rotl((s[1] * 5) & M64, 7) * 9) & M64
        t = (s[1] << 17) & M64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        return result

    def below(self, n):
        threshold = ((1 << 64) - n) % n
        while True:
            r = self.next_u64()
            if r >= threshold:
                return r % n


def eval_rows(n, fraction, seed):
    k = max(1, int(np.floor(n * fraction + 0.5))) if fraction > 0 else 0
    order = list(range(n))
    rng = DataRng(seed)
    for i in range(n, 1, -1):
        j = rng.below(i)
        order[i - 1], order[j] = order[j], order[i - 1]
    return order[:k]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("command", choices=["data", "init", "loss", "train"])
    ap.add_argument("--out")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--features", type=int)
    ap.add_argument("--classes", type=int)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config")
    ap.add_argument("--weights")
    ap.add_argument("--x")
    ap.add_argument("--y")
    ap.add_argument("--eval-fraction", type=float, default=0.0)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--optimizer", choices=["sgd", "adamw"], default="sgd")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)

    if a.command == "data":
        rng = np.random.default_rng(a.seed)
        centers = rng.normal(0, 2, size=(a.classes, a.features))
        y = rng.integers(0, a.classes, size=a.rows)
        x = centers[y] + rng.normal(0, 1, size=(a.rows, a.features))
        np.save(f"{a.out}/x.npy", x.astype(np.float32))
        np.save(f"{a.out}/y.npy", y.astype(np.int32))
        print(json.dumps({"rows": a.rows}))
        return

    if a.command == "init":
        model = build_model(a.config, a.features)
        write_safetensors(a.out, named_weights(model), {"format": "pt"})
        print(json.dumps({"tensors": len(named_weights(model))}))
        return

    x = torch.from_numpy(np.load(a.x).astype(np.float32))
    y = torch.from_numpy(np.load(a.y).astype(np.int64))
    model = build_model(a.config, x.shape[1])
    load_weights(model, a.weights)
    loss_fn = torch.nn.CrossEntropyLoss()

    if a.command == "loss":
        if a.eval_fraction > 0:
            rows = torch.tensor(eval_rows(x.shape[0], a.eval_fraction, a.seed))
            x, y = x[rows], y[rows]
        with torch.no_grad():
            logits = model(x)
            loss = loss_fn(logits, y)
            acc = (logits.argmax(1) == y).double().mean()
        print(json.dumps({"loss": loss.item(), "accuracy": acc.item(), "rows": int(x.shape[0])}))
        return

    # train: plain full-batch SGD (mixtrain's sgd with momentum 0) over mixtrain's training rows.
    if a.eval_fraction > 0:
        held = set(eval_rows(x.shape[0], a.eval_fraction, a.seed))
        rows = torch.tensor([i for i in range(x.shape[0]) if i not in held])
        x, y = x[rows], y[rows]
    losses = []
    if a.optimizer == "adamw":
        # mixtrain's AdamW: betas (0.9, 0.999), eps 1e-8, decay on linear weights only (not on
        # biases or layernorm parameters).
        weights = named_weights(model)
        decay = [p for k, p in weights.items() if k.endswith(".weight") and
                 isinstance(model.mods[k[: -len(".weight")]], torch.nn.Linear)]
        rest = [p for p in weights.values() if all(p is not q for q in decay)]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                                 {"params": rest, "weight_decay": 0.0}],
                                lr=a.lr, betas=(0.9, 0.999), eps=1e-8, foreach=False)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.0)
    for _ in range(a.steps):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        losses.append(loss.item())
        opt.step()
    print(json.dumps({"losses": losses}))


if __name__ == "__main__":
    main()
