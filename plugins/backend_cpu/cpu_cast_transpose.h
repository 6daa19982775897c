// The gemm facet's cast_transpose and cast_transpose_gradient on the CPU (cpu_cast_transpose.cpp,
// sdk/backend_gemm.h 1.6 and 1.7).
//
// Contract
// - args as BackendArgumentChecks::cast_transpose_shape checks them (it runs first). Every code is
//   the one CpuBackend::cast writes for the same element (the SDK's bulk encoder, the same scale,
//   saturation and amax rules), so out equals cast(src) and out_transposed its transpose, byte for
//   byte; the amax folds in as cast's does, NaN included.
// - Tiles of 64 x 64 elements, spread over the OpenMP team when the tensor is large enough.
// - cast_transpose_gradient is the three ops it fuses, one after the other: the activation facet's
//   gradient (apply_activation_grad) into a host buffer of src's dtype, its column sums
//   (sum_columns, the activation facet's bias_grad), then cast_transpose of it. So it is that
//   composition's bits by construction.
// - The gemm facet implements both ops but offers neither (supports() false): they are the
//   reference that host tests put behind a backend that does offer them.
#pragma once

#include "cpu_context.h"
#include "mixtrain/sdk/backend_gemm.h"

namespace mixtrain::backend_cpu {

void cast_transpose(CpuContext& context, const sdk::CastTransposeArgs& args);
void cast_transpose_gradient(CpuContext& context, const sdk::CastTransposeGradientArgs& args);

}  // namespace mixtrain::backend_cpu
