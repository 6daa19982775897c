// The gemm facet's cast_transpose on the CPU (cpu_cast_transpose.cpp, sdk/backend_gemm.h 1.6).
//
// Contract
// - args as BackendArgumentChecks::cast_transpose_shape checks them (it runs first). Every code is
//   the one CpuBackend::cast writes for the same element (the SDK's bulk encoder, the same scale,
//   saturation and amax rules), so out equals cast(src) and out_transposed its transpose, byte for
//   byte; the amax folds in as cast's does, NaN included.
// - Tiles of 64 x 64 elements, spread over the OpenMP team when the tensor is large enough.
// - The gemm facet implements the op with it but does not offer it (supports() false): it is the
//   reference that host tests put behind a backend that does offer it.
#pragma once

#include "cpu_context.h"
#include "mixtrain/sdk/backend_gemm.h"

namespace mixtrain::backend_cpu {

void cast_transpose(CpuContext& context, const sdk::CastTransposeArgs& args);

}  // namespace mixtrain::backend_cpu
