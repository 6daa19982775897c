// The activations (ReLU, tanh-GELU) and their gradients over fp32 / bf16 / fp16 storage: oneDNN's
// eltwise primitives for GELU where they apply (cpu_eltwise.h), else (ReLU always) OpenMP loops
// over stack chunks converted with sdk/float_formats.h's bulk (vectorised, RNE) conversions.
// Parallel regions open only for tensors of at least kParallelMin elements (cpu_access.h).
#include "cpu_activation_kernels.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "cpu_access.h"
#include "cpu_eltwise.h"
#include "cpu_isa.h"
#include "cpu_typed_storage.h"

namespace mixtrain::backend_cpu {

using sdk::Activation;
using sdk::DType;
using sdk::TensorView;

namespace {

constexpr float kGeluK = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

inline float gelu(float x) {
  const float u = kGeluK * (x + kGeluC * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(u));
}

inline float gelu_grad(float x) {
  const float u = kGeluK * (x + kGeluC * x * x * x);
  const float t = std::tanh(u);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kGeluK * (1.0f + 3.0f * kGeluC * x * x);
}

// Σ over rows of x [rows, n]'s columns [c0, c0 + width) into acc (double, zeroed by the caller),
// each column's rows added in order: kColumnBlock doubles a block stay in registers while the
// rows stream past, and bf16 is decoded in the loop.
constexpr std::int64_t kColumnBlock = 64;

template <class T>
[[gnu::always_inline]] inline void column_block_sums(const T* x, std::int64_t rows, std::int64_t n,
                                                     std::int64_t c0, std::int64_t width,
                                                     double* acc) {
  if (width == kColumnBlock) {
    alignas(64) double a[kColumnBlock] = {};
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* row = x + r * n + c0;
#pragma omp simd
      for (std::int64_t j = 0; j < kColumnBlock; ++j) a[j] += load_as_float(row, j);
    }
    for (std::int64_t j = 0; j < kColumnBlock; ++j) acc[j] = a[j];
    return;
  }
  for (std::int64_t r = 0; r < rows; ++r) {
    const T* row = x + r * n + c0;
#pragma omp simd
    for (std::int64_t j = 0; j < width; ++j) acc[j] += load_as_float(row, j);
  }
}

MIXTRAIN_ISA_VARIANTS(column_block_sums)

}  // namespace

void apply_activation(const CpuContext& context, Activation act, TensorView x, TensorView y) {
  context.use_threads();
  checks().activation_args(x, y);
  const std::int64_t total = x.numel();
  // oneDNN runs GELU where it has a primitive, at every size, so its numbers never depend on the
  // tensor size; it refuses ReLU (cpu_eltwise.h), which the loop below runs keeping NaN, as
  // PyTorch does, memory-bound like oneDNN's.
  if (context.eltwise().try_forward(act, x, y)) return;
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float in_buf[kChunk];
    float out_buf[kChunk];
    const float* in = read_chunk(x, c0, len, in_buf);
    float* out = write_target(y, c0, out_buf);
    if (act == Activation::relu) {
#pragma omp simd
      for (std::int64_t i = 0; i < len; ++i) out[i] = in[i] < 0.0f ? 0.0f : in[i];  // NaN stays
    } else {
      for (std::int64_t i = 0; i < len; ++i) out[i] = gelu(in[i]);
    }
    commit_chunk(y, c0, len, out);
  }
}

