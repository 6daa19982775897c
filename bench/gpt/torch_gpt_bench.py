#!/usr/bin/python3
"""Training throughput of the PyTorch reference GPT (tests/integration/gpt_reference.py) on the CPU.

Two shapes, tiny (L=4, H=4, C=128, T=128, V=256, batch 16) and wide (L=4, H=8, C=512, T=256,
V=256, batch 8), each in FP32 and in bf16 autocast (FP32 master weights), AdamW. For each, the
PyTorch settings that matter on a CPU are swept and the best is reported:
  OMP_WAIT_POLICY      unset (libgomp's default) / PASSIVE / ACTIVE
  OPENBLAS_CORETYPE    unset (OpenBLAS's own detection) and every name this OpenBLAS accepts of
                       Haswell, SkylakeX, Zen (probed); FP32 only: under autocast every GEMM is
                       bf16 and runs on oneDNN, not OpenBLAS
  ATEN_CPU_CAPABILITY  unset (PyTorch's choice) / avx512 when the CPU and this build allow it:
                       the vectorised ATen kernels (softmax, layer norm, GELU, AdamW, casts)
  mkldnn               torch.backends.mkldnn.enabled on / off (bf16 only: the bf16 GEMM path)
  adamw_foreach        torch.optim.AdamW(foreach=False) (the reference's) / True
Threads are --threads (torch.set_num_threads, OMP_NUM_THREADS and OPENBLAS_NUM_THREADS alike).
Environment variables only take effect before torch loads, so every setting runs in a child
process of this script, which strips the swept variables from the environment it inherits.

--sweep greedy (default) varies one setting at a time from the all-defaults run, keeping each
change that was faster; --sweep grid runs every combination; --sweep none only the defaults.
--confirm N re-runs the defaults and the sweep's best N more times, interleaved, and both are
reported as the median of their runs (the machine may be shared: each run records the load
average; a best that does not hold up under --confirm is within the noise).

Per run: --warmup steps (at least one), then --windows timed windows of --steps-per-window
steps; tokens/s is the median window's. A setting whose warm-up says its steps would take more
than --budget seconds runs one shorter window instead ("shrunk" in its JSON). Peak RSS is the
child's ru_maxrss after the timed steps. Then --profile-steps steps under torch.profiler give the
step's breakdown by ops' self CPU time on the training thread: GEMMs (addmm/mm/bmm/matmul,
without the LM head's), attention softmax (with the causal mask), layer norm, GELU, LM head +
cross-entropy (its GEMMs, log_softmax, nll_loss), optimizer (everything under
Optimizer.step/zero_grad), casts/copies, other (the rest, Python included). The breakdown is of
profiled steps, whose overhead weighs most on the tiny shape.

stdout: JSON lines (kind "machine", "run", "best") and a readable table on lines that start with
"# ". Run it with Debian's interpreter (/usr/bin/python3: python3-torch 1.13).
"""
import argparse
import ctypes
import importlib.util
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = os.path.join(HERE, "..", "..", "tests", "integration", "gpt_reference.py")
TEXT = "/usr/share/common-licenses/GPL-3"
SHAPES = {  # n_layer, n_head, n_embd, block_size, vocab_size, batch
    "tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=256, batch=16),
    "wide": dict(n_layer=4, n_head=8, n_embd=512, block_size=256, vocab_size=256, batch=8),
}
SWEPT_ENV = ("OMP_WAIT_POLICY", "OPENBLAS_CORETYPE", "ATEN_CPU_CAPABILITY")
CORETYPE_CANDIDATES = ("Haswell", "SkylakeX", "Zen")
GROUPS = ("gemm", "softmax", "layernorm", "gelu", "head_ce", "optimizer", "casts", "other")
GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::baddbmm",
            "aten::addbmm", "aten::linear", "aten::mkldnn_matmul"}
OP_GROUPS = {
    "softmax": {"aten::softmax", "aten::_softmax", "aten::_softmax_backward_data",
                "aten::masked_fill", "aten::masked_fill_"},
    "layernorm": {"aten::layer_norm", "aten::native_layer_norm",
                  "aten::native_layer_norm_backward"},
    "gelu": {"aten::gelu", "aten::gelu_backward"},
    "head_ce": {"aten::cross_entropy_loss", "aten::log_softmax", "aten::_log_softmax",
                "aten::_log_softmax_backward_data", "aten::nll_loss", "aten::nll_loss_nd",
                "aten::nll_loss_forward", "aten::nll_loss_backward"},
    "casts": {"aten::to", "aten::_to_copy", "aten::copy_", "aten::clone", "aten::contiguous"},
}


