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
//   1.2 appended the block-scaled ops, quantize_block_scaled and gemm_block_scaled, with the
//   types they take; their defaults refuse (supports() false, the call a BackendError), so only a
//   backend that implements them offers them, and the host refuses a block-scaled plan on any
//   other at plan time, naming the node. 1.3 appended block_layout_refusal, which narrows them to
//   the layouts a backend runs on its device (default: every layout). 1.4 appended
//   quantizes_transposed: quantize outputs stored as the transpose of their source, which the
//   host asks for only from a backend that says it takes them (default: none). 1.5 appended
//   gemm_gradient, a GEMM of a backward pass with the epilogues that pass needs (an activation's
//   gradient, bias gradients); its default refuses like the block-scaled ops'. 1.6 appended
//   cast_transpose, an FP8 operand cast that also writes the transpose; its default refuses
//   likewise, and the host then casts and lets the GEMM transpose what it needs. 1.7 appended
//   cast_transpose_gradient, that cast for a backward pass's gradient with the bias-gradient sum
//   and gelu's gradient folded in; its default refuses likewise, and the host then runs
//   activation_backward, bias_grad and cast_transpose apart.
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "mixtrain/sdk/device_backend.h"
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
// fused GEMM rounds once where GEMM + activation_forward rounds twice); relu(z) = z < 0 ? 0 : z,
// so a NaN stays NaN (a non-finite step must stay visible to the gradient checks), as in
// activation_forward. `pre_activation`
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

// --- 1.2: block-scaled operands ------------------------------------------------------------------
// Element and scale encodings of a block-scaled tensor; their exact definitions and the host
// reference quantizer are support/block_scaling.h's.
enum class BlockElement : std::uint8_t { e4m3, e5m2, e2m1 };

// How each block's scale is chosen and stored.
enum class BlockScale : std::uint8_t {
  fp32,           // fp32, s = max_elem / amax (FP8 block scaling)
  fp32_pow2,      // fp32, s rounded down to a power of two
  e8m0,           // E8M0, the OCP MX rule (floor)
  e8m0_round_up,  // E8M0, the smallest power of two that saturates nothing
  e4m3,           // E4M3, NVFP4's rule
};

struct BlockScaledLayout {
  BlockElement element = BlockElement::e4m3;
  BlockScale scale = BlockScale::fp32;
  std::int64_t block_rows = 1;    // block extent along dim 0
  std::int64_t block_cols = 128;  // along dim 1, the contiguous one
  bool tensor_scale = false;      // NVFP4's second level; e4m3 scales only

  bool operator==(const BlockScaledLayout&) const = default;
};

// Which dimension of a row-major operand a GEMM reduces over.
enum class ReductionAxis : std::uint8_t { cols, rows };

// A block-scaled tensor in the backend's memory, stored [rows, cols] row-major as its source was.
// codes: one element code per byte (view dtype fp8_e4m3 as 1-byte storage whatever the element;
// E2M1 in the low nibble); scales: fp32 [ceil(rows / block_rows), ceil(cols / block_cols)], each
// block's decode scale as a value (E8M0 and E4M3 scales decode exactly to fp32); tensor_scale: fp32
// [1], the per-tensor decode scale when layout.tensor_scale, else empty (read as 1).
// `transpose` is op() as for GemmOperand: the GEMM reads the transpose of the stored tensor.
struct BlockScaledOperand {
  TensorView codes;
  TensorView scales;
  TensorView tensor_scale;
  BlockScaledLayout layout;
  bool transpose = false;
};

// Quantizes src [rows, cols] (fp32, bf16 or fp16) into each output with codes.data != nullptr, all
// read in one pass over src (a backend may fuse them with the cast): output 0 typically with its
// blocks along one GEMM's reduction dim, output 1 along the other dim for the GEMM that reduces
// over it (the transposed use). Each output's codes/scales/tensor_scale views must fit its layout
// and src's shape; the values written are exactly support/block_scaling.h's
// quantize_block_scaled(). With `stochastic_rounding`, elements round stochastically with
// random_bits(seed, r·cols + c), the same bits on every backend.
// An output with `transpose` (gemm facet 1.4, only to a backend whose quantizes_transposed() is
// true) holds srcᵀ quantized: codes [cols, rows] row-major, its layout and scales those of srcᵀ's
// dims, each element's stochastic bits still keyed by its index r·cols + c in src. It is exactly
// the transpose of src quantized under the transposed layout, so a GEMM that wants an operand's
// reduction dim contiguous reads it in place instead of transposing its codes (Transformer
// Engine's fused cast + transpose).
struct BlockQuantizeArgs {
  TensorView src;
  BlockScaledOperand outputs[2];
  bool stochastic_rounding = false;
  std::uint64_t seed = 0;
};

