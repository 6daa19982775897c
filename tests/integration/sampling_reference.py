"""Hugging Face's logits processors on the cases test_sampling_parity.cpp writes.

For each case: the repetition penalty, then (temperature > 0) the temperature, top-k and top-p
warpers, in the order GenerationMixin.sample applies them, and the softmax it draws from; or
(temperature 0) the argmax greedy search takes. Prints one JSON object: {"cases": [...]}, each
{"probs": [...]} or {"argmax": id}.
"""
import json
import sys

import torch
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

cases = json.load(open(sys.argv[1]))
out = []
for c in cases:
    ids = torch.tensor([c["context"]], dtype=torch.long)
    scores = torch.tensor([c["logits"]], dtype=torch.float32)
    if c["repetition_penalty"] != 1.0:
        scores = RepetitionPenaltyLogitsProcessor(c["repetition_penalty"])(ids, scores)
    if c["temperature"] == 0.0:
        out.append({"argmax": int(torch.argmax(scores, dim=-1)[0])})
        continue
    scores = TemperatureLogitsWarper(c["temperature"])(ids, scores)
    if c["top_k"] > 0:
        scores = TopKLogitsWarper(c["top_k"])(ids, scores)
    if c["top_p"] < 1.0:
        scores = TopPLogitsWarper(c["top_p"])(ids, scores)
    # In double, as mixtrain computes it: the comparison is of the candidates and their mass.
    out.append({"probs": torch.softmax(scores.double(), dim=-1)[0].tolist()})
print(json.dumps({"cases": out}))
