#!/usr/bin/python3
"""mixtrain side of the GPT benchmark: the shapes of torch_gpt_bench.py, trained by `mixtrain train`.

For each shape (tiny, wide) and precision (fp32, bf16 = bf16-mixed) it runs configs/gpt-tiny-fp32.toml
with the shape's sizes and the benchmark's AdamW (lr 3e-4, betas 0.9/0.95, eps 1e-8, weight decay
0.1 on rank >= 2 tensors, no clipping), on the bytes of /usr/share/common-licenses/GPL-3 in the
unshuffled order (source = "text", shuffle = false), backend.threads = --threads:
  1. a timed run: --warmup steps (rounded up to whole windows), then --windows windows of
     --steps-per-window steps (one metrics record per window); tokens/s = B*T * the median window's samples/s; peak RSS = the
     training loop's peak (summary.json peak_rss_bytes, before the final checkpoint);
  2. a run with --profile (steps after the first timed op by op): the breakdown by group.
With --torch FILE (torch_gpt_bench.py's output, from the same session), a side-by-side table
against PyTorch's best setting per shape and precision. Output: JSON lines and '# ' table lines.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

from gpt_bench_runs import POLICY, ROOT, cpu_name, timed_run, train, warmup_steps

SHAPES = {  # torch_gpt_bench.py's
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block=128, batch=16),
    "wide": dict(n_layer=4, n_head=8, n_embd=512, block=256, batch=8),
}
GROUPS = ["GEMMs", "attention softmax", "attention (flash)", "layer norm", "classifier",
          "optimizer", "other"]
LABEL = {"attention softmax": "softmax", "attention (flash)": "flash"}  # table headers


def run_mixtrain(a, shape, precision, steps, log_every, profile, run_dir):
    s = SHAPES[shape]
    sets = {
        "run.steps": steps, "run.log_every": log_every, "run.eval_every": 0,
        "precision.policy": POLICY[precision], "scaler.type": "none",
        "backend.threads": a.threads,
        "model.gpt.n_layer": s["n_layer"], "model.gpt.n_head": s["n_head"],
        "model.gpt.n_embd": s["n_embd"],
        "data.text.path": "/usr/share/common-licenses/GPL-3", "data.block_size": s["block"],
        "data.batch_size": s["batch"], "data.eval_batch_size": s["batch"],
        "data.shuffle": "false",
        "optimizer.schedule": "constant", "optimizer.clip_grad_norm": 0,
        "optimizer.adamw.lr": 3e-4, "optimizer.adamw.beta1": 0.9, "optimizer.adamw.beta2": 0.95,
        "optimizer.adamw.eps": 1e-8, "optimizer.adamw.weight_decay": 0.1,
    }
    for kv in a.set:  # the caller's overrides last: an A/B of a backend option
        key, _, value = kv.partition("=")
        sets[key] = value
    return train(a.mixtrain, sets, run_dir, profile)


def measure(a, shape, precision):
    s = SHAPES[shape]
    with tempfile.TemporaryDirectory() as tmp:
        # The warm-up is whole windows, so every metrics record after it closes a timed window.
        spw = a.steps_per_window
        warmup = warmup_steps(a.warmup, spw)
        steps = warmup + a.windows * spw
        run_mixtrain(a, shape, precision, steps, spw, False, f"{tmp}/timed")
        _, windows, summary = timed_run(f"{tmp}/timed", warmup)
        run_mixtrain(a, shape, precision, a.profile_steps + 1, a.profile_steps + 1, True,
                     f"{tmp}/profiled")
        prof = json.load(open(f"{tmp}/profiled/profile.json"))
    total = prof["recorded_seconds"]
    groups = {g: 0.0 for g in GROUPS}
    for e in prof["entries"]:
        g = e["group"]
        key = next((k for k in GROUPS[:-1] if g.startswith(k)), "other")
        groups[key] += e["seconds"]
    groups["other"] += max(0.0, total - sum(groups.values()))
    # samples/s counts windows (rows) of block tokens; a step is batch rows.
    rows_per_s = statistics.median(windows)
    return {"kind": "mixtrain", "shape": shape, "precision": precision,
            "tokens_per_s": round(s["block"] * rows_per_s, 1),
            "window_tokens_per_s": [round(s["block"] * w, 1) for w in windows],
            "ms_per_step": round(1e3 * s["batch"] / rows_per_s, 1),
            "peak_rss_mib": round(summary["peak_rss_bytes"] / 2**20, 1),
            "profile_ms_per_step": round(1e3 * total / prof["steps"], 1),
            "breakdown_pct": {g: round(100 * v / total, 1) for g, v in groups.items()},
            "loadavg": round(os.getloadavg()[0], 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixtrain", default=os.path.join(ROOT, "build", "bin", "mixtrain"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default="tiny,wide")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--steps-per-window", type=int, default=3)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--torch", help="torch_gpt_bench.py's output of this session")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every mixtrain run (repeatable), e.g. "
                         "backend.cpu.flash_products=fp32")
    a = ap.parse_args()
    print(f"# CPU: {cpu_name()} ({os.cpu_count()} CPUs), threads {a.threads}, load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    torch_best = {}
    if a.torch:
        for line in open(a.torch):
            if line.startswith("{"):
                r = json.loads(line)
                if r.get("kind") != "best":
                    continue
                # Side by side means the same threads: another setting's record is left out, and
                # so is one that does not say (torch_gpt_bench.py's best records carry threads
                # since 2026-12-03; "choice" holds only its swept settings).
                threads = r.get("threads")
                if threads != a.threads:
                    print(f"# left out PyTorch's {r['shape']} {r['precision']}: threads "
                          f"{threads if threads is not None else '?'}, not this run's {a.threads}",
                          flush=True)
                    continue
                torch_best[(r["shape"], r["precision"])] = r
    print(f"# {'shape':<5} {'prec':<5} {'tokens/s':>9} {'ms/step':>8} {'RSS MiB':>7} "
          + " ".join(f"{LABEL.get(g, g)[:8]:>8}" for g in GROUPS)
          + "   (breakdown: % of a profiled step)",
          flush=True)
    results = []
    for shape in a.shapes.split(","):
        for precision in a.precisions.split(","):
            r = measure(a, shape, precision)
            results.append(r)
            print(json.dumps(r), flush=True)
            print(f"# {shape:<5} {precision:<5} {r['tokens_per_s']:>9.0f} {r['ms_per_step']:>8.1f} "
                  f"{r['peak_rss_mib']:>7.0f} "
                  + " ".join(f"{r['breakdown_pct'][g]:>8.1f}" for g in GROUPS), flush=True)
    if torch_best:
        print("#\n# Side by side (PyTorch: its best setting, torch_gpt_bench.py)")
        print(f"# {'shape':<5} {'prec':<5} {'torch tok/s':>11} {'mixtrain':>9} {'ratio':>6} "
              f"{'torch RSS':>9} {'mixtrain':>8} {'ratio':>6}  torch setting")
        for r in results:
            t = torch_best.get((r["shape"], r["precision"]))
            if not t:
                continue
            print(f"# {r['shape']:<5} {r['precision']:<5} {t['tokens_per_s']:>11.0f} "
                  f"{r['tokens_per_s']:>9.0f} {r['tokens_per_s'] / t['tokens_per_s']:>5.2f}x "
                  f"{t['peak_rss_mib']:>9.0f} {r['peak_rss_mib']:>8.0f} "
                  f"{r['peak_rss_mib'] / t['peak_rss_mib']:>5.2f}x  {t['setting']}")
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
