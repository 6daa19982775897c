"""torch.optim.lr_scheduler's learning rates for the schedule cases test_lr_schedule_parity wrote.

Reads a JSON file: a list of cases {kind, base_lr, min_lr, warmup_steps, total_steps, step_size,
gamma, milestones, pct_start, div_factor, final_div_factor, n} and prints {"lrs": [[...], ...]}:
per case, the lr of each of the first n optimizer steps (param_groups[0]["lr"] before step k + 1).

mixtrain's warm-up is torch's LinearLR(start_factor=1/W, total_iters=W-1) followed by the
schedule on its own clock: SequentialLR(..., milestones=[W]), as torchvision's reference
recipes compose them. inverse_sqrt has no torch scheduler: it is Noam's formula in a LambdaLR
(warm-up n * lr / W, then lr * sqrt(W) * n ** -0.5), with n counting the step being taken (fairseq
writes the same formula with n the updates already made, one step later).
"""
import json
import math
import sys
import warnings

import torch
from torch.optim import lr_scheduler as sched

warnings.filterwarnings("ignore")  # SequentialLR's deprecation notice of step(epoch)


def main_scheduler(opt, c):
    kind, w, total = c["kind"], c["warmup_steps"], c["total_steps"]
    if kind == "warmup_cosine":
        return sched.CosineAnnealingLR(opt, T_max=total - w, eta_min=c["min_lr"])
    if kind == "linear":
        return sched.LinearLR(opt, start_factor=1.0, end_factor=c["min_lr"] / c["base_lr"],
                              total_iters=total - w)
    if kind == "step":
        return sched.StepLR(opt, step_size=c["step_size"], gamma=c["gamma"])
    if kind == "multistep":
        return sched.MultiStepLR(opt, milestones=c["milestones"], gamma=c["gamma"])
    raise ValueError(kind)


def lrs(c):
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=c["base_lr"])
    kind, w = c["kind"], c["warmup_steps"]
    if kind == "onecycle":
        s = sched.OneCycleLR(opt, max_lr=c["base_lr"], total_steps=c["total_steps"],
                             pct_start=c["pct_start"], anneal_strategy="cos",
                             div_factor=c["div_factor"], final_div_factor=c["final_div_factor"],
                             cycle_momentum=False)
    elif kind == "inverse_sqrt":
        def noam(k):
            n = k + 1
            if n < w:
                return n / w
            return math.sqrt(w) * n ** -0.5
        s = sched.LambdaLR(opt, noam)
    elif w > 0:
        warm = sched.LinearLR(opt, start_factor=1.0 / w, end_factor=1.0,
                              total_iters=max(1, w - 1))
        s = sched.SequentialLR(opt, [warm, main_scheduler(opt, c)], milestones=[w])
    else:
        s = main_scheduler(opt, c)
    out = []
    for _ in range(c["n"]):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        s.step()
    return out


with open(sys.argv[1]) as f:
    cases = json.load(f)
print(json.dumps({"lrs": [lrs(c) for c in cases]}))
