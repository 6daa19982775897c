#!/usr/bin/python3
"""Training throughput of the PyTorch reference ResNet-20 (tests/integration/resnet_reference.py)
on the CPU, in PyTorch 1.13 eager.

One training step = forward, cross-entropy, backward, SGD (lr 0.1, momentum 0.9, weight decay
5e-4 on convolution and linear weights, foreach=True) at batch --batch (128) of 3x32x32 images
(the reference's synthetic gratings), in four configurations:
  fp32       FP32, NCHW
  fp32-cl    FP32, channels_last (model and inputs)
  bf16       torch.autocast("cpu", bfloat16) around forward + loss, FP32 weights, NCHW
  bf16-cl    the same, channels_last
Each configuration runs in a fresh child process (so peak RSS, ru_maxrss, is its own) under each
OMP_WAIT_POLICY of --wait-policies (default: passive and active; "unset" leaves libgomp's
default), with torch.set_num_threads(--threads) and OMP_NUM_THREADS alike; the best policy per
configuration is reported. Per run: --warmup steps, then --steps timed steps; the step time is
their median, images/s = batch / that.

stdout: JSON lines (kind "machine", one "run" per child, one "best" per configuration) and a
readable table on lines starting with "# "; --json FILE writes {"machine", "runs", "best"} too.
Run it with Debian's interpreter (/usr/bin/python3: python3-torch 1.13).
"""
import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "..", "..", "tests", "integration", "resnet_reference.py")
CONFIGS = {  # name: (bf16, channels_last)
    "fp32": (False, False),
    "fp32-cl": (False, True),
    "bf16": (True, False),
    "bf16-cl": (True, True),
}
WAIT_POLICIES = ("unset", "passive", "active")


def load_reference():
    spec = importlib.util.spec_from_file_location("resnet_reference", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- child: one configuration under one wait policy ----------------------------------------

def child(s):
    import torch
    torch.set_num_threads(s["threads"])
    rr = load_reference()
    bf16, channels_last = CONFIGS[s["config"]]
    torch.manual_seed(0)
    model = rr.ResNet([3, 3, 3], [16, 32, 64], 10)
    model.init_weights("torchvision")
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    opt = rr.make_sgd(model, 0.1, 0.9, weight_decay=5e-4, foreach=True)
    B = s["batch"]
    x, y = rr.make_data(4 * B, 10, 32, 3, 0.2, 1, 0)
    x = torch.from_numpy(x)
    y = torch.from_numpy(y)
    batches = [(rr.to_layout(x[i * B:(i + 1) * B], channels_last), y[i * B:(i + 1) * B])
               for i in range(4)]
    for k in range(max(1, s["warmup"])):
        rr.train_step(model, opt, *batches[k % 4], bf16)
    times, loss = [], None
    for k in range(s["steps"]):
        t0 = time.perf_counter()
        loss = rr.train_step(model, opt, *batches[k % 4], bf16)
        times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    print(json.dumps({
        "kind": "run", **s,
        "ms_per_step": round(1e3 * step_s, 2),
        "images_per_s": round(B / step_s, 1),
        "step_ms": [round(1e3 * t, 2) for t in times],
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "final_loss": round(float(loss), 4),
        "loadavg": round(os.getloadavg()[0], 2),
    }))


# ---- parent --------------------------------------------------------------------------------

def run_child(s):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["OMP_NUM_THREADS"] = str(s["threads"])
    if s["wait_policy"] != "unset":
        env["OMP_WAIT_POLICY"] = s["wait_policy"].upper()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(s)],
                          env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"kind": "run", **s,
                "error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
    return json.loads(lines[-1])


def machine_info():
    info = {"kind": "machine", "cpus": os.cpu_count()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        lscpu = ""
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    info["cpu"] = fields.get("Model name", "?").strip()
    info["flags"] = {f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16",
                                             "amx_tile")}
    probe = subprocess.run(
        [sys.executable, "-c",
         "import torch, json; cfg = torch.__config__.show().splitlines(); print(json.dumps("
         "{'torch': torch.__version__, 'mkldnn': torch.backends.mkldnn.is_available(), "
         "'capability': [l.split(':')[1].strip() for l in cfg if 'CPU capability' in l]}))"],
        capture_output=True, text=True)
    try:
        t = json.loads(probe.stdout)
    except ValueError:
        sys.exit(f"torch_cnn_bench.py: {sys.executable} cannot import torch: "
                 f"{probe.stderr.strip()[-300:]} (use Debian's /usr/bin/python3)")
    info["torch"] = t["torch"]
    info["mkldnn"] = t["mkldnn"]
    info["aten_capability"] = (t["capability"] or [None])[0]
    info["omp_wait_policy_env"] = os.environ.get("OMP_WAIT_POLICY")
    info["loadavg"] = round(os.getloadavg()[0], 2)
    return info