def load_reference():
    spec = importlib.util.spec_from_file_location("gpt_reference", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- child: one run ------------------------------------------------------------------------

def event_group(e, head_dim, ambiguous_dims):
    a = e.cpu_parent
    while a is not None:
        if a.name.startswith("Optimizer."):
            return "optimizer"
        a = a.cpu_parent
    if e.name.startswith("Optimizer."):
        return "optimizer"
    if e.name in GEMM_OPS:
        dims = {d for shape in (e.input_shapes or []) for d in shape}
        return "head_ce" if head_dim in dims and head_dim not in ambiguous_dims else "gemm"
    for group, names in OP_GROUPS.items():
        if e.name in names:
            return group
    return None


def profile_steps(gr, model, opt, batches, bf16, shape):
    from torch.profiler import ProfilerActivity, profile, record_function
    B, T, C, H = shape["batch"], shape["block_size"], shape["n_embd"], shape["n_head"]
    # The LM head's GEMMs are told apart by the vocabulary dimension, unless another GEMM has it.
    ambiguous = {C, 3 * C, 4 * C, T, B * T, B * H, C // H}
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        for inputs, targets in batches:
            with record_function("train_step"):
                gr.train_step(model, opt, inputs, targets, bf16)
        wall = time.perf_counter() - t0
    events = list(prof.events())
    steps = [e for e in events if e.name == "train_step"]
    thread = steps[0].thread
    total = sum(e.cpu_time_total for e in steps)
    us = dict.fromkeys(GROUPS, 0.0)
    for e in events:
        if e.thread == thread:
            group = event_group(e, shape["vocab_size"], ambiguous)
            if group:
                us[group] += e.self_cpu_time_total
    us["other"] = max(0.0, total - sum(us.values()))
    return {
        "profiled_ms_per_step": 1e3 * wall / len(batches),
        "breakdown_pct": {g: round(100.0 * v / total, 1) for g, v in us.items()},
        "head_gemms_separated": shape["vocab_size"] not in ambiguous,
    }


def openblas_core():
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return None


def child(settings):
    import torch
    torch.set_num_threads(settings["threads"])
    torch.backends.mkldnn.enabled = settings["mkldnn"]
    gr = load_reference()
    shape = SHAPES[settings["shape"]]
    bf16 = settings["precision"] == "bf16"
    B, T = shape["batch"], shape["block_size"]
    torch.manual_seed(0)
    if settings["data"] == "text":
        with open(TEXT, "rb") as f:
            tokens = torch.tensor(list(f.read()), dtype=torch.int64)
    else:
        tokens = torch.randint(0, shape["vocab_size"], (64 * B * T,))
    model = gr.GPT(**{k: v for k, v in shape.items() if k != "batch"})
    model.init_weights(0)
    opt = gr.make_adamw(model, 3e-4, (0.9, 0.95), 1e-8, 0.1, foreach=settings["foreach"])
    step = 0

    def next_batch():
        nonlocal step
        step += 1
        return gr.training_batch(tokens, T, B, step - 1)

    t0 = time.perf_counter()
    for _ in range(max(1, settings["warmup"])):
        gr.train_step(model, opt, *next_batch(), bf16)
    # A setting far slower than the others (bf16 GEMMs without oneDNN) gets fewer steps.
    step_s = (time.perf_counter() - t0) / max(1, settings["warmup"])
    planned = settings["windows"] * settings["steps_per_window"] + settings["profile_steps"]
    shrunk = step_s * planned > settings["budget_s"]
    if shrunk:
        settings = dict(settings, windows=1, profile_steps=min(1, settings["profile_steps"]),
                        steps_per_window=max(1, int(settings["budget_s"] / step_s) - 1))
    windows = []
    loss = None
    for _ in range(settings["windows"]):
        batches = [next_batch() for _ in range(settings["steps_per_window"])]
        t0 = time.perf_counter()
        for inputs, targets in batches:
            loss = gr.train_step(model, opt, inputs, targets, bf16)
        windows.append(B * T * len(batches) / (time.perf_counter() - t0))
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tps = statistics.median(windows)
    out = {
        "kind": "run", **settings, "shrunk": shrunk,
        "tokens_per_s": round(tps, 1),
        "ms_per_step": round(1e3 * B * T / tps, 2),
        "window_tokens_per_s": [round(w, 1) for w in windows],
        "peak_rss_mib": round(peak_rss / 2**20, 1),
        "final_loss": round(float(loss), 4),
        "openblas_core": openblas_core(),
        "aten_capability": next((line.split(":")[1].strip()
                                 for line in torch.__config__.show().splitlines()
                                 if "CPU capability usage" in line), None),
        "loadavg": os.getloadavg()[0],
    }
    if settings["profile_steps"] > 0:
        batches = [next_batch() for _ in range(settings["profile_steps"])]
        out.update(profile_steps(gr, model, opt, batches, bf16, shape))
    print(json.dumps(out))


# ---- parent: the sweep ---------------------------------------------------------------------

def child_env(settings):
    env = {k: v for k, v in os.environ.items() if k not in SWEPT_ENV}
    env["OMP_NUM_THREADS"] = env["OPENBLAS_NUM_THREADS"] = str(settings["threads"])
    for k, v in settings["env"].items():
        if v is not None:
            env[k] = v
    return env


def run_child(settings):
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child",
                           json.dumps(settings)], env=child_env(settings), capture_output=True,
                          text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"kind": "run", **settings, "error": (proc.stderr.strip().splitlines() or
                                                     ["no output"])[-1]}
    return json.loads(lines[-1])


