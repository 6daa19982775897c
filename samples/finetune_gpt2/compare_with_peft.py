#!/usr/bin/env python3
"""Load LoRA adapters that `mixtrain export RUN --layout peft` wrote into PEFT, on their base
GPT-2 folder, and compare PEFT's logits with mixtrain's on the same token windows.

mixtrain's side is `mixtrain predict CONFIG --checkpoint RUN --input TOKENS.bin --positions all
--out LOGITS.npy`: [rows, T, vocab], window i being tokens [i*T, i*T + T) of the file (predict's
default stride is the block size). PEFT's side is
`PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(BASE), ADAPTER)` in eval mode on the
same windows. Prints one JSON line (rows; max_relative_gap, the largest difference over the
largest logit; adapter_effect, the same measure between PEFT with and without the adapters) and
exits 1 when the gap exceeds --tolerance, or when PEFT left a tensor of the adapter file unloaded
(its loader skips a misnamed tensor without a word).

Needs transformers, torch and peft 0.4.0: run with the Python peers,
~/.cache/mixtrain/peers/bin/python.

Usage:
  compare_with_peft.py --base data/tiny-gpt2 --adapter runs/x/adapter --tokens data/val.bin \\
      --logits runs/x/val-logits.npy [--tolerance 1e-4]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256  # llm.c's token file (make_token_file.py)


def read_tokens(path):
    with open(path, "rb") as f:
        blob = f.read()
    magic, version, count = struct.unpack_from("<3i", blob)
    if magic != MAGIC or version != VERSION or len(blob) != 4 * HEADER_INTS + 2 * count:
        sys.exit("error: %s is no llm.c token file (magic %d, version %d, %d tokens in %d bytes)"
                 % (path, magic, version, count, len(blob)))
    return np.frombuffer(blob, dtype="<u2", offset=4 * HEADER_INTS).astype(np.int64)


@torch.no_grad()
def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the GPT-2 folder the run started from")
    parser.add_argument("--adapter", required=True, help="export --layout peft's folder")
    parser.add_argument("--tokens", required=True, help="the token file predict read")
    parser.add_argument("--logits", required=True, help="predict --positions all's .npy")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()

    from peft import PeftModel, get_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel

    model = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(args.base), args.adapter)
    model.eval()
    given = load_file(os.path.join(args.adapter, "adapter_model.safetensors"))
    loaded = get_peft_model_state_dict(model)
    all_loaded = sorted(given) == sorted(loaded) and all(
        torch.equal(loaded[k].float(), given[k].float()) for k in given)

    ours = np.load(args.logits)
    rows, block = ours.shape[0], ours.shape[1]
    tokens = read_tokens(args.tokens)
    windows = np.stack([tokens[i * block:(i + 1) * block] for i in range(rows)])
    ids = torch.from_numpy(windows)
    theirs = model(input_ids=ids).logits.float().numpy()
    with model.disable_adapter():  # the base model alone: what the adapters changed
        base = model(input_ids=ids).logits.float().numpy()
    scale = max(1.0, float(np.abs(theirs).max()))
    gap = float(np.abs(theirs - ours).max()) / scale
    print(json.dumps({"rows": rows, "block_size": block, "adapter_tensors": len(given),
                      "all_loaded": all_loaded, "max_relative_gap": gap,
                      "adapter_effect": float(np.abs(theirs - base).max()) / scale}))
    if not all_loaded or not gap <= args.tolerance:
        sys.exit("error: PEFT's logits differ from mixtrain's by %g (tolerance %g), adapters "
                 "loaded: %s" % (gap, args.tolerance, all_loaded))


if __name__ == "__main__":
    main()
