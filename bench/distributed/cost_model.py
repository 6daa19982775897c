#!/usr/bin/env python3
"""Cost model of data-parallel training with a fixed global batch (mixtrain's semantics:
data.batch_size is the global batch), for N ranks at interconnect bandwidth B.

Per step, one rank computes T1/N (T1: the one-rank step at the global batch), of which a
fraction f_b is backward, and the gradients (S bytes, FP32) are all-reduced by a ring:
    T_ar(N) = 2 (N-1)/N * S / B + 2 (N-1) * alpha * buckets
Without overlap the step is T1/N + T_ar(N). With overlap (buckets started during backward) only
what backward cannot hide is exposed, and the last bucket never can:
    T(N) = T1/N + max(T_last, T_ar(N) - f_b * T1/N),  T_last = 2 (N-1)/N * cap / B
A model stops scaling where the exposed communication equals the compute left to each rank
(efficiency T1 / (N T(N)) = 50%). Without overlap that N is about T1 B / (2 S); with overlap it
moves out to about (1 + f_b) T1 B / (2 S).

    python3 bench/distributed/cost_model.py [BENCH_WORK_DIR]

With the work folder of bench/distributed/run.sh, it also checks the model against the 2-rank
wide-MLP measurement: the bandwidth is fitted from the run that communicates after backward, and
the overlapped run's blocked time is predicted from it.
"""
import json
import pathlib
import sys

ALPHA = 5e-6          # s per message hop (a typical InfiniBand/NVLink latency)
CAP = 25 * 2**20      # bytes per bucket (DDP's and mixtrain's default bucket_mb)
F_BACKWARD = 2 / 3    # backward's share of a step (two GEMMs of every three)

# The models: parameters, and the one-GPU step at the global batch. The step times are ASSUMED
# (FLOP counts at an assumed achieved rate), not measured: no GPU was lent for this issue.
MODELS = {
    # 1024-4096-4096-1024-10, batch 512: 25.2 M parameters, 6·P·batch FLOP a step.
    "wide MLP (batch 512)": (25.2e6, 6 * 25.2e6 * 512 / 300e12),
    # 25.6 M parameters; 4.1 GFLOP forward per 224² image, ×3 for forward + backward.
    "ResNet-50 (batch 256, 224²)": (25.6e6, 3 * 4.1e9 * 256 / 300e12),
    # 124 M parameters; 6·P·tokens, 512 sequences of 1024 tokens (llm.c's 0.5 M-token batch).
    "GPT-2 small (0.5 M tokens)": (124e6, 6 * 124e6 * 512 * 1024 / 300e12),
}
BANDWIDTHS = {"12.5 GB/s (100 Gb/s IB)": 12.5e9, "50 GB/s (400 Gb/s IB)": 50e9,
              "450 GB/s (NVLink 4)": 450e9}


def t_allreduce(n, size, bw, buckets):
    return 2 * (n - 1) / n * size / bw + 2 * (n - 1) * ALPHA * buckets


def step(n, t1, size, bw, overlap):
    buckets = max(1, -(-size // CAP))
    compute = t1 / n
    if n == 1:
        return compute
    comm = t_allreduce(n, size, bw, buckets)
    if not overlap:
        return compute + comm
    last = 2 * (n - 1) / n * min(CAP, size) / bw
    return compute + max(last, comm - F_BACKWARD * compute)


def stops_scaling(t1, size, bw, overlap):
    """The first N (a power of 2) whose efficiency falls below 50%."""
    n = 1
    while n < 1 << 20:
        n *= 2
        if t1 / (n * step(n, t1, size, bw, overlap)) < 0.5:
            return n
    return None


def main():
    print("Assumed one-GPU step times: 300 TFLOP/s achieved (bf16 on an H100-class GPU).")
    print()
    print("| model | parameters | T1 (assumed) | bandwidth | N at 50% efficiency, no overlap "
          "| with overlap | speedup at N=8 no overlap / overlap |")
    print("|---|---|---|---|---|---|---|")
    for name, (params, t1) in MODELS.items():
        size = 4 * params
        for bw_name, bw in BANDWIDTHS.items():
            s8 = [t1 / step(8, t1, size, bw, o) for o in (False, True)]
            print(f"| {name} | {params / 1e6:.1f} M | {t1 * 1e3:.1f} ms | {bw_name} | "
                  f"{stops_scaling(t1, size, bw, False)} | {stops_scaling(t1, size, bw, True)} | "
                  f"{s8[0]:.1f}× / {s8[1]:.1f}× |")
    if len(sys.argv) < 2:
        return
    work = pathlib.Path(sys.argv[1])
    load = lambda name: json.loads((work / name / "summary.json").read_text())
    serial, overlapped = load("mlp-2x1-serial"), load("mlp-2x1")
    steps = serial["steps"]
    size = 4 * serial["parameters"]
    waited = serial["distributed"]["allreduce_wait_seconds"] / steps
    bw = 2 * (2 - 1) / 2 * size / waited   # the serial run waits for the whole all-reduce
    # Compute per rank: the step time of the overlapped run less what it waited.
    t_rank = 1 / (overlapped["samples_per_s"] / (512)) - \
        overlapped["distributed"]["allreduce_wait_seconds"] / steps
    buckets = overlapped["distributed"]["buckets"]
    comm = t_allreduce(2, size, bw, buckets)
    last = 2 * (2 - 1) / 2 * min(CAP, size) / bw
    predicted = max(last, comm - F_BACKWARD * t_rank)
    measured = overlapped["distributed"]["allreduce_wait_seconds"] / steps
    print()
    print(f"Check on the 2-rank wide MLP ({work}): all-reduce of {size / 2**20:.0f} MiB took "
          f"{waited * 1e3:.0f} ms after backward, i.e. B = {bw / 1e9:.2f} GB/s (shared memory); "
          f"a rank computes {t_rank * 1e3:.0f} ms a step; the model predicts "
          f"{predicted * 1e3:.0f} ms blocked with overlap, measured {measured * 1e3:.0f} ms.")


if __name__ == "__main__":
    main()