def probe(code, env_updates):
    env = {k: v for k, v in os.environ.items() if k not in SWEPT_ENV}
    env.update(env_updates)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return proc.stdout.strip(), proc.stderr


def machine_info():
    info = {"kind": "machine"}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except OSError:
        lscpu = ""
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    flags = set(fields.get("Flags", "").split())
    info["cpu"] = fields.get("Model name", "?").strip()
    info["cpus"] = os.cpu_count()
    info["flags"] = {f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16",
                                             "amx_tile")}
    code = ("import torch, json, ctypes\n"
            "maps = open('/proc/self/maps').read()\n"
            "libs = sorted({l.split()[-1] for l in maps.splitlines()\n"
            "               if 'blas' in l or 'dnnl' in l or 'gomp' in l})\n"
            "cfg = torch.__config__.show()\n"
            "print(json.dumps({'torch': torch.__version__, 'libs': libs, 'config': cfg}))")
    out, err = probe(code, {})
    try:
        t = json.loads(out)
    except ValueError:
        sys.exit(f"torch_gpt_bench.py: {sys.executable} cannot import torch: {err.strip()[-300:]}"
                 " (use Debian's /usr/bin/python3)")
    info["torch"] = t["torch"]
    info["libs"] = t["libs"]
    cfg = t["config"].splitlines()
    info["blas_info"] = next((s.split("BLAS_INFO=")[1].split(",")[0] for s in cfg
                              if "BLAS_INFO=" in s), None)
    info["onednn"] = next((s.strip(" -") for s in cfg if "MKL-DNN" in s), None)
    info["aten_capability_default"] = next((s.split(":")[1].strip() for s in cfg
                                            if "CPU capability usage" in s), None)
    info["openblas"] = any("openblas" in lib for lib in t["libs"])
    core_code = ("import ctypes; l = ctypes.CDLL('libopenblas.so.0'); "
                 "l.openblas_get_corename.restype = ctypes.c_char_p; "
                 "print(l.openblas_get_corename().decode())")
    if info["openblas"]:
        info["openblas_core_detected"] = probe(core_code, {})[0]
        accepted = []
        for name in CORETYPE_CANDIDATES:
            core, err = probe(core_code, {"OPENBLAS_CORETYPE": name, "OPENBLAS_VERBOSE": "2"})
            if "Core not found" not in err and core.lower() == name.lower():
                accepted.append(name)
        info["openblas_coretypes_accepted"] = accepted
    cap, _ = probe("import torch; print([l for l in torch.__config__.show().splitlines() "
                   "if 'capability' in l][0].split(':')[1].strip())",
                   {"ATEN_CPU_CAPABILITY": "avx512"})
    info["aten_avx512_available"] = cap == "AVX512"
    info["loadavg"] = os.getloadavg()[0]
    return info