// C = alpha · Σ_k op(A)[m,k] · op(B)[k,n] · tensor scales + beta · C (+ bias[n]), C fp32, bf16 or
// fp16, bias fp32 [n] or empty, with the activation epilogue of GemmArgs. Both operands must block
// the reduction dim k alike: their block extent along k is equal (B), so the k-blocks of A and B
// pair up. The result: for each k-block j, p_j = (the dot product of the two blocks' element
// values, exact or rounded once) rounded to fp32, then acc += p_j · (scale_a · scale_b) in fp32,
// j ascending; z = alpha · (acc · (tensor_scale_a · tensor_scale_b)) + beta · C + bias, in fp32.
// A partial last block (k not a multiple of B) holds the elements there are (the quantizer treats
// it as zero-padded). Raises BackendError for operands that do not pair up or fit.
struct BlockScaledGemmArgs {
  BlockScaledOperand a, b;
  TensorView c;
  float alpha = 1.0f;
  float beta = 0.0f;
  TensorView bias;
  bool has_activation = false;
  Activation activation = Activation::relu;
  TensorView pre_activation;
};

// --- 1.5: backward epilogues -------------------------------------------------------------------
// A GEMM of a backward pass with the element-wise work that would otherwise re-read its operands
// or its result (what cuBLASLt's DGELU and BGRAD epilogues compute). `gemm` is as for gemm(), except that its
// bias, has_activation and pre_activation must be unset. Then, in this order:
//   z = alpha·op(A)·op(B) + beta·C in FP32;
//   with `has_activation_grad`: z = z · act'(pre_activation), act'(·) in FP32 from the stored
//     pre_activation [m, n] (fp32, bf16 or fp16; gelu's input z of the forward). Only gelu is
//     defined; relu raises BackendError. This is the dgrad of the layer after a fused activation:
//     its result is the gradient of the activation's input, rounded once;
//   C = z rounded once into C's dtype;
//   c_column_sums (fp32 [n], optional) (+)= the column sums of C as stored: the bias gradient of
//     the layer before the activation, the same sums the activation facet's bias_grad takes of C;
//   a_row_sums (fp32 [m], optional) (+)= Σ_k op(A)[m, k] of A as stored (unscaled by alpha, before
//     any tf32 rounding): wgrad's bias gradient, op(A) = dyᵀ. Only with a.transpose (A stored
//     [k, m]) and A in fp32, bf16 or fp16, else BackendError.
// Each sum accumulates when its flag is set, else overwrites. Neither sum nor pre_activation may
// overlap C. BackendArgumentChecks::gemm_gradient_shape checks all of this.
struct GemmGradientArgs {
  GemmArgs gemm;
  bool has_activation_grad = false;
  Activation activation = Activation::gelu;  // read only when has_activation_grad
  TensorView pre_activation;
  TensorView c_column_sums;
  bool accumulate_c_column_sums = false;
  TensorView a_row_sums;
  bool accumulate_a_row_sums = false;
};

// --- 1.6: FP8 operands in both layouts --------------------------------------------------------
// One read of src [rows, cols] (fp32, bf16 or fp16; leading dims folded into rows) writes each
// given output: `out` [rows, cols] as stored and `out_transposed` [cols, rows], its transpose,
// both of one FP8 dtype (fp8_e4m3 or fp8_e5m2). Each element is exactly what DeviceBackend::cast
// writes with `cast`'s scale and saturate, and cast.amax (fp32 [1], optional) folds in max|src| by
// cast's rule. Either output may be empty, not both; neither may overlap src, the other or amax,
// and amax may not overlap src (it is folded in while src is still read).
// Why: FP8 Tensor Cores take both operands with the reduction dim contiguous (cuBLASLt's "TN"),
// so a linear's dgrad reads Wᵀ and its wgrad reads xᵀ and dyᵀ; writing the transpose during the
// cast saves a pass over each (Transformer Engine's cast_transpose), and a host that keeps only
// xᵀ for the backward keeps no more bytes than before. BackendArgumentChecks::cast_transpose_shape
// checks all of this.
struct CastTransposeArgs {
  TensorView src;
  TensorView out;
  TensorView out_transposed;
  CastArgs cast;
};

