// CudaAttention: the head-layout permutes and the masked scaled softmax
// (cuda_attention.cu). Its GEMMs (QKᵀ, PV) are gemm_strided_batched, one cuBLASLt strided-batched
// GEMM each.
#include "cuda_attention_facet.h"
#include "mixtrain/sdk/support/facet_registry.h"
#include "cuda_access.h"
#include "cuda_attention.h"
#include "cuda_facet_checks.h"

namespace mixtrain::backend_cuda {

using sdk::TensorView;

namespace {

kernels::PermuteShape permute_shape(const sdk::HeadLayout& l) {
  return {l.batch, l.tokens, l.parts, l.heads, l.head_dim, l.capacity(), l.head_offset};
}

}  // namespace

void CudaAttention::split_heads(TensorView x, const sdk::HeadLayout& layout, TensorView y) {
  context_.activate();
  constexpr const char* op = "split_heads";
  checks().head_permute(op, x, layout, y);
  check_cuda(kernels::head_permute(x.data, elem_of(x.dtype), y.data, elem_of(y.dtype),
                                   permute_shape(layout), true, context_.stream),
             op, "kernel launch");
}

void CudaAttention::merge_heads(TensorView y, const sdk::HeadLayout& layout, TensorView x) {
  context_.activate();
  constexpr const char* op = "merge_heads";
  checks().head_permute(op, x, layout, y);
  check_cuda(kernels::head_permute(x.data, elem_of(x.dtype), y.data, elem_of(y.dtype),
                                   permute_shape(layout), false, context_.stream),
             op, "kernel launch");
}

void CudaAttention::softmax_forward(TensorView scores, const sdk::SoftmaxShape& shape, float scale,
                                    TensorView probs) {
  context_.activate();
  constexpr const char* op = "softmax_forward";
  check_softmax_forward(scores, shape, probs);
  check_cuda(kernels::softmax_forward(scores.as<const float>(), probs.as<float>(), shape.batch,
                                      shape.rows, shape.cols, shape.causal, scale, context_.stream),
             op, "kernel launch");
}

void CudaAttention::softmax_backward(TensorView probs, TensorView dprobs,
                                     const sdk::SoftmaxShape& shape, float scale,
                                     TensorView dscores) {
  context_.activate();
  constexpr const char* op = "softmax_backward";
  check_softmax_backward(probs, dprobs, shape, dscores);
  check_cuda(kernels::softmax_backward(probs.as<const float>(), dprobs.as<const float>(),
                                       dscores.as<float>(), shape.batch, shape.rows, shape.cols,
                                       shape.causal, scale, context_.stream),
             op, "kernel launch");
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::AttentionFacet, CudaAttention> kCudaAttentionRegistration;

}  // namespace mixtrain::backend_cuda
