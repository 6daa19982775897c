#!/usr/bin/python3
"""Flash attention against the unfused attention, CPU backend: step time and peak memory of the
same GPT trained both ways (model.gpt.fused_attention = true / false), in the order
flash, unfused, unfused, flash, so drift in the machine's load shows as a gap between the two
runs of one side.

Each run is configs/gpt-tiny-fp32.toml with the shape's sizes, precision.policy fp32 or
bf16-mixed, on the bytes of /usr/share/common-licenses/GPL-3: --warmup steps (whole windows),
then --windows windows of --steps-per-window steps; ms/step = the median window's. Peak memory is
the backend allocator's high-water mark over the training steps (the last metrics record's
device_peak_memory_bytes) and the process's peak RSS (summary.json peak_rss_bytes). Output: JSON
lines and '# ' table lines.
"""
import argparse
import json
import os
import statistics
import tempfile

from gpt_bench_runs import POLICY, ROOT, cpu_name, timed_run, train, warmup_steps

SHAPES = {
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block=128, batch=16),
    "long": dict(n_layer=4, n_head=4, n_embd=256, block=256, batch=8),
}


def run(a, shape, precision, fused, tmp, index):
    s = SHAPES[shape]
    spw = a.steps_per_window
    warmup = warmup_steps(a.warmup, spw)
    sets = {
        "run.steps": warmup + a.windows * spw, "run.log_every": spw, "run.eval_every": 0,
        "checkpoint.every": 0, "precision.policy": POLICY[precision], "scaler.type": "none",
        "backend.threads": a.threads,
        "model.gpt.n_layer": s["n_layer"], "model.gpt.n_head": s["n_head"],
        "model.gpt.n_embd": s["n_embd"], "model.gpt.fused_attention": str(fused).lower(),
        "data.text.path": "/usr/share/common-licenses/GPL-3", "data.block_size": s["block"],
        "data.batch_size": s["batch"], "data.eval_batch_size": s["batch"],
    }
    run_dir = os.path.join(tmp, f"{shape}-{precision}-{index}")
    train(a.mixtrain, sets, run_dir)
    records, windows, summary = timed_run(run_dir, warmup)
    return {"shape": shape, "precision": precision, "attention": "flash" if fused else "unfused",
            "ms_per_step": round(1e3 * s["batch"] / statistics.median(windows), 1),
            "device_peak_mib": round(records[-1]["device_peak_memory_bytes"] / 2**20, 1),
            "peak_rss_mib": round(summary["peak_rss_bytes"] / 2**20, 1),
            "final_loss": records[-1]["loss"], "loadavg": round(os.getloadavg()[0], 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixtrain", default=os.path.join(ROOT, "build", "bin", "mixtrain"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default="tiny,long")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--steps-per-window", type=int, default=3)
    a = ap.parse_args()
    print(f"# CPU: {cpu_name()} ({os.cpu_count()} CPUs), threads {a.threads}", flush=True)
    print(f"# {'shape':<5} {'prec':<5} {'attention':<9} {'ms/step':>8} {'peak MiB':>8} "
          f"{'RSS MiB':>8} {'loss':>8}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for shape in a.shapes.split(","):
            for precision in a.precisions.split(","):
                for index, fused in enumerate((True, False, False, True)):
                    r = run(a, shape, precision, fused, tmp, index)
                    print(json.dumps(r), flush=True)
                    print(f"# {shape:<5} {precision:<5} {r['attention']:<9} "
                          f"{r['ms_per_step']:>8.1f} {r['device_peak_mib']:>8.1f} "
                          f"{r['peak_rss_mib']:>8.1f} {r['final_loss']:>8.4f}", flush=True)


if __name__ == "__main__":
    main()
