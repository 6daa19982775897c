// CudaAttention: the head-layout permutes and the masked scaled softmax
// (cuda_attention.cu), whose GEMMs (QKᵀ, PV) are gemm_strided_batched, one cuBLASLt
// strided-batched GEMM each; flash attention through cuDNN's SDPA graphs (cuda_sdpa_graphs.h).
//
// Why cuDNN's SDPA rather than a kernel of our own: on Hopper its kernels use the warp-group MMA
// and the tensor memory accelerator (FlashAttention-3's design), which a hand-written
// FlashAttention-2 kernel on mma.sync does not reach, and its backward has a deterministic mode;
// it reads q, k, v and writes dq, dk, dv at any strides, so the QKV projection's output is read
// where it is (no permutes) and nothing [T, T] is kept. It takes fp16 and bf16 only; fp32 runs
// the unfused path, as it must keep FP32 products.
#include "cuda_attention_facet.h"

#include <cmath>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>

#include "cuda_access.h"
#include "cuda_attention.h"
#include "cuda_facet_checks.h"
#include "cuda_sdpa_rules.h"
#include "mixtrain/sdk/support/facet_registry.h"
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
#include "cuda_sdpa_graphs.h"
#endif

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

bool CudaAttention::supports(sdk::AttentionOp op, std::span<const sdk::DType> dtypes) const {
  // flash_decode is a kernel of ours (cuda_attention.cu), with or without cuDNN: {cache, out}
  // of any storage floats, as the table says.
  if (op == sdk::AttentionOp::flash_decode) return sdk::signature_accepts(op, dtypes);
  if (op != sdk::AttentionOp::flash_forward && op != sdk::AttentionOp::flash_backward)
    return sdk::AttentionFacet::supports(op, dtypes);
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
  // {qkv} or {qkv, dout}: one 16-bit dtype throughout (cuDNN's graph has one io type).
  const std::size_t want = op == sdk::AttentionOp::flash_forward ? 1 : 2;
  if (dtypes.size() != want || context_.sm < 80) return false;
  for (sdk::DType t : dtypes)
    if (t != dtypes[0] || (t != sdk::DType::bf16 && t != sdk::DType::fp16)) return false;
  return true;
#else
  return false;  // built without the cuDNN frontend
#endif
}

#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
namespace {

sdpa::Key sdpa_key(const sdk::HeadLayout& l, sdk::DType dtype, float scale, bool deterministic) {
  return {l.batch, l.tokens, l.heads, l.head_dim, dtype, scale, deterministic};
}

void require_aligned(const char* op, const char* name, const void* p) {
  if (reinterpret_cast<std::uintptr_t>(p) % 16 != 0)
    fail(op, std::string(name) + " is not 16-byte aligned, which cuDNN's flash attention needs",
         "pass whole tensors from the backend's allocator (they are 256-byte aligned)");
}

// What one flash call runs on: the cuDNN handle on the backend's stream, and cuDNN's workspace
// for the key's graphs (built on the key's first call), after the shape checks of the support
// matrix.
struct SdpaCall {
  cudnnHandle_t handle;
  void* workspace;
};
SdpaCall prepare_sdpa(CudaContext& context, const sdpa::Key& key, const char* op) {
  const std::string why = sdpa::static_refusal(key.tokens, key.head_dim, key.dtype, context.sm);
  if (!why.empty()) fail(op, why, "run the attention unfused (node option fused = false)");
  SdpaState& st = context.sdpa_state();
  cudnnHandle_t handle = st.handle.get(context.stream, op);
  const auto bytes = static_cast<std::size_t>(st.graphs.workspace_bytes(key, handle, op));
  // The plan-time probe (flash_refusal) built one sequence's graphs; the batch's workspace is
  // first known here, so running out of memory for it is an error that says what to change. The
  // words are made only when the workspace grows, not on every call.
  void* ws = nullptr;
  if (bytes > 0 && bytes <= st.workspace.capacity()) {
    ws = st.workspace.get(bytes, context.stream, op);
  } else if (bytes > 0) {
    const std::string buffer =
        "cuDNN's flash-attention workspace (batch " + std::to_string(key.batch) + " of " +
        std::to_string(key.tokens) + " tokens, " + std::to_string(key.heads) + " heads of " +
        std::to_string(key.head_dim) + (key.deterministic ? ", deterministic backward)" : ")");
    const std::string_view fix =
        key.deterministic
            ? "reduce the batch size, or set backend.cuda.deterministic_attention = false "
              "(cuDNN's faster kernels; resume is then no longer bit-exact)"
            : "reduce the batch size, or set model.fused_attention = false (the unfused "
              "attention)";
    ws = st.workspace.get(bytes, context.stream, op, buffer, fix);
  }
  context.account_buffers();
  return {handle, ws};
}

}  // namespace
#endif

