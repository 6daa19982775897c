"""numpy reference of core/include/mixtrain/core/precision/range_statistics.h.

usage: range_statistics_reference.py OUT.json TENSOR.f32...

Each TENSOR.f32 is raw little-endian float32. For each, prints (into OUT.json) what
measure_range() must compute: counts, amax, the smallest non-zero magnitude, the floor(log2|x|)
histogram, per format the values that flush to zero, land on a subnormal or saturate, unscaled
and with per-tensor scaling, the scale itself, and the fp16 loss-scale survival counts.

The formats are computed independently of mixtrain's encoders:
  fp16      numpy's float32 -> float16 conversion (round to nearest even, inf on overflow);
  bf16      round-to-nearest-even on the float32 bit pattern (add 0x7FFF plus the lowest kept
            bit, drop 16 bits); the exponent field all ones is an overflow;
  fp8       exact rounding of the value: |x| = q * 2^(e - m) with e = max(floor(log2|x|), emin),
            q rounded half to even by np.round in float64 (exact: a power-of-two division);
            above the largest finite value is an overflow.
"""
import json
import sys

import numpy as np

FLT_MIN = float(np.finfo(np.float32).tiny)
FLT_MAX = float(np.finfo(np.float32).max)

# name: (max finite, smallest normal exponent, mantissa bits)
FORMATS = {
    "fp16": (65504.0, -14, 10),
    "bf16": (float(np.float32(2.0 - 2.0**-7) * np.float32(2.0**127)), -126, 7),
    "fp8_e4m3": (448.0, -6, 3),
    "fp8_e5m2": (57344.0, -14, 2),
}
ORDER = ["fp16", "bf16", "fp8_e4m3", "fp8_e5m2"]


def magnitudes_fp16(x32):
    """|x| after storing x in fp16, as float64 (inf on overflow)."""
    with np.errstate(over="ignore"):
        return np.abs(x32.astype(np.float16).astype(np.float64))


def magnitudes_bf16(x32):
    bits = np.abs(x32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16).astype(np.uint32)
    overflow = (rounded >> 7) == 0xFF
    value = (rounded << 16).astype(np.uint32).view(np.float32).astype(np.float64)
    value[overflow] = np.inf
    return value


def magnitudes_fp8(x32, fmt):
    max_finite, emin, mbits = FORMATS[fmt]
    a = np.abs(x32.astype(np.float64))
    out = np.zeros_like(a)
    nz = a > 0
    _, e = np.frexp(a[nz])
    e = np.maximum(e - 1, emin)
    quantum = np.ldexp(1.0, e - mbits)
    out[nz] = np.round(a[nz] / quantum) * quantum
    out[out > max_finite] = np.inf
    return out


def stored_magnitudes(x32, fmt):
    if fmt == "fp16":
        return magnitudes_fp16(x32)
    if fmt == "bf16":
        return magnitudes_bf16(x32)
    return magnitudes_fp8(x32, fmt)


def classify(x32, fmt):
    max_finite, emin, _ = FORMATS[fmt]
    m = stored_magnitudes(x32, fmt)
    return {
        "flushed": int(np.sum(m == 0)),
        "subnormal": int(np.sum((m > 0) & (m < 2.0**emin))),
        "saturated": int(np.sum(m > max_finite)),
    }


def tensor_scale(amax, fmt):
    if not (amax > 0) or not np.isfinite(amax):
        return 1.0
    scale = FORMATS[fmt][0] / float(amax)
    if scale > FLT_MAX:
        return FLT_MAX
    if scale < FLT_MIN:
        return FLT_MIN
    return float(np.float32(scale))


def measure(x):
    finite = np.isfinite(x)
    nz = x[finite & (x != 0)]
    a = np.abs(nz)
    amax = float(a.max()) if a.size else 0.0
    out = {
        "count": int(x.size),
        "zeros": int(np.sum(finite & (x == 0))),
        "nonfinite": int(np.sum(~finite)),
        "nonzero": int(nz.size),
        "amax": amax,
        "min_nonzero": float(a.min()) if a.size else 0.0,
    }
    _, e = np.frexp(a.astype(np.float64))
    bins, counts = np.unique(e - 1, return_counts=True)
    out["histogram"] = {str(int(b)): int(c) for b, c in zip(bins, counts)}
    out["unscaled"], out["scaled"], out["scale"] = {}, {}, {}
    for fmt in ORDER:
        out["unscaled"][fmt] = classify(nz, fmt)
        s = tensor_scale(amax, fmt)
        out["scale"][fmt] = s
        with np.errstate(over="ignore", under="ignore"):
            scaled = (nz * np.float32(s)).astype(np.float32)
        out["scaled"][fmt] = classify(scaled, fmt)
    # The smallest power-of-two loss scale 2^k (k <= 24) at which each value survives fp16.
    first = np.full(a.shape, 25, dtype=np.int64)
    for k in range(24, -1, -1):
        with np.errstate(over="ignore"):
            survives = magnitudes_fp16((a * np.float32(2.0**k)).astype(np.float32)) > 0
        first[survives] = k
    out["fp16_scale_log2"] = [int(np.sum(first == k)) for k in range(26)]
    return out


def main():
    results = []
    for path in sys.argv[2:]:
        x = np.fromfile(path, dtype="<f4")
        results.append(measure(x))
    with open(sys.argv[1], "w") as f:
        json.dump({"numpy": np.__version__, "tensors": results}, f)


if __name__ == "__main__":
    main()
