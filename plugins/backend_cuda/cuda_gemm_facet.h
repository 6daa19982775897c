// CudaGemm: the CUDA backend's GemmFacet (sdk/backend_gemm.h): single and strided-batched GEMMs
// through the context's cuBLASLt engine (cuda_gemm.h), on Tensor Cores.
//
// Contract (in addition to sdk/backend_gemm.h)
// - supports() is the SDK's table narrowed to the A/B dtypes the device's capabilities() declare
//   (FP8 only on sm_89+).
// - gemm_strided_batched is one cuBLASLt strided-batched matmul where cuBLASLt takes the layouts
//   (GemmEngine::run_batched), else one GEMM per batch.
// - Scratch the engine grows is folded into the backend's memory statistics after each call.
#pragma once

#include <span>

#include "cuda_context.h"
#include "mixtrain/sdk/backend_gemm.h"

namespace mixtrain::backend_cuda {

class CudaGemm final : public sdk::GemmFacet {
 public:
  explicit CudaGemm(CudaContext& context) : context_(context) {}

  bool supports(sdk::GemmOp op, std::span<const sdk::DType> dtypes) const override;
  void gemm(const sdk::GemmArgs& args) override;
  void gemm_strided_batched(const sdk::GemmBatchedArgs& args) override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
