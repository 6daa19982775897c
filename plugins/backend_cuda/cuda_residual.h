// Launchers of the residual join's kernels (cuda_residual.cu); plain C++ like every launcher header
// (cuda_kernel_types.h).
//
// Contract: enqueues on `stream` only, validates nothing (the backend did), returns the launch
// status. y = Σ inputs in FP32, in input order (((x1 + x2) + x3) + ...), then the optional ReLU,
// rounded once into y's dtype: element::residual_output, bit for bit the CPU backend's add(). The
// backward masks dy where y is not positive (element::residual_grad, the CPU's add_backward bit
// for bit) and rounds it once into each gradient.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

// Up to kResidualInputs tensors summed by one launch (passed by value as a kernel argument).
inline constexpr int kResidualInputs = 8;
struct ResidualInputs {
  const void* data[kResidualInputs];
  Elem type[kResidualInputs];
  int count;
};

// y[n] = residual_output(x_0 + x_1 + ... + x_{count-1}, relu) in y's dtype; y may be one of the
// inputs (each element is read before it is written, by the same thread).
cudaError_t residual_add(const ResidualInputs& xs, bool relu, void* y, Elem yt, std::int64_t n,
                         cudaStream_t stream);

// Up to kResidualInputs gradients written by one launch of add_backward's kernel.
struct ResidualGrads {
  void* data[kResidualInputs];
  Elem type[kResidualInputs];
  int count;
};

// add_backward: every dxs.data[k][n] = residual_grad(dy, y, relu) rounded once into its own
// dtype, from one read of dy (and of y when relu; y may be nullptr otherwise). One gradient may
// be dy itself (same dtype): the thread that writes an element has read it first.
cudaError_t residual_add_backward(const void* dy, Elem dyt, const void* y, Elem yt, bool relu,
                                  const ResidualGrads& dxs, std::int64_t n, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
