// QuantizedWeightFacet: frozen weights stored in a block-quantized format and decoded on the
// device, right before the GEMM that reads them, into a working copy in the compute dtype (QLoRA's
// frozen NF4 base, docs/model-graph.md, "Freezing parameters").
//
// Contract
// - A backend offers it as find_facet("quantized_weight") (nullptr: the backend has none; a host
//   then refuses an NF4 base at plan time).
// - supports(op, dtypes) answers without running anything. dtypes: dequantize_nf4 {absmax, out}:
//   absmax fp32, out fp32, bf16 or fp16 storage.
// - dequantize_nf4 (1.0): out holds n = out.numel() elements (any shape, read flat, row-major);
// codes
//   points at nf4_code_bytes(n) bytes of device memory, two 4-bit codes per byte, element 2i in
//   the high nibble; absmax holds nf4_block_count(n, block) fp32 values, one per `block`
//   consecutive elements, the last block possibly partial. Element i becomes
//   kNf4Codebook[code_i] · absmax[i / block], one fp32 product, rounded once (nearest even) into
//   out's dtype: bit for bit sdk/support/nf4.h's nf4_dequantize, then that rounding.
// - dequantize_block_scaled (1.1): out is [rows, cols] (2-D, fp32, bf16 or fp16 storage); w holds
//   a tensor of that shape in one of support/block_scaling.h's layouts (check_layout), as the
//   BlockScaledWeight comment below stores it. Element (r, c) becomes exactly that header's
//   dequantize_block_scaled() value (code × block scale × tensor scale, rounded once to fp32),
//   then rounded once (nearest even) into out's dtype. The default raises BackendError and the
//   default supports() answers false: a backend offers it by overriding both.
// - Errors: BackendError naming the op, the tensor and its dtype/shape, for a null codes pointer,
//   a block < 1, an absmax of the wrong count or dtype, a layout check_layout refuses, codes or
//   scales that do not fit the layout and out's shape, or a non-storage out.
// - Versions: 1.1 appended dequantize_block_scaled (a frozen base in an FP8 block format).
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/backend_gemm.h"
#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class QuantizedWeightOp {
  dequantize_nf4,
  // 1.1
  dequantize_block_scaled,  // {out}
};
MIXTRAIN_SDK_API std::string_view op_name(QuantizedWeightOp op) noexcept;
constexpr std::uint16_t introduced_in(QuantizedWeightOp op) noexcept {
  return op == QuantizedWeightOp::dequantize_block_scaled ? 1 : 0;
}
MIXTRAIN_SDK_API OpSignature op_signature(QuantizedWeightOp op) noexcept;

// A block-scaled weight in the backend's memory, [rows, cols] row-major (the layout's dims).
// codes: the element codes, one per byte for E4M3 / E5M2; for E2M1 two per byte in pack_e2m1's
// order (element 2i in the low nibble), ceil(rows·cols / 2) bytes. scales: one per block of
// block_grid(), row-major: fp32 decode scales for the fp32 / fp32_pow2 layouts, else the E8M0 or
// E4M3 scale codes, one byte each. Byte views use a 1-byte dtype (fp8_e4m3) as storage; nothing
// reads them as that dtype. tensor_scale: fp32 [1], the decode scale S_dec, when
// layout.tensor_scale; else empty (read as 1).
struct BlockScaledWeight {
  TensorView codes;
  TensorView scales;
  TensorView tensor_scale;
  BlockScaledLayout layout;
};

class MIXTRAIN_SDK_API QuantizedWeightFacet : public Facet {
 public:
  using Op = QuantizedWeightOp;
  static constexpr FacetVersion kVersion{1, 1};
  static constexpr std::string_view kName = "quantized_weight";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(QuantizedWeightOp op, std::span<const DType> dtypes) const;

  // out[i] = dtype(kNf4Codebook[code(i)] · absmax[i / block]); out is overwritten.
  virtual void dequantize_nf4(const void* codes, TensorView absmax, std::int64_t block,
                              TensorView out) = 0;

  // --- 1.1 ---------------------------------------------------------------------------------------
  // out[r, c] = dtype(dequantize_block_scaled(w)[r, c]); out is overwritten.
  virtual void dequantize_block_scaled(const BlockScaledWeight& w, TensorView out);

 protected:
  ~QuantizedWeightFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
