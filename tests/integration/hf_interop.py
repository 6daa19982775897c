#!/usr/bin/python3
"""mixtrain's exports as the Python ecosystem loads them, and the folders it writes for
mixtrain to start from, for test_hf_export.cpp and test_from_pretrained.cpp.

  gpt2    --folder DIR --tokens eval.bin --block-size T --logits-out F.npy
          transformers.GPT2LMHeadModel.from_pretrained(DIR): the loading report (missing,
          unexpected and mismatched keys, errors), whether lm_head.weight is wte's tensor, the
          config it read, and its logits of every held-out window of the llm.c token file at
          stride T (gpt_reference.py's windows, mixtrain's `predict --positions all`), float32
          [W, T, V], with their mean cross-entropy. Needs the peers venv (transformers).
  make-gpt2 --out DIR --n-layer L --n-head H --n-embd C --n-positions T --vocab-size V --seed S
          GPT2LMHeadModel(GPT2Config(those sizes, the rest GPT2Config's defaults)) with noise on
          every parameter (so that biases and LayerNorms count too), written by
          save_pretrained(DIR, safe_serialization=True): the folder mixtrain's [model]
          from_pretrained reads. Prints the files written. Needs the peers venv (transformers).
  peft-train --folder DIR --adapter A --tokens train.bin --block-size T --batch B --steps N
          --lr LR --weight-decay WD --save F.safetensors
          PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(DIR, dropout 0), A,
          is_trainable=True), then N steps of torch.optim.AdamW (betas 0.9, 0.999, eps 1e-8) on
          its trainable parameters over gpt_reference.py's batches (mixtrain's sampler with
          shuffle = false): the per-step losses, the trainable parameters' names, whether the
          adapter file's tensors are exactly what PEFT loaded, and the trained adapters (PEFT's
          get_peft_model_state_dict) written to F. Needs peft 0.4.0.
  peft-logits --folder DIR --adapter A --tokens eval.bin --block-size T --logits-out F.npy
          --merged-out M.safetensors
          The same model in eval mode: its logits of every held-out window (as gpt2), then
          merge_and_unload()'s state dict (GPT2LMHeadModel's names, Conv1D [in, out]) written to
          M. Needs peft 0.4.0.
  make-peft-adapter --folder DIR --out A --r R --alpha ALPHA --targets T[,T...] [--regex] --seed S
          get_peft_model(GPT2LMHeadModel.from_pretrained(DIR), LoraConfig(r, lora_alpha,
          lora_dropout 0, target_modules: the list T, or with --regex the one string T,
          fan_in_fan_out, CAUSAL_LM)) with noise on lora_B (PEFT starts it at zero, which would
          hide a misplaced or unscaled adapter), written by save_pretrained(A,
          safe_serialization=True): a PEFT-made adapter for [model.lora] from_peft. Prints the
          files and the adapted modules. Needs peft 0.4.0.
  resnet  --weights F.safetensors --classes K --images x.npy --logits-out F.npy
          torchvision.models.resnet18(num_classes=K).load_state_dict(file, strict=True), then
          its eval-mode logits of the [N, 3, H, W] images in [0, 1] behind the Normalize whose
          mean and std the file's metadata holds ("normalization"). Needs torchvision.

Prints one JSON object. Runs under any python that imports torch and numpy, and the package
the subcommand names; the ResNet's file is read with safetensors_interop.py's reader (json and
numpy), so /usr/bin/python3 needs no safetensors package.
"""
import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import heldout_windows, read_tokens, training_batch  # noqa: E402
from safetensors_interop import read_safetensors, write_safetensors  # noqa: E402


@torch.no_grad()
def gpt2(a):
    from transformers import GPT2LMHeadModel
    model, info = GPT2LMHeadModel.from_pretrained(a.folder, output_loading_info=True)
    model.eval()
    windows = heldout_windows(read_tokens(a.tokens), a.block_size)
    logits = model(windows[:, :-1]).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             windows[:, 1:].reshape(-1))
    np.save(a.logits_out, logits.numpy())
    c = model.config
    print(json.dumps({
        "missing_keys": list(info["missing_keys"]),
        "unexpected_keys": list(info["unexpected_keys"]),
        "mismatched_keys": [str(k) for k in info["mismatched_keys"]],
        "error_msgs": [str(e) for e in info["error_msgs"]],
        "tied": model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr(),
        "config": {k: getattr(c, k) for k in (
            "n_layer", "n_head", "n_embd", "n_positions", "vocab_size", "n_inner",
            "layer_norm_epsilon", "activation_function", "tie_word_embeddings")},
        "torch_dtype": str(c.torch_dtype),
        "loss": float(loss),
        "windows": int(windows.shape[0]),
    }))


@torch.no_grad()
def make_gpt2(a):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(a.seed)
    model = GPT2LMHeadModel(GPT2Config(n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd,
                                       n_positions=a.n_positions, vocab_size=a.vocab_size))
    # GPT-2's init leaves biases at 0 and LayerNorms at 1, which a misplaced one would not show.
    for p in model.parameters():
        p.add_(0.05 * torch.randn_like(p))
    model.save_pretrained(a.out, safe_serialization=True)
    print(json.dumps({"files": sorted(os.listdir(a.out))}))


def peft_model(a, trainable):
    from peft import PeftModel
    from transformers import GPT2LMHeadModel
    base = GPT2LMHeadModel.from_pretrained(a.folder, resid_pdrop=0.0, embd_pdrop=0.0,
                                           attn_pdrop=0.0)
    return PeftModel.from_pretrained(base, a.adapter, is_trainable=trainable)


