#!/usr/bin/python3
"""mixtrain side of the CNN benchmark: ResNet-20 training as torch_cnn_bench.py measures it, by
`mixtrain train`.

For each precision (fp32: configs/resnet20-fp32.toml, bf16: configs/resnet20-bf16.toml;
fp32-winograd: the fp32 config with backend.conv_algorithm = "winograd") it trains
at batch --batch (128) on synthetic 3x32x32 images (resnet_reference.py's gratings, 4 batches of
them in a temporary .npy pair; source = "npy", shuffle = false, eval_fraction = 0) with the
benchmark's SGD (lr 0.1, momentum 0.9, weight decay 5e-4, constant schedule, no clipping),
no augmentation (the configs' [data.augment] random crop and flip turned off: PyTorch's side
trains on the same fixed batches), backend.threads = --threads:
  1. a timed run: --warmup steps (rounded up to whole windows), then --windows windows of
     --steps-per-window steps (one metrics record per window); images/s = the median window's
     samples/s; peak RSS = summary.json's peak_rss_bytes (the training loop's peak);
  2. a run with --profile (the steps after the first, every backend op timed): the breakdown of a
     step by group: convolutions, batch norm, pooling, layout permutes, optimizer, other (GEMMs
     of the classifier, activations, adds, casts, the loss, host time).
Then a side-by-side table against torch_cnn_bench.py: its results from --torch FILE (its --json
output or its stdout), or, without --torch, a run of it in this invocation (same --threads and
--batch; --no-torch skips it). mixtrain's fp32 (and fp32-winograd) is set against PyTorch's
faster of fp32 and fp32-cl (each at its best OMP_WAIT_POLICY), bf16 against bf16 and bf16-cl.
--repeat R runs the whole list of precisions R times in turn (fp32, fp32-winograd, fp32, ...: on
a shared machine alternation spreads the load over all of them) and reports each precision's
median run (by images/s; of an even R the slower middle one, a run that happened), with every
run's ms/step listed. The median, not the best: torch_cnn_bench.py runs each setting once, so a
best-of-R on this side alone would set mixtrain's luckiest run against PyTorch's typical one.
Output: JSON lines and '# ' table lines.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.join(ROOT, "bench", "cnn")
sys.path.insert(0, os.path.join(ROOT, "bench"))
from host_cpu import cpu_name  # noqa: E402
REFERENCE = os.path.join(ROOT, "tests", "integration", "resnet_reference.py")
CONFIG = {"fp32": "resnet20-fp32.toml", "fp32-winograd": "resnet20-fp32.toml",
          "bf16": "resnet20-bf16.toml"}
# Backend options of a precision beyond its config.
BACKEND_SETS = {"fp32-winograd": {"backend.conv_algorithm": "winograd"}}
TORCH_CONFIGS = {"fp32": ("fp32", "fp32-cl"), "fp32-winograd": ("fp32", "fp32-cl"),
                 "bf16": ("bf16", "bf16-cl")}
GROUPS = ["convolutions", "batch norm", "pooling", "layout permutes", "optimizer", "other"]


def write_images(folder, rows):
    """The reference's synthetic images (numpy only) as features.npy / labels.npy."""
    spec = importlib.util.spec_from_file_location("resnet_reference", REFERENCE)
    rr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rr)
    x, y = rr.make_data(rows, 10, 32, 3, 0.2, 1, 0)
    import numpy as np
    np.save(os.path.join(folder, "features.npy"), x)
    np.save(os.path.join(folder, "labels.npy"), y)


