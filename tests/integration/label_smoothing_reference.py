"""torch.nn.CrossEntropyLoss(label_smoothing=eps) on the logits test_label_smoothing_parity wrote.

Reads a JSON file {rows, classes, logits, labels, cases: [{eps, grad_scale}]} and prints
{"results": [{"loss": L, "grad": [...]}, ...]}: per case the mean loss over the rows and the
gradient of grad_scale * loss with respect to the logits, computed in float64 from the float32
logits (so the reference is torch's formula without float32 rounding of its own).
"""
import json
import sys

import torch

with open(sys.argv[1]) as f:
    d = json.load(f)
logits = torch.tensor(d["logits"], dtype=torch.float32).reshape(d["rows"], d["classes"])
labels = torch.tensor(d["labels"], dtype=torch.int64)
results = []
for case in d["cases"]:
    z = logits.to(torch.float64).clone().requires_grad_(True)
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=case["eps"])
    loss = criterion(z, labels)
    (loss * case["grad_scale"]).backward()
    results.append({"loss": loss.item(), "grad": z.grad.reshape(-1).tolist()})
print(json.dumps({"results": results}))
