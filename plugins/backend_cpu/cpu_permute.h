// The convolution facet's image permutes (cpu_permute.cpp): the bodies of ConvolutionFacet's
// to_channels_last (to_last) and to_channels_first (sdk/backend_convolution.h).
//
// Contract
// - src and dst hold N images of channels x height x width in any two storage dtypes (fp32,
//   bf16, fp16); each value is rounded once when they differ. `op` names the call in errors
//   (sdk::BackendError). Scratch lives in context.prims() and is accounted before returning.
#pragma once

#include <cstdint>
#include <string_view>

#include "cpu_context.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::backend_cpu {

void permute_channels(CpuContext& context, std::string_view op, sdk::TensorView src,
                      std::int64_t channels, std::int64_t height, std::int64_t width,
                      sdk::TensorView dst, bool to_last);

}  // namespace mixtrain::backend_cpu