# Whether the adapter file's tensors are, name for name and bit for bit, what PEFT loaded: its
# loader is strict=False, so a misnamed tensor would be skipped without a word.
def adapter_loaded(model, adapter):
    from peft import get_peft_model_state_dict
    loaded = get_peft_model_state_dict(model)
    given, _ = read_safetensors(os.path.join(adapter, "adapter_model.safetensors"))
    return sorted(loaded) == sorted(given) and all(
        torch.equal(loaded[k].float(), given[k]) for k in given)


def peft_train(a):
    from peft import get_peft_model_state_dict
    model = peft_model(a, trainable=True)
    loaded = adapter_loaded(model, a.adapter)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=a.lr,
                            betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay)
    tokens = read_tokens(a.tokens)
    model.train()
    losses = []
    for step in range(a.steps):
        inputs, targets = training_batch(tokens, a.block_size, a.batch, step)
        logits = model(input_ids=inputs).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 targets.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    trained = {k: v.detach().float().contiguous() for k, v in
               get_peft_model_state_dict(model).items()}
    write_safetensors(a.save, trained, {})
    print(json.dumps({"losses": losses, "trainable": names, "adapter_loaded": loaded,
                      "saved": sorted(trained)}))


@torch.no_grad()
def peft_logits(a):
    model = peft_model(a, trainable=False)
    loaded = adapter_loaded(model, a.adapter)
    model.eval()
    windows = heldout_windows(read_tokens(a.tokens), a.block_size)
    logits = model(input_ids=windows[:, :-1]).logits.float()
    np.save(a.logits_out, logits.numpy())
    merged = model.merge_and_unload()
    state = {k: v.float().contiguous() for k, v in merged.state_dict().items()
             if not k.endswith(".attn.bias") and not k.endswith(".attn.masked_bias")}
    write_safetensors(a.merged_out, state, {})
    print(json.dumps({"adapter_loaded": loaded, "merged": sorted(state)}))


@torch.no_grad()
def make_peft_adapter(a):
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2LMHeadModel
    torch.manual_seed(a.seed)
    base = GPT2LMHeadModel.from_pretrained(a.folder)
    targets = a.targets if a.regex else a.targets.split(",")
    model = get_peft_model(base, LoraConfig(r=a.r, lora_alpha=a.alpha, lora_dropout=0.0,
                                            target_modules=targets, fan_in_fan_out=True,
                                            task_type="CAUSAL_LM"))
    adapted = []
    for name, p in model.named_parameters():
        if "lora_B" in name:
            p.add_(0.05 * torch.randn_like(p))
            adapted.append(name)
    model.save_pretrained(a.out, safe_serialization=True)
    print(json.dumps({"files": sorted(os.listdir(a.out)), "adapted": adapted}))


@torch.no_grad()
def resnet(a):
    import torchvision
    tensors, metadata = read_safetensors(a.weights)
    model = torchvision.models.resnet18(num_classes=a.classes)
    # strict: every parameter and buffer name and shape of torchvision's module. A state dict
    # without PyTorch's version metadata (any file's) gets num_batches_tracked = 0 from
    # BatchNorm's loader, as a missing key of an old checkpoint.
    model.load_state_dict(tensors, strict=True)
    model.eval()
    norm = json.loads(metadata["normalization"])
    mean = torch.tensor(norm["mean"], dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(norm["std"], dtype=torch.float32).view(1, -1, 1, 1)
    x = torch.from_numpy(np.load(a.images).astype(np.float32))
    logits = model((x - mean) / std)
    np.save(a.logits_out, logits.numpy())
    print(json.dumps({
        "normalization": norm,
        "tensors": len(tensors),
        "state_dict": len(model.state_dict()),
        "num_batches_tracked": sum(1 for k in model.state_dict() if
                                   k.endswith("num_batches_tracked")),
    }))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gpt2")
    g.add_argument("--folder", required=True)
    g.add_argument("--tokens", required=True)
    g.add_argument("--block-size", type=int, required=True)
    g.add_argument("--logits-out", required=True)
    m = sub.add_parser("make-gpt2")
    m.add_argument("--out", required=True)
    for size in ("n-layer", "n-head", "n-embd", "n-positions", "vocab-size", "seed"):
        m.add_argument("--" + size, type=int, required=True)
    t = sub.add_parser("peft-train")
    for key in ("folder", "adapter", "tokens", "save"):
        t.add_argument("--" + key, required=True)
    for key in ("block-size", "batch", "steps"):
        t.add_argument("--" + key, type=int, required=True)
    t.add_argument("--lr", type=float, required=True)
    t.add_argument("--weight-decay", type=float, required=True)
    lg = sub.add_parser("peft-logits")
    for key in ("folder", "adapter", "tokens", "logits-out", "merged-out"):
        lg.add_argument("--" + key, required=True)
    lg.add_argument("--block-size", type=int, required=True)
    pa = sub.add_parser("make-peft-adapter")
    for k in ("folder", "out", "targets"):
        pa.add_argument("--" + k, required=True)
    pa.add_argument("--r", type=int, required=True)
    pa.add_argument("--alpha", type=float, required=True)
    pa.add_argument("--seed", type=int, required=True)
    pa.add_argument("--regex", action="store_true")
    r = sub.add_parser("resnet")
    r.add_argument("--weights", required=True)
    r.add_argument("--classes", type=int, required=True)
    r.add_argument("--images", required=True)
    r.add_argument("--logits-out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    {"gpt2": gpt2, "make-gpt2": make_gpt2, "peft-train": peft_train, "peft-logits": peft_logits,
     "make-peft-adapter": make_peft_adapter,
     "resnet": resnet}[a.command](a)


if __name__ == "__main__":
    main()
