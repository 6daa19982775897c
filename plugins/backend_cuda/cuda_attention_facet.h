// CudaAttention: the CUDA backend's AttentionFacet (sdk/backend_attention.h): the head-layout
// permutes and the masked scaled softmax (cuda_attention.cu), whose GEMMs (QKᵀ, PV) are the GEMM
// facet's gemm_strided_batched, one cuBLASLt strided-batched GEMM each; and flash attention
// (1.1, 1.2), cuDNN's fused SDPA kernels (cuda_sdpa_graphs.h) reading q, k and v in place, in
// fp16 and bf16, where the build found the cuDNN frontend (MIXTRAIN_HAVE_CUDNN_FRONTEND; without
// it supports() answers no for the flash ops and the host runs the unfused path); and a decode
// step over a KV cache in one kernel of ours (1.3's flash_decode).
#pragma once

#include <span>
#include <string>

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

  bool supports(sdk::AttentionOp op, std::span<const sdk::DType> dtypes) const override;
  void flash_forward(sdk::TensorView qkv, const sdk::HeadLayout& layout, float scale,
                     sdk::TensorView out, sdk::TensorView lse) override;
  void flash_backward(sdk::TensorView qkv, sdk::TensorView out, sdk::TensorView dout,
                      sdk::TensorView lse, const sdk::HeadLayout& layout, float scale,
                      sdk::TensorView dqkv) override;
  // A kernel of ours (cuda_attention.cu), any storage floats, with or without cuDNN (1.3).
  void flash_decode(sdk::TensorView cache, const sdk::HeadLayout& layout, float scale,
                    sdk::TensorView out) override;
  // cuda_sdpa_rules.h's static rules, then whether cuDNN builds both graphs for the shape.
  std::string flash_refusal(const sdk::HeadLayout& layout, sdk::DType dtype) const override;

 private:
  CudaContext& context_;
};

}  // namespace mixtrain::backend_cuda
