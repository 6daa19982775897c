// Launchers of the batch norm facet's kernels (cuda_batch_norm.cu), over channels-last [rows, C].
//
// Contract: cuda_kernel_types.h's (enqueue only, no validation, cudaError_t for the caller; storage
// tags fp32 / bf16 / fp16). Per-element math is cuda_element_math.h's. Every reduction has a fixed
// partition and order (no atomics): results are bit-reproducible run to run.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

// Per-channel sums of a [rows, C] pass: fixed row splits (a function of rows only), double
// accumulators per thread, a fixed tree per block, splits summed in order.
std::size_t bn_partial_doubles(std::int64_t rows, std::int64_t channels);

struct BnForward {
  const void* x;
  void* y;
  // Nullable: [rows, C] of t added to the normalised value in FP32 before the ReLU, the sum
  // rounded once (batch norm + add + ReLU); may be y (each element is read, then written, by one
  // thread).
  const void* residual;
  Elem t;
  const float* gamma;  // nullable (not affine: 1 and beta 0)
  const float* beta;
  float eps;
  bool relu;
  std::int64_t rows, channels;
};
// Batch statistics (one pass over x, sums of x - x[0, c] and its square in double), save_mean /
// save_var (biased), running stats (nullable) moved by `momentum` with the unbiased variance,
// scale_shift [2C] (the workspace or scratch), then y (with a.residual when given).
cudaError_t bn_forward_training(const BnForward& a, float momentum, float* save_mean,
                                float* save_var, float* running_mean, float* running_var,
                                float* scale_shift, double* partial, cudaStream_t stream);
// y (with a.residual when given) from the running statistics; scale_shift: scratch of 2C floats.
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
// Statistics: mean and biased var [C] of x (a.y, a.residual, a.gamma, a.beta unused);
// scale_shift: scratch of 2C floats.
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