def row(r):
    if "error" in r:
        return f"# {r['config']:<8} {r['wait_policy']:<8} ERROR {r['error']}"
    return (f"# {r['config']:<8} {r['wait_policy']:<8} {r['ms_per_step']:>8.1f} "
            f"{r['images_per_s']:>9.1f} {r['peak_rss_mib']:>8.0f} {r['loadavg']:>5.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma-separated: " + ", ".join(CONFIGS))
    ap.add_argument("--wait-policies", default="passive,active",
                    help="comma-separated OMP_WAIT_POLICY values: unset, passive, active")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="timed steps (the median is reported)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(json.loads(a.child))
        return
    configs = a.configs.split(",")
    policies = a.wait_policies.lower().split(",")
    bad = [c for c in configs if c not in CONFIGS] + [p for p in policies
                                                      if p not in WAIT_POLICIES]
    if bad:
        ap.error(f"unknown configuration / wait policy {bad}: configurations {list(CONFIGS)}, "
                 f"policies {list(WAIT_POLICIES)}")
    if a.threads < 1 or a.batch < 1 or a.steps < 1 or a.warmup < 0:
        ap.error("--threads, --batch and --steps must be >= 1, --warmup >= 0")

    info = machine_info()
    print(json.dumps(info), flush=True)
    f = info["flags"]
    print(f"# CPU: {info['cpu']} ({info['cpus']} CPUs); avx2 {f['avx2']}, avx512f {f['avx512f']}, "
          f"avx512_bf16 {f['avx512_bf16']}, amx_bf16 {f['amx_bf16']}, amx_tile {f['amx_tile']}")
    print(f"# torch {info['torch']} (oneDNN {'on' if info['mkldnn'] else 'off'}, ATen "
          f"{info['aten_capability']}); ResNet-20, batch {a.batch}, 3x32x32; threads {a.threads}; "
          f"warmup {a.warmup}, {a.steps} timed steps; load average {info['loadavg']:.2f}",
          flush=True)
    print(f"# {'config':<8} {'OMP wait':<8} {'ms/step':>8} {'images/s':>9} {'RSS MiB':>8} "
          f"{'load':>5}", flush=True)
    runs, best = [], []
    for config in configs:
        mine = []
        for policy in policies:
            r = run_child(dict(config=config, wait_policy=policy, threads=a.threads,
                               batch=a.batch, warmup=a.warmup, steps=a.steps))
            runs.append(r)
            mine.append(r)
            print(json.dumps(r), flush=True)
            print(row(r), flush=True)
        good = [r for r in mine if "error" not in r]
        if good:
            top = max(good, key=lambda r: r["images_per_s"])
            best.append({"kind": "best", "config": config, "wait_policy": top["wait_policy"],
                         "threads": a.threads, "batch": a.batch,
                         "ms_per_step": top["ms_per_step"], "images_per_s": top["images_per_s"],
                         "peak_rss_mib": top["peak_rss_mib"]})
            print(json.dumps(best[-1]), flush=True)
    print("#\n# Best OMP_WAIT_POLICY per configuration")
    print(f"# {'config':<8} {'OMP wait':<8} {'ms/step':>8} {'images/s':>9} {'RSS MiB':>8}")
    for b in best:
        print(f"# {b['config']:<8} {b['wait_policy']:<8} {b['ms_per_step']:>8.1f} "
              f"{b['images_per_s']:>9.1f} {b['peak_rss_mib']:>8.0f}")
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")
    if a.json:
        with open(a.json, "w") as out:
            json.dump({"machine": info, "runs": runs, "best": best}, out, indent=1)


if __name__ == "__main__":
    main()