// --- 1.7: an FP8 gradient's cast with its epilogues ---------------------------------------------
// cast_transpose (`cast`, as above) of d [rows, cols] instead of src, where:
//   d = src, or with `has_activation_grad` d = src · act'(pre_activation) in FP32, rounded once
//     into src's dtype: activation_backward's element rule and rounding, src being the gradient of
//     the activation's output and pre_activation [rows, cols] (src's dtype) its input of the
//     forward. Only gelu is defined; relu raises BackendError;
//   column_sums (fp32 [cols], optional) (+)= Σ_rows d as rounded, FP32 or wider, in an order fixed
//     by the shape (the same sums within FP32 rounding as the activation facet's bias_grad of d);
//     it accumulates with `accumulate_column_sums`, else overwrites.
// The codes and cast.amax are of d: exactly what activation_backward, then cast_transpose, write.
// Neither column_sums nor pre_activation may overlap an output, column_sums none of src,
// pre_activation or amax, and amax not pre_activation. Why: the gradient a linear's backward casts
// to FP8 is also the one its bias gradient sums, and after a gelu it is that gelu's gradient: one
// read of dy (and z) instead of three passes (Transformer Engine's cast_transpose_dbias_dgelu).
// BackendArgumentChecks::cast_transpose_gradient_shape checks all of this.
struct CastTransposeGradientArgs {
  CastTransposeArgs cast;
  bool has_activation_grad = false;
  Activation activation = Activation::gelu;  // read only when has_activation_grad
  TensorView pre_activation;
  TensorView column_sums;
  bool accumulate_column_sums = false;
};

enum class GemmOp {
  gemm,                  // {A, B, C}
  gemm_strided_batched,  // {A, B, C}
  // 1.1
  gemm_grouped,  // {A, B, C}, the same for every GEMM of the group
  // 1.2
  quantize_block_scaled,  // {src}
  gemm_block_scaled,      // {C}
  // 1.5
  gemm_gradient,  // {A, B, C}
  // 1.6
  cast_transpose,  // {src, FP8 output}
  // 1.7
  cast_transpose_gradient,  // {src, FP8 output}
};
MIXTRAIN_SDK_API std::string_view op_name(GemmOp op) noexcept;
constexpr std::uint16_t introduced_in(GemmOp op) noexcept {
  switch (op) {
    case GemmOp::gemm_grouped:
      return 1;
    case GemmOp::quantize_block_scaled:
    case GemmOp::gemm_block_scaled:
      return 2;
    case GemmOp::gemm_gradient:
      return 5;
    case GemmOp::cast_transpose:
      return 6;
    case GemmOp::cast_transpose_gradient:
      return 7;
    default:
      return 0;
  }
}
MIXTRAIN_SDK_API OpSignature op_signature(GemmOp op) noexcept;

class MIXTRAIN_SDK_API GemmFacet : public Facet {
 public:
  using Op = GemmOp;
  static constexpr FacetVersion kVersion{1, 7};
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

  // --- 1.2 ---------------------------------------------------------------------------------------
  // Block-scaled operands (the structs above). The defaults raise BackendError, and the default
  // supports() answers false for both ops: a backend offers them by overriding all three.
  virtual void quantize_block_scaled(const BlockQuantizeArgs& args);
  virtual void gemm_block_scaled(const BlockScaledGemmArgs& args);

  // --- 1.3 ---------------------------------------------------------------------------------------
  // Whether the block-scaled ops run operands of `layout` (quantize outputs and GEMM operands) on
  // this backend's device: "" when they do, else why not in one sentence naming what is missing
  // (the device, a library version) and where the layout does run. supports() cannot tell, as it
  // sees dtypes only; the host asks for every layout a block-scaled node plans, after supports()
  // answered for the ops, and refuses the plan with this text, naming the node. Default: "" (every
  // layout block_scaling.h defines, as the CPU backend's simulator runs them).
  virtual std::string block_layout_refusal(const BlockScaledLayout& layout) const;

  // --- 1.4 ---------------------------------------------------------------------------------------
  // Whether quantize_block_scaled takes outputs with `transpose` (BlockQuantizeArgs) and this
  // backend's block-scaled GEMM prefers them: the host then quantizes an operand that a GEMM
  // reduces along its rows (wgrad's x and dy) as its transpose, which such a GEMM reads in place.
  // Default: false (outputs with `transpose` are the caller's bug there).
  virtual bool quantizes_transposed() const;

  // --- 1.5 ---------------------------------------------------------------------------------------
  // A backward GEMM with its epilogues (GemmGradientArgs). The default raises BackendError and the
  // default supports() answers false for it: a backend offers it by overriding both, and the host
  // runs the unfused ops (gemm, activation_backward, bias_grad) on any other. A facet that
  // forwards supports() to another one must forward this call too.
  virtual void gemm_gradient(const GemmGradientArgs& args);

  // --- 1.6 ---------------------------------------------------------------------------------------
  // An FP8 operand in one or both layouts from one read of its source (CastTransposeArgs). The
  // default raises BackendError and the default supports() answers false for it: a backend
  // offers it by overriding both, where its FP8 GEMM gains from operands stored transposed.
  virtual void cast_transpose(const CastTransposeArgs& args);

  // --- 1.7 ---------------------------------------------------------------------------------------
  // An FP8 gradient's cast with its bias-gradient sum and activation gradient
  // (CastTransposeGradientArgs). The default raises BackendError and the default supports()
  // answers false for it, as for cast_transpose: the host then runs the ops apart.
  virtual void cast_transpose_gradient(const CastTransposeGradientArgs& args);

 protected:
  ~GemmFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