void apply_activation_grad(const CpuContext& context, Activation act, TensorView x, TensorView dy,
                           TensorView dx) {
  context.use_threads();
  checks().activation_grad_args(x, dy, dx);
  const std::int64_t total = x.numel();
  if (context.eltwise().try_backward(act, x, dy, dx)) return;
#pragma omp parallel for schedule(static) if (parallel_worth(total))
  for (std::int64_t c0 = 0; c0 < total; c0 += kChunk) {
    const std::int64_t len = std::min(kChunk, total - c0);
    float x_buf[kChunk];
    float dy_buf[kChunk];
    float out_buf[kChunk];
    const float* xs = read_chunk(x, c0, len, x_buf);
    const float* g = read_chunk(dy, c0, len, dy_buf);
    float* out = write_target(dx, c0, out_buf);
    if (act == Activation::relu) {
      // dy where x > 0, else +0 (x NaN too), as a bit mask: branch-free, so it vectorises (a
      // compare-and-branch per element ran at ~2 ns/element on random signs).
#pragma omp simd
      for (std::int64_t i = 0; i < len; ++i) {
        const std::uint32_t keep = xs[i] > 0.0f ? 0xffffffffu : 0u;
        out[i] = std::bit_cast<float>(std::bit_cast<std::uint32_t>(g[i]) & keep);
      }
    } else {
      for (std::int64_t i = 0; i < len; ++i) out[i] = g[i] * gelu_grad(xs[i]);
    }
    commit_chunk(dx, c0, len, out);
  }
}

void apply_activation_grad_into(const CpuContext& context, Activation act, TensorView x,
                                TensorView z, TensorView c, float* decoded) {
  context.use_threads();
  const std::int64_t total = z.numel();
  float* zs = z.as<float>();
  for (std::int64_t b0 = 0; b0 < total; b0 += kEpilogueBlock) {
    const std::int64_t len = std::min(kEpilogueBlock, total - b0);
    const float* xs = x.dtype == DType::fp32 ? x.as<const float>() + b0 : decoded;
    if (x.dtype != DType::fp32) {
#pragma omp parallel for schedule(static) if (parallel_worth(len))
      for (std::int64_t c0 = 0; c0 < len; c0 += kDecodeChunk)
        decode_into(x, b0 + c0, std::min(kDecodeChunk, len - c0), decoded + c0);
    }
    const TensorView xb{const_cast<float*>(xs), DType::fp32, sdk::Shape{len}};
    const TensorView zb{zs + b0, DType::fp32, sdk::Shape{len}};
    apply_activation_grad(context, act, xb, zb, zb);
    if (c.data == z.data) continue;  // fp32 C is z itself
#pragma omp parallel for schedule(static) if (parallel_worth(len))
    for (std::int64_t c0 = 0; c0 < len; c0 += kDecodeChunk)
      commit_chunk(c, b0 + c0, std::min(kDecodeChunk, len - c0), zs + b0 + c0);
  }
}

void sum_columns(const CpuContext& context, TensorView x, std::int64_t rows, std::int64_t n,
                 float* sums, bool accumulate) {
  context.use_threads();
  if (typed_storage(x)) {
    // Blocks of kColumnBlock columns, each one thread's walk down the rows: the same sums, in the
    // same order, as the chunked loop below, at about 4x its rate (bench/RESULTS.md, session 66:
    // it read each row's 256 columns through a decoding call into a buffer, and its 256 double
    // sums lived in memory).
    with_typed(x, [&](auto* data) {
      const auto* xs = static_cast<const std::remove_pointer_t<decltype(data)>*>(data);
#pragma omp parallel for schedule(static) if (parallel_worth(rows * n))
      for (std::int64_t c0 = 0; c0 < n; c0 += kColumnBlock) {
        const std::int64_t width = std::min(kColumnBlock, n - c0);
        double acc[kColumnBlock] = {};
        column_block_sums_best(xs, rows, n, c0, width, acc);
        for (std::int64_t j = 0; j < width; ++j)
          sums[c0 + j] = static_cast<float>((accumulate ? sums[c0 + j] : 0.0) + acc[j]);
      }
    });
    return;
  }
  constexpr std::int64_t kBlock = 256;
#pragma omp parallel for schedule(static) if (parallel_worth(rows * n))
  for (std::int64_t c0 = 0; c0 < n; c0 += kBlock) {
    const std::int64_t len = std::min(kBlock, n - c0);
    double acc[kBlock] = {};
    float buf[kBlock];
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* row = read_chunk(x, r * n + c0, len, buf);
#pragma omp simd
      for (std::int64_t j = 0; j < len; ++j) acc[j] += row[j];
    }
    for (std::int64_t j = 0; j < len; ++j)
      sums[c0 + j] = static_cast<float>((accumulate ? sums[c0 + j] : 0.0) + acc[j]);
  }
}

}  // namespace mixtrain::backend_cpu
