// CudaQuantizedWeight: NF4 and block-scaled frozen weights decoded on the device
// (cuda_quantized_weight.cu), after the SDK's shared argument checks.
#include "cuda_quantized_weight_facet.h"

#include "cuda_access.h"
#include "cuda_quantized_weight.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/facet_registry.h"
#include "mixtrain/sdk/support/nf4.h"

namespace mixtrain::backend_cuda {

using sdk::DType;
using sdk::TensorView;

bool CudaQuantizedWeight::supports(sdk::QuantizedWeightOp op, std::span<const DType> dtypes) const {
  if (op != sdk::QuantizedWeightOp::dequantize_block_scaled)
    return QuantizedWeightFacet::supports(op, dtypes);
  return dtypes.size() == 1 && sdk::is_storage_float(dtypes[0]);
}

void CudaQuantizedWeight::dequantize_nf4(const void* codes, TensorView absmax, std::int64_t block,
                                         TensorView out) {
  const std::int64_t n = checks().dequantize_nf4(codes, absmax, block, out);
  context_.activate();
  check_cuda(kernels::dequantize_nf4(static_cast<const std::uint8_t*>(codes),
                                     absmax.as<const float>(), block, n, sdk::kNf4Codebook,
                                     out.data, elem_of(out.dtype), context_.stream),
             "dequantize_nf4", "kernel launch");
}

void CudaQuantizedWeight::dequantize_block_scaled(const sdk::BlockScaledWeight& w, TensorView out) {
  const auto grid = checks().dequantize_block_scaled(w, out);
  kernels::BlockScaledSource source;
  source.codes = w.codes.as<const std::uint8_t>();
  source.element = quantized::element_of(w.layout.element);
  source.scales = w.scales.data;
  source.scale = quantized::scale_code_of(w.layout.scale);
  source.grid_cols = grid.cols;
  source.block_rows = w.layout.block_rows;
  source.block_cols = w.layout.block_cols;
  source.tensor_scale = w.layout.tensor_scale ? w.tensor_scale.as<const float>() : nullptr;
  context_.activate();
  check_cuda(kernels::dequantize_block_scaled(source, out.shape[0], out.shape[1], out.data,
                                              elem_of(out.dtype), context_.stream),
             "dequantize_block_scaled", "kernel launch");
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::QuantizedWeightFacet, CudaQuantizedWeight>
    kCudaQuantizedWeightRegistration;

}  // namespace mixtrain::backend_cuda
