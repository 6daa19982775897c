"""What the mixtrain GPT benchmarks share (mixtrain_gpt_bench.py, flash_attention_bench.py): the
CPU's name, the precisions, and one `mixtrain train` of configs/gpt-tiny-fp32.toml with --set
overrides, timed by whole windows of metrics records after a warm-up of whole windows."""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from host_cpu import cpu_name  # noqa: E402,F401  (re-exported to the GPT benchmarks)
POLICY = {"fp32": "fp32", "bf16": "bf16-mixed"}


def warmup_steps(warmup, steps_per_window):
    """--warmup rounded up to whole windows (at least one step), so every metrics record after it
    closes a timed window."""
    return -(-max(warmup, 1) // steps_per_window) * steps_per_window


def train(mixtrain, sets, run_dir, profile=False):
    """`mixtrain train configs/gpt-tiny-fp32.toml` with `sets` as --set key=value into run_dir;
    returns its stdout, raises RuntimeError with the command and stderr when it fails."""
    cmd = [mixtrain, "train", os.path.join(ROOT, "configs", "gpt-tiny-fp32.toml"),
           "--run-dir", run_dir, "--log-level", "warn"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    if profile:
        cmd.append("--profile")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{p.stderr}")
    return p.stdout


def timed_run(run_dir, warmup):
    """The run's loss records, the samples/s of its windows after `warmup` steps, its summary."""
    records = [json.loads(l) for l in open(f"{run_dir}/metrics.jsonl") if '"loss"' in l]
    windows = [r["samples_per_s"] for r in records if r["step"] > warmup]
    summary = json.load(open(f"{run_dir}/summary.json"))
    return records, windows, summary
