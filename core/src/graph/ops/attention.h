// Causal multi-head self-attention: the part between the fused QKV projection and the output
// projection (both are linear nodes), as GPT-2 computes it.
//
// Contract
// - Input qkv [N, T, 3C] (q, k, v in that order, each [H, D] with C = H·D, as a fused c_attn
//   linear produces them); output [N, T, C] = concat over heads of softmax(q·kᵀ/√D, causal)·v.
// - Two paths, chosen once by choose_kernels() (before the memory plans, which then keep what
//   the chosen backward reads; allocate() without it chooses too):
//   - flash (the default): the attention facet's flash_forward / flash_backward (facet 1.1) read
//     qkv where the QKV projection wrote it and write the context token-major; the softmax is FP32
//     and only its row log-sum-exp (fp32 [N, H, T]) is kept. Saved for backward: the input qkv
//     and the output themselves (traits: backward reads both) and the lse; no [T, T] tensor.
//     The unfused path keeps neither (its own head-major copies instead).
//     Taken when `fused` (the node option, default true), the facet is 1.1 or later and supports
//     both ops on the GEMM dtype, and the activations are stored in that dtype. An input of
//     another dtype is cast into scratch; an input gradient of another dtype than dy is written
//     in dy's and cast (as is a dy the backend refuses, into the planned gradient dtype). An FP32
//     dy (a gradient sum) into a 16-bit input gradient of qkv's dtype is rounded into that dtype
//     first: the 16-bit kernel writes dx itself (an FP32 dx keeps dy as it is).
//   - unfused (`fused = false`, or any condition above unmet, logged once per run with the
//     reason): split_heads permutes qkv into head-major q, k, v [N·H, T, D] in the GEMM dtype;
//     the scores q·kᵀ and the context P·v are strided-batched GEMMs; the softmax (forward and
//     backward) is FP32 whatever the policy (the scores come out of their GEMM in FP32 and the
//     probabilities are kept in FP32 for the backward; P is rounded to the GEMM dtype only as
//     the operand of P·v). Saved for backward: q, k, v head-major and P.
// - Precision: the op's two GEMMs ("scores", "context") multiply activations only, so an FP8
//   policy leaves them in its 16-bit base (Transformer Engine does the same).
// - Decoding (KV cache, `mixtrain sample`): make_decode_state(capacity) makes the cache of one
//   sequence, k and v of every position decoded so far, which the Decoder owns; each
//   decode_forward takes rows = new tokens at positions [start, start + rows) and attends to the
//   cache's first start + rows positions. Where the node is fused and the backend's attention
//   facet has flash_decode (1.3) for the cache's and output's dtypes (choose_kernels), in that
//   one op: no scores, no permute back, and the cache is all the state holds. Otherwise by the
//   unfused method, with the cache's own score scratch under the flash path (sized for its
//   capacity). Training forward and backward work as ever in between.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "mixtrain/core/graph/layer.h"

namespace mixtrain::core {

class AttentionLayer final : public Layer {
 public:
  AttentionLayer(std::string name, std::int64_t tokens, std::int64_t width, std::int64_t heads,
                 bool fused = true);
  std::int64_t heads() const { return heads_; }
  // Whether choose_kernels() chose the flash path (see the contract).
  bool flash() const { return flash_; }
  void choose_kernels(sdk::DeviceBackend& backend) override;
  std::vector<BackendNeed> backend_needs(sdk::DType input) const override;
  void allocate(const std::shared_ptr<sdk::DeviceBackend>& backend, std::int64_t max_rows) override;
  void forward(sdk::TensorView x, std::int64_t rows) override;
  void backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx,
                std::int64_t rows) override;

  std::unique_ptr<DecodeState> make_decode_state(std::int64_t capacity) const override;
  void decode_forward(std::span<const sdk::TensorView> xs, std::int64_t start, std::int64_t rows,
                      DecodeState* state) override;

 private:
  sdk::DType gemm_dtype() const;
  // Why the flash path cannot run under this plan on `backend`'s facets; empty when it can.
  std::string unfused_reason(sdk::DeviceBackend& backend) const;
  void flash_forward(sdk::TensorView x, std::int64_t rows);
  void flash_backward(sdk::TensorView x, sdk::TensorView dy, sdk::TensorView dx, std::int64_t rows);

  std::int64_t tokens_, heads_, head_dim_;
  float scale_;
  bool fused_;          // the node option: flash when the backend and the plan allow it
  bool flash_ = false;  // what choose_kernels() chose
  bool flash_decode_ = false;  // decode_forward in one op (choose_kernels)
  bool chosen_ = false;  // choose_kernels() ran since the last allocate()
  Tensor lse_;          // flash: fp32 [N, H, T]
  Tensor x_cast_;       // flash: qkv cast into the GEMM dtype, when its producer stores another
  Tensor dy_cast_;      // flash: dy cast into the planned gradient dtype, or dx's (flash_backward)
  Tensor dx_scratch_;   // flash: dqkv in dout's dtype, when dx is stored in another
  Tensor qkv_heads_;   // [3, N, H, T, D] in the GEMM dtype
  Tensor probs_;       // fp32 [N·H, T, T]
  Tensor probs_gemm_;  // [N·H, T, T] in the GEMM dtype (P, then dS, as GEMM operands)
  // Whether probs_gemm_ holds the last forward's P: a backward leaves dS there, and a second
  // backward of the same forward (the underflow measurement's, then the step's) casts P again
  // from probs_, which no backward writes.
  bool probs_gemm_holds_p_ = false;
  Tensor context_;     // [N, H, T, D] in the activation dtype (forward), the GEMM dtype (dO)
  Tensor dprobs_;      // fp32 [N·H, T, T]
  Tensor dqkv_heads_;  // [3, N, H, T, D] in the input gradient's dtype
};

}  // namespace mixtrain::core
