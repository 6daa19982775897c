// Host-callable launchers of the image and batch-norm kernels: pooling and the channels-first /
// channels-last permutes (cuda_pooling.cu), the convolution's helpers around cuDNN
// (cuda_conv_kernels.cu), and batch norm (cuda_batch_norm.cu).
//
// Contract: as cuda_kernels.h's launchers (enqueue only, no validation, cudaError_t for the
// caller; storage tags fp32 / bf16 / fp16, anything else launches nothing and returns
// cudaErrorInvalidValue). Per-element math is cuda_element_math.h's. Every reduction has a fixed
// partition and order (no atomics): results are bit-reproducible run to run. Plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda_kernels.h"

namespace mixtrain::backend_cuda::kernels {

// --- convolution helpers
// --------------------------------------------------------------------------- dst [K, R, S, C] (dt)
// = src [K, C, R, S] (st): the channels-last copy of PyTorch's weights, each value decoded exactly
// and encoded once.
cudaError_t filter_to_krsc(const void* src, Elem st, void* dst, Elem dt, std::int64_t k,
                           std::int64_t c, std::int64_t r, std::int64_t s, cudaStream_t stream);
// dw [K, C, R, S] = (accumulate ? dw : 0) + src, src fp32 in KRSC order (krsc) or KCRS.
cudaError_t filter_from_fp32(const float* src, bool krsc, float* dw, std::int64_t k, std::int64_t c,
                             std::int64_t r, std::int64_t s, bool accumulate, cudaStream_t stream);
// y [rows, n] = encode(acc + bias[col]) in y's dtype (bias nullable): one rounding.
cudaError_t finish_output(const float* acc, const float* bias, void* y, Elem yt, std::int64_t rows,
                          std::int64_t n, cudaStream_t stream);

// --- pooling and permutes
// ----------------------------------------------------------------------------
struct PoolShape {
  std::int64_t n, c, h, w, oh, ow;
  int kh, kw, sh, sw, ph, pw;
  bool max, include_pad;
};
// y = pool(x); argmax (nullable, max only): the window-relative index kh*KW + kw of each output's
// first maximum, int32 [N, OH, OW, C].
cudaError_t pool_forward(const PoolShape& p, const void* x, Elem t, void* y, std::int32_t* argmax,
                         cudaStream_t stream);
// dx (overwritten) gathers, per input element, dy of every window it belongs to (max: only where
// it is that window's argmax, read from `argmax` or recomputed from x), in window order.
cudaError_t pool_backward(const PoolShape& p, const void* dy, const void* x,
                          const std::int32_t* argmax, void* dx, Elem t, cudaStream_t stream);
// Each of `images` matrices [rows, cols] of src becomes [cols, rows] in dst, converted once.
cudaError_t permute_images(const void* src, Elem st, void* dst, Elem dt, std::int64_t images,
                           std::int64_t rows, std::int64_t cols, cudaStream_t stream);

// --- batch norm over [rows, C]
// ----------------------------------------------------------------------- Per-channel sums of a
// [rows, C] pass: fixed row splits (a function of rows only), double accumulators per thread, a
// fixed tree per block, splits summed in order.
std::size_t bn_partial_doubles(std::int64_t rows, std::int64_t channels);

struct BnForward {
  const void* x;
  void* y;
  Elem t;
  const float* gamma;  // nullable (not affine: 1 and beta 0)
  const float* beta;
  float eps;
  bool relu;
  std::int64_t rows, channels;
};
// Batch statistics (one pass over x, sums of x - x[0, c] and its square in double), save_mean /
// save_var (biased), running stats (nullable) moved by `momentum` with the unbiased variance,
// scale_shift [2C] (the workspace or scratch), then y.
cudaError_t bn_forward_training(const BnForward& a, float momentum, float* save_mean,
                                float* save_var, float* running_mean, float* running_var,
                                float* scale_shift, double* partial, cudaStream_t stream);
// y from the running statistics; scale_shift: scratch of 2C floats.
cudaError_t bn_forward_inference(const BnForward& a, const float* running_mean,
                                 const float* running_var, float* scale_shift, cudaStream_t stream);

struct BnBackward {
  const void* dy;
  const void* x;
  const void* y;  // mask == 2
  void* dx;
  Elem t;
  const float* gamma;  // nullable
  const float* save_mean;
  const float* save_var;
  const float* scale_shift;  // mask == 1: the training forward's [2C]
  int mask;                  // 0 none, 1 recompute from x with scale_shift, 2 where y > 0
  float eps;
  std::int64_t rows, channels;
};
// dgamma / dbeta (nullable) written or accumulated, dx overwritten. coeff: scratch of 3C floats.
cudaError_t bn_backward(const BnBackward& a, float* dgamma, float* dbeta, bool accumulate,
                        float* coeff, double* partial, cudaStream_t stream);

// Synchronized batch norm's split ops (BatchNormFacet v2), the fused ops' kernels reused.
// Statistics: mean and biased var [C] of x (a.y, a.gamma, a.beta unused); scale_shift: scratch of
// 2C floats.
cudaError_t bn_statistics(const BnForward& a, float* mean, float* var, float* scale_shift,
                          double* partial, cudaStream_t stream);
// Σ g and Σ g·x_hat [C] (overwritten) with a.save_mean / a.save_var the given statistics, a.mask 0
// or 2 (y); coeff: scratch of 3C floats.
cudaError_t bn_backward_reduce(const BnBackward& a, float* sum_g, float* sum_gx_hat, float* coeff,
                               double* partial, cudaStream_t stream);
// dx from the global means of g and g·x_hat; coeff: scratch of 3C floats.
cudaError_t bn_backward_elementwise(const BnBackward& a, const float* mean_g,
                                    const float* mean_gx_hat, float* coeff, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
