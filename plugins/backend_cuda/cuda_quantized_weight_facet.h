// CudaQuantizedWeight: the CUDA backend's QuantizedWeightFacet (sdk/backend_quantized_weight.h):
// QLoRA's NF4 base and the FP8 block formats' bases decoded on the device into the compute dtype,
// right before the GEMMs that read them (cuda_quantized_weight.cu).
//
// Contract (in addition to sdk/backend_quantized_weight.h)
// - Arguments: the SDK's shared checks (sdk/support/backend_argument_checks.h), so a bad call
//   reads as it does on the CPU backend; nothing is enqueued before they pass.
// - Each element is the SDK reference's value rounded once into out's dtype, bit for bit the CPU
//   backend's (cuda_quantized_weight_math.h; the conformance suite compares both with the SDK).
// - Enqueued on the backend's stream; a block-scaled weight's tensor scale is read there, on the
//   device (no host wait).
#pragma once

#include <cstdint>
#include <span>

#include "cuda_context.h"
#include "mixtrain/sdk/backend_quantized_weight.h"

namespace mixtrain::backend_cuda {

class CudaQuantizedWeight final : public sdk::QuantizedWeightFacet {
 public:
  explicit CudaQuantizedWeight(CudaContext& context) : context_(context) {}

  // The SDK's table, and dequantize_block_scaled into fp32 / bf16 / fp16 ({out}).
  bool supports(sdk::QuantizedWeightOp op, std::span<const sdk::DType> dtypes) const override;
  void dequantize_nf4(const void* codes, sdk::TensorView absmax, std::int64_t block,
                      sdk::TensorView out) override;
  void dequantize_block_scaled(const sdk::BlockScaledWeight& w, sdk::TensorView out) override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