def run_mixtrain(a, precision, data, steps, log_every, profile, run_dir):
    sets = {
        "run.steps": steps, "run.log_every": log_every, "run.eval_every": 0,
        "backend.threads": a.threads,
        "data.source": "npy",
        "data.npy.features": os.path.join(data, "features.npy"),
        "data.npy.labels": os.path.join(data, "labels.npy"),
        "data.batch_size": a.batch, "data.eval_batch_size": a.batch,
        "data.shuffle": "false", "data.eval_fraction": 0, "data.classes": 10,
        "optimizer.type": "sgd", "optimizer.schedule": "constant",
        "optimizer.clip_grad_norm": 0,
        "optimizer.sgd.lr": 0.1, "optimizer.sgd.momentum": 0.9,
        "optimizer.sgd.weight_decay": 5e-4,
        # The configs' [data.augment] (random crop with 4 pixels of padding, horizontal flips)
        # off: PyTorch's side steps through fixed batches, so augmenting here would time work
        # only this side does. [data.normalize] from_training stays: it rescales the splits once
        # at load, before the first step, and no step does more for it.
        "data.augment.crop_padding": 0, "data.augment.horizontal_flip": "false",
    }
    sets.update(BACKEND_SETS.get(precision, {}))
    cmd = [a.mixtrain, "train", os.path.join(ROOT, "configs", CONFIG[precision]),
           "--run-dir", run_dir, "--log-level", "warn"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    if profile:
        cmd.append("--profile")
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{p.stderr}")
    return p.stdout


def measure(a, precision, data):
    with tempfile.TemporaryDirectory() as tmp:
        # The warm-up is whole windows, so every metrics record after it closes a timed window.
        spw = a.steps_per_window
        warmup = -(-max(a.warmup, 1) // spw) * spw
        run_mixtrain(a, precision, data, warmup + a.windows * spw, spw, False, f"{tmp}/timed")
        with open(f"{tmp}/timed/metrics.jsonl") as f:
            records = [json.loads(line) for line in f if '"loss"' in line]
        windows = [r["samples_per_s"] for r in records if r["step"] > warmup]
        with open(f"{tmp}/timed/summary.json") as f:
            summary = json.load(f)
        run_mixtrain(a, precision, data, a.profile_steps + 1, a.profile_steps + 1, True,
                     f"{tmp}/profiled")
        with open(f"{tmp}/profiled/profile.json") as f:
            prof = json.load(f)
    total = prof["recorded_seconds"]
    groups = dict.fromkeys(GROUPS, 0.0)
    for e in prof["entries"]:
        groups[e["group"] if e["group"] in groups else "other"] += e["seconds"]
    groups["other"] += max(0.0, total - sum(groups.values()))
    images_per_s = statistics.median(windows)
    return {"kind": "mixtrain", "precision": precision, "config": CONFIG[precision],
            "images_per_s": round(images_per_s, 1),
            "window_images_per_s": [round(w, 1) for w in windows],
            "ms_per_step": round(1e3 * a.batch / images_per_s, 1),
            "peak_rss_mib": round(summary["peak_rss_bytes"] / 2**20, 1),
            "profile_ms_per_step": round(1e3 * total / prof["steps"], 1),
            "breakdown_pct": {g: round(100 * v / total, 1) if total else 0.0
                              for g, v in groups.items()},
            "loadavg": round(os.getloadavg()[0], 2)}


def torch_results(a):
    """torch_cnn_bench.py's "best" records by configuration: from --torch, or a run now."""
    if a.torch:
        with open(a.torch) as f:
            text = f.read()
    else:
        print("# running torch_cnn_bench.py ...", flush=True)
        cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_cnn_bench.py"),
               "--threads", str(a.threads), "--batch", str(a.batch)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            print(f"# torch_cnn_bench.py failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}")
            return {}
        text = p.stdout
        for line in text.splitlines():
            if line.startswith("# "):
                print(line, flush=True)
    try:
        records = json.loads(text)["best"]  # its --json file
    except (ValueError, KeyError, TypeError):
        records = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    best = {}
    for r in records:
        if r.get("kind") != "best":
            continue
        # Side by side means the same threads and batch: a record from another setting (or one
        # too old to say) is left out, saying so.
        if r.get("threads") != a.threads or r.get("batch") != a.batch:
            print(f"# left out PyTorch's {r['config']}: threads {r.get('threads', '?')}, batch "
                  f"{r.get('batch', '?')}, not this run's {a.threads} and {a.batch}", flush=True)
            continue
        best[r["config"]] = r
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixtrain", default=os.path.join(ROOT, "build", "bin", "mixtrain"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--steps-per-window", type=int, default=3)
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=1,
                    help="runs per precision, alternating; the median run is reported")
    ap.add_argument("--torch", help="torch_cnn_bench.py's output (--json file or stdout)")
    ap.add_argument("--no-torch", action="store_true", help="no PyTorch side by side")
    a = ap.parse_args()
    precisions = a.precisions.split(",")
    if any(p not in CONFIG for p in precisions):
        ap.error(f"--precisions: of {list(CONFIG)}")
    print(f"# CPU: {cpu_name()} ({os.cpu_count()} CPUs), threads {a.threads}, batch {a.batch}, "
          f"no augmentation, {a.repeat} run(s) per precision (the median run is reported), "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    print(f"# {'prec':<13} {'images/s':>9} {'ms/step':>8} {'RSS MiB':>7} "
          + " ".join(f"{g[:8]:>8}" for g in GROUPS) + "   (breakdown: % of a profiled step)",
          flush=True)
    runs = {p: [] for p in precisions}
    with tempfile.TemporaryDirectory() as data:
        write_images(data, 4 * a.batch)
        for _ in range(a.repeat):
            for precision in precisions:
                r = measure(a, precision, data)
                runs[precision].append(r)
                print(json.dumps(r), flush=True)
                print(f"# {precision:<13} {r['images_per_s']:>9.1f} {r['ms_per_step']:>8.1f} "
                      f"{r['peak_rss_mib']:>7.0f} "
                      + " ".join(f"{r['breakdown_pct'][g]:>8.1f}" for g in GROUPS)
                      + f"   load {r['loadavg']:.2f}", flush=True)
    # The median run, as PyTorch's side runs each setting once (see the docstring); of an even
    # count the slower middle run, so the figure is a run's own (not a mean of two) and does not
    # lean mixtrain's way.
    results = [sorted(runs[p], key=lambda r: r["images_per_s"])[(len(runs[p]) - 1) // 2]
               for p in precisions]
    if a.repeat > 1:
        print(f"#\n# Median of {a.repeat} runs per precision (ms/step of every run in order)")
        for r in results:
            every = ", ".join(f"{x['ms_per_step']:.1f}" for x in runs[r["precision"]])
            print(f"# {r['precision']:<13} {r['images_per_s']:>9.1f} {r['ms_per_step']:>8.1f}"
                  f"   ({every})", flush=True)
    best = {} if a.no_torch else torch_results(a)
    if best:
        print(f"#\n# Side by side (mixtrain: the median of {a.repeat} run(s); PyTorch: one run "
              "per setting, its faster layout at its best OMP_WAIT_POLICY)")
        print(f"# {'prec':<13} {'torch img/s':>11} {'mixtrain':>9} {'ratio':>6} "
              f"{'torch RSS':>9} {'mixtrain':>8} {'ratio':>6}  torch setting")
        for r in results:
            candidates = [best[c] for c in TORCH_CONFIGS[r["precision"]] if c in best]
            if not candidates:
                continue
            t = max(candidates, key=lambda c: c["images_per_s"])
            print(f"# {r['precision']:<13} {t['images_per_s']:>11.1f} {r['images_per_s']:>9.1f} "
                  f"{r['images_per_s'] / t['images_per_s']:>5.2f}x {t['peak_rss_mib']:>9.0f} "
                  f"{r['peak_rss_mib']:>8.0f} {r['peak_rss_mib'] / t['peak_rss_mib']:>5.2f}x  "
                  f"{t['config']}, OMP_WAIT_POLICY {t['wait_policy']}")
            print(json.dumps({"kind": "side_by_side", "precision": r["precision"],
                              "torch": t, "mixtrain_images_per_s": r["images_per_s"],
                              "mixtrain_peak_rss_mib": r["peak_rss_mib"]}))
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
