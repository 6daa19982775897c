// AttentionFacet: the non-GEMM kernels of scaled dot-product attention — the head layout
// permutes and the (causal) scaled softmax, forward and backward, in FP32.
//
// Contract
// - A backend offers it as find_facet("attention") (nullptr: the backend has none).
// - The GEMMs of attention (QKᵀ and PV) are GemmFacet::gemm_strided_batched over the head-major
//   tensors [N·H, T, D] these permutes produce; this facet holds everything between them.
// - supports(op, dtypes) answers without running anything. dtypes: split_heads / merge_heads
//   {token-major, head-major} (fp32, bf16, fp16, either mix: the permute rounds once when the two
//   differ); softmax_forward / softmax_backward {fp32} (the softmax is FP32 whatever the policy,
//   as the mixed-precision recipes require).
// - Shapes are checked against the layout; a mismatch raises BackendError.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
// - 1.1 appended fused ("flash") attention, flash_forward / flash_backward: q, k, v read where the
//   QKV projection wrote them, no [T, T] tensor kept (only the row log-sum-exp). Their defaults
//   raise BackendError and the base supports() answers false for them, so only a backend that
//   overrides both offers them; the host calls them only when version() >= 1.1 and supports()
//   says yes, and otherwise runs the permutes, batched GEMMs and softmax above. dtypes:
//   flash_forward {qkv}, flash_backward {qkv, dout} (fp32, bf16, fp16); lse and the softmax math
//   are FP32.
// - 1.2 appended flash_refusal: the shapes (head dimension, sequence length) a backend's fused
//   kernel has no variant for, asked at plan time; the default refuses none. The host calls it
//   only when version() >= 1.2.
// - 1.3 appended flash_decode: a decode step's attention over a KV cache in one op, no scores
//   tensor. Refused by default (BackendError; supports() false); the host calls it only when
//   version() >= 1.3 and supports() says yes, and otherwise runs the unfused decode.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

// The two layouts of multi-head attention: token-major x [N, T, P, H, D] (what a linear layer
// produces: P = 3 interleaved parts q, k, v for the fused QKV projection, P = 1 for the context)
// and head-major y [P, N, H, T', D] (what the batched GEMMs read), where T' >= T is the head-major
// tensor's token capacity and token t of x is token `head_offset + t` of y. T' > T is a KV cache:
// decoding appends T new tokens at head_offset.
struct HeadLayout {
  std::int64_t batch = 1;        // N
  std::int64_t tokens = 1;       // T, tokens in the token-major tensor
  std::int64_t heads = 1;        // H
  std::int64_t head_dim = 1;     // D
  std::int64_t parts = 1;        // P
  std::int64_t head_tokens = 0;  // T'; 0 means T
  std::int64_t head_offset = 0;  // in [0, T' - T]
  std::int64_t capacity() const { return head_tokens == 0 ? tokens : head_tokens; }
};

