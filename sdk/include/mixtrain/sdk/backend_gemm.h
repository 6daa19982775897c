// GemmFacet: matrix products on the backend's device, single and strided-batched.
//
// Contract
// - A backend offers it as find_facet("gemm") (nullptr: the backend has none).
// - supports(op, dtypes) answers for the operand dtypes {A, B, C} of one call, without running
//   anything; the host asks before the first step and runs only what was answered true.
// - Accumulation is FP32 whatever the storage dtypes; tensors are contiguous row-major views into
//   this backend's memory. A call the backend cannot run raises BackendError listing what it can.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods). 1.1 appended gemm_grouped (with a default: a loop of gemm).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class Activation { relu, gelu };  // gelu: tanh approximation, as GPT-2 / PyTorch 'tanh'

struct GemmOperand {
  TensorView view;  // stored [rows, cols]; op() transposes when `transpose`
  bool transpose = false;
  float scale_inv = 1.0f;  // fp8 only: real value = stored value * scale_inv
};

// z[m,n] = alpha * op(A)[m,k] · op(B)[k,n] + beta * C (+ bias[n] broadcast over rows);
// C = act(z) when `has_activation`, else z. A and B: fp32, tf32 (fp32 storage, inputs rounded
// to tf32), bf16, fp16, fp8_e4m3/e5m2 (either mix). Accumulation in FP32. C: fp32, bf16 or fp16;
// bias: fp32 [n] or empty.
// Activation epilogue: act runs on the FP32 z, before the single rounding into C's dtype (so a
// fused GEMM rounds once where GEMM + activation_forward rounds twice). `pre_activation`
// (optional, only with an activation): [m, n] in fp32, bf16 or fp16, receives z rounded to its
// dtype: the input activation_backward needs for gelu (relu's backward can use C itself, since
// relu(z) > 0 exactly where z > 0). It must not overlap C.
struct GemmArgs {
  GemmOperand a, b;
  TensorView c;
  float alpha = 1.0f;
  float beta = 0.0f;
  TensorView bias;
  DType compute = DType::fp32;  // tf32 asks for tf32 rounding of fp32 inputs
  bool has_activation = false;
  Activation activation = Activation::relu;  // read only when has_activation
  TensorView pre_activation;
};

// `batch` independent GEMMs C_i = alpha * op(A_i) · op(B_i) + beta * C_i, i in [0, batch).
// `gemm` describes batch 0 (views of one batch's [rows, cols], as for gemm()); batch i's operand
// starts `stride_*` elements after batch i-1's (cuBLAS's strided-batched layout; a stride of 0
// broadcasts one operand to every batch, e.g. a shared weight). No bias, activation or
// pre_activation: an attention score or context product has none. Output batches must not
// overlap (|stride_c| >= m*n).
struct GemmBatchedArgs {
  GemmArgs gemm;
  std::int64_t batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;  // in elements
};

enum class GemmOp {
  gemm,                  // {A, B, C}
  gemm_strided_batched,  // {A, B, C}
  // 1.1
  gemm_grouped,  // {A, B, C}, the same for every GEMM of the group
};
MIXTRAIN_SDK_API std::string_view op_name(GemmOp op) noexcept;
constexpr std::uint16_t introduced_in(GemmOp op) noexcept {
  return op == GemmOp::gemm_grouped ? 1 : 0;
}
MIXTRAIN_SDK_API OpSignature op_signature(GemmOp op) noexcept;

class MIXTRAIN_SDK_API GemmFacet : public Facet {
 public:
  using Op = GemmOp;
  static constexpr FacetVersion kVersion{1, 1};
  static constexpr std::string_view kName = "gemm";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // dtypes: {A, B, C} storage dtypes of the call (tf32 for a tf32-compute fp32 operand).
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(GemmOp op, std::span<const DType> dtypes) const;

  virtual void gemm(const GemmArgs& args) = 0;
  virtual void gemm_strided_batched(const GemmBatchedArgs& args) = 0;

  // --- 1.1 ---------------------------------------------------------------------------------------
  // Independent GEMMs of different shapes in one call (a grouped GEMM: a mixture's experts, a
  // batch of LoRA adapters), each group[i] as for gemm(), all of one {A, B, C} dtype triple; no
  // output may overlap another GEMM's operands. The default runs gemm() on each in order, so
  // every backend has it; a backend overrides it to launch the group at once.
  virtual void gemm_grouped(std::span<const GemmArgs> group);

 protected:
  ~GemmFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
