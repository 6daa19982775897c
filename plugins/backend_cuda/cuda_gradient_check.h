// Launchers of the gradient-check facet's multi-tensor kernels (cuda_gradient_check.cu): fused
// unscale + finite check, sum of squares, first non-finite tensor, each over the whole tensor list
// in one launch (kernels::Chunk tables uploaded by the caller). Contract: cuda_kernel_types.h's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

struct TensorRef {
  void* data;
  std::int64_t numel;
  Elem type;
  int pad;
};

// found[0] = 1 when any element of any tensor is inf/NaN after g *= inv_scale (f32 tensors; at
// inv_scale == 1 the tensors are only read).
cudaError_t unscale_and_check(const TensorRef* tensors, const Chunk* chunks, int num_chunks,
                              float inv_scale, int* found, cudaStream_t stream);
// result[0] = sum of squares in double (partial: num_chunks doubles of scratch).
cudaError_t sum_of_squares(const TensorRef* tensors, const Chunk* chunks, int num_chunks,
                           double* partial, double* result, cudaStream_t stream);
// The device side of sdk::GradientStatus (same 16 bytes; the facet static_asserts the layout).
// deferred: 1 when a label or id error record was set, which also sets found (the update that
// reads the status must not apply gradients a bad input made meaningless).
struct StatusRecord {
  double sum_of_squares;
  int found_inf;
  int deferred;
};

// *status = {sum ? *sum : 0, found | label error | id error, label or id error}, one thread.
// label_flag / id_flag: the error records' flags, or nullptr when no such check ran.
cudaError_t write_status(const int* found, const double* sum, const int* label_flag,
                         const int* id_flag, StatusRecord* status, cudaStream_t stream);

// flags[t] = 1 when tensor t holds an inf/NaN (flags zeroed by the caller).
cudaError_t find_nonfinite(const TensorRef* tensors, const Chunk* chunks, int num_chunks,
                           int* flags, cudaStream_t stream);

// tally[0] += the values that are not zero, tally[1] += those of them with |x| <= threshold
// (element::underflow_flags); x is [n] fp32, tally two zeroed counters. Exact: integer sums.
cudaError_t count_underflow(const float* x, std::int64_t n, float threshold,
                            unsigned long long* tally, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