def factors(info, precision):
    """(name, values) pairs; the first value is PyTorch's default."""
    out = [("omp_wait_policy", [None, "PASSIVE", "ACTIVE"])]
    if precision == "fp32" and info.get("openblas"):
        out.append(("openblas_coretype", [None] + info["openblas_coretypes_accepted"]))
    if info["aten_avx512_available"] and info["aten_capability_default"] != "AVX512":
        out.append(("aten_cpu_capability", [None, "avx512"]))
    if precision == "bf16":
        out.append(("mkldnn", [True, False]))
    out.append(("adamw_foreach", [False, True]))
    return out


ENV_OF = {"omp_wait_policy": "OMP_WAIT_POLICY", "openblas_coretype": "OPENBLAS_CORETYPE",
          "aten_cpu_capability": "ATEN_CPU_CAPABILITY"}


def settings_of(choice, base):
    s = dict(base, env={ENV_OF[k]: v for k, v in choice.items() if k in ENV_OF})
    s["mkldnn"] = choice.get("mkldnn", True)
    s["foreach"] = choice.get("adamw_foreach", False)
    return s


SHORT = {"omp_wait_policy": "wait", "openblas_coretype": "core", "aten_cpu_capability": "cap",
         "mkldnn": "mkldnn", "adamw_foreach": "foreach"}


def label(choice, defaults):
    diff = [f"{SHORT[k]}={choice[k]}" for k in defaults if choice[k] != defaults[k]]
    return " ".join(diff) or "defaults"


def median_tps(runs):
    good = [r["tokens_per_s"] for r in runs if "tokens_per_s" in r]
    return statistics.median(good) if good else 0.0


def sweep(info, shape, precision, a, emit):
    fs = factors(info, precision)
    defaults = {name: values[0] for name, values in fs}
    base = dict(shape=shape, precision=precision, threads=a.threads, data=a.data,
                warmup=a.warmup, windows=a.windows, steps_per_window=a.steps_per_window,
                profile_steps=a.profile_steps, budget_s=a.budget)
    runs = {}  # choice as a sorted tuple -> list of run results

    def key_of(choice):
        return tuple(sorted(choice.items()))

    def measure(choice):
        result = run_child(settings_of(choice, base))
        result["setting"] = label(choice, defaults)
        emit(result)
        runs.setdefault(key_of(choice), []).append(result)
        return median_tps(runs[key_of(choice)])

    best = dict(defaults)
    best_tps = measure(best)
    if a.sweep == "greedy":
        for name, values in fs:
            for value in values:
                if value == best[name]:
                    continue
                trial = dict(best, **{name: value})
                tps = measure(trial)
                if tps > best_tps:
                    best, best_tps = trial, tps
    elif a.sweep == "grid":
        for combo in itertools.product(*(values for _, values in fs)):
            trial = dict(zip(defaults, combo))
            if trial != defaults:
                tps = measure(trial)
                if tps > best_tps:
                    best, best_tps = trial, tps
    for _ in range(a.confirm):
        measure(defaults)
        if best != defaults:
            measure(best)
    best_runs = runs[key_of(best)]
    default_runs = runs[key_of(defaults)]
    last = [r for r in best_runs if "tokens_per_s" in r][-1:] or best_runs[-1:]
    # threads beside the choice (which holds only the swept settings), as the CNN bench's best
    # records carry it: mixtrain_gpt_bench.py sets a record only against a run of as many threads.
    return {"kind": "best", "shape": shape, "precision": precision, "threads": a.threads,
            "setting": label(best, defaults), "choice": best,
            "tokens_per_s": round(median_tps(best_runs), 1), "runs": len(best_runs),
            "default_tokens_per_s": round(median_tps(default_runs), 1),
            "default_runs": len(default_runs),
            "peak_rss_mib": last[0].get("peak_rss_mib"),
            "breakdown_pct": last[0].get("breakdown_pct")}


def row(r, width):
    if "error" in r:
        return f"# {r['shape']:<5} {r['precision']:<5} {r['setting']:<{width}} ERROR {r['error']}"
    b = r.get("breakdown_pct") or {}
    cells = " ".join(f"{b.get(g, 0):>6.1f}" for g in GROUPS)
    return (f"# {r['shape']:<5} {r['precision']:<5} {r['setting']:<{width}} "
            f"{r['tokens_per_s']:>9.0f} {r.get('ms_per_step', 0):>8.1f} "
            f"{r['peak_rss_mib']:>7.0f} {r.get('loadavg', 0):>5.2f} {cells}")


