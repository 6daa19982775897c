#!/usr/bin/env python3
"""Hugging Face's generate() on GPT-2 small's shape, greedy, on the CPU: the peer of
`mixtrain sample --temperature 0 --ignore-eos` (bench/gpt/README.md, "Decoding").

Prints one JSON object: the seconds generate() took for 1 and for `--tokens` new tokens after a
3-token prompt, with the model already in memory, and the milliseconds a token between the two.
Random weights (decoding costs the same whatever the values). Needs transformers (the peers'
virtual environment, tests/integration/hf_interop.py's) and PyTorch; set OMP_WAIT_POLICY, and
OPENBLAS_CORETYPE=SkylakeX for fp32 where Debian's OpenBLAS picks its SSE3 kernel
(bench/RESULTS.md, session 73).
"""
import argparse
import json
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    p.add_argument("--tokens", type=int, default=257)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    config = GPT2Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024)
    model = GPT2LMHeadModel(config).eval()
    if a.dtype == "bf16":
        model = model.to(torch.bfloat16)
    prompt = torch.tensor([[1, 2, 3]])
    seconds = {}
    with torch.no_grad():
        for tokens in (4, 1, a.tokens):  # the first call warms up
            start = time.perf_counter()
            model.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                           pad_token_id=0)
            seconds[tokens] = time.perf_counter() - start
    per_token = (seconds[a.tokens] - seconds[1]) / (a.tokens - 1) * 1e3
    print(json.dumps({"dtype": a.dtype, "threads": a.threads, "tokens": a.tokens,
                      "seconds_1": round(seconds[1], 3), "seconds": round(seconds[a.tokens], 3),
                      "ms_per_token": round(per_token, 2)}))


if __name__ == "__main__":
    main()
