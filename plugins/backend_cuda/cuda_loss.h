// Launchers of the loss facet's kernels (cuda_loss.cu): softmax cross-entropy with the labels
// checked on the device. Contract: cuda_kernel_types.h's; the log-sum-exp and the loss in double
// as the CPU reference.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda_kernel_types.h"

namespace mixtrain::backend_cuda::kernels {

// Validates labels into `error` (first bad row), then, unless one was bad, writes loss[0] (mean
// cross-entropy against targets smoothed by label_smoothing), correct[0] (nullable) and dlogits
// (nullable). row_loss: rows doubles, row_ok: rows ints of scratch. `code` (nonzero, another per
// call) claims the record: the first failing call of those queued before the host reads it keeps
// its row, label and class count; a later call writes nothing once the record holds an error.
cudaError_t softmax_cross_entropy(const void* logits, Elem lt, const std::int32_t* labels,
                                  float grad_scale, float label_smoothing, float* loss,
                                  std::int32_t* correct, void* dlogits, Elem dt, std::int64_t rows,
                                  std::int64_t classes, double* row_loss, int* row_ok, int code,
                                  ErrorRecord* error, cudaStream_t stream);

}  // namespace mixtrain::backend_cuda::kernels
