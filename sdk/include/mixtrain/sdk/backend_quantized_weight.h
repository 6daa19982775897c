// QuantizedWeightFacet: frozen weights stored in a block-quantized format and decoded on the
// device, right before the GEMM that reads them, into a working copy in the compute dtype (QLoRA's
// frozen NF4 base, docs/model-graph.md, "Freezing parameters").
//
// Contract
// - A backend offers it as find_facet("quantized_weight") (nullptr: the backend has none; a host
//   then refuses an NF4 base at plan time).
// - supports(op, dtypes) answers without running anything. dtypes: dequantize_nf4 {absmax, out}:
//   absmax fp32, out fp32, bf16 or fp16 storage.
// - dequantize_nf4: out holds n = out.numel() elements (any shape, read flat, row-major); codes
//   points at nf4_code_bytes(n) bytes of device memory, two 4-bit codes per byte, element 2i in
//   the high nibble; absmax holds nf4_block_count(n, block) fp32 values, one per `block`
//   consecutive elements, the last block possibly partial. Element i becomes
//   kNf4Codebook[code_i] · absmax[i / block], one fp32 product, rounded once (nearest even) into
//   out's dtype: bit for bit sdk/support/nf4.h's nf4_dequantize, then that rounding.
// - Errors: BackendError naming the op, the tensor and its dtype/shape, for a null codes pointer,
//   a block < 1, an absmax of the wrong count or dtype, or a non-storage out.
// - name() and version() report kName and kVersion as the backend was compiled (facet.h: a
//   minor step only appends methods).
#pragma once

#include "mixtrain/sdk/export.h"

#include <cstdint>
#include <span>
#include <string_view>

#include "mixtrain/sdk/facet.h"
#include "mixtrain/sdk/op_signatures.h"
#include "mixtrain/sdk/tensor_view.h"

namespace mixtrain::sdk {

enum class QuantizedWeightOp { dequantize_nf4 };
MIXTRAIN_SDK_API std::string_view op_name(QuantizedWeightOp op) noexcept;
MIXTRAIN_SDK_API OpSignature op_signature(QuantizedWeightOp op) noexcept;

class MIXTRAIN_SDK_API QuantizedWeightFacet : public Facet {
 public:
  using Op = QuantizedWeightOp;
  static constexpr FacetVersion kVersion{1, 0};
  static constexpr std::string_view kName = "quantized_weight";
  std::string_view name() const final { return kName; }
  FacetVersion version() const final { return kVersion; }
  // Default: the SDK's table (op_signatures.h); a backend overrides it only to narrow it.
  virtual bool supports(QuantizedWeightOp op, std::span<const DType> dtypes) const;

  // out[i] = dtype(kNf4Codebook[code(i)] · absmax[i / block]); out is overwritten.
  virtual void dequantize_nf4(const void* codes, TensorView absmax, std::int64_t block,
                              TensorView out) = 0;

 protected:
  ~QuantizedWeightFacet() override;  // not owned through the facet: the backend is
};

}  // namespace mixtrain::sdk
