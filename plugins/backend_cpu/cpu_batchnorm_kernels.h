// The per-channel kernels of the CPU backend's batch norm over channels-last activations.
//
// Contract
// - x, y, dy, dx are [rows, C] (rows = N·H·W of [N, H, W, C] images), T = float (fp32 storage),
//   Bf16Bits (bf16 storage: the value's top 16 bits, decoded exactly, outputs rounded once RNE,
//   NaNs quieted: cpu_bf16_bits.h) or Fp16Bits (IEEE fp16 storage, decoded exactly, outputs
//   rounded once RNE: the SDK's conversions). A 16-bit type's results are the fp32 kernel's on the
//   decoded inputs, each output rounded once, bit for bit. Per-channel vectors are fp32 [C],
//   caller-owned. fp16 takes four chunks of fp32 scratch a thread (about 64 KiB each, one
//   16-row block where that is larger; freed on return), never a copy of a whole tensor.
// - Statistics are computed in FP32 within blocks of rows (about 2048 elements, at least 16 rows:
//   block mean, then the block's sum of squared deviations from it) and merged in double across
//   blocks and threads (Chan et al.'s pairwise update): one pass over memory, no E[x²] − E[x]²
//   cancellation.
// - The backward's sums (channel_grad_sums) accumulate g and g·(x − mean) in double from the
//   stored values, the difference included: a channel whose sums cancel keeps its digits
//   (docs/model-graph.md, batch norm's reductions).
// - Results depend on the thread count (the merge order), as oneDNN's do; for one thread count
//   they are deterministic.
// - The fused ReLU's mask is recomputed, not stored: v = (x − mean)·scale + shift is computed by
//   the same fma in the forward and the backward, so the backward sees v > 0 exactly where the
//   forward did. The forward's scale and shift per channel are what the backward needs for it
//   (the training forward leaves them in the caller's workspace).
// - OpenMP over contiguous row ranges with the calling thread's team size; small tensors run on
//   the calling thread (parallel_worth). Each kernel is compiled for x86-64-v4 (AVX-512),
//   x86-64-v3 (AVX2 + FMA) and the baseline; cpuid picks one at the first call.
// - The loops ask for the lines they will read about 2 KiB ahead (the tensors come from memory in
//   training); a prefetch changes no value, and one past a tensor's end never faults.
#pragma once

#include <cstdint>

#include "cpu_bf16_bits.h"

namespace mixtrain::backend_cpu {

// fp16 storage codes (IEEE binary16): a type of its own, as Bf16Bits is uint16_t.
enum class Fp16Bits : std::uint16_t {};

// mean[c] and var[c] (biased: the sum of squared deviations / rows) of x [rows, C].
template <class T>
void channel_moments(const T* x, std::int64_t rows, std::int64_t channels, float* mean, float* var);

// y = (x − mean)·scale + shift per channel, then max(0, ·) when `relu`; y may be x.
template <class T>
void channel_affine(const T* x, T* y, std::int64_t rows, std::int64_t channels, const float* mean,
                    const float* scale, const float* shift, bool relu);

// y = (x − mean)·scale + shift + residual per channel, then max(0, ·) when `relu`: the affine
// value is never rounded, the sum rounded once into y (batch norm + add + ReLU); y may be the
// residual (each element is read before it is written), not x.
template <class T>
void channel_affine_add(const T* x, const T* residual, T* y, std::int64_t rows,
                        std::int64_t channels, const float* mean, const float* scale,
                        const float* shift, bool relu);

// Which elements of dy pass the fused ReLU's backward.
struct ReluMask {
  enum class Kind { none, recompute, from_y } kind = Kind::none;
  const float* scale = nullptr;  // recompute: the forward's scale and shift, with its mean
  const float* shift = nullptr;
  const void* y = nullptr;  // from_y: the forward's output (y > 0), x's element type
};

// g = dy masked by `mask`; sum_g[c] = Σ g, sum_gx[c] = Σ g·(x − mean) over the rows (double).
template <class T>
void channel_grad_sums(const T* x, const T* dy, const ReluMask& mask, std::int64_t rows,
                       std::int64_t channels, const float* mean, double* sum_g, double* sum_gx);

// dx = a·g + b·(x − mean) + d per channel, g = dy masked by `mask`; dx may be dy.
template <class T>
void channel_grad_input(const T* x, const T* dy, const ReluMask& mask, T* dx, std::int64_t rows,
                        std::int64_t channels, const float* mean, const float* a, const float* b,
                        const float* d);

}  // namespace mixtrain::backend_cpu