void CudaAttention::flash_forward(TensorView qkv, const sdk::HeadLayout& layout, float scale,
                                  TensorView out, TensorView lse) {
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
  context_.activate();
  constexpr const char* op = "flash_forward";
  checks().flash_forward(qkv, layout, out, lse);
  if (layout.batch == 0 || layout.tokens == 0) return;
  require_aligned(op, "qkv", qkv.data);
  require_aligned(op, "out", out.data);
  const sdpa::Key key = sdpa_key(layout, qkv.dtype, scale, context_.deterministic_attention);
  const SdpaCall call = prepare_sdpa(context_, key, op);
  context_.sdpa->graphs.forward(key, call.handle, qkv.data, out.data, lse.as<float>(),
                                call.workspace, op);
#else
  sdk::AttentionFacet::flash_forward(qkv, layout, scale, out, lse);
#endif
}

void CudaAttention::flash_backward(TensorView qkv, TensorView out, TensorView dout, TensorView lse,
                                   const sdk::HeadLayout& layout, float scale, TensorView dqkv) {
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
  context_.activate();
  constexpr const char* op = "flash_backward";
  checks().flash_backward(qkv, out, dout, lse, layout, dqkv);
  if (layout.batch == 0 || layout.tokens == 0) return;
  if (dout.dtype != qkv.dtype)
    fail(op,
         "dout is " + std::string(sdk::dtype_name(dout.dtype)) + " but qkv is " +
             std::string(sdk::dtype_name(qkv.dtype)) + ": cuDNN's graph reads one dtype",
         "cast dout to qkv's dtype first (supports() answers no for mixed dtypes)");
  require_aligned(op, "qkv", qkv.data);
  require_aligned(op, "out", out.data);
  require_aligned(op, "dout", dout.data);
  require_aligned(op, "dqkv", dqkv.data);
  const sdpa::Key key = sdpa_key(layout, qkv.dtype, scale, context_.deterministic_attention);
  const SdpaCall call = prepare_sdpa(context_, key, op);
  context_.sdpa->graphs.backward(key, call.handle, qkv.data, out.data, dout.data,
                                 lse.as<const float>(), dqkv.data, call.workspace, op);
#else
  sdk::AttentionFacet::flash_backward(qkv, out, dout, lse, layout, scale, dqkv);
#endif
}

std::string CudaAttention::flash_refusal(const sdk::HeadLayout& layout, sdk::DType dtype) const {
#ifdef MIXTRAIN_HAVE_CUDNN_FRONTEND
  std::string why = sdpa::static_refusal(layout.tokens, layout.head_dim, dtype, context_.sm);
  if (!why.empty()) return why;
  // Whether cuDNN builds both graphs, for one sequence (batch 0): its kernels' limits are in the
  // sequence length and head shape, not the batch. The scale is the one the host uses, 1/√D.
  // A plan-time question: whatever fails here (cuDNN's handle, a graph) is a reason to run the
  // node unfused, never an error.
  constexpr const char* op = "flash_refusal";
  try {
    // The handle and the graphs are this device's, whichever device the caller's thread has.
    context_.activate();
    SdpaState& st = context_.sdpa_state();
    const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(layout.head_dim)));
    why = st.graphs.refusal(sdpa_key(layout, dtype, scale, context_.deterministic_attention),
                            st.handle.get(context_.stream, op));
  } catch (const std::exception& e) {
    return std::string("cuDNN could not be asked: ") + e.what();
  }
  return why.empty() ? why : "cuDNN declines its SDPA graphs: " + why;
#else
  (void)layout;
  (void)dtype;
  return "the CUDA backend was built without the cuDNN frontend";
#endif
}

void CudaAttention::flash_decode(TensorView cache, const sdk::HeadLayout& layout, float scale,
                                 TensorView out) {
  context_.activate();
  constexpr const char* op = "flash_decode";
  checks().flash_decode(cache, layout, out);
  check_cuda(
      kernels::flash_decode(cache.data, elem_of(cache.dtype), layout.heads, layout.capacity(),
                            layout.head_dim, layout.head_offset, layout.tokens, scale, out.data,
                            elem_of(out.dtype), context_.stream),
      op, "kernel launch");
}

// The backend makes one per CudaBackend over its context (sdk/support/facet_registry.h).
const sdk::FacetRegistration<CudaContext, sdk::AttentionFacet, CudaAttention> kCudaAttentionRegistration;

}  // namespace mixtrain::backend_cuda