enum class AttentionOp {
  split_heads,
  merge_heads,
  softmax_forward,
  softmax_backward,
  // 1.1
  flash_forward,   // {qkv}; out shares it
  flash_backward,  // {qkv, dout}; out shares qkv's, dqkv dout's
  // 1.3
  flash_decode,  // {cache, out}
};
MIXTRAIN_SDK_API std::string_view op_name(AttentionOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(AttentionOp op) noexcept;
constexpr std::uint16_t introduced_in(AttentionOp op) noexcept {
  return op == AttentionOp::flash_decode ? 3 : op >= AttentionOp::flash_forward ? 1 : 0;
}

// Scores of `batch` independent attention matrices [batch, rows, cols] (batch = N·H; rows are
// queries, cols keys). causal: query i sees keys j <= i + (cols - rows) (bottom-right aligned, so
// rows < cols is a decode step over a cache); every other probability is exactly 0.
struct SoftmaxShape {
  std::int64_t batch = 1, rows = 1, cols = 1;
  bool causal = true;
};

class MIXTRAIN_SDK_API AttentionFacet : public Facet {
 public:
  using Op = AttentionOp;
  static constexpr FacetVersion kVersion{1, 3};
  static constexpr std::string_view kName = "attention";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h) for the 1.0 ops, false for flash_forward and
  // flash_backward (a backend that implements them answers for them itself).
  virtual bool supports(AttentionOp op, std::span<const DType> dtypes) const;

  // y [P, N, H, T', D] rows [offset, offset + T) of each (p, n, h) = x [N, T, P, H, D]; the other
  // rows of y are left as they are.
  virtual void split_heads(TensorView x, const HeadLayout& layout, TensorView y) = 0;
  // x [N, T, P, H, D] = y [P, N, H, T', D] rows [offset, offset + T) (the inverse permute).
  virtual void merge_heads(TensorView y, const HeadLayout& layout, TensorView x) = 0;

  // probs = softmax(scale · scores) over each row, masked as `shape` says; fp32 both, [batch,
  // rows, cols]; probs may alias scores. A row with no visible key cannot occur under the causal
  // rule above (rows <= cols is required).
  virtual void softmax_forward(TensorView scores, const SoftmaxShape& shape, float scale,
                               TensorView probs) = 0;
  // dscores = scale · probs ∘ (dprobs − Σ_j dprobs ∘ probs) per row (the gradient w.r.t. the
  // unscaled scores); fp32, [batch, rows, cols]; dscores may alias dprobs. Masked entries come out
  // exactly 0 because their probs are.
  virtual void softmax_backward(TensorView probs, TensorView dprobs, const SoftmaxShape& shape,
                                float scale, TensorView dscores) = 0;

  // --- 1.1 ---------------------------------------------------------------------------------------
  // Causal attention in one op. qkv [N, T, 3, H, D] token-major (layout.parts == 3, head_tokens 0,
  // head_offset 0: the fused QKV projection's output as it is); query i sees keys j <= i.
  // out [N, T, H, D] in qkv's dtype = softmax(scale·q·kᵀ)·v, the scores and sums in FP32,
  // rounded once into out; a 16-bit qkv's Tensor Core kernel may also round the probabilities to
  // qkv's dtype before their product with v (and the backward the score gradient before its
  // products with q and k), as FlashAttention does: one more rounding per product, which the
  // conformance suite's bound allows;
  // lse fp32 [N, H, T] = log Σ_{j<=i} exp(scale·q_i·k_j) (natural log, the row max folded in),
  // all the backward keeps of the softmax. out and lse overlap nothing.
  // Default: BackendError (this backend does not offer flash attention).
  virtual void flash_forward(TensorView qkv, const HeadLayout& layout, float scale, TensorView out,
                             TensorView lse);
  // The gradient of flash_forward: dqkv [N, T, 3, H, D] in dout's dtype (dq, dk, dv interleaved
  // as in qkv), from qkv, out and lse as flash_forward left them and dout [N, T, H, D] (any
  // storage float). dqkv overlaps no input. Deterministic: the same inputs give the same bits on
  // every run, whatever the thread count (no atomics, no order that depends on scheduling).
  // Default: BackendError.
  virtual void flash_backward(TensorView qkv, TensorView out, TensorView dout, TensorView lse,
                              const HeadLayout& layout, float scale, TensorView dqkv);

  // --- 1.2 ---------------------------------------------------------------------------------------
  // Why flash_forward / flash_backward cannot take attention of `layout` (its tokens, heads and
  // head_dim; parts 3; batch 0, meaning any batch) with qkv and dout in `dtype`, or "" when they
  // can. The host asks once per attention node at plan time, after supports() said yes for the
  // dtypes, and runs the unfused path when the answer is not empty, logging it once: a head
  // dimension or sequence length the fused kernel has no variant for is a fallback, never an
  // error. May do one-time work (a backend may build its kernels' plans for the shape to know).
  // Default: "" (every layout the 1.1 ops accept).
  virtual std::string flash_refusal(const HeadLayout& layout, DType dtype) const;

  // --- 1.3 ---------------------------------------------------------------------------------------
  // A decode step in one op: one sequence's new queries at positions [start, start + rows) attend
  // causally (query i to keys j <= start + i) to a KV cache's first start + rows positions.
  // cache [3, 1, H, T', D] head-major as split_heads wrote it (layout: batch 1, parts 3, tokens =
  // rows, head_tokens = T' the cache's capacity, head_offset = start): q's rows [start, start +
  // rows), k's and v's rows [0, start + rows). out [1, rows, H, D] token-major, any storage float,
  // apart from the cache: softmax(scale·q·kᵀ)·v with the scores, probabilities and sums in FP32,
  // rounded once into out. Why: the unfused decode keeps a [H, rows, T'] score buffer per cache
  // and permutes the context back; this writes the output where the projection reads it.
  // Deterministic. supports({cache, out}); default: BackendError, and supports() false.
  virtual void flash_decode(TensorView cache, const HeadLayout& layout, float scale,
                            TensorView out);

 protected:
  ~AttentionFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
