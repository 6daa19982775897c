// CudaOptimizer: the CUDA backend's OptimizerFacet (sdk/backend_optimizer_updates.h): fused SGD
// and AdamW steps over every parameter in one multi-tensor launch, bit for bit the CPU
// reference's per-element steps (cuda_element_math.h); AdamW's bias corrections in double on the
// host, as the CPU (and PyTorch) computes them.
#pragma once

#include <span>

#include "cuda_context.h"
#include "cuda_optimizer.h"
#include "mixtrain/sdk/backend_optimizer_updates.h"

namespace mixtrain::backend_cuda {

class CudaOptimizer final : public sdk::OptimizerFacet {
 public:
  explicit CudaOptimizer(CudaContext& context) : context_(context) {}

  void sgd_update(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> params) override;
  void adamw_update(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> params) override;
  void sgd_update_gated(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> params,
                        const sdk::UpdateGate& gate) override;
  void adamw_update_gated(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> params,
                          const sdk::UpdateGate& gate) override;

 private:
  // The launches behind the plain and gated calls (gate.status == nullptr: plain).
  void sgd(const sdk::SgdHyper& h, std::span<const sdk::ParamTensors> params,
           const kernels::UpdateGate& gate, const char* op);
  void adamw(const sdk::AdamWHyper& h, std::span<const sdk::ParamTensors> params,
             const kernels::UpdateGate& gate, const char* op);

  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