def header(width):
    groups = " ".join(f"{g[:6]:>6}" for g in GROUPS)
    return (f"# {'shape':<5} {'prec':<5} {'setting':<{width}} {'tokens/s':>9} {'ms/step':>8} "
            f"{'RSS MiB':>7} {'load':>5} {groups}   (breakdown: % of a profiled step)")


def parent(a):
    info = machine_info()
    print(json.dumps(info), flush=True)
    f = info["flags"]
    print(f"# CPU: {info['cpu']} ({info['cpus']} CPUs); avx2 {f['avx2']}, avx512f {f['avx512f']}, "
          f"avx512_bf16 {f['avx512_bf16']}, amx_bf16 {f['amx_bf16']}, amx_tile {f['amx_tile']}")
    print(f"# torch {info['torch']}; BLAS_INFO={info['blas_info']}; {info['onednn']}; ATen "
          f"capability {info['aten_capability_default']} by default"
          f"{', AVX512 selectable' if info['aten_avx512_available'] else ''}")
    if info.get("openblas"):
        print(f"# OpenBLAS core detected: {info['openblas_core_detected']}; OPENBLAS_CORETYPE "
              f"accepted of {', '.join(CORETYPE_CANDIDATES)}: "
              f"{', '.join(info['openblas_coretypes_accepted']) or 'none'}")
    print(f"# libraries: {' '.join(os.path.basename(p) for p in info['libs'])}")
    print(f"# threads {a.threads}, data {a.data}, sweep {a.sweep}, warmup {a.warmup}, "
          f"{a.windows} windows x {a.steps_per_window} steps, confirm {a.confirm}, "
          f"load average {info['loadavg']:.2f}", flush=True)
    width = 40
    print(header(width), flush=True)
    runs, bests = [], []

    def emit(r):
        runs.append(r)
        print(json.dumps(r), flush=True)
        print(row(r, width), flush=True)

    for shape in a.shapes:
        for precision in a.precisions:
            best = sweep(info, shape, precision, a, emit)
            bests.append(best)
            print(json.dumps(best), flush=True)
    print("#\n# Best per shape and precision (tokens/s: median over that setting's runs)")
    print(f"# {'shape':<5} {'prec':<5} {'defaults':>9} {'best':>9} {'gain':>6} {'RSS MiB':>7}  "
          f"setting")
    for b in bests:
        gain = b["tokens_per_s"] / b["default_tokens_per_s"] if b["default_tokens_per_s"] else 0
        print(f"# {b['shape']:<5} {b['precision']:<5} {b['default_tokens_per_s']:>9.0f} "
              f"{b['tokens_per_s']:>9.0f} {gain:>5.2f}x {b['peak_rss_mib'] or 0:>7.0f}  "
              f"{b['setting']}")
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default="tiny,wide", help="comma-separated: tiny, wide")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    ap.add_argument("--data", choices=["text", "random"], default="text",
                    help=f"text: the bytes of {TEXT} as tokens; random: uniform tokens")
    ap.add_argument("--sweep", choices=["greedy", "grid", "none"], default="greedy")
    ap.add_argument("--confirm", type=int, default=1,
                    help="extra interleaved runs of the defaults and the best")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--windows", type=int, default=3)
    ap.add_argument("--steps-per-window", type=int, default=3)
    ap.add_argument("--profile-steps", type=int, default=2, help="0: no breakdown")
    ap.add_argument("--budget", type=float, default=60.0,
                    help="seconds a run's timed and profiled steps may take, judged from the "
                         "warm-up; a slower setting runs one short window instead")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(json.loads(a.child))
        return
    a.shapes = a.shapes.split(",")
    a.precisions = a.precisions.split(",")
    bad = [s for s in a.shapes if s not in SHAPES] + [p for p in a.precisions
                                                      if p not in ("fp32", "bf16")]
    if bad:
        ap.error(f"unknown shape/precision {bad}: shapes are {list(SHAPES)}, precisions fp32, bf16")
    if a.threads < 1 or a.windows < 1 or a.steps_per_window < 1 or a.warmup < 0:
        ap.error("--threads, --windows and --steps-per-window must be >= 1, --warmup >= 0")
    if a.data == "text" and not os.path.exists(TEXT):
        ap.error(f"{TEXT} not found: use --data random")
    parent(a)


if __name__ == "__main__":
    main()
