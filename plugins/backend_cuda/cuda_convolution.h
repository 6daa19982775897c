// Launchers of the convolution facet's kernels: the convolution's helpers around cuDNN
// (cuda_conv_kernels.cu), pooling and the channels-first / channels-last permutes
// (cuda_pooling.cu).
//
// Contract: cuda_kernel_types.h's (enqueue only, no validation, cudaError_t for the caller; storage
// tags fp32 / bf16 / fp16). Per-element math is cuda_element_math.h's. Every reduction has a fixed
// partition and order (no atomics): results are bit-reproducible run to run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

// --- around cuDNN (cuda_conv_kernels.cu) -------------------------------------------------------
// dst [K, R, S, C] (dt) = src [K, C, R, S] (st): the channels-last copy of PyTorch's weights, each
// value decoded exactly and encoded once.
cudaError_t filter_to_krsc(const void* src, Elem st, void* dst, Elem dt, std::int64_t k,
                           std::int64_t c, std::int64_t r, std::int64_t s, cudaStream_t stream);
// dw [K, C, R, S] fp32 = (accumulate ? dw : 0) + src, src (st: fp32, or the 16-bit dw cuDNN
// wrote under conv_wgrad_in_operand_dtype, decoded exactly) in KRSC order (krsc) or KCRS.
cudaError_t filter_gradient_from(const void* src, Elem st, bool krsc, float* dw, std::int64_t k,
                                 std::int64_t c, std::int64_t r, std::int64_t s, bool accumulate,
                                 cudaStream_t stream);
// y [rows, n] = encode(acc + bias[col]) in y's dtype (bias nullable): one rounding.
cudaError_t finish_output(const float* acc, const float* bias, void* y, Elem yt, std::int64_t rows,
                          std::int64_t n, cudaStream_t stream);

// --- pooling and permutes (cuda_pooling.cu) -----------------------------------------------------
struct PoolShape {
  std::int64_t n, c, h, w, oh, ow;
  int kh, kw, sh, sw, ph, pw;
  bool max, include_pad;
};
// Whether every index the pooling kernels form fits in 32 bits: they then run on 32-bit index
// math (a 64-bit division is several times a 32-bit one, and each element takes several).
bool pool_index_fits(const PoolShape& p);
// The max pool's argmax element: one byte where a window has at most 255 positions (kh * kw; the
// index 255 then marks a window with no element in the image), else int32. ResNet-50's 3x3 pool
// kept 98 MiB of int32 indices through the step (session 58's memory table): 24.5 in bytes.
__host__ __device__ inline bool pool_argmax_in_bytes(std::int64_t kh, std::int64_t kw) {
  return kh * kw <= 255;
}
// y = pool(x); argmax (nullable, max only): the window-relative index kh*KW + kw of each output's
// first maximum, [N, OH, OW, C] of pool_argmax_in_bytes' element.
cudaError_t pool_forward(const PoolShape& p, const void* x, Elem t, void* y, void* argmax,
                         cudaStream_t stream);
// dx (overwritten) gathers, per input element, dy of every window it belongs to (max: only where
// it is that window's argmax, read from `argmax` or recomputed from x), in window order, summed
// in fp32 and rounded once into t (x's and dx's). dy is t, or fp32 (dyt).
cudaError_t pool_backward(const PoolShape& p, const void* dy, Elem dyt, const void* x,
                          const void* argmax, void* dx, Elem t, cudaStream_t stream);
// Each of `images` matrices [rows, cols] of src becomes [cols, rows] in dst, converted once.
// Through 32 x 32 shared-memory tiles; a side of at most kShortSide (an RGB image's channels) by
// one thread per element of the other side instead.
inline constexpr std::int64_t kShortSide = 8;
cudaError_t permute_images(const void* src, Elem st, void* dst, Elem dt, std::int64_t images,
                           std::int64_t rows, std::int64_t cols, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
