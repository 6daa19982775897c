"""torch.nn.Dropout against mixtrain's dropout op, from the tensors test_dropout_parity wrote.

Reads a JSON file {p, shape, x, y_train, y_eval, y_p0} and prints a JSON object of the largest
differences: eval mode and p = 0 against torch.nn.Dropout itself, training mode against torch's
formula x * m / (1 - p) with m taken from mixtrain's own output (y != 0), since the two draw
their masks from different generators.
"""
import json
import sys

import torch

with open(sys.argv[1]) as f:
    d = json.load(f)
p = d["p"]
x = torch.tensor(d["x"], dtype=torch.float32).reshape(d["shape"])
y_train = torch.tensor(d["y_train"], dtype=torch.float32).reshape(d["shape"])
y_eval = torch.tensor(d["y_eval"], dtype=torch.float32).reshape(d["shape"])
y_p0 = torch.tensor(d["y_p0"], dtype=torch.float32).reshape(d["shape"])

drop = torch.nn.Dropout(p)
drop.eval()
eval_ref = drop(x)
zero = torch.nn.Dropout(0.0)
zero.train()
p0_ref = zero(x)
# torch's training forward: x * (bernoulli(1 - p) / (1 - p)), the noise a float32 tensor.
m = (y_train != 0).to(torch.float32)
noise = m.div_(1 - p)
train_ref = x * noise
print(json.dumps({
    "eval_max_abs": (eval_ref - y_eval).abs().max().item(),
    "p0_max_abs": (p0_ref - y_p0).abs().max().item(),
    "train_max_rel": ((train_ref - y_train).abs() / x.abs().clamp_min(1e-30)).max().item(),
    "kept_fraction": m.count_nonzero().item() / m.numel() if m.numel() else 0.0,
}))
