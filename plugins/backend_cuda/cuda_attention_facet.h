// CudaAttention: the CUDA backend's AttentionFacet (sdk/backend_attention.h): the head-layout
// permutes and the masked scaled softmax (cuda_attention.cu). Its GEMMs (QKᵀ, PV) are the GEMM
// facet's gemm_strided_batched, one cuBLASLt strided-batched GEMM each.
#pragma once

#include "cuda_context.h"
#include "mixtrain/sdk/backend_attention.h"

namespace mixtrain::backend_cuda {

class CudaAttention final : public sdk::AttentionFacet {
 public:
  explicit CudaAttention(CudaContext& context) : context_(context) {}

  void split_heads(sdk::TensorView x, const sdk::HeadLayout& layout, sdk::TensorView y) override;
  void merge_heads(sdk::TensorView y, const sdk::HeadLayout& layout, sdk::TensorView x) override;
  void softmax_forward(sdk::TensorView scores, const sdk::SoftmaxShape& shape, float scale,
                       sdk::TensorView probs) override;
  void softmax_backward(sdk::TensorView probs, sdk::TensorView dprobs,
                        const sdk::SoftmaxShape& shape, float scale,
                        sdk::TensorView dscores) override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
