// CpuQuantizedWeight: the CPU backend's QuantizedWeightFacet: NF4 decoded as sdk/support/nf4.h
// defines it (cpu_nf4_decode.h: a table of each block's 16 values, rounded once into out's dtype),
// and block-scaled weights as sdk/support/block_scaling.h's dequantize_block_scaled() does.
//
// - Arguments: the SDK's shared checks (sdk/support/backend_argument_checks.h).
// - OpenMP over runs of whole blocks (NF4) or over rows (block-scaled); an element depends on its
//   code and its block's scales alone, so the output has the same bits for any thread count.
// - Block-scaled: code × block scale × tensor scale in double, exact (at most 4 + 24 + 24
//   significant bits), rounded once to fp32, as the reference computes it, then rounded once
//   (RNE) into out's dtype (cpu_block_scaled_decode.h).

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "cpu_access.h"
#include "cpu_block_scaled.h"
#include "cpu_block_scaled_decode.h"
#include "cpu_context.h"
#include "cpu_nf4_decode.h"
#include "mixtrain/sdk/backend_quantized_weight.h"
#include "mixtrain/sdk/support/block_scaling.h"
#include "mixtrain/sdk/support/facet_registry.h"
#include "mixtrain/sdk/support/nf4.h"

namespace mixtrain::backend_cpu {

using sdk::DType;
using sdk::TensorView;

namespace {

class CpuQuantizedWeight final : public sdk::QuantizedWeightFacet {
 public:
  explicit CpuQuantizedWeight(CpuContext& context) : context_(context) {}

  // The SDK's table, and dequantize_block_scaled into fp32 / bf16 / fp16 ({out}).
  bool supports(sdk::QuantizedWeightOp op, std::span<const DType> dtypes) const override {
    if (op != sdk::QuantizedWeightOp::dequantize_block_scaled)
      return QuantizedWeightFacet::supports(op, dtypes);
    return dtypes.size() == 1 && is_storage_float(dtypes[0]);
  }

  void dequantize_nf4(const void* codes, TensorView absmax, std::int64_t block,
                      TensorView out) override {
    checks().dequantize_nf4(codes, absmax, block, out);
    context_.use_threads();
    decode_nf4(static_cast<const std::uint8_t*>(codes), absmax.as<const float>(), block, out);
  }

  // out is [rows, cols]; w's codes and scales tile it in w.layout's blocks.
  void dequantize_block_scaled(const sdk::BlockScaledWeight& w, TensorView out) override {
    const auto grid = checks().dequantize_block_scaled(w, out);
    const bool packed = w.layout.element == sdk::BlockElement::e2m1;
    const bool fp32_scales =
        w.layout.scale == sdk::BlockScale::fp32 || w.layout.scale == sdk::BlockScale::fp32_pow2;
    const float tensor_scale = w.layout.tensor_scale ? *w.tensor_scale.as<const float>() : 1.0f;
    context_.use_threads();
    // The scales as given: fp32 values, or byte codes with the 256 codes' values (E8M0 and E4M3
    // decode exactly), looked up by the decode where it needs them (a float a block, formed
    // beforehand, and a table found per float cost mxfp8's 1x32 blocks a pass and a hash each).
    BlockScales scales{.grid_cols = grid.cols};
    std::array<float, 256> code_values;
    if (fp32_scales) {
      scales.values = w.scales.as<const float>();
    } else {
      code_values = scale_code_values(w.layout.scale);
      scales.codes = w.scales.as<const std::uint8_t>();
      scales.code_values = &code_values;
    }
    decode_block_scaled(w.codes.as<const std::uint8_t>(), packed,
                        block_element_values(w.layout.element), scales, w.layout.block_rows,
                        w.layout.block_cols, tensor_scale, out);
  }

 private:
  CpuContext& context_;
};

const sdk::FacetRegistration<CpuContext, sdk::QuantizedWeightFacet, CpuQuantizedWeight>
    kRegistration;

}  // namespace

}  // namespace mixtrain::backend_cpu
