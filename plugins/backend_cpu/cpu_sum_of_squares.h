// sum_of_squares: Σ x² in double over a list of storage-dtype tensors (fp32, bf16, fp16), each
// element decoded exactly; what the gradient check reports and CpuBackend's diagnostic returns.
// OpenMP over pieces (cpu_pieces.h); throws sdk::BackendError for a tensor of another dtype.
#pragma once

#include <span>

#include "cpu_context.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

double sum_of_squares(const CpuContext& context, std::span<const sdk::TensorView> tensors);

}  // namespace mixtrain::backend_cpu
