// CudaForeach: the CUDA backend's ForeachFacet (sdk/backend_foreach.h): in-place ops on lists
// of fp32 tensors, each call one multi-tensor launch of cuda_foreach.cu's kernel for the whole
// list.
#pragma once

#include <span>

#include "cuda_context.h"
#include "cuda_foreach.h"
#include "mixtrain/sdk/backend_foreach.h"

namespace mixtrain::backend_cuda {

class CudaForeach final : public sdk::ForeachFacet {
 public:
  explicit CudaForeach(CudaContext& context) : context_(context) {}

  void foreach_mul_scalar(std::span<const sdk::TensorView> self, float scalar) override;
  void foreach_mul(std::span<const sdk::TensorView> self,
                   std::span<const sdk::TensorView> other) override;
  void foreach_add_scalar(std::span<const sdk::TensorView> self, float scalar) override;
  void foreach_add(std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> other,
                   float alpha = 1.0f) override;
  void foreach_addcmul(std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> t1,
                       std::span<const sdk::TensorView> t2, float value = 1.0f) override;
  void foreach_sqrt(std::span<const sdk::TensorView> self) override;
  void foreach_sign(std::span<const sdk::TensorView> self) override;
  void foreach_lerp(std::span<const sdk::TensorView> self, std::span<const sdk::TensorView> end,
                    float weight) override;
  void foreach_clamp(std::span<const sdk::TensorView> self, float lo, float hi) override;

 private:
  // lists: how many of a, b the op reads.
  void launch(const char* op, kernels::ForeachKind kind, std::span<const sdk::TensorView> self,
              std::span<const sdk::TensorView> a, std::span<const sdk::TensorView> b, float s0,
              float s1, int lists);

  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
